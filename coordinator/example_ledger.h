// ExampleLedger: which examples of each epoch an elastic job's workers
// have trained, and which each worker holds now.
//
// An elastic job (JobConfig.max_workers) does not split its data by rank:
// the coordinator leases it out. Each epoch's examples, in the epoch's
// shuffled order, are cut into blocks of one worker step's examples
// (ExampleLedgerShape); a worker leases a few blocks at a time, trains one
// per step, and reports each trained block with its step. The blocks of a
// worker that leaves, dies or registers again come back and are leased
// again, lowest first, before any new block. So whatever the live set does,
// each block of each epoch is trained once: by the worker that held its
// lease when its gradient was pushed.
//
// A coordinator that takes the job over imports the ledger from its state
// file, which may miss the last leases and reports. The blocks past the
// state's last lease, up to kLimboBlocks of them, are in limbo: the workers
// re-send their recent reports and the blocks they hold with every lease
// (Claim), which takes them out of limbo as trained or leased; what is
// still in limbo is leased last, once no other block is left, and not
// while the holder holds the limbo (HoldLimbo: until every live worker has
// called once since the take-over).
//
// What breaks "once": a worker killed after it pushed a block's gradient and
// before it reported the block (its lease comes back and the block is
// trained again: at most the blocks of one report interval), and a report
// for a block the rank no longer holds (counted, refused_reports). A block
// whose lease comes back after every other worker finished is not trained.
//
// Not thread-safe: the JobStateMachine's mutex guards it.
#ifndef GRPS_COORDINATOR_EXAMPLE_LEDGER_H_
#define GRPS_COORDINATOR_EXAMPLE_LEDGER_H_

#include <cstdint>
#include <map>
#include <set>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "job/job_config.h"
#include "proto/grps.pb.h"

namespace grps {

class ExampleLedger {
 public:
  // At most this many blocks are leased, and reported, per request.
  static constexpr uint32_t kMaxWant = 64;
  static constexpr int kMaxReports = 1024;
  // Blocks a rank holds, leased and not reported, beyond which it is leased
  // none until it reports (a worker holds one lease of 8, and the blocks of
  // the steps its loader prepared ahead).
  static constexpr uint64_t kMaxHeld = 2 * kMaxWant;
  // Blocks put in limbo by an import (at most; fewer near the end).
  static constexpr uint64_t kLimboBlocks = 1 << 14;
  // A training set's examples, and a ledger's blocks, at most.
  static constexpr uint64_t kMaxTrainExamples = uint64_t{1} << 40;
  static constexpr uint64_t kMaxBlocks = uint64_t{1} << 32;

  // The shape of `config`'s ledger for a worker that loaded `train_examples`
  // (ExampleLedgerShape), computed without overflow. INVALID_ARGUMENT for
  // train_examples 0, above kMaxTrainExamples or above the job's
  // dataset.train_limit, or a ledger of more than kMaxBlocks blocks.
  static absl::StatusOr<LedgerShape> ShapeFor(const v1::JobConfig& config,
                                              uint64_t train_examples);

  // Everything a lease request could be refused for by a ledger of `shape`
  // (the shape this one has, or will have once sized): want, the number of
  // reported and held blocks, each block in range. A request that passes is
  // refused by neither Claim nor Lease, so that it is checked whole before
  // anything changes.
  static absl::Status CheckRequest(const LedgerShape& shape,
                                   const v1::LeaseExamplesRequest& request);

  // Sizes the ledger (the first worker's training set decides); an equal
  // shape later is OK, another FAILED_PRECONDITION. INVALID_ARGUMENT for an
  // empty shape.
  absl::Status Size(LedgerShape shape);
  // What Size would answer, changing nothing.
  absl::Status CheckSize(const LedgerShape& shape) const;
  bool sized() const { return shape_.total_blocks > 0; }
  uint64_t blocks_per_epoch() const { return shape_.blocks_per_epoch; }

  // Records `trained` for `rank` (a block the rank does not hold is counted
  // in refused_reports; one it already reported is ignored), then leases it
  // up to `want` blocks, the returned ones first, ascending, at most its
  // share of what is left when `sharing` workers share it (rounded up), so
  // that the workers run out within a block of each other, and no more than
  // keep it within kMaxHeld held. `*exhausted` when it wanted some and none
  // is left to lease. INVALID_ARGUMENT for a block out of range, more than
  // kMaxReports reports or want > kMaxWant; FAILED_PRECONDITION before
  // Size. On error nothing changes.
  absl::StatusOr<std::vector<uint64_t>> Lease(uint32_t rank,
                                              absl::Span<const v1::TrainedBlock> trained,
                                              uint32_t want, bool* exhausted,
                                              uint32_t sharing = 1);

  // Blocks the rank says it holds: those in limbo become its leases; the
  // others are left as they are (INVALID_ARGUMENT for a block out of range
  // or more than kMaxReports, and nothing changes).
  absl::Status Claim(uint32_t rank, absl::Span<const uint64_t> held);

  // While `hold`, no block in limbo is leased (a lease that finds nothing
  // else gets none, and is not exhausted).
  void HoldLimbo(bool hold) { hold_limbo_ = hold; }
  bool holding_limbo() const { return hold_limbo_ && !limbo_.empty(); }

  // The rank's leases come back (it left, died or registered again).
  void ReturnLeases(uint32_t rank);

  // A roll-back: rank r trains again from resume_steps[r] (0 past the
  // vector's end), so its blocks trained at that step or later come back;
  // so does every lease (the workers drop theirs).
  void RollBack(const std::vector<uint64_t>& resume_steps);

  v1::DataProgress Progress() const;
  // Blocks the rank holds now.
  uint64_t LeasedBy(uint32_t rank) const;

  void ExportTo(v1::ExampleLedgerState* state) const;
  // INVALID_ARGUMENT for a state that is not a ledger's (nothing changes).
  absl::Status ImportFrom(const v1::ExampleLedgerState& state);
  // After ImportFrom by a coordinator that took the job over: the state may
  // miss the last leases, so the next kLimboBlocks blocks (fewer near the
  // end) go to limbo rather than to the next lease.
  void LimboAfterTakeOver();

 private:
  enum class Kind : uint8_t { kFree, kLeased, kTrained, kLimbo };
  struct Block {
    Kind kind = Kind::kFree;
    uint32_t rank = 0;  // leased or trained by
    uint64_t step = 0;  // trained at
  };

  void Free(uint64_t block);

  LedgerShape shape_;
  std::vector<Block> blocks_;  // [0, next_new): handed out at least once
  std::set<uint64_t> free_;    // came back, to lease again first
  std::set<uint64_t> limbo_;   // fate unknown after an import: leased last
  std::map<uint32_t, std::set<uint64_t>> leases_;  // by rank
  uint64_t trained_ = 0;
  uint64_t leased_ = 0;
  bool hold_limbo_ = false;
  mutable uint64_t lowest_untrained_ = 0;  // advanced lazily by Progress
  uint64_t returned_ = 0;
  uint64_t refused_reports_ = 0;
};

}  // namespace grps

#endif  // GRPS_COORDINATOR_EXAMPLE_LEDGER_H_
