// LaunchOptions: what grps-local runs (the job, its daemons, its run
// directory and its timings); see local_launcher.h.
#ifndef GRPS_LAUNCHER_LAUNCH_OPTIONS_H_
#define GRPS_LAUNCHER_LAUNCH_OPTIONS_H_

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/time/time.h"

namespace grps {

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
  bool token_generated = false;  // not given (GRPS_TOKEN): made for the job
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

}  // namespace grps

#endif  // GRPS_LAUNCHER_LAUNCH_OPTIONS_H_
