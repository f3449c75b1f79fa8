#include "launcher/run_result.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "client/status_format.h"
#include "job/job_config.h"
#include "launcher/child_specs.h"
#include "launcher/json_text.h"

namespace grps {

JobProgress EntryProgressOf(const v1::JobStatus& status) {
  JobProgress p = ProgressOf(status);
  const v1::JobConfig& config = status.config();
  double step = static_cast<double>(status.global_step());
  if (config.mode() != v1::MODE_SYNC && config.num_workers() > 0) step /= config.num_workers();
  p.step = step;
  p.total = config.steps() > 0 ? config.steps() : status.total_steps();
  return p;
}

std::string ShardStepsText(const v1::JobStatus& status) {
  std::vector<uint64_t> versions;
  for (const v1::ShardStatus& s : status.shards())
    if (s.num_chunks() > 0) versions.push_back(s.version());
  if (versions.empty()) return "";
  std::sort(versions.begin(), versions.end());
  versions.erase(std::unique(versions.begin(), versions.end()), versions.end());
  if (versions.size() > 1)
    return absl::StrCat("shards at versions ", absl::StrJoin(versions, ", "), ": they differ");
  if (status.config().mode() == v1::MODE_SYNC)
    return absl::StrCat(versions[0], " steps (every shard at version ", versions[0], ")");
  return absl::StrCat("every shard at version ", versions[0], " (a version a gradient)");
}

std::string RankStepsText(const v1::JobStatus& status) {
  if (status.config().max_workers() == 0) return "";
  std::map<uint32_t, uint64_t> by_rank;  // a rank's newest incarnation's step
  for (const v1::WorkerStatus& w : status.workers())
    if (w.progress().step() > 0)
      by_rank[w.rank()] = std::max(by_rank[w.rank()], w.progress().step());
  if (by_rank.empty()) return "";
  uint64_t all = 0;
  std::vector<std::string> each;
  for (const auto& [rank, step] : by_rank) {
    all += step;
    each.push_back(absl::StrCat("rank ", rank, ": ", step));
  }
  return absl::StrCat(by_rank.size(), by_rank.size() == 1 ? " rank" : " ranks", " trained ", all,
                      " steps (", absl::StrJoin(each, ", "), ")");
}

RunResult ResultOf(const LaunchOptions& options,
                   const std::optional<v1::JobStatus>& latest,
                   const std::optional<v1::JobStatus>& final_eval,
                   double wall_seconds) {
  RunResult r;
  r.mode = options.mode;
  r.servers = options.servers;
  r.workers = options.workers;
  if (const std::string* model = FindJobFlag(options, "model")) r.model = *model;
  if (const std::string* opt = FindJobFlag(options, "optimizer")) r.optimizer = *opt;
  r.wall_seconds = wall_seconds;
  r.run_dir = options.run_dir;
  if (latest) {
    const v1::JobConfig& config = latest->config();
    if (config.mode() != v1::MODE_UNSPECIFIED) r.mode = ModeName(config.mode());
    if (config.model() != v1::MODEL_UNSPECIFIED) r.model = ModelName(config.model());
    if (config.optimizer().kind() != v1::OPTIMIZER_UNSPECIFIED)
      r.optimizer = OptimizerName(config.optimizer().kind());
    if (config.num_servers() > 0) r.servers = config.num_servers();
    if (config.num_workers() > 0) r.workers = config.num_workers();
    r.steps = static_cast<uint64_t>(std::llround(
        (options.entry.empty() ? ProgressOf(*latest) : EntryProgressOf(*latest)).step));
    uint64_t samples = 0;
    int norms = 0;
    for (const v1::WorkerStatus& w : latest->workers()) {
      samples += w.progress().samples();
      r.clipped_steps += w.progress().clipped_steps();
      r.overflow_steps += w.progress().overflow_steps();
      if (w.progress().loss_scale() > 0 &&
          (r.loss_scale == 0 || w.progress().loss_scale() < r.loss_scale))
        r.loss_scale = w.progress().loss_scale();
      if (w.progress().gradient_norm() > 0) {
        r.gradient_norm += w.progress().gradient_norm();
        ++norms;
      }
    }
    if (norms > 0) r.gradient_norm /= norms;
    if (wall_seconds > 0) r.samples_per_sec = samples / wall_seconds;
    r.backup_workers = config.backup_workers();
    r.staleness_bound = config.staleness_bound();
    uint64_t shard_late = 0, shard_too_stale = 0, counted = 0;
    double staleness_sum = 0;
    for (const v1::ShardStatus& shard : latest->shards()) {
      shard_late += shard.late_gradients();
      shard_too_stale += shard.too_stale();
      r.staleness_max = std::max(r.staleness_max, shard.staleness_max());
      if (r.staleness_histogram.size() < static_cast<size_t>(shard.staleness_histogram_size()))
        r.staleness_histogram.resize(shard.staleness_histogram_size(), 0);
      uint64_t count = 0;
      for (int i = 0; i < shard.staleness_histogram_size(); ++i) {
        r.staleness_histogram[i] += shard.staleness_histogram(i);
        count += shard.staleness_histogram(i);
      }
      staleness_sum += shard.staleness_mean() * static_cast<double>(count);
      counted += count;
    }
    if (counted > 0) r.staleness_mean = staleness_sum / static_cast<double>(counted);
    // The coordinator sums the shards' counts; older ones left it to us.
    r.late_gradients = latest->late_gradients() > 0 ? latest->late_gradients() : shard_late;
    r.worker_leaves = latest->worker_leaves();
    r.worker_joins = latest->worker_joins();
    r.data = latest->data();
    r.warnings.assign(latest->warnings().begin(), latest->warnings().end());
    r.too_stale = latest->too_stale() > 0 ? latest->too_stale() : shard_too_stale;
  }
  if (final_eval) {
    r.final_test_accuracy = final_eval->final_test_accuracy();
    r.final_test_loss = final_eval->final_test_loss();
    if (final_eval->has_final_test_auc()) r.final_test_auc = final_eval->final_test_auc();
  }
  return r;
}

std::string ResultJson(const RunResult& r) {
  std::string json = absl::StrCat(
      "{\"mode\":", JsonString(r.mode), ",\"servers\":", r.servers,
      ",\"workers\":", r.workers, ",\"model\":", JsonString(r.model),
      ",\"optimizer\":", JsonString(r.optimizer), ",\"steps\":", r.steps,
      ",\"final_test_accuracy\":", JsonNumber(r.final_test_accuracy),
      ",\"final_test_loss\":", JsonNumber(r.final_test_loss),
      ",\"final_test_auc\":", JsonNumber(r.final_test_auc),
      ",\"wall_seconds\":", JsonNumber(r.wall_seconds),
      ",\"samples_per_sec\":", JsonNumber(r.samples_per_sec),
      ",\"run_dir\":", JsonString(r.run_dir),
      ",\"started_unix\":", JsonUnixTime(r.started_unix),
      ",\"workers_died\":", r.workers_died,
      ",\"workers_restarted\":", r.workers_restarted,
      ",\"worker_leaves\":", r.worker_leaves, ",\"worker_joins\":", r.worker_joins,
      ",\"backup_workers\":", r.backup_workers,
      ",\"staleness_bound\":", r.staleness_bound,
      ",\"late_gradients\":", r.late_gradients, ",\"too_stale\":", r.too_stale,
      ",\"staleness_mean\":", JsonNumber(r.staleness_mean),
      ",\"staleness_max\":", r.staleness_max,
      ",\"staleness_histogram\":", JsonArray(r.staleness_histogram),
      ",\"clipped_steps\":", r.clipped_steps,
      ",\"gradient_norm\":", JsonNumber(r.gradient_norm),
      ",\"overflow_steps\":", r.overflow_steps,
      ",\"loss_scale\":", JsonNumber(r.loss_scale),
      ",\"exit\":", JsonString(r.exit));
  if (r.exit != "ok") absl::StrAppend(&json, ",\"error\":", JsonString(r.error));
  if (r.data.total_blocks() > 0)
    absl::StrAppend(&json, ",\"data\":{\"blocks_per_epoch\":", r.data.blocks_per_epoch(),
                    ",\"total_blocks\":", r.data.total_blocks(),
                    ",\"trained\":", r.data.consumed(), ",\"leased\":", r.data.leased(),
                    ",\"returned\":", r.data.returned(),
                    ",\"refused_reports\":", r.data.refused_reports(), "}");
  std::vector<std::string> warnings;
  for (const std::string& w : r.warnings) warnings.push_back(JsonString(w));
  absl::StrAppend(&json, ",\"warnings\":[", absl::StrJoin(warnings, ","), "]");
  return json + "}\n";
}

}  // namespace grps
