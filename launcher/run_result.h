// How a grps-local launch ended (RunResult), from its options and the job's
// newest status, as the summary and the --result_json file say it.
#ifndef GRPS_LAUNCHER_RUN_RESULT_H_
#define GRPS_LAUNCHER_RUN_RESULT_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "launcher/launch_options.h"
#include "launcher/progress_line.h"
#include "proto/grps.pb.h"

namespace grps {

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
  std::optional<double> final_test_auc;  // two-class models
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

// What an elastic job's closing line says of its steps (its ranks train
// what the example ledger leases them, a rank that joined included): "3
// ranks trained 2811 steps (rank 0: 400, rank 1: 2331, rank 2: 80)". Empty
// for a job that is not elastic (max_workers 0) or when no rank trained.
std::string RankStepsText(const v1::JobStatus& status);

// Fills the job's figures from the launch options, then from the newest
// snapshot (`latest`) and the one with the final evaluation, when there are.
RunResult ResultOf(const LaunchOptions& options,
                   const std::optional<v1::JobStatus>& latest,
                   const std::optional<v1::JobStatus>& final_eval,
                   double wall_seconds);

// One JSON object: {"mode", "servers", "workers", "model", "optimizer",
// "steps", "final_test_accuracy", "final_test_loss", "final_test_auc" (null
// but for a two-class model's final evaluation), "wall_seconds",
// "samples_per_sec", "run_dir", "started_unix", "workers_died",
// "workers_restarted", "worker_leaves", "worker_joins", "backup_workers",
// "staleness_bound",
// "late_gradients", "too_stale", "staleness_mean", "staleness_max",
// "staleness_histogram" (an array), "exit"}, plus "error" unless exit is
// "ok", and for an elastic job "data": {"blocks_per_epoch", "total_blocks",
// "trained", "leased", "returned", "refused_reports"}. A figure not known is
// null.
std::string ResultJson(const RunResult& result);

}  // namespace grps

#endif  // GRPS_LAUNCHER_RUN_RESULT_H_
