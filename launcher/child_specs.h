// What grps-local starts: each daemon's command line, log and environment
// (ChildSpec), built from the LaunchOptions alone, and where each daemon
// serves its metrics. No process is started here (LocalLauncher does).
#ifndef GRPS_LAUNCHER_CHILD_SPECS_H_
#define GRPS_LAUNCHER_CHILD_SPECS_H_

#include <cstdint>
#include <string>
#include <vector>

#include "launcher/child_process.h"
#include "launcher/launch_options.h"

namespace grps {

// The daemons' binaries, in LaunchOptions::bin_dir.
inline constexpr char kCoordinatorBinary[] = "grps-coordinator";
inline constexpr char kServerBinary[] = "grps-server";
inline constexpr char kWorkerBinary[] = "grps-worker";

// `name` in the folder `dir`.
std::string InDir(const std::string& dir, const std::string& name);

// The value of the coordinator flag `name` in LaunchOptions::job_flags, or
// null when the launch does not set it.
const std::string* FindJobFlag(const LaunchOptions& options, const std::string& name);

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

}  // namespace grps

#endif  // GRPS_LAUNCHER_CHILD_SPECS_H_
