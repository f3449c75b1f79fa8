// The durability part of a ShardStore (docs/durability.md): capturing the
// shard's part of a checkpoint, and the checks and resets of a restore.
//
// Capture. Each target (chunk or table) joins a checkpoint as its policy's
// Cut says: its state (values, optimizer state, version, dedup marks as the
// policy's KeepMark keeps them) is copied now, or, in sync, armed and copied
// inside the update that brings it to the checkpoint's version, before any
// later update, so every chunk and table of the shard is cut at the same
// step without pausing training. CheckpointCapture arms and collects; a
// newer arm supersedes an older one, whose collection then returns ABORTED.
//
// Restore. MatchChunkStates and LoadTableStates check a checkpoint's states
// against the targets and load the tables' rows, before any lock is taken;
// ResetTargets then moves every target to them with all locks held.
//
// Thread safety: CheckpointCapture's methods may be called from any thread.
// Lock order: the capture's mutex before a target's.
#ifndef GRPS_SERVER_SHARD_CHECKPOINT_H_
#define GRPS_SERVER_SHARD_CHECKPOINT_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "proto/grps.pb.h"
#include "server/consistency_policy.h"
#include "server/sparse_rows.h"
#include "server/store_targets.h"

namespace grps {

class CheckpointCapture {
 public:
  // What a capture reads of its shard; everything outlives the capture.
  struct Shard {
    std::string job_id;
    uint32_t shard = 0;
    std::vector<StoreTarget*> targets;  // chunks (ascending id), then tables
    // A capture gives up when the generation changes (a restore) or the
    // shard shuts down.
    const std::atomic<uint64_t>* generation = nullptr;
    const std::atomic<bool>* shutdown = nullptr;
  };
  explicit CheckpointCapture(Shard shard) : shard_(std::move(shard)) {}

  // Copies the targets that join `request` now and arms the others, without
  // waiting; disarms an earlier capture. FAILED_PRECONDITION naming the
  // target that is past the checkpoint's version (nothing stays armed).
  // `changes_only`: each table captures the rows changed since its previous
  // capture (an incremental checkpoint on top of the previous one, which the
  // caller knows to be whole and written).
  absl::Status Arm(const v1::CheckpointRequest& request, bool changes_only = false)
      ABSL_LOCKS_EXCLUDED(mu_);
  // Waits for the armed targets of checkpoint `id` and returns the shard's
  // file. ABORTED when another checkpoint has been armed since or the shard
  // was restored meanwhile, DEADLINE_EXCEEDED naming a target that has not
  // reached the version by `deadline`, UNAVAILABLE after shutdown.
  absl::StatusOr<v1::ShardCheckpointFile> Collect(uint64_t id, absl::Time deadline)
      ABSL_LOCKS_EXCLUDED(mu_);

 private:
  // Ends every target's capture (a failed or superseded checkpoint).
  void DisarmAll();

  const Shard shard_;
  absl::Mutex mu_;
  std::optional<v1::CheckpointRequest> armed_ ABSL_GUARDED_BY(mu_);
  uint64_t armed_generation_ ABSL_GUARDED_BY(mu_) = 0;
  // Bumped by every Arm: a collection of an older one gives up.
  std::atomic<uint64_t> epoch_{0};
};

// Checks `states` (a checkpoint's, any order; empty: back to the initial
// values) against `chunks` (ascending id): by chunk, its state (null for
// none). INVALID_ARGUMENT when a state is missing, twice, or does not fit
// its chunk; states of other shards' chunks are skipped.
absl::StatusOr<std::vector<const v1::ChunkState*>> MatchChunkStates(
    const std::vector<std::unique_ptr<StoreChunk>>& chunks,
    const std::vector<v1::ChunkState>& states);

// A table's state from a checkpoint, its rows loaded (null: no rows).
struct LoadedTable {
  const v1::TableState* state = nullptr;
  std::unique_ptr<SparseRows> rows;
};
// Each table's rows from `states`, loaded into new SparseRows (by table
// index) and checked: INVALID_ARGUMENT for a table the job has not, one
// twice, a row out of range or of another shard, or (when `required`) a
// table missing; the rows' own refusals (SparseRows::Load).
absl::StatusOr<std::vector<LoadedTable>> LoadTableStates(
    const std::vector<std::unique_ptr<StoreTable>>& tables, uint32_t shard,
    uint32_t num_servers, const std::vector<v1::TableState>& states, bool required);

// With every target's lock held: each chunk and table back to its matched
// state (or its initial one), the mode's pending state dropped, ssp's
// clocks at `resume_steps`, and the policies told the live set.
absl::Status ResetTargets(const std::vector<std::unique_ptr<StoreChunk>>& chunks,
                          absl::Span<const v1::ChunkState* const> chunk_states,
                          const std::vector<std::unique_ptr<StoreTable>>& tables,
                          std::vector<LoadedTable> table_states, const v1::ShardMap& map,
                          const v1::JobConfig& config, absl::Span<const uint64_t> resume_steps,
                          const LiveSet& live);

}  // namespace grps

#endif  // GRPS_SERVER_SHARD_CHECKPOINT_H_
