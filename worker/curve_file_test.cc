#include "worker/curve_file.h"

#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>

#include "gtest/gtest.h"

namespace grps {
namespace {

std::string Read(const std::string& path) {
  std::ifstream in(path);
  std::stringstream all;
  all << in.rdbuf();
  return all.str();
}

std::string TempPath(const char* name) {
  const char* dir = std::getenv("TEST_TMPDIR");
  return std::string(dir != nullptr ? dir : "/tmp") + "/" + name;
}

TEST(CurveFile, WritesTheHeaderThenARowPerWriteAtOnce) {
  const std::string path = TempPath("curve_file_test.csv");
  std::remove(path.c_str());
  const absl::Time start = absl::FromUnixSeconds(1000);
  absl::StatusOr<std::unique_ptr<CurveFile>> curve = CurveFile::Create(path, start);
  ASSERT_TRUE(curve.ok()) << curve.status();
  EXPECT_EQ(Read(path),
            "step,epoch,elapsed_s,unix_time,loss,samples_per_sec,test_accuracy,test_loss,"
            "evaluated,test_auc\n");
  CurveRow row;
  row.step = 7;
  row.epoch = 1;
  row.loss = 0.5;
  row.samples_per_sec = 1234.56;
  (*curve)->Write(row, start + absl::Milliseconds(2500));
  row.test_accuracy = 0.875;
  row.test_loss = 0.25;
  row.evaluated = true;
  row.test_auc = 0.9375;
  (*curve)->Write(row, start + absl::Seconds(3));
  // Flushed: read while the file is still open.
  EXPECT_EQ(Read(path),
            "step,epoch,elapsed_s,unix_time,loss,samples_per_sec,test_accuracy,test_loss,"
            "evaluated,test_auc\n"
            "7,1,2.500,1002.500,0.500000,1234.6,-1.000000,-1.000000,0,-1.000000\n"
            "7,1,3.000,1003.000,0.500000,1234.6,0.875000,0.250000,1,0.937500\n");
  std::remove(path.c_str());
}

// A worker started again for its rank: the rows of both, one header.
TEST(CurveFile, ASecondCurveOnTheSamePathAddsItsRowsToTheFirstsUnderOneHeader) {
  const std::string path = TempPath("curve_file_test_twice.csv");
  std::remove(path.c_str());
  const absl::Time start = absl::FromUnixSeconds(1000);
  CurveRow row;
  row.step = 3;
  {
    absl::StatusOr<std::unique_ptr<CurveFile>> first = CurveFile::Create(path, start);
    ASSERT_TRUE(first.ok()) << first.status();
    (*first)->Write(row, start + absl::Seconds(1));
  }
  absl::StatusOr<std::unique_ptr<CurveFile>> second =
      CurveFile::Create(path, start + absl::Seconds(5));
  ASSERT_TRUE(second.ok()) << second.status();
  row.step = 9;
  (*second)->Write(row, start + absl::Seconds(6));
  EXPECT_EQ(Read(path),
            "step,epoch,elapsed_s,unix_time,loss,samples_per_sec,test_accuracy,test_loss,"
            "evaluated,test_auc\n"
            "3,0,1.000,1001.000,-1.000000,0.0,-1.000000,-1.000000,0,-1.000000\n"
            "9,0,1.000,1006.000,-1.000000,0.0,-1.000000,-1.000000,0,-1.000000\n");
  std::remove(path.c_str());
}

TEST(CurveFile, APathThatCannotBeWrittenIsNamed) {
  absl::StatusOr<std::unique_ptr<CurveFile>> curve =
      CurveFile::Create("/nonexistent-dir/curve.csv", absl::Now());
  EXPECT_EQ(curve.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(curve.status().message().find("/nonexistent-dir/curve.csv"), std::string::npos);
}

}  // namespace
}  // namespace grps
