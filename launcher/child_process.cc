#include "launcher/child_process.h"

#include <fcntl.h>
#include <signal.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"

namespace grps {
namespace {

constexpr absl::Duration kPollPeriod = absl::Milliseconds(10);

// Runs in the forked child: only async-signal-safe calls until exec (the
// parent may have other threads, e.g. gRPC's). Never returns; on failure
// writes errno to `error_fd` for the parent and exits 127.
[[noreturn]] void ExecChild(char* const* argv, char* const* envp, int log_fd,
                            int null_fd, int error_fd, pid_t parent) {
  setpgid(0, 0);
  // SIGTERM when the launcher's thread exits; if it already has, stop now.
  prctl(PR_SET_PDEATHSIG, SIGTERM);
  if (getppid() != parent) _exit(127);
  sigset_t none;
  sigemptyset(&none);
  sigprocmask(SIG_SETMASK, &none, nullptr);
  // Handlers are reset by exec; ignored signals are not.
  signal(SIGPIPE, SIG_DFL);
  signal(SIGINT, SIG_DFL);
  signal(SIGTERM, SIG_DFL);
  if (dup2(null_fd, STDIN_FILENO) < 0 || dup2(log_fd, STDOUT_FILENO) < 0 ||
      dup2(log_fd, STDERR_FILENO) < 0) {
    int e = errno;
    (void)!write(error_fd, &e, sizeof(e));
    _exit(127);
  }
  execve(argv[0], argv, envp);
  int e = errno;
  (void)!write(error_fd, &e, sizeof(e));
  _exit(127);
}

}  // namespace

ChildProcess::ChildProcess(std::string name, std::vector<std::string> argv,
                           std::string log_path, Environment environment)
    : name_(std::move(name)),
      argv_(std::move(argv)),
      log_path_(std::move(log_path)),
      environment_(std::move(environment)) {}

ChildProcess::~ChildProcess() {
  if (running()) {
    kill(pid_, SIGKILL);
    while (waitpid(pid_, &wait_status_, 0) < 0 && errno == EINTR) {
    }
  }
}

absl::Status ChildProcess::Start() {
  if (started()) return absl::FailedPreconditionError(name_ + " already started");
  if (argv_.empty()) return absl::InvalidArgumentError(name_ + ": empty argv");
  int log_fd = open(log_path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (log_fd < 0)
    return absl::UnavailableError(
        absl::StrCat("cannot create log file ", log_path_, ": ", strerror(errno)));
  int null_fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
  // The child reports a failed exec through this pipe; a successful exec
  // closes it (O_CLOEXEC) with nothing written.
  int error_pipe[2];
  if (null_fd < 0 || pipe2(error_pipe, O_CLOEXEC) < 0) {
    absl::Status s = absl::InternalError(
        absl::StrCat("cannot set up ", name_, ": ", strerror(errno)));
    close(log_fd);
    if (null_fd >= 0) close(null_fd);
    return s;
  }
  std::vector<char*> argv;
  for (const std::string& a : argv_) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  // The child's environment, built here: the forked child may not allocate.
  std::vector<std::string> env_strings;
  for (char** e = environ; *e != nullptr; ++e) {
    const absl::string_view entry(*e);
    const absl::string_view name = entry.substr(0, entry.find('='));
    bool replaced = false;
    for (const auto& [n, v] : environment_) replaced = replaced || n == name;
    if (!replaced) env_strings.emplace_back(entry);
  }
  for (const auto& [name, value] : environment_)
    if (!value.empty()) env_strings.push_back(absl::StrCat(name, "=", value));
  std::vector<char*> envp;
  for (std::string& e : env_strings) envp.push_back(e.data());
  envp.push_back(nullptr);

  const pid_t parent = getpid();
  pid_t pid = fork();
  if (pid == 0)
    ExecChild(argv.data(), envp.data(), log_fd, null_fd, error_pipe[1], parent);
  int fork_errno = errno;
  close(log_fd);
  close(null_fd);
  close(error_pipe[1]);
  if (pid < 0) {
    close(error_pipe[0]);
    return absl::ResourceExhaustedError(
        absl::StrCat("cannot fork for ", name_, ": ", strerror(fork_errno)));
  }
  pid_ = pid;
  // Also here, so the group exists before anyone could signal it; fails
  // harmlessly (EACCES) once the child has exec'd.
  setpgid(pid, pid);

  int child_errno = 0;
  ssize_t n;
  while ((n = read(error_pipe[0], &child_errno, sizeof(child_errno))) < 0 &&
         errno == EINTR) {
  }
  close(error_pipe[0]);
  if (n > 0) {
    while (waitpid(pid_, &wait_status_, 0) < 0 && errno == EINTR) {
    }
    exited_ = true;
    return absl::FailedPreconditionError(absl::StrCat(
        "cannot execute ", argv_[0], " (", name_, "): ", strerror(child_errno)));
  }
  return absl::OkStatus();
}

bool ChildProcess::Poll() {
  if (!running()) return exited_;
  pid_t r;
  while ((r = waitpid(pid_, &wait_status_, WNOHANG)) < 0 && errno == EINTR) {
  }
  if (r == pid_) exited_ = true;
  return exited_;
}

bool ChildProcess::WaitFor(absl::Duration timeout) {
  absl::Time deadline = absl::Now() + timeout;
  while (!Poll()) {
    if (absl::Now() >= deadline) return false;
    absl::SleepFor(kPollPeriod);
  }
  return true;
}

void ChildProcess::Signal(int signal) {
  if (running()) kill(pid_, signal);
}

bool ChildProcess::succeeded() const {
  return exited_ && WIFEXITED(wait_status_) && WEXITSTATUS(wait_status_) == 0;
}

bool ChildProcess::killed_by_signal() const {
  return exited_ && WIFSIGNALED(wait_status_);
}

std::string ChildProcess::DescribeExit() const {
  if (!exited_) return started() ? "running" : "not started";
  if (WIFEXITED(wait_status_))
    return absl::StrCat("exited with status ", WEXITSTATUS(wait_status_));
  if (WIFSIGNALED(wait_status_)) {
    int sig = WTERMSIG(wait_status_);
    return absl::StrCat("killed by signal ", sig, " (", strsignal(sig), ")");
  }
  return absl::StrCat("ended with wait status ", wait_status_);
}

std::vector<std::string> StopChildren(
    const std::vector<std::unique_ptr<ChildProcess>>& children,
    absl::Duration grace) {
  for (const auto& child : children) child->Signal(SIGTERM);
  absl::Time deadline = absl::Now() + grace;
  for (const auto& child : children)
    if (child->running()) child->WaitFor(std::max(deadline - absl::Now(), absl::ZeroDuration()));
  // Every SIGKILL first, then the reaping: the kernel tears them down
  // together, not one after the other.
  std::vector<std::string> killed;
  for (const auto& child : children) {
    if (!child->running()) continue;
    killed.push_back(child->name());
    child->Signal(SIGKILL);
  }
  for (const auto& child : children) child->WaitFor(absl::InfiniteDuration());
  return killed;
}

}  // namespace grps
