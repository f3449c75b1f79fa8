// Fresh folders for a test's files, removed with what is in them when the
// TempFolders that made them goes: a test run leaves nothing in /tmp.
//
//   class ShardTest : public ::testing::Test {
//    protected:
//     TempFolders temp_;
//     const std::string dir_ = temp_.Make("shard_test");  // after temp_
//   };
//
// Each folder is new and empty (mkdtemp under ::testing::TempDir(), which is
// $TEST_TMPDIR under Bazel and /tmp/ otherwise), so tests that run at once,
// in one process or several, never share one.
#ifndef GRPS_TEST_TEMP_FOLDERS_H_
#define GRPS_TEST_TEMP_FOLDERS_H_

#include <gtest/gtest.h>
#include <stdlib.h>

#include <filesystem>
#include <string>
#include <string_view>
#include <system_error>
#include <vector>

namespace grps {

class TempFolders {
 public:
  TempFolders() = default;
  TempFolders(const TempFolders&) = delete;
  TempFolders& operator=(const TempFolders&) = delete;
  ~TempFolders() {
    std::error_code ignored;  // a folder already gone is no failure
    for (const std::string& dir : made_) std::filesystem::remove_all(dir, ignored);
  }

  // A new empty folder whose name starts with `name` (a test fails, and ""
  // is returned, when none can be made).
  std::string Make(std::string_view name) {
    std::string dir = ::testing::TempDir();
    if (!dir.empty() && dir.back() != '/') dir += '/';
    dir.append(name).append(".XXXXXX");
    if (mkdtemp(dir.data()) == nullptr) {
      ADD_FAILURE() << "mkdtemp " << dir << " failed";
      return "";
    }
    made_.push_back(dir);
    return dir;
  }

 private:
  std::vector<std::string> made_;
};

}  // namespace grps

#endif  // GRPS_TEST_TEMP_FOLDERS_H_
