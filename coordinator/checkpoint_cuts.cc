#include "coordinator/checkpoint_cuts.h"

#include <algorithm>
#include <cmath>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "coordinator/words.h"
#include "spdlog/spdlog.h"

namespace grps {

CheckpointCuts::CheckpointCuts(const v1::JobConfig& config, CheckpointScheduler* scheduler,
                               const Membership* membership, const GlobalStep* global_step)
    : job_id_(config.job_id()),
      mode_(config.mode()),
      heartbeat_interval_ms_(config.heartbeat_interval_ms()),
      scheduler_(scheduler),
      membership_(membership),
      global_step_(global_step) {}

absl::StatusOr<uint64_t> CheckpointCuts::Join(const Job& job, absl::Time now,
                                              absl::string_view why) {
  if (scheduler_->pending()) return scheduler_->pending_summary().id();
  absl::StatusOr<v1::CheckpointRequest> started = Start(job, now, why);
  if (!started.ok()) return started.status();
  return started->id();
}

absl::StatusOr<v1::CheckpointRequest> CheckpointCuts::StartAt(const Job& job, absl::Time now,
                                                              absl::string_view why,
                                                              uint64_t not_before) {
  std::vector<uint32_t> not_alive;
  for (const v1::ShardStatus& shard : membership_->ShardStatuses(now))
    if (shard.state() != v1::MEMBER_STATE_ALIVE) not_alive.push_back(shard.shard());
  if (!not_alive.empty())
    return absl::UnavailableError(absl::StrCat(Members("shard", not_alive),
                                               not_alive.size() == 1 ? " is" : " are",
                                               " not alive; a checkpoint needs every shard"));
  uint64_t version = 0;
  std::vector<uint64_t> worker_steps;
  if (mode_ == v1::MODE_SYNC) {
    // While the job trains, a sync cut is a step ahead of every shard: not
    // before each has said where it is (after a take-over no version is
    // known until the shards' first heartbeats; the state file's steps are
    // old), nor, after a take-over, while the step moves at a rate not yet
    // measured over a whole window (the margin would be a guess: a first
    // estimate of 100 ms, as the members reconnect, made a cut at 424 while
    // a shard was at 425; Tick waits so for a periodic cut as the job
    // starts too). Once training is done, the finished workers' step is
    // the cut.
    if (!job.training_done) {
      if (const std::vector<uint32_t> unheard = membership_->LiveShardsUnheard(); !unheard.empty())
        return absl::UnavailableError(
            absl::StrCat("waiting for the version of ", Members("shard", unheard)));
      if (job.taken_over && !global_step_->RateMeasured() &&
          now - global_step_->moved() < absl::Seconds(1))
        return absl::UnavailableError("measuring the step rate since the take-over");
    }
    version = SyncVersion(job);
    if (!job.training_done && not_before > version) version = not_before;
  } else {
    for (const v1::WorkerStatus& w : membership_->WorkerStatuses(now))
      worker_steps.push_back(w.progress().step());
  }
  v1::CheckpointRequest request =
      scheduler_->Start(version, std::move(worker_steps), global_step_->step().value_or(0), now);
  spdlog::info("checkpoint {} ({}) asked of {} shards{}", request.id(), std::string(why),
               membership_->num_shards(),
               mode_ == v1::MODE_SYNC ? absl::StrCat(" at step ", version)
                                      : std::string(" (each chunk as it is)"));
  return request;
}

uint64_t CheckpointCuts::HighestShardVersion() const {
  uint64_t highest = 0;
  for (uint64_t v : membership_->LiveShardVersions()) highest = std::max(highest, v);
  return highest;
}

double CheckpointCuts::StepsPerHeartbeat() const {
  return global_step_->FastestRecentRate() * heartbeat_interval_ms_ / 1000.0;
}

uint64_t CheckpointCuts::SyncVersion(const Job& job) const {
  const uint64_t highest = HighestShardVersion();
  if (job.training_done) {
    // Every step is done: the shards are at (or about to report) the
    // finished workers' step count, and stay there.
    return std::max(highest, MaxWorkerStep());
  }
  // Ahead of every shard by what they may do before they hear the request
  // (about one heartbeat interval each way), more after failures.
  // Versions reach the coordinator a heartbeat late and the request reaches
  // the shards a heartbeat later: three intervals of steps, and some slack.
  uint64_t margin =
      std::max<uint64_t>(4, static_cast<uint64_t>(std::ceil(3 * StepsPerHeartbeat())) + 2);
  margin <<= std::min<uint32_t>(scheduler_->consecutive_failures(), 4);
  uint64_t version = highest + margin;
  const uint64_t total = MaxWorkerTotal();
  // Never past the last step: a cut there would wait for good. (After a
  // roll-back the versions reported may still be the pre-roll-back ones.)
  if (total > 0 && version > total) version = total;
  return version;
}

bool CheckpointCuts::Tick(const Job& job, bool training, absl::Time now) {
  if (!scheduler_->enabled()) return false;
  bool failed = false;
  if (scheduler_->TimedOut(now)) {
    const uint64_t id = scheduler_->pending_summary().id();
    scheduler_->Fail(absl::StrCat("not every shard wrote its file within ",
                                  WholeSeconds(CheckpointScheduler::kTimeout)),
                     now);
    spdlog::warn("checkpoint {} failed: {}", id, scheduler_->SummaryOf(id).error());
    failed = true;
  }
  if (!training) return failed;
  uint64_t step = global_step_->step().value_or(0);
  uint64_t at = 0;
  if (mode_ == v1::MODE_SYNC) {
    // This tick the cut can be at `earliest` or later; the next tick (a
    // heartbeat interval on, give or take) about an interval's steps
    // further. A step due within two intervals' steps is asked for now, and
    // cut at exactly that step (with one, the ticks' jitter made a cut due
    // at 4000 miss it and fall at 4039).
    const uint64_t earliest = SyncVersion(job);
    step = earliest + static_cast<uint64_t>(std::ceil(2 * StepsPerHeartbeat()));
    const uint64_t due = scheduler_->NextStepDue();
    at = due >= earliest && due <= step ? due : earliest;
  }
  if (!scheduler_->Due(step, now)) return failed;
  if (mode_ == v1::MODE_SYNC) {
    if (!global_step_->RateMeasured() && now - global_step_->moved() < absl::Seconds(1)) {
      // The step moves, at a rate not measured yet: with no estimate as the
      // workers started, the least margin made a cut at 244 while a shard
      // was at 530. (A step that stands still needs no rate.)
      spdlog::debug("periodic checkpoint not asked for: measuring the step rate");
      return failed;
    }
    if (HighestShardVersion() <= scheduler_->last_step()) {
      spdlog::debug("periodic checkpoint not asked for: no shard is past step {} yet",
                    scheduler_->last_step());
      return failed;
    }
    if (const uint64_t total = MaxWorkerTotal(); total > 0 && at >= total) {
      spdlog::debug("periodic checkpoint not asked for: the final one is cut at step {}", total);
      return failed;
    }
  }
  absl::StatusOr<v1::CheckpointRequest> request = StartAt(job, now, "periodic", at);
  if (!request.ok())
    spdlog::debug("periodic checkpoint not asked for: {}", std::string(request.status().message()));
  return failed;
}

bool CheckpointCuts::FinalSettled(const Job& job, absl::Time now) {
  if (!scheduler_->enabled() || final_settled_) return true;
  // Without the final checkpoint (`why`), which the job's status warns of.
  auto settle = [this](std::string why = "") {
    final_settled_ = true;
    scheduler_->set_final_missing(std::move(why));
    return true;
  };
  if (final_deadline_ == absl::InfiniteFuture())
    final_deadline_ = now + CheckpointScheduler::kTimeout;
  if (final_id_ == 0) {
    // A sync checkpoint asked for at a step the shards will not reach now.
    if (scheduler_->pending() && mode_ == v1::MODE_SYNC &&
        scheduler_->pending_summary().step() > SyncVersion(job))
      scheduler_->Fail(
          absl::StrCat("training ended before step ", scheduler_->pending_summary().step()), now);
    // One in progress was cut before the last updates: let it end, then
    // take the final one.
    if (scheduler_->pending())
      return now >= final_deadline_ &&
             settle(absl::StrCat("checkpoint ", scheduler_->pending_summary().id(),
                                 " was still in progress after ",
                                 WholeSeconds(CheckpointScheduler::kTimeout)));
    if (now < final_retry_at_) return now >= final_deadline_ && settle(final_error_);
    absl::StatusOr<v1::CheckpointRequest> request = Start(job, now, "final");
    if (!request.ok()) {
      if (absl::IsUnavailable(request.status()) && now < final_deadline_)
        return false;  // a shard is not alive right now; try again
      spdlog::warn("job {}: no final checkpoint: {}", job_id_,
                   std::string(request.status().message()));
      return settle(std::string(request.status().message()));
    }
    final_id_ = request->id();
  }
  const v1::CheckpointSummary summary = scheduler_->SummaryOf(final_id_);
  if (summary.state() == v1::CHECKPOINT_STATE_PENDING) {
    // A shard that ended below the cut never reaches it: no minute's wait.
    if (const std::string split = SplitShards(job, summary.step()); !split.empty()) {
      scheduler_->Fail(split, now);
      spdlog::warn("job {}: no final checkpoint: {}", job_id_, split);
      return settle(split);
    }
    if (now < final_deadline_) return false;
    spdlog::warn("job {}: the final checkpoint {} did not complete in {}; ending without it",
                 job_id_, final_id_, WholeSeconds(CheckpointScheduler::kTimeout));
    return settle(absl::StrCat("checkpoint ", final_id_, " did not complete in ",
                               WholeSeconds(CheckpointScheduler::kTimeout)));
  }
  if (summary.state() == v1::CHECKPOINT_STATE_FAILED) {
    if (now >= final_deadline_) return settle(summary.error());
    // Try again (with a fresh id) until the deadline, a retry's pause
    // apart: a failure that lasts (a folder gone) is not asked again and
    // again.
    final_id_ = 0;
    final_retry_at_ = now + CheckpointScheduler::kRetryBackoff;
    final_error_ = summary.error();
    return false;
  }
  return settle();
}

void CheckpointCuts::ForgetFinal() {
  final_id_ = 0;
  final_settled_ = false;
  final_deadline_ = absl::InfiniteFuture();
  final_retry_at_ = absl::InfinitePast();
  final_error_.clear();
  scheduler_->set_final_missing("");
}

std::string CheckpointCuts::SplitShards(const Job& job, uint64_t step) const {
  if (mode_ != v1::MODE_SYNC || !job.versions_final) return "";
  const std::vector<uint64_t> versions = membership_->LiveShardVersions();
  if (versions.empty()) return "";
  const auto [lowest, highest] = std::minmax_element(versions.begin(), versions.end());
  if (*lowest == *highest || *lowest >= step) return "";
  return absl::StrCat("the sync shards ended at different versions (",
                      absl::StrJoin(versions, ", "), "): one never reaches step ", step);
}

uint64_t CheckpointCuts::MaxWorkerTotal() const {
  uint64_t total = 0;
  for (const v1::WorkerStatus& w : membership_->WorkerStatuses(absl::InfinitePast()))
    total = std::max(total, w.progress().total_steps());
  return total;
}

uint64_t CheckpointCuts::MaxWorkerStep() const {
  uint64_t step = 0;
  for (const v1::WorkerStatus& w : membership_->WorkerStatuses(absl::InfinitePast()))
    step = std::max(step, w.progress().step());
  return step;
}

}  // namespace grps
