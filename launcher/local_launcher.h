// LocalLauncher: runs a whole job on this machine, on loopback: one
// grps-coordinator, N grps-server and M grps-worker processes, each a child
// of the launcher with its output in the run directory:
//
//   <run_dir>/coordinator.log, server-<i>.log, worker-<i>.log
//   <run_dir>/coordinator.port              the coordinator's bound port
//   <run_dir>/curve-worker-<rank>.csv       each worker's training curve
//
// With LaunchOptions::entry the M workers are copies of the user's own
// command instead (a PyTorch script using grps.torch; see WorkerSpec), and
// everything below holds for them the same way; their curves are what the
// program reports (gt.report), none if it reports nothing.
//
// A server or coordinator killed by a signal (a crash, kill -9) is started
// again, as a StatefulSet or a Deployment would, while restarts are left
// (LaunchOptions::restart_servers, restart_coordinator): a server with the
// same --shard (it reloads the job's newest checkpoint; see
// docs/durability.md), the coordinator on the same port with its state in
// the run directory (it takes the job back). Their logs are
// server-<shard>.restart-<n>.log and coordinator.restart-<n>.log. One that
// exits with a non-zero status instead (it saw the job fail, or could not
// start) fails the launch.
//
// A worker that dies (non-zero exit, or killed by a signal) while the job
// runs is not a job failure: the coordinator declares it dead after the
// heartbeat timeout and the job goes on with the others. (Before the job
// runs, the coordinator waits for every worker to register, so a worker that
// dies then, with no restart left, fails the launch; so does one that exits
// 0 then, having trained nothing.) The launcher says so on a line of its
// own and, while LaunchOptions::restart_workers allows, starts the worker
// again with the same rank (it rejoins through the coordinator; its log is
// worker-<rank>.restart-<n>.log). LaunchOptions::strict restores the rule
// that any child's failure fails the launch, and fails a job that completed
// with a warning (an elastic job's epoch not trained exactly once).
//
// It shows progress while the job runs, and ends in one of three ways:
//   - the job completed and every child still there exited 0: prints the
//     summary (ending with the line "final test accuracy: 0.xxxx"), writes
//     the result JSON, returns 0;
//   - the coordinator or a server failed (non-zero exit, or killed by a
//     signal), every worker died with no restart left, the job failed or was
//     stopped (e.g. by `grpsctl stop`), or the timeout passed: says why,
//     prints the tail of the failed child's log, stops the others, returns 1;
//   - interrupted (SIGINT/SIGTERM to the launcher), even while it still
//     starts them: stops the children, returns 130.
// Stopping means SIGTERM to each child, up to 5 s, then SIGKILL; every child
// is reaped before Run returns, and a launcher that dies takes its children
// with it (see child_process.h).
//
// Whichever way it ends, if gnuplot is on PATH it plots the workers' curves
// into <run_dir>/curves.svg (script: curves.gp; see CurvesGnuplotScript);
// entry workers that wrote none are passed over in silence.
//
// The first line printed is "run dir: PATH".
#ifndef GRPS_LAUNCHER_LOCAL_LAUNCHER_H_
#define GRPS_LAUNCHER_LOCAL_LAUNCHER_H_

#include <cstdint>
#include <cstdio>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "launcher/child_process.h"
#include "launcher/child_specs.h"
#include "launcher/curves_plot.h"
#include "launcher/launch_options.h"
#include "launcher/progress_line.h"
#include "launcher/run_result.h"
#include "launcher/status_feed.h"
#include "proto/grps.pb.h"

namespace grps {

inline constexpr int kLaunchOk = 0;
inline constexpr int kLaunchFailed = 1;
inline constexpr int kLaunchInterrupted = 130;

// "runs/<mode>-<YYYYmmdd-HHMMSS>" for a job started at `now` (local time).
std::string DefaultRunDir(const std::string& mode, absl::Time now,
                          absl::TimeZone zone);

// The port in a port file's contents ("40123\n"); InvalidArgument unless it
// is a number in [1, 65535].
absl::StatusOr<int> ParsePort(const std::string& contents);

// The last `max_lines` lines of the file at `path` (at most its last 64 KiB),
// or a note saying it cannot be read.
std::string TailOfFile(const std::string& path, int max_lines);

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
  enum class Role { kCoordinator, kServer, kWorker };
  // The steps of Run. Each returns Finish's exit code when the launch ends
  // in it, nothing when it goes on.
  std::optional<int> PrepareRunDir();
  std::optional<int> StartCoordinator();  // sets coordinator_address_
  std::optional<int> StartMembers();
  std::optional<int> Supervise();  // nothing: every child exited 0
  // One look at every child: deals with each death (restart, or the end
  // of the launch); `all_exited` says whether none runs any more.
  std::optional<int> HandleExitedChildren(bool* all_exited);
  // Prints each daemon's /metrics address, then writes them, as Prometheus
  // file_sd targets, to <run_dir>/prometheus-targets.json.
  void SayWhereMetricsAre();
  // Starts `spec`'s program as a child in `role` (`index`: shard or rank);
  // it becomes the newest child of that role and index.
  absl::Status StartChild(const ChildSpec& spec, Role role, uint32_t index = 0);
  // A server or the coordinator was killed by a signal (not strict):
  // restarts it if restarts are left. An error fails the launch.
  absl::Status OnDaemonCrashed(size_t child_index);
  // A server exited 0 while the job runs (a re-sharding retired its shard):
  // starts it again as a standby when the launch has standbys.
  absl::Status OnServerRetired(size_t child_index);
  // Once `now` is past stop_standbys_at_: every server started as a
  // standby that still runs is asked to leave (SIGTERM; it exits 0). One
  // that a re-sharding took in has heard the end and exited by then.
  void StopStandbys(absl::Time now);
  // The coordinator that runs now (the newest one started).
  const ChildProcess& coordinator() const { return *children_[coordinator_child_]; }
  // A worker child has exited non-zero or by a signal (not strict): says so,
  // and restarts it if restarts are left. Returns an error (the launch
  // fails) if the restart could not be started, or if the worker died with
  // no restart left before the job started running (JobStartedWhenItExited:
  // until that is known, the worker is left for the next look).
  absl::Status OnWorkerDied(size_t child_index);
  // A worker child exited 0. Once the job started, it finished its part.
  // Before, it quit without training, and the coordinator would wait for
  // it for good: an error (the launch fails; no restart, which would quit
  // the same way). Which of the two: JobStartedWhenItExited.
  absl::Status OnWorkerExited0(size_t child_index);
  // The feed has shown the job past WAITING: running, or ended.
  bool JobStarted() const;
  // Whether the job had started when worker child `child_index` exited, as
  // only a snapshot built after the exit tells (the feed may not have shown
  // a job that runs yet); nullopt until the feed brought one.
  std::optional<bool> JobStartedWhenItExited(size_t child_index);
  // When no worker is running or has finished (every rank's newest child
  // died), the last of them; otherwise null.
  const ChildProcess* EveryWorkerDead() const;
  // Draws <run_dir>/curves.svg with gnuplot, if there is one; says where the
  // plot is, or why there is none. Never fails the launch.
  void PlotCurves();
  // Takes the newest snapshots from the feed, if there is one; once the
  // coordinator has exited, the status the job ended with from its state
  // file when the feed did not hear it (EndFromStateFile).
  void RefreshStatus();
  // The status the job ended with, from the coordinator's state file
  // (CoordinatorState.final_status) written since this launch started;
  // nullopt when there is none (a coordinator killed, or no file).
  std::optional<v1::JobStatus> EndFromStateFile() const;
  // Redraws the bar (terminal) or prints a plain line when one is due.
  void ShowProgress(absl::Time now);
  // Prints a line of its own (ending the progress bar first, if drawn).
  void Say(const std::string& message);

  const LaunchOptions options_;
  std::FILE* const out_;
  const std::function<bool()> interrupted_;
  const bool tty_;
  absl::Time start_;
  std::string coordinator_address_;
  // Parallel to children_: the role and index (shard, rank) of each child,
  // and whether its death was already dealt with.
  std::vector<Role> child_role_;
  std::vector<uint32_t> child_index_;
  std::vector<bool> death_handled_;
  size_t coordinator_child_ = 0;
  int coordinator_port_ = 0;
  uint32_t coordinator_restarts_ = 0;
  std::vector<uint32_t> server_restarts_;  // by shard
  uint32_t servers_restarted_ = 0;
  // Supervise saw the job end (or its coordinator exit): no standby is
  // started again after that.
  bool job_ended_ = false;
  // Children started as standbys (StopStandbys), and when to stop them.
  std::vector<size_t> standbys_;
  absl::Time stop_standbys_at_ = absl::InfiniteFuture();
  // By rank: the index in children_ of the rank's newest child, and how many
  // times it was restarted. A dead child that was replaced stays in
  // children_, exited.
  std::vector<size_t> worker_child_;
  std::vector<uint32_t> worker_restarts_;
  // Workers (by index in children_) that exited while the job had not
  // started as far as the feed said, each with the feed's snapshot count
  // then (JobStartedWhenItExited).
  std::map<size_t, uint64_t> exited_at_snapshot_;
  uint32_t workers_died_ = 0;
  uint32_t workers_restarted_ = 0;
  bool bar_drawn_ = false;
  std::vector<std::unique_ptr<ChildProcess>> children_;
  std::unique_ptr<StatusFeed> feed_;  // once the coordinator listens
  EtaEstimator eta_;
  uint64_t snapshots_seen_ = 0;
  absl::Time next_plain_line_ = absl::InfinitePast();
  std::optional<v1::JobStatus> latest_;
  std::optional<v1::JobStatus> final_eval_;
  bool end_from_state_file_ = false;  // latest_ is EndFromStateFile's
};

}  // namespace grps

#endif  // GRPS_LAUNCHER_LOCAL_LAUNCHER_H_
