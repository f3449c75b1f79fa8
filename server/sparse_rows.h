// SparseRows: the rows of one sparse table that one shard holds, each with
// its row-wise optimizer state (momentum velocity, Adam's moments and update
// count, AdaGrad's accumulator: dim floats, or one with rowwise_adagrad),
// created on first use from the table's
// deterministic initializer (job/sparse_tables.h). An update touches only
// the rows of its gradient ("lazy" optimizers: a row's state moves only when
// the row is updated, and Adam's bias correction counts that row's own
// updates).
//
// Memory: rows live in blocks of kRowsPerBlock (values and optimizer state
// in one flat array, each row's id and counters in another), so growing the
// table never moves existing rows; an open-addressing index of 4-byte slot
// numbers finds them (row_index.h). bytes() counts all of it: with
// row-wise AdaGrad a row of 16 costs about 90 bytes (64 of values).
//
// A managed table (SparseTableSpec.eviction, admit_after,
// evict_after_updates set) manages its own rows: a pull creates none (a row
// not held reads as its initializer's values), an update creates its rows
// (once admitted: the admit_after-th update naming the id), and after each
// update the rows past the capacity (least recently or least often
// updated, ties by id) and, every few updates, those idle too long leave,
// with the ids waiting for admission likewise. Every decision reads only
// the sequence of updates and the table's clock (its updates here), never
// the pulls or their timing: in sync, the same run keeps the same rows.
// Evicting down to max_rows_per_shard - max_rows_per_shard / 16 at once
// keeps the cost of choosing (linear in the rows) off most updates.
//
// Thread safety: none; the owner (a ShardStore table) calls it under the
// table's lock.
#ifndef GRPS_SERVER_SPARSE_ROWS_H_
#define GRPS_SERVER_SPARSE_ROWS_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/types/span.h"
#include "proto/grps.pb.h"
#include "server/consistency_policy.h"
#include "server/row_index.h"
#include "tensor/backend.h"

namespace grps {

class SparseRows {
 public:
  static constexpr uint32_t kRowsPerBlock = 4096;

  // `spec` and `optimizer` must be valid (ValidateJobConfig); `backend` runs
  // the optimizer updates and must outlive this.
  SparseRows(const v1::SparseTableSpec& spec, const v1::OptimizerConfig& optimizer, uint64_t seed,
             Backend* backend);
  SparseRows(const SparseRows&) = delete;
  SparseRows& operator=(const SparseRows&) = delete;

  // A managed table's counts since this object was made (or Cleared).
  struct Managed {
    uint64_t evicted = 0;   // rows that left, past the capacity or idle
    uint64_t admitted = 0;  // rows created by their admit_after-th update
    uint64_t dropped = 0;   // row gradients dropped before admission
  };

  uint32_t dim() const { return dim_; }
  uint64_t size() const { return index_.size(); }
  bool managed() const { return managed_; }
  const Managed& managed_counts() const { return counts_; }
  uint64_t pending() const { return pending_.size(); }

  // Whether the rows of `ids` that do not exist yet fit: FAILED_PRECONDITION
  // when creating them would take the shard past the table's
  // max_rows_per_shard: the table is full, and sending the request again
  // will not help (unlike RESOURCE_EXHAUSTED, which clients retry as a shard
  // short of memory for calls). `ids` may repeat. A managed table is never
  // full. Looks ids up only when the table has a limit.
  absl::Status CheckRoom(absl::Span<const int64_t> ids) const;
  // CheckRoom, then creates the rows of `ids` that do not exist yet: all or
  // none. A managed table creates nothing here.
  absl::Status Ensure(absl::Span<const int64_t> ids);

  // Copies the rows of `ids` to out, dim floats each, in order, and counts
  // each as a pull of that row. A row missing is created (CheckRoom says
  // whether they fit); in a managed table, one not held reads as its
  // initializer's values and is not created.
  void Read(absl::Span<const int64_t> ids, float* out);

  // One optimizer update of the gradient's rows (grad.ids distinct; rows
  // missing are created first, past any limit: Ensure decides the limit
  // before a push is accepted) at learning rate `lr`. A managed table
  // creates only the rows admitted, then evicts (above). With push_taken
  // the gradient is a push applied as it is taken (async): its rows are also
  // counted as TakePush counts them, in the same walk.
  void Apply(const GradientRef& grad, float lr, bool push_taken = false);

  // A push of the rows of `ids` taken: creates those missing (CheckRoom
  // says whether they fit; a managed table creates none here) and counts a
  // push of each row held (for hottest_share).
  void TakePush(absl::Span<const int64_t> ids);

  // Memory held by the rows: values, optimizer state, counters, the index.
  uint64_t bytes() const;

  // The share of row traffic (pushes and pulls) that went to the hottest 1%
  // of the rows (at least one row); estimated from an even sample of
  // kHotSample rows when there are more. 0 when there was no traffic.
  static constexpr uint64_t kHotSample = 65536;
  double hottest_share() const;

  // Drops every row (a restore to the initial values).
  void Clear();

  // The rows as a checkpoint keeps them (v1::TableState): dim, ids in slot
  // order, values, the optimizer state slots and each row's update count.
  // The name, version and marks are the owner's; the traffic counters are
  // not kept.
  void Save(v1::TableState* out) const;

  // Incremental checkpoints: what changed since the last ForgetChanges (or
  // Load or Clear), noted only once set_track_changes(true) was called (a
  // job of incremental checkpoints: otherwise the ids that left would pile
  // up with nothing to take them). SaveChanged writes as Save does, but only the rows
  // created or updated since, and in removed_ids the ids that left since
  // (sorted); the clock and the ids waiting for admission whole. Applied to
  // the state saved then (checkpoint/ MergeTableDelta) it gives Save's
  // state now. ForgetChanges starts counting again.
  void SaveChanged(v1::TableState* out) const;
  void ForgetChanges();
  void set_track_changes(bool on) {
    track_changes_ = on;
    ForgetChanges();
  }
  // The rows created or updated since (tests, logs).
  uint64_t changed_rows() const;

  // Replaces every row with the rows of `state`, exactly as Save wrote
  // them. INVALID_ARGUMENT naming the table when the state does not
  // fit (dim, sizes, optimizer slots, an id twice), FAILED_PRECONDITION when
  // it holds more rows than max_rows_per_shard (a managed table evicts
  // instead); the caller then drops this object (a failed load leaves it
  // half filled).
  absl::Status Load(const v1::TableState& state);

  // A zero gradient of this table's shape, for the consistency policies.
  std::unique_ptr<GradientBuffer> NewBuffer() const;

  // The value of a row, or null if it does not exist (tests).
  const float* TEST_Row(int64_t id) const;

 private:
  // A row's id and counters, beside its values.
  struct SlotMeta {
    int64_t id = 0;
    uint32_t updates = 0;  // the row's updates (Adam's t)
    uint32_t traffic = 0;  // pushes + pulls, saturating
  };

  // The slot of `id`, creating the row if needed (in a free slot first).
  uint32_t SlotOf(int64_t id);
  // A slot past the last one (a new block when needed); its row unset.
  uint32_t NewSlot();
  // The index's view of the ids by slot.
  struct IdsBySlot {
    const SparseRows* rows;
    int64_t operator()(uint32_t slot) const { return rows->MetaAt(slot).id; }
  };
  IdsBySlot IdOf() const { return IdsBySlot{this}; }
  // Calls found(i, the slot of ids[i] if held) for each i in order, the
  // index's entries and the rows' ids (with their counts) prefetched ahead
  // (RowIndex::ForEach), and the rows themselves where `found` reads them
  // (kRows: not for a walk that reads only ids and counts, where those
  // lines would be fetched for nothing). `found` may create and remove rows.
  enum class Reads { kMeta, kRows };
  template <typename Found>
  void ForEachSlot(absl::Span<const int64_t> ids, Reads reads, Found found) const {
    index_.ForEach(
        ids, IdOf(),
        [this, reads](uint32_t slot) {
          __builtin_prefetch(&MetaAt(slot));
          if (reads == Reads::kMeta) return;
          const float* row = RowAt(slot);
          __builtin_prefetch(row);
          __builtin_prefetch(row + stride_ - 1);
        },
        found);
  }
  bool Held(int64_t id) const { return index_.Find(id, IdOf()).has_value(); }
  void CountTraffic(uint32_t slot) {
    uint32_t& t = MetaAt(slot).traffic;
    if (t != UINT32_MAX) ++t;
  }
  // A managed table's update of row `id` (at `clock_` + 1): its slot, or
  // none while the id waits for admission.
  std::optional<uint32_t> AdmittedSlot(int64_t id);
  // One step of row-wise AdaGrad (SparseTableSpec.rowwise_adagrad) on a row
  // and its one accumulator.
  void RowwiseAdagradStep(float lr, float* row, const float* grad, float* accum) const;
  // A managed table's evictions after an update (class comment).
  void EvictIdle();
  void EvictPastCapacity();
  void BoundPending();
  // Frees row `slot` (its id leaves the index; the slot is reused).
  void Remove(uint32_t slot);
  // Marks row `slot` as created or updated (SaveChanged).
  void MarkChanged(uint32_t slot) {
    if (!track_changes_) return;
    if (slot / 64 >= changed_.size()) changed_.resize(slot / 64 + 1, 0);
    changed_[slot / 64] |= uint64_t{1} << (slot % 64);
  }
  bool Changed(uint32_t slot) const {
    return slot / 64 < changed_.size() && (changed_[slot / 64] >> (slot % 64) & 1) != 0;
  }
  // The held rows' slots in slot order.
  std::vector<uint32_t> HeldSlots() const;
  // Save's body for the rows of `slots`.
  void SaveSlots(const std::vector<uint32_t>& slots, v1::TableState* out) const;
  SlotMeta& MetaAt(uint32_t slot) { return meta_[slot / kRowsPerBlock][slot % kRowsPerBlock]; }
  const SlotMeta& MetaAt(uint32_t slot) const {
    return meta_[slot / kRowsPerBlock][slot % kRowsPerBlock];
  }
  float* RowAt(uint32_t slot) {
    return blocks_[slot / kRowsPerBlock].get() +
           static_cast<size_t>(slot % kRowsPerBlock) * stride_;
  }
  const float* RowAt(uint32_t slot) const {
    return blocks_[slot / kRowsPerBlock].get() +
           static_cast<size_t>(slot % kRowsPerBlock) * stride_;
  }

  const v1::SparseTableSpec spec_;
  const v1::OptimizerConfig optimizer_;
  const uint64_t seed_;
  Backend* const backend_;
  const uint32_t dim_;
  const uint32_t slots_;        // optimizer state vectors per row (0, 1 or 2)
  const uint32_t state_width_;  // floats per state vector: dim, or 1 (row-wise AdaGrad)
  const size_t stride_;         // floats per row: values, then each state vector
  const bool managed_;    // eviction, admit_after or evict_after_updates set
  RowIndex index_;
  std::vector<std::unique_ptr<float[]>> blocks_;
  std::vector<std::unique_ptr<SlotMeta[]>> meta_;  // by block, as blocks_
  uint32_t slots_used_ = 0;                         // slots handed out
  uint64_t total_traffic_ = 0;
  // A managed table's: by slot, the clock at its row's last update; the
  // free slots; the clock; the ids waiting for admission.
  struct Pending {
    uint32_t count = 0;
    int64_t last = 0;
  };
  std::vector<int64_t> last_;
  std::vector<uint32_t> free_;
  int64_t clock_ = 0;
  absl::flat_hash_map<int64_t, Pending> pending_;
  Managed counts_;
  // Since the last ForgetChanges: by slot, one bit a row created or
  // updated; the ids that left.
  bool track_changes_ = false;
  std::vector<uint64_t> changed_;
  absl::flat_hash_set<int64_t> removed_;
};

}  // namespace grps

#endif  // GRPS_SERVER_SPARSE_ROWS_H_
