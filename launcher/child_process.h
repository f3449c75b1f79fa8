// ChildProcess: one program the launcher runs, from fork+exec to its reaping.
//
// The child reads /dev/null, writes stdout and stderr to its log file
// (truncated at start), runs in its own process group so that a terminal's
// Ctrl-C reaches only the launcher (which then stops its children in order),
// and is sent SIGTERM by the kernel when the thread that started it exits
// (PR_SET_PDEATHSIG), so it cannot outlive a launcher that dies, even by
// SIGKILL. Signals are sent to the child's pid only, never to a group.
//
// Thread safety: none. Start, and destroy, every ChildProcess on one thread
// that lives as long as the children should (the launcher's main thread):
// PR_SET_PDEATHSIG fires when the starting *thread* exits.
#ifndef GRPS_LAUNCHER_CHILD_PROCESS_H_
#define GRPS_LAUNCHER_CHILD_PROCESS_H_

#include <sys/types.h>

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"

namespace grps {

class ChildProcess {
 public:
  // Changes to the launcher's environment for this child: (name, value)
  // sets the variable, (name, "") removes it. Secrets (tokens) go here
  // rather than in argv, which every local user can read in /proc.
  using Environment = std::vector<std::pair<std::string, std::string>>;

  // `argv[0]` is the program's path (not searched in PATH).
  ChildProcess(std::string name, std::vector<std::string> argv,
               std::string log_path, Environment environment = {});
  // A child still running is killed (SIGKILL) and reaped: no zombie, no
  // orphan.
  ~ChildProcess();

  ChildProcess(const ChildProcess&) = delete;
  ChildProcess& operator=(const ChildProcess&) = delete;

  // Starts the program. Fails, with nothing left running, when the log file
  // cannot be created or the program cannot be executed (the message names
  // it). Call at most once.
  absl::Status Start();

  // Reaps the child if it has exited; never blocks. True once it has exited.
  bool Poll();
  // Polls until the child exits or `timeout` passes; true if it exited.
  bool WaitFor(absl::Duration timeout);
  // Sends `signal` to the child if it is running; otherwise does nothing.
  void Signal(int signal);

  bool started() const { return pid_ > 0; }
  bool running() const { return pid_ > 0 && !exited_; }
  bool exited() const { return exited_; }
  // exited() and the program returned 0.
  bool succeeded() const;
  // exited() because a signal killed it (a crash or kill -9, not an exit).
  bool killed_by_signal() const;
  // "exited with status 3", "killed by signal 9 (Killed)", or "running".
  std::string DescribeExit() const;

  pid_t pid() const { return pid_; }
  const std::string& name() const { return name_; }
  const std::vector<std::string>& argv() const { return argv_; }
  const std::string& log_path() const { return log_path_; }

 private:
  const std::string name_;
  const std::vector<std::string> argv_;
  const std::string log_path_;
  const Environment environment_;
  pid_t pid_ = -1;
  bool exited_ = false;
  int wait_status_ = 0;  // from waitpid, valid once exited_
};

// Stops every running child: SIGTERM to each, up to `grace` for them to
// exit, then SIGKILL to the rest; returns once all are reaped. Returns the
// names of the children that needed SIGKILL.
std::vector<std::string> StopChildren(
    const std::vector<std::unique_ptr<ChildProcess>>& children,
    absl::Duration grace);

}  // namespace grps

#endif  // GRPS_LAUNCHER_CHILD_PROCESS_H_
