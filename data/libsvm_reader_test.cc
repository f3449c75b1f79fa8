#include "data/libsvm_reader.h"

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "data/testing/idx_test_files.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace grps {
namespace {

using ::testing::AllOf;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using testing_files::TempPath;
using testing_files::WriteFile;
using testing_files::WriteGzipFile;

constexpr char kSample[] =
    "# a comment line\n"
    "2 1:0.5 3:-1 10:2e1\n"
    "\n"
    "0\t4:1   # a trailing comment\n"
    "   \n"
    "1\n";  // an example with no ids

absl::StatusOr<SparseDataset> ReadText(const std::string& text,
                                       const LibsvmOptions& options = {}) {
  const std::string path = TempPath("data.libsvm");
  WriteFile(path, text);
  return ReadLibsvm(path, options);
}

TEST(LibsvmReaderTest, ReadsExamplesWithOneBasedIdsStoredFromZero) {
  absl::StatusOr<SparseDataset> data = ReadText(kSample);
  ASSERT_TRUE(data.ok()) << data.status();
  EXPECT_EQ(data->num_examples(), 3);
  EXPECT_EQ(data->num_classes(), 3);       // largest label 2, + 1
  EXPECT_EQ(data->feature_space(), 10u);   // largest id 10, stored as 9, + 1
  EXPECT_THAT(data->labels(), ElementsAre(2, 0, 1));
  EXPECT_THAT(data->ids(0), ElementsAre(0, 2, 9));
  EXPECT_THAT(data->values(0), ElementsAre(0.5f, -1.0f, 20.0f));
  EXPECT_THAT(data->ids(1), ElementsAre(3));
  EXPECT_THAT(data->values(1), ElementsAre(1.0f));
  EXPECT_THAT(data->ids(2), IsEmpty());
}

TEST(LibsvmReaderTest, ZeroBasedKeepsIdsAsWritten) {
  LibsvmOptions options;
  options.zero_based = true;
  absl::StatusOr<SparseDataset> data = ReadText("1 0:1 5:2\n0 3:1\n", options);
  ASSERT_TRUE(data.ok()) << data.status();
  EXPECT_THAT(data->ids(0), ElementsAre(0, 5));
  EXPECT_THAT(data->ids(1), ElementsAre(3));
  EXPECT_EQ(data->feature_space(), 6u);
}

TEST(LibsvmReaderTest, OptionsSetClassesAndFeatureSpace) {
  LibsvmOptions options;
  options.num_classes = 5;
  options.feature_space = 100;
  absl::StatusOr<SparseDataset> data = ReadText(kSample, options);
  ASSERT_TRUE(data.ok()) << data.status();
  EXPECT_EQ(data->num_classes(), 5);
  EXPECT_EQ(data->feature_space(), 100u);
}

TEST(LibsvmReaderTest, FileWithoutIdsHasUnboundedFeatureSpace) {
  absl::StatusOr<SparseDataset> data = ReadText("1\n0\n");
  ASSERT_TRUE(data.ok()) << data.status();
  EXPECT_EQ(data->nnz(), 0);
  EXPECT_EQ(data->feature_space(), 0u);
}

TEST(LibsvmReaderTest, GzipFileReadsLikeThePlainOne) {
  const std::string path = TempPath("data.libsvm.gz");
  WriteGzipFile(path, kSample);
  absl::StatusOr<SparseDataset> gzip = ReadLibsvm(path);
  absl::StatusOr<SparseDataset> plain = ReadText(kSample);
  ASSERT_TRUE(gzip.ok()) << gzip.status();
  ASSERT_TRUE(plain.ok()) << plain.status();
  EXPECT_EQ(gzip->offsets(), plain->offsets());
  EXPECT_EQ(gzip->all_ids(), plain->all_ids());
  EXPECT_EQ(gzip->all_values(), plain->all_values());
  EXPECT_EQ(gzip->labels(), plain->labels());
  EXPECT_EQ(gzip->num_classes(), plain->num_classes());
  EXPECT_EQ(gzip->feature_space(), plain->feature_space());
}

TEST(LibsvmReaderTest, CrlfLinesReadLikeLfLines) {
  absl::StatusOr<SparseDataset> data = ReadText("1 2:3\r\n0 1:1\r\n");
  ASSERT_TRUE(data.ok()) << data.status();
  EXPECT_THAT(data->labels(), ElementsAre(1, 0));
  EXPECT_THAT(data->values(0), ElementsAre(3.0f));
}

TEST(LibsvmReaderTest, BinaryMinusOneAndPlusOneAreClassesZeroAndOne) {
  absl::StatusOr<SparseDataset> data =
      ReadText("+1 1:1\n-1 2:1\n1 3:1\n-1 4:1\n");
  ASSERT_TRUE(data.ok()) << data.status();
  EXPECT_THAT(data->labels(), ElementsAre(1, 0, 1, 0));
  EXPECT_EQ(data->num_classes(), 2);
}

TEST(LibsvmReaderTest, ParseLibsvmNamesTheTextInErrors) {
  absl::StatusOr<SparseDataset> data = ParseLibsvm("1 1:1\n1 x\n", "memory");
  EXPECT_EQ(data.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(data.status().message(), HasSubstr("memory:2: "));
}

// A malformed file: its text, the options, and the line and words the
// error must name.
struct BadFile {
  const char* what;
  std::string text;
  int line;
  std::string message;
  LibsvmOptions options = {};
};

LibsvmOptions ZeroBased() {
  LibsvmOptions options;
  options.zero_based = true;
  return options;
}
LibsvmOptions FeatureSpace(uint64_t space, bool zero_based = false) {
  LibsvmOptions options;
  options.feature_space = space;
  options.zero_based = zero_based;
  return options;
}
LibsvmOptions Classes(int32_t n) {
  LibsvmOptions options;
  options.num_classes = n;
  return options;
}

std::vector<BadFile> BadFiles() {
  return {
      {"missing colon", "1 1:1\n0 3\n", 2, "\"3\" is not id:value (no ':')"},
      {"id not an integer", "1 a:1\n", 1, "id of \"a:1\": \"a\" is not an "
                                          "integer"},
      {"id a fraction", "# c\n1 1.5:1\n", 2, "\"1.5\" is not an integer"},
      {"id empty", "1 :1\n", 1, "\"\" is not an integer"},
      {"id overflows", "1 99999999999999999999:1\n", 1,
       "outside the range of int64"},
      {"id 0 in a 1-based file", "1 0:1\n", 1,
       "id 0 is not a 1-based libsvm id"},
      {"negative id, 1-based", "1 -3:1\n", 1,
       "id -3 is not a 1-based libsvm id"},
      {"negative id, 0-based", "\n1 -3:1\n", 2, "id -3 is negative",
       ZeroBased()},
      {"id beyond feature space, 1-based", "1 1:1\n1 2:1 11:1\n", 2,
       "id 11 is outside the feature space of 10 ids (1..10)",
       FeatureSpace(10)},
      {"id beyond feature space, 0-based", "1 10:1\n", 1,
       "id 10 is outside the feature space of 10 ids (0..9)",
       FeatureSpace(10, true)},
      {"ids descending", "1 1:1\n1 5:1 3:1\n", 2,
       "id 3 follows id 5; ids must be ascending"},
      {"id duplicated", "1 3:1 3:2\n", 1, "id 3 appears twice"},
      {"value nan", "1 3:nan\n", 1, "value of id 3: \"nan\" is not a finite "
                                    "number"},
      {"value inf", "1 3:inf\n", 1, "value of id 3: \"inf\""},
      {"value too large", "1 3:1e39\n", 1, "too large for a float"},
      {"value unparsable", "1 3:abc\n", 1, "value of id 3: \"abc\" is not a "
                                          "number"},
      {"value with trailing garbage", "1 3:1.5x\n", 1, "\"1.5x\""},
      {"value empty", "1 3:\n", 1, "value of id 3: \"\" is not a number"},
      {"second colon", "1 3:1:2\n", 1, "\"1:2\" is not a number"},
      {"label not a number", "a 1:1\n", 1, "label \"a\" is not an integer"},
      {"label a fraction", "1.0 1:1\n", 1, "label \"1.0\" is not an integer"},
      {"label negative", "-2 1:1\n", 1, "label -2 is negative"},
      {"label +2", "+2 1:1\n", 1, "label \"+2\" is not an integer"},
      {"label too large", "2147483647 1:1\n", 1, "too large for a class"},
      {"label missing", "1:1 2:1\n", 1, "label \"1:1\" is not an integer"},
      {"label >= num_classes", "0\n1\n3 1:1\n", 3, "label 3 is outside [0, 3)",
       Classes(3)},
      {"+1 with one class", "+1\n", 1, "label +1 is outside [0, 1)",
       Classes(1)},
      {"-1 after class 0", "0 1:1\n1 1:1\n-1 1:1\n", 3,
       "labels mix the binary -1/+1 convention (line 3 has -1"},
      {"class 2 after -1", "-1 1:1\n+1 1:1\n2 1:1\n", 3,
       "with class 2 (line 3)"},
  };
}

TEST(LibsvmReaderTest, EveryMalformedLineIsInvalidArgumentNamingFileAndLine) {
  for (const BadFile& bad : BadFiles()) {
    SCOPED_TRACE(bad.what);
    const std::string path = TempPath("bad.libsvm");
    WriteFile(path, bad.text);
    absl::StatusOr<SparseDataset> data = ReadLibsvm(path, bad.options);
    ASSERT_FALSE(data.ok());
    EXPECT_EQ(data.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(data.status().message(),
                AllOf(HasSubstr(absl::StrCat(path, ":", bad.line, ": ")),
                      HasSubstr(bad.message)));
  }
}

TEST(LibsvmReaderTest, MalformedGzipFileNamesLineToo) {
  const std::string path = TempPath("bad.libsvm.gz");
  WriteGzipFile(path, "1 1:1\n0 2:1 1:1\n");
  absl::StatusOr<SparseDataset> data = ReadLibsvm(path);
  EXPECT_EQ(data.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(data.status().message(), HasSubstr(path + ":2: id 1 follows"));
}

TEST(LibsvmReaderTest, FileWithNoExamplesIsInvalidArgument) {
  for (const std::string text :
       {"", "\n\n", "# only a comment\n  # another\n"}) {
    absl::StatusOr<SparseDataset> data = ReadText(text);
    EXPECT_EQ(data.status().code(), absl::StatusCode::kInvalidArgument)
        << text;
    EXPECT_THAT(data.status().message(), HasSubstr("holds no examples"));
  }
}

TEST(LibsvmReaderTest, MissingFileIsNotFound) {
  const std::string path = TempPath("missing.libsvm");
  absl::StatusOr<SparseDataset> data = ReadLibsvm(path);
  EXPECT_EQ(data.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(data.status().message(), HasSubstr(path));
}

TEST(LibsvmReaderTest, FileOverMaxBytesIsResourceExhausted) {
  LibsvmOptions options;
  options.max_bytes = 10;
  absl::StatusOr<SparseDataset> data = ReadText("1 1:1 2:1 3:1\n", options);
  EXPECT_EQ(data.status().code(), absl::StatusCode::kResourceExhausted);
}

TEST(LibsvmReaderTest, NegativeNumClassesIsInvalidArgument) {
  EXPECT_EQ(ReadText("1 1:1\n", Classes(-1)).status().code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace grps
