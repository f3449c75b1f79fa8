#include "data/text_file.h"

#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "data/testing/idx_test_files.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace grps {
namespace {

using ::testing::AllOf;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using testing_files::MakeTempDir;
using testing_files::ReadFileBytes;
using testing_files::TempPath;
using testing_files::WriteFile;
using testing_files::WriteGzipFile;

// Long enough to span several of the reader's 1 MiB pieces.
std::string LongText() {
  std::string text;
  for (int i = 0; text.size() < (3u << 20) + 17; ++i) {
    text += std::to_string(i) + " 1:0.5 7:2\n";
  }
  return text;
}

TEST(ReadTextFileTest, ReadsAPlainFileAsIs) {
  const std::string path = TempPath("plain.txt");
  const std::string text = LongText();
  WriteFile(path, text);
  absl::StatusOr<std::string> read = ReadTextFile(path);
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_EQ(*read, text);
}

TEST(ReadTextFileTest, DecompressesGzipRecognisedByContentNotName) {
  const std::string gzip_without_suffix = TempPath("data.txt");
  const std::string plain_with_suffix = TempPath("data.txt.gz");
  const std::string text = LongText();
  WriteGzipFile(gzip_without_suffix, text);
  WriteFile(plain_with_suffix, text);
  ASSERT_EQ(ReadFileBytes(gzip_without_suffix).substr(0, 2), "\x1f\x8b");
  for (const std::string& path : {gzip_without_suffix, plain_with_suffix}) {
    absl::StatusOr<std::string> read = ReadTextFile(path);
    ASSERT_TRUE(read.ok()) << path << ": " << read.status();
    EXPECT_EQ(*read, text) << path;
  }
}

TEST(ReadTextFileTest, ReadsEmptyFiles) {
  const std::string plain = TempPath("empty");
  const std::string gzip = TempPath("empty.gz");
  WriteFile(plain, "");
  WriteGzipFile(gzip, "");
  for (const std::string& path : {plain, gzip}) {
    absl::StatusOr<std::string> read = ReadTextFile(path);
    ASSERT_TRUE(read.ok()) << path << ": " << read.status();
    EXPECT_EQ(*read, "") << path;
  }
}

TEST(ReadTextFileTest, MissingFileIsNotFound) {
  const std::string path = TempPath("missing");
  absl::StatusOr<std::string> read = ReadTextFile(path);
  EXPECT_EQ(read.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(read.status().message(), HasSubstr(path));
}

TEST(ReadTextFileTest, DirectoryIsInvalidArgument) {
  const std::string dir = MakeTempDir("dir");
  absl::StatusOr<std::string> read = ReadTextFile(dir);
  EXPECT_EQ(read.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(read.status().message(), HasSubstr(dir));
}

TEST(ReadTextFileTest, TextLongerThanMaxBytesIsResourceExhausted) {
  const std::string plain = TempPath("plain");
  const std::string gzip = TempPath("gzip");
  const std::string text(1000, 'x');
  WriteFile(plain, text);
  WriteGzipFile(gzip, text);
  for (const std::string& path : {plain, gzip}) {
    EXPECT_TRUE(ReadTextFile(path, 1000).ok()) << path;
    absl::StatusOr<std::string> read = ReadTextFile(path, 999);
    EXPECT_EQ(read.status().code(), absl::StatusCode::kResourceExhausted)
        << path;
    EXPECT_THAT(read.status().message(),
                AllOf(HasSubstr(path), HasSubstr("limit of 999 bytes")));
  }
}

TEST(ReadTextFileTest, GzipBombStopsAtMaxBytes) {
  // 64 MiB of zeros compress to about 64 KiB; the reader gives up after
  // max_bytes + one piece.
  const std::string path = TempPath("bomb.gz");
  WriteGzipFile(path, std::string(64u << 20, '0'));
  absl::StatusOr<std::string> read = ReadTextFile(path, 1u << 20);
  EXPECT_EQ(read.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(read.status().message(), HasSubstr("after decompression"));
}

TEST(ReadTextFileTest, CutShortGzipIsDataLoss) {
  const std::string whole = TempPath("whole.gz");
  const std::string cut = TempPath("cut.gz");
  WriteGzipFile(whole, LongText());
  const std::string bytes = ReadFileBytes(whole);
  WriteFile(cut, bytes.substr(0, bytes.size() / 2));
  absl::StatusOr<std::string> read = ReadTextFile(cut);
  EXPECT_EQ(read.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(read.status().message(),
              AllOf(HasSubstr(cut), HasSubstr("cut short")));
}

TEST(ReadTextFileTest, CorruptGzipIsDataLoss) {
  const std::string whole = TempPath("whole.gz");
  const std::string corrupt = TempPath("corrupt.gz");
  WriteGzipFile(whole, "1 1:1\n0 2:1\n");
  std::string bytes = ReadFileBytes(whole);
  bytes[bytes.size() - 5] ^= 0x55;  // the CRC or length trailer
  WriteFile(corrupt, bytes);
  absl::StatusOr<std::string> read = ReadTextFile(corrupt);
  EXPECT_EQ(read.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(read.status().message(), HasSubstr(corrupt));
}

std::vector<std::pair<int64_t, std::string>> Lines(absl::string_view text) {
  std::vector<std::pair<int64_t, std::string>> out;
  TextLines lines(text);
  absl::string_view line;
  while (lines.Next(&line)) out.emplace_back(lines.number(), std::string(line));
  return out;
}

TEST(TextLinesTest, NumbersLinesFromOneAndDropsLineEnds) {
  using Line = std::pair<int64_t, std::string>;
  EXPECT_THAT(Lines("a\nb\r\n\nc"),
              ElementsAre(Line{1, "a"}, Line{2, "b"}, Line{3, ""},
                          Line{4, "c"}));
  EXPECT_THAT(Lines("a\n"), ElementsAre(Line{1, "a"}));
  EXPECT_THAT(Lines("\n"), ElementsAre(Line{1, ""}));
  EXPECT_THAT(Lines(""), ElementsAre());
}

TEST(TextLinesTest, NumberIsZeroBeforeTheFirstLine) {
  TextLines lines("x\n");
  EXPECT_EQ(lines.number(), 0);
}

TEST(LineErrorTest, NamesFileAndLine) {
  absl::Status status = LineError("data/a.txt", 12, "bad thing");
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(status.message(), "data/a.txt:12: bad thing");
}

TEST(ParseFiniteFloatTest, ReadsDecimalNumbers) {
  const std::vector<std::pair<std::string, float>> cases = {
      {"0", 0.0f},     {"1", 1.0f},      {"-2.5", -2.5f}, {"+0.25", 0.25f},
      {".5", 0.5f},    {"5.", 5.0f},     {"1e3", 1000.0f}, {"-1E-2", -0.01f},
      {"3.4e38", 3.4e38f}, {"1e-50", 0.0f}, {"1e-400", 0.0f}};
  for (const auto& [token, expected] : cases) {
    absl::StatusOr<float> value = ParseFiniteFloat(token);
    ASSERT_TRUE(value.ok()) << token << ": " << value.status();
    EXPECT_FLOAT_EQ(*value, expected) << token;
  }
}

TEST(ParseFiniteFloatTest, RefusesNonNumbersAndNonFiniteValues) {
  for (const std::string token :
       {"", "+", "-", "abc", "1.5x", "1 ", " 1", "0x10", "1e", "1,5", "--1",
        "+-1", "++1", "nan", "NaN", "-nan", "inf", "-inf", "infinity", "1e39",
        "-1e39", "1e400"}) {
    absl::StatusOr<float> value = ParseFiniteFloat(token);
    EXPECT_EQ(value.status().code(), absl::StatusCode::kInvalidArgument)
        << "\"" << token << "\" read as " << (value.ok() ? *value : 0.0f);
    EXPECT_THAT(value.status().message(), HasSubstr("\"" + token + "\""));
  }
}

TEST(ParseInt64Test, ReadsDecimalIntegersStrictly) {
  EXPECT_EQ(*ParseInt64("0"), 0);
  EXPECT_EQ(*ParseInt64("-17"), -17);
  EXPECT_EQ(*ParseInt64("9223372036854775807"),
            std::numeric_limits<int64_t>::max());
  for (const std::string token :
       {"", "+1", "1.0", "1e3", "0x1", " 1", "1 ", "-", "abc"}) {
    absl::StatusOr<int64_t> value = ParseInt64(token);
    EXPECT_EQ(value.status().code(), absl::StatusCode::kInvalidArgument)
        << token;
    EXPECT_THAT(value.status().message(), HasSubstr("is not an integer"));
  }
  absl::StatusOr<int64_t> big = ParseInt64("9223372036854775808");
  EXPECT_EQ(big.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(big.status().message(), HasSubstr("outside the range of int64"));
}

}  // namespace
}  // namespace grps
