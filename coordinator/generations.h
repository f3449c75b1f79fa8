// Generations: which generation the job runs in, the restore order that
// started it, the checkpoints a shard could not restore, and the generation
// each rank last heartbeated in. One of JobStateMachine's collaborators; not
// thread-safe (it is used under the machine's mutex).
//
// A job starts at generation 1 with the initial values (generation 0 is
// "unchecked" on the wire: a plain client's), one resumed from a checkpoint
// at 2. Each roll-back starts the next generation with an order to restore:
// the newest checkpoint that verifies on disk now (skipping the refused
// ones), a re-sharding's cut, or the initial values. A member whose request
// names an older generation has not followed the newest order yet.
#ifndef GRPS_COORDINATOR_GENERATIONS_H_
#define GRPS_COORDINATOR_GENERATIONS_H_

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "daemon/env.h"
#include "proto/grps.pb.h"

namespace grps {

class Generations {
 public:
  // `config` must be valid; `env` reads checkpoint_dir for roll-backs.
  Generations(const v1::JobConfig& config, Env* env);

  // The order the current generation restored (generation set).
  const v1::RestoreOrder& order() const { return order_; }
  uint64_t current() const { return order_.generation(); }
  // A member's request in `generation` is of a generation the job left
  // (0, a client that does not say, is taken as current).
  bool IsOlder(uint64_t generation) const { return generation > 0 && generation < current(); }

  // ---- Before serving ----
  // The job resumes from checkpoint `manifest` in `dir`: generation 2.
  void ResumeFrom(const v1::CheckpointManifest& manifest, const std::string& dir);
  // A persisted state's order and refused checkpoints (TakeOver).
  void TakeOver(const v1::CoordinatorState& state);
  void ExportTo(v1::CoordinatorState* state) const;

  // ---- Roll-backs ----
  // The order (generation not set) of the newest checkpoint in
  // checkpoint_dir that verifies now (with per-shard storage: its
  // manifest), skipping the refused ones, or the initial values. What is on
  // disk, any job's: a coordinator that took the job over from an older
  // state file may not know the newest, and the job may have resumed from
  // another's. Reads files: roll-backs are rare.
  v1::RestoreOrder NewestVerified() const;
  // The order (generation not set) to restore checkpoint `manifest` from `dir`.
  v1::RestoreOrder OrderFor(const v1::CheckpointManifest& manifest, const std::string& dir) const;
  // Starts the next generation with `order`; returns it (generation set).
  const v1::RestoreOrder& Next(v1::RestoreOrder order);
  // A member runs in `generation`, newer than the current one (a
  // coordinator that took over from an older state file): the count jumps
  // to it, so that the roll-back that follows (Next) goes past it. False,
  // and nothing changes, when it is not newer.
  bool JumpTo(uint64_t generation);
  // Shard `shard` could not restore checkpoint failed.id(). When that is
  // the current order's checkpoint it is refused for the rest of the job
  // and true is returned: the caller rolls back. A stale report is ignored.
  bool Refuse(uint32_t shard, const v1::ShardCheckpoint& failed);

  // ---- Workers ----
  // Rank `rank`'s incarnation heartbeated in `generation`.
  void NoteWorker(uint32_t rank, uint64_t incarnation, uint64_t generation);
  // Whether a WorkerDone is from before the newest roll-back: by its
  // generation, or for a client that names none, by its incarnation's last
  // heartbeat.
  bool StaleWorkerDone(const v1::WorkerDoneRequest& request) const;

 private:
  const uint32_t ranks_;
  const std::string checkpoint_dir_;
  const bool per_shard_;
  Env* const env_;
  v1::RestoreOrder order_;
  std::vector<uint64_t> refused_;
  // The (incarnation, generation) each rank last heartbeated in.
  std::map<uint32_t, std::pair<uint64_t, uint64_t>> rank_generation_;
};

}  // namespace grps

#endif  // GRPS_COORDINATOR_GENERATIONS_H_
