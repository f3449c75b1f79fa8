// The targets of a ShardStore: what one gradient updates, under one lock.
// A StoreTarget is a dense chunk (StoreChunk) or a sparse table's rows on
// the shard (StoreTable); each has its version, its mode's ChunkPolicy, the
// dedup marks by rank, its counters, and its checkpoint capture.
//
// Thread safety: every member past the constants is guarded by the target's
// `mu`, and the policy is called with it held. TargetLocks is the only way
// to hold several targets' locks at once.
#ifndef GRPS_SERVER_STORE_TARGETS_H_
#define GRPS_SERVER_STORE_TARGETS_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/types/span.h"
#include "proto/grps.pb.h"
#include "server/chunk_optimizer.h"
#include "server/consistency_policy.h"
#include "server/shard_status.h"
#include "server/sparse_rows.h"
#include "tensor/backend.h"

namespace grps {

// The newest push of one rank accepted for one target (deduplication).
struct AcceptedMark {
  bool valid = false;
  uint64_t incarnation = 0;
  uint64_t step = 0;
};

class StoreTarget : public UpdateTarget {
 public:
  // `order`: where the target's lock comes in the lock order (TargetLocks).
  StoreTarget(uint64_t order, std::string name, const v1::JobConfig& config);

  uint64_t version() const override ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) { return version_; }
  // The update, then the capture of a checkpoint armed for the new version
  // (before any later update), then the staleness counters.
  void Apply(const GradientRef& grad, const UpdateStep& step, int64_t staleness) final
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);

  // Checkpoint capture: Capture keeps the state as it is now (the dedup
  // marks as the policy's KeepMark says; a table's rows changed since its
  // previous capture only when capture_changes is set), TakeCapture moves a
  // kept state into the file (false when there is none yet), Disarm forgets
  // it and any capture armed (capture_at).
  void Capture() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  bool TakeCapture(v1::ShardCheckpointFile* file) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  void Disarm() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);

  const uint64_t order;
  const std::string name;  // "chunk 3", "table 'emb'": for messages
  absl::Mutex mu;

  std::unique_ptr<ChunkPolicy> policy ABSL_GUARDED_BY(mu);
  std::vector<AcceptedMark> marks ABSL_GUARDED_BY(mu);  // by rank
  TargetCounters counters ABSL_GUARDED_BY(mu);
  // An armed capture: the version at which Apply captures (0: none), and
  // the state captured, until collected.
  uint64_t capture_at ABSL_GUARDED_BY(mu) = 0;
  bool capture_changes ABSL_GUARDED_BY(mu) = false;
  std::optional<v1::ShardCheckpointFile> captured ABSL_GUARDED_BY(mu);
  // A chunk of a user model's "given" tensor that has no values yet: no
  // pull is served and no gradient taken until worker rank 0's come.
  bool awaiting_values ABSL_GUARDED_BY(mu) = false;

 protected:
  // Back to the start of a (restored) generation: a new policy, no marks,
  // no capture.
  void ResetEngine(const v1::JobConfig& config, absl::Span<const uint64_t> resume_steps)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  // The optimizer update itself.
  virtual void Update(const GradientRef& grad, const UpdateStep& step)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) = 0;
  // Adds this target's state now to `into`, for a checkpoint, and starts
  // counting changes again: with `changes_only`, a table's rows created,
  // updated or removed since its previous snapshot (SparseRows::SaveChanged)
  // rather than all of them; a chunk is always whole.
  virtual void SnapshotInto(v1::ShardCheckpointFile* into, bool changes_only)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) = 0;
  // The dedup marks as a checkpoint keeps them (ChunkPolicy::KeepMark), and
  // the steps from which ranks must compute again.
  void SnapshotMarks(google::protobuf::RepeatedPtrField<v1::DedupMark>* out,
                     google::protobuf::Map<uint32_t, uint64_t>* held_from) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  void LoadMarks(const google::protobuf::RepeatedPtrField<v1::DedupMark>& saved)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  // The state's counters as a checkpoint keeps them: the pushes of the
  // gradients it does not hold (ChunkPolicy::NotKept) left out.
  void SnapshotCounters(v1::StateCounters* out) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);

  uint64_t version_ ABSL_GUARDED_BY(mu) = 0;
};

// One dense chunk: its values and optimizer.
class StoreChunk final : public StoreTarget {
 public:
  // `backend` must be a host-memory one; the values start uninitialized.
  StoreChunk(uint32_t id, uint64_t num_elements, std::unique_ptr<Backend> backend,
             const v1::JobConfig& config);
  // The policy's buffers came from the backend: they go first.
  ~StoreChunk() override;

  uint64_t num_elements() const { return num_elements_; }
  std::unique_ptr<GradientBuffer> NewBuffer() override;

  // Replaces the state with `state` (checked by MatchChunkStates), or with
  // the initial values at version 0 when null (a "given" tensor's: those
  // rank 0 gave, or none yet); drops the mode's pending state.
  absl::Status Reset(const v1::ChunkState* state, const v1::ChunkSpec& spec,
                     const v1::TensorSpec& tensor, const v1::JobConfig& config,
                     absl::Span<const uint64_t> resume_steps) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);

  // A "given" tensor's initial values, from worker rank 0: taken (true)
  // while the chunk awaits them, and kept for a roll-back to step 0;
  // ignored (false) once it has values.
  bool Give(absl::Span<const float> initial) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);

  // The updates the optimizer has counted (Adam's bias correction): the
  // chunk's version, plus the steps of a loaded state.
  uint64_t OptimizerSteps() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    return static_cast<uint64_t>(static_cast<int64_t>(version()) + step_offset_);
  }
  // A program's saved optimizer state (`slots` checked by the caller) that
  // had counted `steps` updates, in place of this chunk's.
  void LoadOptimizerState(const std::vector<const std::string*>& slots, uint64_t steps)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);

  const uint32_t id;

 protected:
  void Update(const GradientRef& grad, const UpdateStep& step) override
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  void SnapshotInto(v1::ShardCheckpointFile* into, bool changes_only) override
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);

 private:
  const uint64_t num_elements_;
  // Declared before the buffers, which it allocated and must outlive.
  const std::unique_ptr<Backend> backend_;

 public:
  DeviceBuffer values ABSL_GUARDED_BY(mu);
  std::unique_ptr<ChunkOptimizer> optimizer ABSL_GUARDED_BY(mu);

 private:
  std::vector<float> given_ ABSL_GUARDED_BY(mu);  // Give's values; empty before
  // OptimizerSteps() - version() (ChunkState.optimizer_step_offset).
  int64_t step_offset_ ABSL_GUARDED_BY(mu) = 0;
};

// One sparse table's rows on this shard. Locked after every chunk (its
// order is past every chunk id).
class StoreTable final : public StoreTarget {
 public:
  // `config` must outlive the table.
  StoreTable(uint32_t index, const v1::SparseTableSpec& spec, std::unique_ptr<Backend> backend,
             const v1::JobConfig& config);

  // Empty rows of this table (a restore fills them before taking the lock).
  std::unique_ptr<SparseRows> NewRows() const;
  std::unique_ptr<GradientBuffer> NewBuffer() override ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);

  // Back to `state` with its rows already loaded into `loaded` (Restore), or
  // to the initial values (no rows, version 0) when `state` is null.
  void Reset(const v1::TableState* state, std::unique_ptr<SparseRows> loaded,
             const v1::JobConfig& config, absl::Span<const uint64_t> resume_steps)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);

  const v1::SparseTableSpec spec;

 protected:
  void Update(const GradientRef& grad, const UpdateStep& step) override
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  void SnapshotInto(v1::ShardCheckpointFile* into, bool changes_only) override
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);

 private:
  const v1::JobConfig& config_;
  const std::unique_ptr<Backend> backend_;

 public:
  std::unique_ptr<SparseRows> rows ABSL_GUARDED_BY(mu);
  uint64_t rows_pushed ABSL_GUARDED_BY(mu) = 0;  // row gradients taken
  // The ids of the push being accepted in async mode (ShardStore::PushSparse),
  // else null: when the policy applies that very gradient, Update counts its
  // rows as taken (SparseRows::Apply's push_taken) and sets push_applied, so
  // that its rows are walked once, not twice (TakePush, then Apply).
  const int64_t* accepting_ids ABSL_GUARDED_BY(mu) = nullptr;
  bool push_applied ABSL_GUARDED_BY(mu) = false;
  uint64_t rows_pulled ABSL_GUARDED_BY(mu) = 0;  // rows served
};

// Holds the mutexes of distinct targets, taken in ascending order (chunk
// id, then tables) so that two multi-target holders never deadlock.
class TargetLocks {
 public:
  template <typename T>
  explicit TargetLocks(const std::vector<T*>& targets) : targets_(targets.begin(), targets.end()) {
    Lock();
  }
  ~TargetLocks() ABSL_NO_THREAD_SAFETY_ANALYSIS;
  TargetLocks(const TargetLocks&) = delete;
  TargetLocks& operator=(const TargetLocks&) = delete;

 private:
  void Lock() ABSL_NO_THREAD_SAFETY_ANALYSIS;
  std::vector<StoreTarget*> targets_;
};

}  // namespace grps

#endif  // GRPS_SERVER_STORE_TARGETS_H_
