#include "launcher/child_process.h"

#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "test/temp_folders.h"

namespace grps {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

std::string ReadFile(const std::string& path) {
  std::ifstream f(path);
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}

// /bin/sh -c `script`.
std::unique_ptr<ChildProcess> Shell(const std::string& name, const std::string& script,
                                    const std::string& log) {
  return std::make_unique<ChildProcess>(
      name, std::vector<std::string>{"/bin/sh", "-c", script}, log);
}

class ChildProcessTest : public ::testing::Test {
 protected:
  std::string Log(const std::string& name) { return dir_ + "/" + name + ".log"; }
  TempFolders temp_;
  const std::string dir_ = temp_.Make("child_process_test");
};

TEST_F(ChildProcessTest, ReportsTheExitStatus) {
  auto child = Shell("three", "exit 3", Log("three"));
  ASSERT_TRUE(child->Start().ok());
  ASSERT_TRUE(child->WaitFor(absl::Seconds(10)));
  EXPECT_FALSE(child->succeeded());
  EXPECT_EQ(child->DescribeExit(), "exited with status 3");

  auto ok = Shell("zero", "exit 0", Log("zero"));
  ASSERT_TRUE(ok->Start().ok());
  ASSERT_TRUE(ok->WaitFor(absl::Seconds(10)));
  EXPECT_TRUE(ok->succeeded());
}

TEST_F(ChildProcessTest, ReportsDeathBySignal) {
  auto child = Shell("killed", "kill -KILL $$", Log("killed"));
  ASSERT_TRUE(child->Start().ok());
  ASSERT_TRUE(child->WaitFor(absl::Seconds(10)));
  EXPECT_FALSE(child->succeeded());
  EXPECT_THAT(child->DescribeExit(), HasSubstr("killed by signal 9"));
}

TEST_F(ChildProcessTest, WritesStdoutAndStderrToAFreshLogAndReadsNothing) {
  {
    std::ofstream old(Log("talk"));
    old << "left over from an earlier run\n";
  }
  auto child = Shell("talk", "echo to-stdout; echo to-stderr >&2; cat; echo done",
                     Log("talk"));
  ASSERT_TRUE(child->Start().ok());
  ASSERT_TRUE(child->WaitFor(absl::Seconds(10)));  // cat sees EOF at once
  EXPECT_TRUE(child->succeeded());
  EXPECT_EQ(ReadFile(Log("talk")), "to-stdout\nto-stderr\ndone\n");
}

TEST_F(ChildProcessTest, AProgramThatCannotRunFailsToStartNamingIt) {
  ChildProcess child("ghost", {dir_ + "/no-such-program"}, Log("ghost"));
  absl::Status s = child.Start();
  ASSERT_FALSE(s.ok());
  EXPECT_THAT(std::string(s.message()), HasSubstr("no-such-program"));
  EXPECT_FALSE(child.running());
}

TEST_F(ChildProcessTest, RunsInItsOwnProcessGroup) {
  auto child = Shell("group", "exec sleep 30", Log("group"));
  ASSERT_TRUE(child->Start().ok());
  EXPECT_EQ(getpgid(child->pid()), child->pid());
  EXPECT_NE(getpgid(child->pid()), getpgrp());
}

TEST_F(ChildProcessTest, DestroyingARunningChildKillsAndReapsIt) {
  pid_t pid;
  {
    auto child = Shell("doomed", "exec sleep 30", Log("doomed"));
    ASSERT_TRUE(child->Start().ok());
    pid = child->pid();
  }
  EXPECT_EQ(kill(pid, 0), -1);  // gone, not a zombie
  EXPECT_EQ(errno, ESRCH);
}

TEST_F(ChildProcessTest, StopChildrenTermsAllThenKillsThoseThatIgnoreTerm) {
  std::vector<std::unique_ptr<ChildProcess>> children;
  children.push_back(Shell("polite", "exec sleep 30", Log("polite")));
  children.push_back(Shell("stubborn", "trap '' TERM; exec sleep 30", Log("stubborn")));
  children.push_back(Shell("done", "exit 0", Log("done")));
  for (auto& c : children) ASSERT_TRUE(c->Start().ok());
  ASSERT_TRUE(children[2]->WaitFor(absl::Seconds(10)));
  absl::SleepFor(absl::Milliseconds(200));  // let the trap be installed

  absl::Time start = absl::Now();
  std::vector<std::string> killed = StopChildren(children, absl::Milliseconds(500));
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
  EXPECT_THAT(killed, ElementsAre("stubborn"));
  for (auto& c : children) EXPECT_TRUE(c->exited()) << c->name();
  EXPECT_THAT(children[0]->DescribeExit(), HasSubstr("signal 15"));
  EXPECT_THAT(children[1]->DescribeExit(), HasSubstr("signal 9"));
  EXPECT_TRUE(children[2]->succeeded());
}

TEST_F(ChildProcessTest, ChildGetsSigtermWhenItsParentDies) {
  // Orphans are re-parented to this process, so it can reap the grandchild.
  ASSERT_EQ(prctl(PR_SET_CHILD_SUBREAPER, 1), 0);
  int pipe_fds[2];
  ASSERT_EQ(pipe(pipe_fds), 0);
  pid_t launcher = fork();
  ASSERT_GE(launcher, 0);
  if (launcher == 0) {
    // A launcher that starts a child and dies without cleaning up.
    auto* child = Shell("orphan", "exec sleep 30", Log("orphan")).release();
    if (!child->Start().ok()) _exit(1);
    pid_t pid = child->pid();
    (void)!write(pipe_fds[1], &pid, sizeof(pid));
    _exit(0);
  }
  close(pipe_fds[1]);
  pid_t orphan = -1;
  ASSERT_EQ(read(pipe_fds[0], &orphan, sizeof(orphan)),
            static_cast<ssize_t>(sizeof(orphan)));
  close(pipe_fds[0]);
  int status = 0;
  ASSERT_EQ(waitpid(launcher, &status, 0), launcher);

  absl::Time deadline = absl::Now() + absl::Seconds(10);
  pid_t reaped = 0;
  while ((reaped = waitpid(orphan, &status, WNOHANG)) == 0 && absl::Now() < deadline)
    absl::SleepFor(absl::Milliseconds(10));
  prctl(PR_SET_CHILD_SUBREAPER, 0);
  ASSERT_EQ(reaped, orphan) << "the child outlived its launcher";
  ASSERT_TRUE(WIFSIGNALED(status));
  EXPECT_EQ(WTERMSIG(status), SIGTERM);
}

}  // namespace
}  // namespace grps
