#include "coordinator/generations.h"

#include <limits>

#include "checkpoint/checkpoint.h"
#include "job/job_config.h"
#include "spdlog/spdlog.h"

namespace grps {

Generations::Generations(const v1::JobConfig& config, Env* env)
    : ranks_(JobRanks(config)),
      checkpoint_dir_(config.checkpoint_dir()),
      per_shard_(config.checkpoint_storage() == v1::CHECKPOINT_STORAGE_PER_SHARD),
      env_(env) {
  order_.set_generation(1);
  order_.mutable_worker_steps()->Resize(ranks_, 0);
}

void Generations::ResumeFrom(const v1::CheckpointManifest& manifest, const std::string& dir) {
  order_ = OrderFor(manifest, dir);
  order_.set_generation(2);
}

void Generations::TakeOver(const v1::CoordinatorState& state) {
  order_ = state.restore();
  order_.mutable_worker_steps()->Resize(ranks_, 0);
  refused_.assign(state.refused_checkpoints().begin(), state.refused_checkpoints().end());
}

void Generations::ExportTo(v1::CoordinatorState* state) const {
  *state->mutable_restore() = order_;
  state->mutable_refused_checkpoints()->Add(refused_.begin(), refused_.end());
}

v1::RestoreOrder Generations::NewestVerified() const {
  v1::RestoreOrder order;  // the initial values
  order.mutable_worker_steps()->Resize(ranks_, 0);
  if (checkpoint_dir_.empty()) return order;
  absl::StatusOr<CheckpointChoice> choice = FindNewestCheckpoint(
      env_, checkpoint_dir_, "",
      per_shard_ ? CheckpointFiles::kManifestOnly : CheckpointFiles::kEveryFile, refused_);
  if (!choice.ok()) {
    spdlog::error("roll-back: {}; back to the initial values",
                  std::string(choice.status().message()));
    return order;
  }
  for (const std::string& refused : choice->refused)
    spdlog::warn("roll-back: checkpoint refused: {}", refused);
  if (!choice->manifest.has_value()) {
    spdlog::error("roll-back: no checkpoint in {} verifies; back to the initial values",
                  checkpoint_dir_);
    return order;
  }
  return OrderFor(*choice->manifest, choice->dir);
}

v1::RestoreOrder Generations::OrderFor(const v1::CheckpointManifest& manifest,
                                       const std::string& dir) const {
  v1::RestoreOrder order;
  order.set_checkpoint_id(manifest.id());
  order.set_dir(dir);
  order.set_step(manifest.step());
  for (uint32_t r = 0; r < ranks_; ++r)
    order.add_worker_steps(r < static_cast<uint32_t>(manifest.worker_steps_size())
                               ? manifest.worker_steps(r)
                               : manifest.step());
  if (per_shard_) *order.mutable_manifest() = manifest;
  return order;
}

const v1::RestoreOrder& Generations::Next(v1::RestoreOrder order) {
  order.set_generation(current() + 1);
  order_ = std::move(order);
  return order_;
}

bool Generations::JumpTo(uint64_t generation) {
  // The largest generation could not be rolled past.
  if (generation <= current() || generation == std::numeric_limits<uint64_t>::max())
    return false;
  order_.set_generation(generation);
  return true;
}

bool Generations::Refuse(uint32_t shard, const v1::ShardCheckpoint& failed) {
  if (failed.id() == 0 || failed.id() != order_.checkpoint_id()) return false;
  refused_.push_back(failed.id());
  spdlog::error("server of shard {} cannot restore checkpoint {}: {}; the checkpoint is "
                "refused for the rest of the job",
                shard, failed.id(), failed.error());
  return true;
}

void Generations::NoteWorker(uint32_t rank, uint64_t incarnation, uint64_t generation) {
  rank_generation_[rank] = {incarnation, generation};
}

bool Generations::StaleWorkerDone(const v1::WorkerDoneRequest& request) const {
  if (request.generation() > 0) return IsOlder(request.generation());
  auto it = rank_generation_.find(request.worker_rank());
  return it != rank_generation_.end() && it->second.first == request.incarnation() &&
         IsOlder(it->second.second);
}

}  // namespace grps
