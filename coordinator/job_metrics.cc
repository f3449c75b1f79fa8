#include "coordinator/job_metrics.h"

#include <map>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "daemon/metrics.h"
#include "job/job_config.h"

namespace grps {

namespace {

using Families = std::vector<prometheus::MetricFamily>;

// A family of one value without labels.
void AddOne(Families& families, prometheus::MetricFamily family, double value) {
  AddValue(family, {}, value);
  families.push_back(std::move(family));
}

// An elastic job's example ledger.
void AddDataLedger(const v1::DataProgress& d, Families& families) {
  families.push_back(
      GaugeFamily("grps_job_data_blocks", "elastic jobs: the example ledger's blocks by state"));
  AddValue(families.back(), {{"state", "trained"}}, static_cast<double>(d.consumed()));
  AddValue(families.back(), {{"state", "leased"}}, static_cast<double>(d.leased()));
  AddValue(families.back(), {{"state", "total"}}, static_cast<double>(d.total_blocks()));
  AddOne(families,
         GaugeFamily("grps_job_data_epoch", "elastic jobs: the epoch of the lowest untrained block"),
         static_cast<double>(d.epoch()));
  AddOne(families,
         CounterFamily("grps_job_data_blocks_returned_total",
                       "elastic jobs: leased blocks that came back to be leased again"),
         static_cast<double>(d.returned()));
}

// Servers that scale: the shard count and the re-shardings done.
void AddShardCount(const v1::JobStatus& s, Families& families) {
  AddOne(families, GaugeFamily("grps_job_shards", "the shards of the job's current shard map"),
         static_cast<double>(s.config().num_servers()));
  AddOne(families, GaugeFamily("grps_job_shard_map_epoch", "the shard map's epoch"),
         static_cast<double>(s.map_epoch()));
  AddOne(families, CounterFamily("grps_job_reshards_total", "re-shardings of the running job done"),
         static_cast<double>(s.reshard().completed()));
  AddOne(families,
         GaugeFamily("grps_job_reshard_target",
                     "the shard count a re-sharding in progress moves to (0: none)"),
         static_cast<double>(s.reshard().target_servers()));
}

void AddMembers(const v1::JobStatus& s, Families& families) {
  std::map<std::pair<std::string, std::string>, int> members;
  for (const v1::WorkerStatus& w : s.workers()) ++members[{"worker", MemberStateName(w.state())}];
  for (const v1::ShardStatus& sh : s.shards()) ++members[{"server", MemberStateName(sh.state())}];
  families.push_back(GaugeFamily("grps_job_members", "workers and servers by state"));
  for (const auto& [key, count] : members)
    AddValue(families.back(), {{"role", key.first}, {"state", key.second}}, count);
}

void AddCheckpoints(const v1::JobStatus& s, Families& families) {
  AddOne(families, CounterFamily("grps_job_checkpoints_completed_total", "checkpoints completed"),
         static_cast<double>(s.checkpoints_completed()));
  if (s.checkpoints_completed() == 0) return;
  AddOne(families,
         GaugeFamily("grps_job_last_checkpoint_seconds",
                     "the newest complete checkpoint: time from request to manifest"),
         s.last_checkpoint().seconds());
  AddOne(families,
         GaugeFamily("grps_job_last_checkpoint_step", "the newest complete checkpoint's step"),
         static_cast<double>(s.last_checkpoint().step()));
}

// Each worker's step, rate, loss and straggler flag, labelled by rank.
void AddPerWorker(const v1::JobStatus& s, Families& families) {
  prometheus::MetricFamily step = GaugeFamily("grps_job_worker_step", "a worker's step");
  prometheus::MetricFamily rate =
      GaugeFamily("grps_job_worker_samples_per_second", "a worker's samples per second");
  prometheus::MetricFamily loss = GaugeFamily("grps_job_worker_loss", "a worker's recent loss");
  prometheus::MetricFamily straggler =
      GaugeFamily("grps_job_worker_straggler", "1 when a worker is behind the median");
  for (const v1::WorkerStatus& w : s.workers()) {
    const Labels rank = {{"rank", absl::StrCat(w.rank())}};
    AddValue(step, rank, static_cast<double>(w.progress().step()));
    AddValue(rate, rank, w.progress().samples_per_sec());
    AddValue(loss, rank, w.progress().loss());
    AddValue(straggler, rank, w.straggler() ? 1 : 0);
  }
  for (auto* f : {&step, &rate, &loss, &straggler}) families.push_back(std::move(*f));
}

}  // namespace

std::vector<prometheus::MetricFamily> JobMetricFamilies(const v1::JobStatus& s) {
  Families families;
  families.push_back(GaugeFamily("grps_job_state", "1 for the job's current state"));
  AddValue(families.back(), {{"state", JobStateName(s.state())}}, 1);
  AddOne(families, GaugeFamily("grps_job_global_step", "steps every shard has completed"),
         static_cast<double>(s.global_step()));
  AddOne(families, GaugeFamily("grps_job_total_steps", "steps the job trains"),
         static_cast<double>(s.total_steps()));
  AddOne(families,
         GaugeFamily("grps_job_samples_per_second", "training samples per second, all workers"),
         s.samples_per_sec());
  AddOne(families, GaugeFamily("grps_job_loss", "mean recent training loss of the live workers"),
         s.loss());
  if (s.test_accuracy() >= 0)
    AddOne(families,
           GaugeFamily("grps_job_test_accuracy", "the latest evaluation's test accuracy"),
           s.test_accuracy());
  if (s.has_test_auc())
    AddOne(families,
           GaugeFamily("grps_job_test_auc",
                       "the latest evaluation's AUC (two-class models: class 1's score)"),
           s.test_auc());
  AddOne(families,
         CounterFamily("grps_job_late_gradients_total",
                       "sync: chunk gradients that arrived after their step, over the shards"),
         static_cast<double>(s.late_gradients()));
  AddOne(families,
         CounterFamily("grps_job_too_stale_total",
                       "async and ssp: chunk gradients refused as too stale, over the shards"),
         static_cast<double>(s.too_stale()));
  AddOne(families,
         CounterFamily("grps_job_worker_leaves_total",
                       "workers that left the running job on purpose (SIGTERM, drain)"),
         static_cast<double>(s.worker_leaves()));
  AddOne(families,
         CounterFamily("grps_job_worker_joins_total",
                       "ranks that joined the running job (restarts, after a leave, new ranks)"),
         static_cast<double>(s.worker_joins()));
  if (s.data().total_blocks() > 0) AddDataLedger(s.data(), families);
  if (s.config().max_servers() > 0) AddShardCount(s, families);
  AddMembers(s, families);
  AddCheckpoints(s, families);
  AddPerWorker(s, families);
  return families;
}

}  // namespace grps
