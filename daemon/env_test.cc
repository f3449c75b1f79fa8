#include "daemon/env.h"

#include <string>

#include "daemon/testing/fault_injection_env.h"
#include "gtest/gtest.h"
#include "test/temp_folders.h"

namespace grps {
namespace {

class EnvTest : public ::testing::Test {
 protected:
  std::vector<std::string> Entries() { return *Env::Default()->ListDir(dir_); }
  TempFolders temp_;
  const std::string dir_ = temp_.Make("env_test");
  const std::string path_ = JoinPath(dir_, "file");
};

TEST_F(EnvTest, AtomicWriteReplacesTheFileAndLeavesNoTemporary) {
  ASSERT_TRUE(WriteFileAtomically(Env::Default(), path_, "old").ok());
  ASSERT_TRUE(WriteFileAtomically(Env::Default(), path_, "new contents").ok());
  EXPECT_EQ(*Env::Default()->ReadFile(path_), "new contents");
  EXPECT_EQ(Entries(), std::vector<std::string>{"file"});
}

TEST_F(EnvTest, FailedWriteLeavesTheOldFileAndNoTemporary) {
  ASSERT_TRUE(WriteFileAtomically(Env::Default(), path_, "old").ok());
  FaultInjectionEnv env(Env::Default());
  env.FailWritesAfter(2);
  absl::Status s = WriteFileAtomically(&env, path_, "new contents");
  EXPECT_TRUE(absl::IsUnavailable(s)) << s;
  EXPECT_NE(s.message().find(path_), std::string::npos) << s;
  EXPECT_EQ(*Env::Default()->ReadFile(path_), "old");
  EXPECT_EQ(Entries(), std::vector<std::string>{"file"});
}

TEST_F(EnvTest, FailedFsyncLeavesTheOldFileAndNoTemporary) {
  ASSERT_TRUE(WriteFileAtomically(Env::Default(), path_, "old").ok());
  FaultInjectionEnv env(Env::Default());
  env.FailSyncs(true);
  absl::Status s = WriteFileAtomically(&env, path_, "new contents");
  EXPECT_TRUE(absl::IsUnavailable(s)) << s;
  EXPECT_NE(s.message().find("fsync"), std::string::npos) << s;
  EXPECT_EQ(*Env::Default()->ReadFile(path_), "old");
  EXPECT_EQ(Entries(), std::vector<std::string>{"file"});
}

TEST_F(EnvTest, FailedRenameLeavesTheOldFileAndNoTemporary) {
  ASSERT_TRUE(WriteFileAtomically(Env::Default(), path_, "old").ok());
  FaultInjectionEnv env(Env::Default());
  env.FailRenames(true);
  EXPECT_FALSE(WriteFileAtomically(&env, path_, "new contents").ok());
  EXPECT_EQ(*Env::Default()->ReadFile(path_), "old");
  EXPECT_EQ(Entries(), std::vector<std::string>{"file"});
}

TEST_F(EnvTest, AnAtomicWriteIsSyncedBeforeItIsVisible) {
  FaultInjectionEnv env(Env::Default());
  ASSERT_TRUE(WriteFileAtomically(&env, path_, "durable").ok());
  EXPECT_EQ(env.syncs(), 1);
  // A crash now loses nothing: every byte was synced before the rename.
  ASSERT_TRUE(env.DropUnsyncedData().ok());
  EXPECT_EQ(*Env::Default()->ReadFile(path_), "durable");
}

TEST_F(EnvTest, DropUnsyncedDataCutsAFileBackToItsLastSync) {
  FaultInjectionEnv env(Env::Default());
  auto file = env.NewWritableFile(path_);
  ASSERT_TRUE(file.ok());
  ASSERT_TRUE((*file)->Append("synced|").ok());
  ASSERT_TRUE((*file)->Sync().ok());
  ASSERT_TRUE((*file)->Append("lost").ok());
  ASSERT_TRUE((*file)->Close().ok());
  ASSERT_TRUE(env.DropUnsyncedData().ok());
  EXPECT_EQ(*Env::Default()->ReadFile(path_), "synced|");
}

TEST_F(EnvTest, MissingFileIsNotFoundAndCreateDirMakesParents) {
  EXPECT_TRUE(absl::IsNotFound(Env::Default()->ReadFile(JoinPath(dir_, "nope")).status()));
  const std::string deep = JoinPath(dir_, "a/b/c");
  ASSERT_TRUE(Env::Default()->CreateDir(deep).ok());
  ASSERT_TRUE(Env::Default()->CreateDir(deep).ok());
  EXPECT_TRUE(Env::Default()->FileExists(deep));
}

TEST_F(EnvTest, AWritableDirIsMadeAndLeftEmpty) {
  const std::string deep = JoinPath(dir_, "a/b");
  ASSERT_TRUE(CreateWritableDir(Env::Default(), deep).ok());
  EXPECT_TRUE(Env::Default()->ListDir(deep)->empty());
}

TEST_F(EnvTest, ADirThatCannotBeMadeOrWrittenIsRefused) {
  ASSERT_TRUE(WriteFileAtomically(Env::Default(), path_, "a file, not a folder").ok());
  EXPECT_FALSE(CreateWritableDir(Env::Default(), JoinPath(path_, "sub")).ok());
  FaultInjectionEnv env(Env::Default());
  env.FailWritesAfter(0);
  const std::string dir = JoinPath(dir_, "full");
  EXPECT_FALSE(CreateWritableDir(&env, dir).ok());
  EXPECT_TRUE(Env::Default()->ListDir(dir)->empty());  // the probe is gone
}

}  // namespace
}  // namespace grps
