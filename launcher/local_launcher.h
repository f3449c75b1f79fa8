// LocalLauncher: runs a whole job on this machine, on loopback: one
// grps-coordinator, N grps-server and M grps-worker processes, each a child
// of the launcher with its output in the run directory:
//
//   <run_dir>/coordinator.log, server-<i>.log, worker-<i>.log
//   <run_dir>/coordinator.port              the coordinator's bound port
//   <run_dir>/curve-worker-<rank>.csv       each worker's training curve
//
// It shows progress while the job runs, and ends in one of three ways:
//   - every child exited 0: prints the summary (ending with the line
//     "final test accuracy: 0.xxxx"), writes the result JSON, returns 0;
//   - a child failed (non-zero exit, or killed by a signal), the job failed
//     or was stopped (e.g. by `grpsctl stop`), or the timeout passed: says
//     why, prints the tail of the failed child's log, stops the others,
//     returns 1;
//   - interrupted (SIGINT/SIGTERM to the launcher): stops the children,
//     returns 130.
// Stopping means SIGTERM to each child, up to 5 s, then SIGKILL; every child
// is reaped before Run returns, and a launcher that dies takes its children
// with it (see child_process.h).
//
// The first line printed is "run dir: PATH".
#ifndef GRPS_LAUNCHER_LOCAL_LAUNCHER_H_
#define GRPS_LAUNCHER_LOCAL_LAUNCHER_H_

#include <cstdint>
#include <cstdio>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "launcher/child_process.h"
#include "launcher/progress_line.h"
#include "launcher/status_feed.h"
#include "proto/grps.pb.h"

namespace grps {

namespace v1 = ::grps::v1;

inline constexpr int kLaunchOk = 0;
inline constexpr int kLaunchFailed = 1;
inline constexpr int kLaunchInterrupted = 130;

struct LaunchOptions {
  std::string bin_dir;  // holds grps-coordinator, grps-server, grps-worker
  std::string run_dir;  // created if missing
  std::string job_id;
  std::string mode = "sync";
  uint32_t servers = 2;
  uint32_t workers = 2;
  std::string backend = "auto";  // the workers' --backend
  // Further coordinator flags, each passed as --name=value. A setting not
  // listed takes the coordinator's default.
  std::vector<std::pair<std::string, std::string>> job_flags;
  absl::Duration timeout = absl::ZeroDuration();  // zero: none
  std::string result_json;  // where to write the result; empty: nowhere

  // Timings (tests shorten them).
  absl::Duration status_interval = absl::Milliseconds(500);
  absl::Duration port_file_timeout = absl::Seconds(30);
  absl::Duration stop_grace = absl::Seconds(5);
  // After the job ended (or the coordinator exited), how long the other
  // daemons get to exit by themselves before the launcher calls it a hang.
  absl::Duration exit_grace = absl::Seconds(30);
  absl::Duration plain_progress_period = absl::Seconds(5);
};

// What one child runs: its name (also its log's stem), argv, log path.
struct ChildSpec {
  std::string name;
  std::vector<std::string> argv;
  std::string log_path;
};

ChildSpec CoordinatorSpec(const LaunchOptions& options);
// `coordinator` is the coordinator's "host:port".
ChildSpec ServerSpec(const LaunchOptions& options, uint32_t shard,
                     const std::string& coordinator);
ChildSpec WorkerSpec(const LaunchOptions& options, uint32_t rank,
                     const std::string& coordinator);
std::string CoordinatorPortFile(const LaunchOptions& options);

// "runs/<mode>-<YYYYmmdd-HHMMSS>" for a job started at `now` (local time).
std::string DefaultRunDir(const std::string& mode, absl::Time now,
                          absl::TimeZone zone);

// The port in a port file's contents ("40123\n"); InvalidArgument unless it
// is a number in [1, 65535].
absl::StatusOr<int> ParsePort(const std::string& contents);

// The last `max_lines` lines of the file at `path` (at most its last 64 KiB),
// or a note saying it cannot be read.
std::string TailOfFile(const std::string& path, int max_lines);

// How a launch ended, as written to --result_json.
struct RunResult {
  // "ok", "failed", "stopped" (by an operator), "timeout", "interrupted".
  std::string exit = "ok";
  std::string error;        // why, unless ok
  std::string mode;
  uint32_t servers = 0;
  uint32_t workers = 0;
  std::string model;
  std::string optimizer;
  uint64_t steps = 0;  // steps run per worker (mean over the workers)
  std::optional<double> final_test_accuracy;
  std::optional<double> final_test_loss;
  double wall_seconds = 0;
  double samples_per_sec = 0;  // samples over all workers / wall_seconds
  std::string run_dir;
};

// Fills the job's figures from the launch options, then from the newest
// snapshot (`latest`) and the one with the final evaluation, when there are.
RunResult ResultOf(const LaunchOptions& options,
                   const std::optional<v1::JobStatus>& latest,
                   const std::optional<v1::JobStatus>& final_eval,
                   double wall_seconds);

// One JSON object: {"mode", "servers", "workers", "model", "optimizer",
// "steps", "final_test_accuracy", "final_test_loss", "wall_seconds",
// "samples_per_sec", "run_dir", "exit"}, plus "error" unless exit is "ok".
// A figure not known is null.
std::string ResultJson(const RunResult& result);

class LocalLauncher {
 public:
  // Progress and messages go to `out` (a bar redrawn in place when it is a
  // terminal). `interrupted` is polled; when it returns true the launcher
  // stops the job (the binary passes ShutdownRequested from daemon.h).
  LocalLauncher(LaunchOptions options, std::FILE* out,
                std::function<bool()> interrupted);

  // Runs the job to its end; returns kLaunchOk, kLaunchFailed or
  // kLaunchInterrupted. Call once.
  int Run();

 private:
  // Ends the launch: prints why (`exit` other than "ok": `error`, and the
  // log tail of `failed_child` if not null), stops every child still
  // running, prints the summary, writes the result JSON. Returns the exit
  // code for `exit`.
  int Finish(const std::string& exit, const std::string& error,
             const ChildProcess* failed_child);
  absl::Status StartChild(const ChildSpec& spec);
  // Takes the newest snapshots from the feed, if there is one.
  void RefreshStatus();
  // Redraws the bar (terminal) or prints a plain line when one is due.
  void ShowProgress(absl::Time now);
  // Prints a line of its own (ending the progress bar first, if drawn).
  void Say(const std::string& message);

  const LaunchOptions options_;
  std::FILE* const out_;
  const std::function<bool()> interrupted_;
  const bool tty_;
  absl::Time start_;
  bool bar_drawn_ = false;
  std::vector<std::unique_ptr<ChildProcess>> children_;
  std::unique_ptr<StatusFeed> feed_;  // once the coordinator listens
  EtaEstimator eta_;
  uint64_t snapshots_seen_ = 0;
  absl::Time next_plain_line_ = absl::InfinitePast();
  std::optional<v1::JobStatus> latest_;
  std::optional<v1::JobStatus> final_eval_;
};

}  // namespace grps

#endif  // GRPS_LAUNCHER_LOCAL_LAUNCHER_H_
