#include "data/csv_reader.h"

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
using testing_files::TempPath;
using testing_files::WriteFile;
using testing_files::WriteGzipFile;

constexpr char kSample[] =
    "2,0.5,-1,2e1\n"
    "\n"
    "0, 1 ,\t0,0\n"
    "1,0,0,3.25\n";

absl::StatusOr<Dataset> ReadText(const std::string& text,
                                 const CsvOptions& options = {}) {
  const std::string path = TempPath("data.csv");
  WriteFile(path, text);
  return ReadCsv(path, options);
}

TEST(CsvReaderTest, ReadsLabelAndFeaturesPerRow) {
  absl::StatusOr<Dataset> data = ReadText(kSample);
  ASSERT_TRUE(data.ok()) << data.status();
  EXPECT_EQ(data->num_examples(), 3);
  EXPECT_EQ(data->num_features(), 3);
  EXPECT_EQ(data->num_classes(), 3);  // largest label 2, + 1
  EXPECT_THAT(data->labels(), ElementsAre(2, 0, 1));
  EXPECT_THAT(data->features(),
              ElementsAre(0.5f, -1.0f, 20.0f, 1.0f, 0.0f, 0.0f, 0.0f, 0.0f,
                          3.25f));
}

TEST(CsvReaderTest, HeaderLineIsSkippedWhateverItHolds) {
  CsvOptions options;
  options.header = true;
  absl::StatusOr<Dataset> data =
      ReadText("label,\"a, b\",c\n1,2,3\n0,4,5\n", options);
  ASSERT_TRUE(data.ok()) << data.status();
  EXPECT_THAT(data->labels(), ElementsAre(1, 0));
  EXPECT_THAT(data->features(), ElementsAre(2.0f, 3.0f, 4.0f, 5.0f));
}

TEST(CsvReaderTest, LabelColumnMayBeAnyColumnOrTheLast) {
  CsvOptions last;
  last.label_column = -1;
  absl::StatusOr<Dataset> data = ReadText("0.5,0.25,1\n0,1,0\n", last);
  ASSERT_TRUE(data.ok()) << data.status();
  EXPECT_THAT(data->labels(), ElementsAre(1, 0));
  EXPECT_THAT(data->features(), ElementsAre(0.5f, 0.25f, 0.0f, 1.0f));

  CsvOptions middle;
  middle.label_column = 1;
  data = ReadText("0.5,3,0.25\n", middle);
  ASSERT_TRUE(data.ok()) << data.status();
  EXPECT_THAT(data->labels(), ElementsAre(3));
  EXPECT_THAT(data->features(), ElementsAre(0.5f, 0.25f));
}

TEST(CsvReaderTest, NumClassesOptionIsKept) {
  CsvOptions options;
  options.num_classes = 10;
  absl::StatusOr<Dataset> data = ReadText(kSample, options);
  ASSERT_TRUE(data.ok()) << data.status();
  EXPECT_EQ(data->num_classes(), 10);
}

TEST(CsvReaderTest, GzipFileReadsLikeThePlainOne) {
  const std::string path = TempPath("data.csv.gz");
  WriteGzipFile(path, kSample);
  absl::StatusOr<Dataset> gzip = ReadCsv(path);
  absl::StatusOr<Dataset> plain = ReadText(kSample);
  ASSERT_TRUE(gzip.ok()) << gzip.status();
  ASSERT_TRUE(plain.ok()) << plain.status();
  EXPECT_EQ(gzip->features(), plain->features());
  EXPECT_EQ(gzip->labels(), plain->labels());
  EXPECT_EQ(gzip->num_features(), plain->num_features());
  EXPECT_EQ(gzip->num_classes(), plain->num_classes());
}

TEST(CsvReaderTest, ByteOrderMarkAndCrlfAreIgnored) {
  absl::StatusOr<Dataset> data = ReadText("\xef\xbb\xbf" "1,2\r\n0,3\r\n");
  ASSERT_TRUE(data.ok()) << data.status();
  EXPECT_THAT(data->labels(), ElementsAre(1, 0));
  EXPECT_THAT(data->features(), ElementsAre(2.0f, 3.0f));
}

TEST(CsvReaderTest, ParseCsvNamesTheTextInErrors) {
  absl::StatusOr<Dataset> data = ParseCsv("1,2\n1,x\n", "memory");
  EXPECT_EQ(data.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(data.status().message(), HasSubstr("memory:2: "));
}

struct BadFile {
  const char* what;
  std::string text;
  int line;
  std::string message;
  CsvOptions options = {};
};

CsvOptions Header() {
  CsvOptions options;
  options.header = true;
  return options;
}
CsvOptions LabelColumn(int32_t column) {
  CsvOptions options;
  options.label_column = column;
  return options;
}
CsvOptions Classes(int32_t n) {
  CsvOptions options;
  options.num_classes = n;
  return options;
}

std::vector<BadFile> BadFiles() {
  return {
      {"more columns", "1,2,3\n0,1,2,3\n", 2,
       "row has 4 columns, but line 1 has 3"},
      {"fewer columns", "\n1,2,3\n0,1\n", 3,
       "row has 2 columns, but line 2 has 3"},
      {"one column", "1\n", 1, "a row needs a label and at least one feature"},
      {"label_column past the row", "1,2\n", 1,
       "label_column 2 is outside the row's 2 columns", LabelColumn(2)},
      {"feature not a number", "1,2,abc\n", 1,
       "column 2: \"abc\" is not a number"},
      {"feature empty", "1,,2\n", 1, "column 1: \"\" is not a number"},
      {"feature with trailing garbage", "1,2.5kg\n", 1, "\"2.5kg\""},
      {"feature nan", "1,2\n1,nan\n", 2, "\"nan\" is not a finite number"},
      {"feature inf", "1,-inf\n", 1, "\"-inf\" is not a finite number"},
      {"feature too large", "1,1e39\n", 1, "too large for a float"},
      {"feature quoted", "1,\"2\"\n", 1, "\"\"2\"\" is not a number"},
      {"label a fraction", "1.0,2\n", 1,
       "label (column 0): \"1.0\" is not an integer"},
      {"label negative", "-1,2\n", 1, "label (column 0): -1 is negative"},
      {"label not a number", "x,2\n", 1, "label (column 0): \"x\""},
      {"label too large", "2147483647,2\n", 1, "too large for a class index"},
      {"label last column", "2,1.5\n", 1,
       "label (column 1): \"1.5\" is not an integer", LabelColumn(-1)},
      {"label >= num_classes", "1,2\n2,3\n", 2, "label 2 is outside [0, 2)",
       Classes(2)},
      {"header counts as line 1", "a,b\n1,2\n1,2,3\n", 3,
       "row has 3 columns, but line 2 has 2", Header()},
  };
}

TEST(CsvReaderTest, EveryMalformedRowIsInvalidArgumentNamingFileAndLine) {
  for (const BadFile& bad : BadFiles()) {
    SCOPED_TRACE(bad.what);
    const std::string path = TempPath("bad.csv");
    WriteFile(path, bad.text);
    absl::StatusOr<Dataset> data = ReadCsv(path, bad.options);
    ASSERT_FALSE(data.ok());
    EXPECT_EQ(data.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(data.status().message(),
                AllOf(HasSubstr(absl::StrCat(path, ":", bad.line, ": ")),
                      HasSubstr(bad.message)));
  }
}

TEST(CsvReaderTest, FileWithNoRowsIsInvalidArgument) {
  for (const auto& [text, header] : std::vector<std::pair<std::string, bool>>{
           {"", false}, {"\n \n", false}, {"a,b\n", true}}) {
    CsvOptions options;
    options.header = header;
    absl::StatusOr<Dataset> data = ReadText(text, options);
    EXPECT_EQ(data.status().code(), absl::StatusCode::kInvalidArgument)
        << text;
    EXPECT_THAT(data.status().message(), HasSubstr("holds no rows"));
  }
}

TEST(CsvReaderTest, BadOptionsAreInvalidArgument) {
  EXPECT_EQ(ReadText("1,2\n", LabelColumn(-2)).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ReadText("1,2\n", Classes(-1)).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(CsvReaderTest, MissingFileIsNotFound) {
  const std::string path = TempPath("missing.csv");
  absl::StatusOr<Dataset> data = ReadCsv(path);
  EXPECT_EQ(data.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(data.status().message(), HasSubstr(path));
}

TEST(CsvReaderTest, FileOverMaxBytesIsResourceExhausted) {
  CsvOptions options;
  options.max_bytes = 4;
  absl::StatusOr<Dataset> data = ReadText("1,2,3\n", options);
  EXPECT_EQ(data.status().code(), absl::StatusCode::kResourceExhausted);
}

}  // namespace
}  // namespace grps
