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
// dies then, with no restart left, fails the launch.) The launcher says so on a line of its
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
//   - interrupted (SIGINT/SIGTERM to the launcher): stops the children,
//     returns 130.
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
  // Servers started for the shards past `servers` (a job with
  // --max_servers): standbys that `grpsctl scale --servers` takes in. One
  // that a re-sharding retires (it exits 0) is started again as a standby.
  // They serve no metrics.
  uint32_t standby_servers = 0;
  std::string backend = "auto";  // the workers' --backend
  // With a value, each worker runs this command (`/bin/sh -c "exec ENTRY"`)
  // instead of grps-worker: see WorkerSpec. The job's model is then the
  // workers' own (the coordinator's --model=user; the caller passes it in
  // job_flags).
  std::string entry;
  // Further coordinator flags, each passed as --name=value. A setting not
  // listed takes the coordinator's default.
  std::vector<std::pair<std::string, std::string>> job_flags;
  absl::Duration timeout = absl::ZeroDuration();  // zero: none
  std::string result_json;  // where to write the result; empty: nowhere
  // Any child's failure fails the launch, a worker's included, and so does
  // a job that completed with a warning (JobStatus.warnings).
  bool strict = false;
  // Dead workers restarted, in total over all ranks (ignored when strict).
  uint32_t restart_workers = 0;
  // Crashed servers (over all shards) and coordinators restarted, in total
  // (ignored when strict).
  uint32_t restart_servers = 10;
  uint32_t restart_coordinator = 3;
  // Straggler injection: the worker of this rank gets --straggle_factor
  // and/or --straggle_ms (those set); the others get neither.
  std::optional<uint32_t> straggler_rank;
  std::optional<double> straggle_factor;  // sleeps (F - 1) x its step time
  std::optional<uint32_t> straggle_ms;    // sleeps this long every step
  // grps-worker writes <run_dir>/examples-worker-<rank>.log (--examples_log).
  bool examples_logs = false;
  // The job's admin and worker tokens (see daemon/security.h), handed to
  // the daemons in GRPS_TOKEN / GRPS_WORKER_TOKEN (workers get only theirs);
  // empty: authentication off. `tls_flags` (--tls_cert=..., --tls_ca=...) go
  // to every daemon as they are.
  std::string token;
  std::string worker_token;
  std::vector<std::string> tls_flags;
  // With a value, every daemon serves Prometheus metrics on `host`: the
  // coordinator at `first_port`, server s at first_port + 1 + s, worker r
  // at first_port + 1 + servers + r (a restarted daemon on its
  // predecessor's port); entry workers serve none. See MetricsTargets.
  struct MetricsPorts {
    std::string host;
    int first_port = 0;
  };
  std::optional<MetricsPorts> metrics;
  // Where to look for gnuplot (a PATH-style list); empty: no plot.
  std::string plot_search_path;
  absl::Duration plot_timeout = absl::Seconds(20);

  // Timings (tests shorten them).
  absl::Duration status_interval = absl::Milliseconds(500);
  absl::Duration port_file_timeout = absl::Seconds(30);
  absl::Duration stop_grace = absl::Seconds(5);
  // After the job ended (or the coordinator exited), how long the other
  // daemons get to exit by themselves before the launcher calls it a hang.
  absl::Duration exit_grace = absl::Seconds(30);
  absl::Duration plain_progress_period = absl::Seconds(5);
};

// What one child runs: its name (also its log's stem), argv, log path, and
// the changes to its environment (see ChildProcess).
struct ChildSpec {
  std::string name;
  std::vector<std::string> argv;
  std::string log_path;
  ChildProcess::Environment environment;
};

// `port` 0: any free port (the first start); otherwise that port (a
// restart, which must be found where the daemons look for it).
ChildSpec CoordinatorSpec(const LaunchOptions& options, int port = 0);
// `coordinator` is the coordinator's "host:port".
ChildSpec ServerSpec(const LaunchOptions& options, uint32_t shard,
                     const std::string& coordinator);
// The worker of `rank`: grps-worker; with `options.entry`, the user's
// command as `/bin/sh -c "exec ENTRY"` (the shell splits and quotes it as a
// terminal would; exec leaves the program itself as the child, to be
// signalled and reaped) with the job in its environment:
//   GRPS_COORDINATOR, GRPS_RANK, GRPS_WORKERS, GRPS_JOB_ID, GRPS_RUN_DIR;
//   GRPS_LOCAL_RANK = GRPS_RANK and GRPS_LOCAL_SIZE = GRPS_WORKERS (every
//     worker runs on this host);
//   torchrun's RANK, WORLD_SIZE, LOCAL_RANK and LOCAL_WORLD_SIZE, the same
//     values, replacing any the launcher has;
//   GRPS_WORKER_TOKEN as grps-worker gets it (GRPS_TOKEN removed);
//   GRPS_TLS_CERT, _KEY, _CA, _CLIENT_AUTH, _SERVER_NAME: the TLS flags
//     daemons get, each one the launch does not set removed;
//   PYTHONPATH led by the build tree's python folder (<bin_dir>/../python,
//     when it holds grps/__init__.py), so `import grps.torch` works from
//     the build tree.
//   GRPS_CURVE_CSV: <run_dir>/curve-worker-<rank>.csv, the curve grps.torch
//     writes (a row per gt.report());
//   GRPS_STRAGGLE_FACTOR, GRPS_STRAGGLE_MS for the straggler rank: grps.torch
//     sleeps after each step as grps-worker's --straggle_* do.
// An entry worker serves no metrics.
// Reads the launcher's PYTHONPATH and the file system.
ChildSpec WorkerSpec(const LaunchOptions& options, uint32_t rank,
                     const std::string& coordinator);
std::string CoordinatorPortFile(const LaunchOptions& options);

// One daemon's metrics endpoint: "coordinator", "server-S" or "worker-R", and
// its host:port.
struct MetricsTarget {
  std::string daemon;
  std::string address;
};
// Every daemon's endpoint under `options.metrics` (none without), the
// coordinator first, then the servers and the workers in order (no workers
// with `options.entry`: the user's program serves no metrics).
std::vector<MetricsTarget> MetricsTargets(const LaunchOptions& options);
// The targets as a Prometheus file_sd file: one group per daemon, labelled
// grps_job (the job id) and daemon.
std::string PrometheusTargetsJson(const std::vector<MetricsTarget>& targets,
                                  const std::string& job_id);

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
  // Steps run per worker: the mean over the workers; for an --entry job the
  // job's step as the shards count it (EntryProgressOf).
  uint64_t steps = 0;
  std::optional<double> final_test_accuracy;
  std::optional<double> final_test_loss;
  double wall_seconds = 0;
  double samples_per_sec = 0;  // samples over all workers / wall_seconds
  std::string run_dir;
  double started_unix = 0;  // the launch's start, seconds since the epoch
  uint32_t workers_died = 0;       // worker children that failed
  uint32_t workers_restarted = 0;  // of those, started again
  // From the newest status: workers that left on purpose, ranks that joined
  // the running job (JobStatus.worker_leaves, worker_joins).
  uint64_t worker_leaves = 0;
  uint64_t worker_joins = 0;
  // An elastic job's example ledger (JobStatus.data), from the newest status.
  v1::DataProgress data;
  // What the job that completed went wrong in without failing
  // (JobStatus.warnings): with --strict, such a job fails.
  std::vector<std::string> warnings;
  // Consistency figures from the newest status (zero without one).
  uint32_t backup_workers = 0;
  uint32_t staleness_bound = 0;
  uint64_t late_gradients = 0;
  uint64_t too_stale = 0;
  // Over every shard: the mean weighted by each shard's histogram count, the
  // max, and the histogram summed bucket by bucket (the last bucket counts
  // everything at or above its index).
  double staleness_mean = 0;
  uint64_t staleness_max = 0;
  std::vector<uint64_t> staleness_histogram;
  // Gradient clipping (zero when the job does not clip): steps clipped, over
  // every worker, and the workers' mean recent gradient norm before it.
  uint64_t clipped_steps = 0;
  double gradient_norm = 0;
  // f16 compute (zero otherwise): gradients that overflowed and were
  // skipped, over every worker, and the lowest loss scale among them now.
  uint64_t overflow_steps = 0;
  double loss_scale = 0;
};

// The progress of an --entry job (the workers are the user's program): the
// job's step as the shards count it (JobStatus.global_step, the lowest
// shard version: in sync the steps every worker completed; in async and ssp
// a version a gradient, so divided by the workers), out of the job's steps
// (its --steps, else the highest count a worker reported: a Python program
// declares its own with gt.set_total_steps), 0 while neither is known. A
// worker's own step says nothing of the job's: a restarted rank may train
// on after the others finished, or resume where the job is. The other
// figures as ProgressOf's.
JobProgress EntryProgressOf(const v1::JobStatus& status);

// What an --entry job's closing line says of its steps, from the versions of
// the shards that hold chunks (whatever their state): in sync "1872 steps
// (every shard at version 1872)", in async and ssp "every shard at version
// 3744 (a version a gradient)"; shards that ended apart "shards at versions
// 1872, 1873: they differ". Empty when no shard reported a version.
std::string ShardStepsText(const v1::JobStatus& status);

// Fills the job's figures from the launch options, then from the newest
// snapshot (`latest`) and the one with the final evaluation, when there are.
RunResult ResultOf(const LaunchOptions& options,
                   const std::optional<v1::JobStatus>& latest,
                   const std::optional<v1::JobStatus>& final_eval,
                   double wall_seconds);

// One JSON object: {"mode", "servers", "workers", "model", "optimizer",
// "steps", "final_test_accuracy", "final_test_loss", "wall_seconds",
// "samples_per_sec", "run_dir", "started_unix", "workers_died",
// "workers_restarted", "worker_leaves", "worker_joins", "backup_workers",
// "staleness_bound",
// "late_gradients", "too_stale", "staleness_mean", "staleness_max",
// "staleness_histogram" (an array), "exit"}, plus "error" unless exit is
// "ok", and for an elastic job "data": {"blocks_per_epoch", "total_blocks",
// "trained", "leased", "returned", "refused_reports"}. A figure not known is
// null.
std::string ResultJson(const RunResult& result);

// What the plot needs to know of one worker's curve CSV.
struct CurveFile {
  std::string path;
  std::string label;  // e.g. "worker-0"
  // 1-based columns by name from the header line; 0: absent.
  int step = 0, unix_time = 0, loss = 0, test_accuracy = 0, evaluated = 0;
  bool has_rows = false;       // any line after the header
  bool has_evaluated = false;  // any row with evaluated=1
  bool has_training = false;   // any row that is not an evaluation (a loss to draw)
};

// Reads the header and scans the rows of the CSV at `path`.
CurveFile ReadCurveFile(const std::string& path, const std::string& label);

// A gnuplot script that draws `svg_path`, two panels: training loss against
// step (one line per file with rows and the columns), above test accuracy
// of the evaluated rows against seconds since `started_unix` (one line per
// file that has any). A panel with nothing to draw says "no data".
std::string CurvesGnuplotScript(const std::vector<CurveFile>& curves, double started_unix,
                                const std::string& svg_path);

// The first executable file named `program` in the directories of
// `search_path` (a PATH-style list), or "" if none.
std::string FindInSearchPath(const std::string& program, const std::string& search_path);

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
  // Prints each daemon's /metrics address and writes them, as Prometheus
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
  // no restart left before the job started running.
  absl::Status OnWorkerDied(size_t child_index);
  // When no worker is running or has finished (every rank's newest child
  // died), the last of them; otherwise null.
  const ChildProcess* EveryWorkerDead() const;
  // Draws <run_dir>/curves.svg with gnuplot, if there is one; says where the
  // plot is, or why there is none. Never fails the launch.
  void PlotCurves();
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
};

}  // namespace grps

#endif  // GRPS_LAUNCHER_LOCAL_LAUNCHER_H_
