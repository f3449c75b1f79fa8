#include "coordinator/job_summary.h"

#include <algorithm>
#include <limits>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace grps {

namespace {

bool Alive(v1::MemberState state) { return state == v1::MEMBER_STATE_ALIVE; }

}  // namespace

void AddCompletionWarnings(v1::JobStatus* status) {
  if (status->state() != v1::JOB_STATE_COMPLETED) return;
  if (status->mode() == v1::MODE_SYNC) {
    std::vector<std::string> versions;
    uint64_t lowest = std::numeric_limits<uint64_t>::max(), highest = 0;
    for (const v1::ShardStatus& s : status->shards()) {
      if (s.num_chunks() == 0) continue;
      lowest = std::min(lowest, s.version());
      highest = std::max(highest, s.version());
      versions.push_back(absl::StrCat("shard ", s.shard(), " at ", s.version()));
    }
    if (!versions.empty() && lowest != highest)
      status->add_warnings(absl::StrCat("the sync shards ended at different versions (",
                                        absl::StrJoin(versions, ", "),
                                        "): their steps differ"));
  }
  if (!status->has_data()) return;
  const v1::DataProgress& data = status->data();
  if (data.consumed() < data.total_blocks()) {
    const uint64_t missed = data.total_blocks() - data.consumed();
    status->add_warnings(absl::StrCat(
        missed, " of the job's ", data.total_blocks(), " blocks of examples ",
        missed == 1 ? "was" : "were", " never trained (", data.leased(),
        " still leased at the end): an epoch's examples were not each trained once"));
  }
  if (data.refused_reports() > 0)
    status->add_warnings(absl::StrCat(
        data.refused_reports(), " block", data.refused_reports() == 1 ? " was" : "s were",
        " reported trained by a rank that did not hold its lease: trained twice"));
}

double MedianStep(std::vector<uint64_t> steps) {
  if (steps.empty()) return 0;
  std::sort(steps.begin(), steps.end());
  const size_t n = steps.size();
  if (n % 2 == 1) return static_cast<double>(steps[n / 2]);
  return (static_cast<double>(steps[n / 2 - 1]) +
          static_cast<double>(steps[n / 2])) / 2;
}

bool IsStraggler(uint64_t step, double median_step) {
  const double allowed = std::max(3.0, 0.1 * median_step);
  return median_step - static_cast<double>(step) > allowed;
}

void SummarizeJobStatus(v1::JobStatus* status) {
  std::vector<uint64_t> live_steps;
  uint64_t max_step = 0;
  uint64_t total_steps = 0;
  double samples_per_sec = 0;
  double live_loss = 0, any_loss = 0;
  int live_reports = 0, any_reports = 0;
  for (const v1::WorkerStatus& w : status->workers()) {
    const bool alive = Alive(w.state());
    if (alive) live_steps.push_back(w.progress().step());
    if (!w.has_progress()) continue;
    const v1::WorkerProgress& p = w.progress();
    max_step = std::max(max_step, p.step());
    total_steps = std::max(total_steps, p.total_steps());
    any_loss += p.loss();
    ++any_reports;
    if (alive) {
      samples_per_sec += p.samples_per_sec();
      live_loss += p.loss();
      ++live_reports;
    }
  }

  uint64_t min_version = std::numeric_limits<uint64_t>::max();
  for (const v1::ShardStatus& s : status->shards())
    if (Alive(s.state()) && s.num_chunks() > 0)
      min_version = std::min(min_version, s.version());
  status->set_global_step(min_version != std::numeric_limits<uint64_t>::max()
                              ? min_version
                              : max_step);
  status->set_total_steps(total_steps);
  status->set_samples_per_sec(static_cast<float>(samples_per_sec));
  if (live_reports > 0)
    status->set_loss(static_cast<float>(live_loss / live_reports));
  else if (any_reports > 0)
    status->set_loss(static_cast<float>(any_loss / any_reports));
  else
    status->set_loss(0);

  uint64_t late = 0, too_stale = 0;
  std::vector<uint64_t> late_by_worker(status->workers_size(), 0);
  for (const v1::ShardStatus& s : status->shards()) {
    late += s.late_gradients();
    too_stale += s.too_stale();
    for (int r = 0; r < s.late_by_worker_size() && r < status->workers_size(); ++r)
      late_by_worker[r] += s.late_by_worker(r);
  }
  status->set_late_gradients(late);
  status->set_too_stale(too_stale);

  const double median = MedianStep(live_steps);
  for (int i = 0; i < status->workers_size(); ++i) {
    v1::WorkerStatus& w = *status->mutable_workers(i);
    w.set_straggler(Alive(w.state()) && IsStraggler(w.progress().step(), median));
    w.set_late_gradients(late_by_worker[i]);
  }
}

}  // namespace grps
