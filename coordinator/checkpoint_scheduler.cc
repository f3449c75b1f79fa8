#include "coordinator/checkpoint_scheduler.h"

#include <algorithm>
#include <limits>
#include <utility>

#include "absl/strings/str_cat.h"
#include "checkpoint/checkpoint.h"
#include "job/job_config.h"

namespace grps {

namespace {

constexpr size_t kMaxFileName = 255;
constexpr size_t kMaxError = 1024;

// A shard's file name must name a file inside the checkpoint's folder.
bool PlainFileName(absl::string_view name) {
  if (name.empty() || name.size() > kMaxFileName || name == "." || name == "..") return false;
  for (char c : name)
    if (c == '/' || c < 0x21 || c > 0x7e) return false;
  return true;
}

uint64_t UnixMillis(absl::Time t) {
  return static_cast<uint64_t>(std::max<int64_t>(0, absl::ToUnixMillis(t)));
}

}  // namespace

CheckpointScheduler::CheckpointScheduler(const v1::JobConfig& config, uint32_t num_shards)
    : root_(config.checkpoint_dir()),
      mode_(config.mode()),
      every_steps_(config.checkpoint_every_steps()),
      every_(absl::Seconds(config.checkpoint_every_seconds())),
      num_shards_(num_shards),
      job_id_(config.job_id()) {}

void CheckpointScheduler::SetNewestComplete(const v1::CheckpointManifest& manifest,
                                            const std::string& dir, uint64_t completed) {
  last_complete_.set_id(manifest.id());
  last_complete_.set_state(v1::CHECKPOINT_STATE_COMPLETE);
  last_complete_.set_step(manifest.step());
  last_complete_.set_dir(dir);
  uint64_t bytes = 0;
  for (const v1::ShardCheckpoint& s : manifest.shards()) bytes += ShardFileBytes(s);
  last_complete_.set_bytes(bytes);
  last_complete_.set_seconds(manifest.seconds());
  last_complete_.set_unix_time_ms(manifest.unix_time_ms());
  last_complete_worker_steps_.assign(manifest.worker_steps().begin(),
                                     manifest.worker_steps().end());
  completed_ = completed;
  last_step_ = std::max(last_step_, manifest.step());
  SetNextId(manifest.id() + 1);
}

void CheckpointScheduler::SetNextId(uint64_t id) {
  if (!pending_.has_value()) next_id_ = std::max(next_id_, id);
}

bool CheckpointScheduler::Due(uint64_t step, absl::Time now) {
  if (!enabled() || pending_.has_value()) return false;
  if (last_time_ == absl::InfinitePast()) last_time_ = now;
  if (now < retry_after_) return false;
  if (consecutive_failures_ > 0 && (every_steps_ > 0 || every_ > absl::ZeroDuration())) return true;
  if (every_steps_ > 0 && step >= NextStepDue()) return true;
  return every_ > absl::ZeroDuration() && now - last_time_ >= every_;
}

v1::CheckpointRequest CheckpointScheduler::Start(uint64_t version,
                                                 std::vector<uint64_t> worker_steps,
                                                 uint64_t global_step, absl::Time now) {
  Pending p;
  p.request.set_id(next_id_++);
  p.request.set_dir(CheckpointFolder(root_, p.request.id()));
  p.request.set_version(version);
  p.request.set_coordinator_incarnation(coordinator_incarnation_);
  p.worker_steps = std::move(worker_steps);
  p.started = now;
  pending_ = std::move(p);
  last_time_ = now;
  last_step_ = std::max(last_step_, mode_ == v1::MODE_SYNC ? version : global_step);
  return pending_->request;
}

std::optional<v1::CheckpointRequest> CheckpointScheduler::RequestFor(uint32_t shard) const {
  if (!pending_.has_value() || pending_->writing || pending_->reports.count(shard) > 0)
    return std::nullopt;
  return pending_->request;
}

void CheckpointScheduler::Report(uint32_t shard, const v1::ShardCheckpoint& report,
                                 absl::Time now) {
  if (!pending_.has_value() || pending_->writing || report.id() != pending_->request.id() ||
      report.coordinator_incarnation() != pending_->request.coordinator_incarnation() ||
      shard >= num_shards_ || pending_->reports.count(shard) > 0)
    return;
  switch (report.state()) {
    case v1::CHECKPOINT_STATE_WRITTEN: {
      auto plain_parts = [](const auto& parts) {
        return std::all_of(parts.begin(), parts.end(), [](const v1::ShardFilePart& part) {
          return PlainFileName(part.file());
        });
      };
      bool plain = PlainFileName(report.file()) && plain_parts(report.parts());
      uint64_t previous = 0;  // a chain's checkpoints: increasing, before this one
      for (const v1::ShardFileRef& ref : report.chain()) {
        plain = plain && PlainFileName(ref.file()) && plain_parts(ref.parts()) &&
                ref.id() > previous && ref.id() < report.id();
        previous = ref.id();
      }
      if (!plain) {
        EndFailed(absl::StrCat("shard ", shard,
                               " reported its checkpoint file (or its chain) with a bad name"),
                  now);
        return;
      }
      if (mode_ == v1::MODE_SYNC && report.num_chunks() + report.num_tables() > 0 &&
          (report.min_version() != pending_->request.version() ||
           report.max_version() != pending_->request.version())) {
        EndFailed(absl::StrCat("shard ", shard, " wrote versions ", report.min_version(), "..",
                               report.max_version(), ", not ", pending_->request.version()),
                  now);
        return;
      }
      v1::ShardCheckpoint kept = report;
      kept.set_shard(shard);
      kept.clear_error();
      pending_->reports[shard] = std::move(kept);
      return;
    }
    case v1::CHECKPOINT_STATE_FAILED:
      EndFailed(absl::StrCat("shard ", shard, ": ", report.error().substr(0, kMaxError)), now);
      return;
    default:
      return;  // PENDING or unset: not reported yet
  }
}

std::optional<v1::CheckpointManifest> CheckpointScheduler::TakeManifestToWrite(
    const v1::ShardMap& shard_map, const v1::JobConfig& config, absl::Time now) {
  if (!pending_.has_value() || pending_->writing || pending_->reports.size() != num_shards_)
    return std::nullopt;
  pending_->writing = true;
  v1::CheckpointManifest m;
  m.set_job_id(config.job_id());
  m.set_id(pending_->request.id());
  m.set_mode(config.mode());
  const uint64_t step = CutStep();
  m.set_step(step);
  for (const auto& [shard, r] : pending_->reports) *m.add_shards() = r;
  *m.mutable_shard_map() = shard_map;
  *m.mutable_config() = config;
  if (config.mode() == v1::MODE_SYNC) pending_->worker_steps.assign(JobRanks(config), step);
  // ssp: a rank whose gradient a shard held at the cut computes it again.
  for (const auto& [shard, r] : pending_->reports)
    for (const auto& [rank, held] : r.held_from())
      if (rank < pending_->worker_steps.size())
        pending_->worker_steps[rank] = std::min(pending_->worker_steps[rank], held);
  m.mutable_worker_steps()->Add(pending_->worker_steps.begin(), pending_->worker_steps.end());
  m.set_unix_time_ms(UnixMillis(now));
  m.set_seconds(std::max(0.0, absl::ToDoubleSeconds(now - pending_->started)));
  return m;
}

uint64_t CheckpointScheduler::CutStep() const {
  if (mode_ == v1::MODE_SYNC) return pending_->request.version();
  // The lowest version any shard holding state was cut at (an empty shard
  // says nothing).
  uint64_t step = std::numeric_limits<uint64_t>::max();
  for (const auto& [shard, r] : pending_->reports)
    if (r.num_chunks() + r.num_tables() > 0) step = std::min(step, r.min_version());
  return step == std::numeric_limits<uint64_t>::max() ? 0 : step;
}

void CheckpointScheduler::FinishWrite(uint64_t id, const absl::Status& status, absl::Time now) {
  if (!pending_.has_value() || !pending_->writing || pending_->request.id() != id) return;
  if (!status.ok()) {
    pending_->writing = false;
    EndFailed(absl::StrCat("writing the manifest: ", status.message()), now);
    return;
  }
  v1::CheckpointSummary s;
  s.set_id(id);
  s.set_state(v1::CHECKPOINT_STATE_COMPLETE);
  s.set_dir(pending_->request.dir());
  uint64_t bytes = 0;
  const uint64_t step = CutStep();
  for (const auto& [shard, r] : pending_->reports) bytes += ShardFileBytes(r);
  s.set_step(step);
  s.set_bytes(bytes);
  s.set_seconds(std::max(0.0, absl::ToDoubleSeconds(now - pending_->started)));
  s.set_unix_time_ms(UnixMillis(now));
  last_complete_ = s;
  last_complete_worker_steps_ = pending_->worker_steps;
  ++completed_;
  consecutive_failures_ = 0;
  pending_.reset();
}

void CheckpointScheduler::Fail(absl::string_view error, absl::Time now) {
  if (!pending_.has_value() || pending_->writing) return;
  EndFailed(std::string(error), now);
}

bool CheckpointScheduler::TimedOut(absl::Time now) const {
  return pending_.has_value() && !pending_->writing && now - pending_->started > kTimeout;
}

void CheckpointScheduler::EndFailed(std::string error, absl::Time now) {
  v1::CheckpointSummary s;
  s.set_id(pending_->request.id());
  s.set_state(v1::CHECKPOINT_STATE_FAILED);
  s.set_dir(pending_->request.dir());
  s.set_step(pending_->request.version());
  s.set_seconds(std::max(0.0, absl::ToDoubleSeconds(now - pending_->started)));
  s.set_unix_time_ms(UnixMillis(now));
  s.set_error(std::move(error));
  last_failed_ = std::move(s);
  ++consecutive_failures_;
  // The first retry goes at once (a sync cut that a shard had passed costs
  // nothing, and the caller asks with a larger margin); then 1 s, 2 s, 4 s
  // ... up to 64 s: a shard that cannot write is not asked every second.
  retry_after_ =
      consecutive_failures_ == 1
          ? now
          : now + kRetryBackoff * (1 << std::min<uint32_t>(consecutive_failures_ - 2, 6));
  pending_.reset();
}

v1::CheckpointSummary CheckpointScheduler::pending_summary() const {
  if (!pending_.has_value()) return last_failed_;
  v1::CheckpointSummary s;
  s.set_id(pending_->request.id());
  s.set_state(v1::CHECKPOINT_STATE_PENDING);
  s.set_dir(pending_->request.dir());
  s.set_step(pending_->request.version());
  s.set_unix_time_ms(UnixMillis(pending_->started));
  uint64_t bytes = 0;
  for (const auto& [shard, r] : pending_->reports) bytes += ShardFileBytes(r);
  s.set_bytes(bytes);
  return s;
}

v1::CheckpointSummary CheckpointScheduler::SummaryOf(uint64_t id) const {
  if (pending_.has_value() && pending_->request.id() == id) return pending_summary();
  if (last_complete_.id() == id) return last_complete_;
  if (last_failed_.id() == id) return last_failed_;
  v1::CheckpointSummary s;
  s.set_id(id);
  return s;  // state UNSPECIFIED: superseded or unknown
}

void CheckpointScheduler::TakeOver(const v1::CoordinatorState& state,
                                   const std::optional<v1::CheckpointManifest>& newest) {
  if (newest.has_value())
    SetNewestComplete(*newest, state.last_checkpoint().dir(), state.checkpoints_completed());
  SetNextId(state.next_checkpoint_id());
  warnings_.assign(state.checkpoint_warnings().begin(), state.checkpoint_warnings().end());
}

void CheckpointScheduler::AddTo(v1::JobStatus* status) const {
  if (last_complete_.id() > 0) *status->mutable_last_checkpoint() = last_complete_;
  if (v1::CheckpointSummary pending = pending_summary(); pending.id() > 0)
    *status->mutable_pending_checkpoint() = std::move(pending);
  status->set_checkpoints_completed(completed_);
  for (const std::string& warning : warnings_) status->add_warnings(warning);
  if (!final_missing_.empty())
    status->add_warnings(absl::StrCat(
        "no final checkpoint (", final_missing_, "): the final weights are not on disk; ",
        last_complete_.id() > 0 ? absl::StrCat("the newest checkpoint is ", last_complete_.id(),
                                               " at step ", last_complete_.step())
                                : std::string("the job has no checkpoint")));
}

void CheckpointScheduler::ExportTo(v1::CoordinatorState* state) const {
  state->set_next_checkpoint_id(next_id_);
  if (last_complete_.id() > 0) *state->mutable_last_checkpoint() = last_complete_;
  state->set_checkpoints_completed(completed_);
  for (const std::string& warning : warnings_) state->add_checkpoint_warnings(warning);
}

}  // namespace grps
