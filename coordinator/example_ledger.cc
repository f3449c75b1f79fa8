#include "coordinator/example_ledger.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"

namespace grps {

namespace {

// INVALID_ARGUMENT for more than kMaxReports trained blocks or one out of
// `shape`'s range. `Trained`: a container of v1::TrainedBlock.
template <typename Trained>
absl::Status CheckReports(const LedgerShape& shape, const Trained& trained) {
  if (static_cast<size_t>(trained.size()) > static_cast<size_t>(ExampleLedger::kMaxReports))
    return absl::InvalidArgumentError(absl::StrCat(
        "at most ", ExampleLedger::kMaxReports, " trained blocks per report, not ",
        trained.size()));
  for (const v1::TrainedBlock& t : trained)
    if (t.block() >= shape.total_blocks)
      return absl::InvalidArgumentError(absl::StrCat(
          "trained block ", t.block(), " is out of range; the job has ", shape.total_blocks));
  return absl::OkStatus();
}

// The same for held blocks. `Held`: a container of uint64_t.
template <typename Held>
absl::Status CheckHeld(const LedgerShape& shape, const Held& held) {
  if (static_cast<size_t>(held.size()) > static_cast<size_t>(ExampleLedger::kMaxReports))
    return absl::InvalidArgumentError(absl::StrCat(
        "at most ", ExampleLedger::kMaxReports, " held blocks per request, not ", held.size()));
  for (uint64_t block : held)
    if (block >= shape.total_blocks)
      return absl::InvalidArgumentError(absl::StrCat(
          "held block ", block, " is out of range; the job has ", shape.total_blocks));
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<LedgerShape> ExampleLedger::ShapeFor(const v1::JobConfig& config,
                                                    uint64_t train_examples) {
  if (train_examples == 0)
    return absl::InvalidArgumentError("train_examples must be the examples the worker loaded");
  if (train_examples > kMaxTrainExamples)
    return absl::InvalidArgumentError(absl::StrCat(
        "train_examples ", train_examples, " is more than ", kMaxTrainExamples, " (2^40)"));
  const uint64_t limit = config.dataset().train_limit();
  if (limit > 0 && train_examples > limit)
    return absl::InvalidArgumentError(absl::StrCat(
        "train_examples ", train_examples, " is more than the job's train_limit ", limit));
  const LedgerShape shape = ExampleLedgerShape(config, train_examples);
  // ExampleLedgerShape's product again, checked: steps x workers, or
  // blocks_per_epoch x epochs.
  uint64_t total = 0;
  const bool overflow =
      config.steps() > 0
          ? __builtin_mul_overflow(config.steps(),
                                   std::max<uint64_t>(1, config.num_workers()), &total)
          : __builtin_mul_overflow(shape.blocks_per_epoch,
                                   std::max<uint64_t>(1, config.epochs()), &total);
  if (overflow || total > kMaxBlocks)
    return absl::InvalidArgumentError(absl::StrCat(
        "train_examples ", train_examples, " makes a ledger of more than ", kMaxBlocks,
        " blocks (2^32) for this job"));
  return shape;
}

absl::Status ExampleLedger::CheckRequest(const LedgerShape& shape,
                                         const v1::LeaseExamplesRequest& request) {
  if (request.want() > kMaxWant)
    return absl::InvalidArgumentError(
        absl::StrCat("want ", request.want(), " is more than ", kMaxWant));
  if (absl::Status s = CheckReports(shape, request.trained()); !s.ok()) return s;
  return CheckHeld(shape, request.held());
}

absl::Status ExampleLedger::CheckSize(const LedgerShape& shape) const {
  if (shape.blocks_per_epoch == 0 || shape.total_blocks == 0)
    return absl::InvalidArgumentError("the example ledger needs at least one block");
  if (!sized() || (shape.blocks_per_epoch == shape_.blocks_per_epoch &&
                   shape.total_blocks == shape_.total_blocks))
    return absl::OkStatus();
  return absl::FailedPreconditionError(absl::StrCat(
      "this worker's training set makes ", shape.total_blocks, " blocks, ",
      shape.blocks_per_epoch, " per epoch; the job's ledger has ", shape_.total_blocks, ", ",
      shape_.blocks_per_epoch, " per epoch (every worker must load the same training set)"));
}

absl::Status ExampleLedger::Size(LedgerShape shape) {
  if (absl::Status s = CheckSize(shape); !s.ok()) return s;
  shape_ = shape;
  return absl::OkStatus();
}

absl::StatusOr<std::vector<uint64_t>> ExampleLedger::Lease(
    uint32_t rank, absl::Span<const v1::TrainedBlock> trained, uint32_t want,
    bool* exhausted, uint32_t sharing) {
  *exhausted = false;
  if (!sized()) return absl::FailedPreconditionError("the example ledger is not sized yet");
  if (want > kMaxWant)
    return absl::InvalidArgumentError(absl::StrCat("want must be at most ", kMaxWant));
  if (absl::Status s = CheckReports(shape_, trained); !s.ok()) return s;
  for (const v1::TrainedBlock& t : trained) {
    if (t.block() >= blocks_.size()) {
      ++refused_reports_;
      continue;
    }
    Block& b = blocks_[t.block()];
    if (b.kind == Kind::kTrained && b.rank == rank) continue;  // a retried report
    if (b.kind == Kind::kLimbo) {
      // Leased to this rank by a coordinator that died before it saved so.
      limbo_.erase(t.block());
      b = Block{Kind::kTrained, rank, t.step()};
      ++trained_;
      continue;
    }
    if (b.kind != Kind::kLeased || b.rank != rank) {
      ++refused_reports_;
      continue;
    }
    leases_[rank].erase(t.block());
    --leased_;
    b.kind = Kind::kTrained;
    b.step = t.step();
    ++trained_;
  }
  const uint64_t available = free_.size() + (hold_limbo_ ? 0 : limbo_.size()) +
                             (shape_.total_blocks - blocks_.size());
  const uint64_t share = (available + std::max<uint32_t>(1, sharing) - 1) /
                         std::max<uint32_t>(1, sharing);
  const uint64_t held = LeasedBy(rank);
  const uint64_t room = held < kMaxHeld ? kMaxHeld - held : 0;
  const uint64_t wanted = std::min<uint64_t>({want, share, room});
  std::vector<uint64_t> leased;
  while (leased.size() < wanted) {
    uint64_t block;
    if (!free_.empty()) {
      block = *free_.begin();
      free_.erase(free_.begin());
    } else if (blocks_.size() < shape_.total_blocks) {
      block = blocks_.size();
      blocks_.emplace_back();
    } else if (!limbo_.empty() && !hold_limbo_) {
      block = *limbo_.begin();
      limbo_.erase(limbo_.begin());
    } else {
      break;
    }
    blocks_[block] = Block{Kind::kLeased, rank, 0};
    leases_[rank].insert(block);
    ++leased_;
    leased.push_back(block);
  }
  std::sort(leased.begin(), leased.end());
  // Not when the rank holds too many to be leased more: blocks are left.
  *exhausted = want > 0 && available == 0 && !holding_limbo();
  return leased;
}

void ExampleLedger::Free(uint64_t block) {
  Block& b = blocks_[block];
  if (b.kind == Kind::kLeased) {
    --leased_;
    leases_[b.rank].erase(block);
  } else if (b.kind == Kind::kTrained) {
    --trained_;
  }
  b = Block{};
  free_.insert(block);
  lowest_untrained_ = std::min(lowest_untrained_, block);
}

absl::Status ExampleLedger::Claim(uint32_t rank, absl::Span<const uint64_t> held) {
  if (absl::Status s = CheckHeld(shape_, held); !s.ok()) return s;
  for (uint64_t block : held) {
    if (block >= blocks_.size() || blocks_[block].kind != Kind::kLimbo) continue;
    limbo_.erase(block);
    blocks_[block] = Block{Kind::kLeased, rank, 0};
    leases_[rank].insert(block);
    ++leased_;
  }
  return absl::OkStatus();
}

void ExampleLedger::ReturnLeases(uint32_t rank) {
  auto it = leases_.find(rank);
  if (it == leases_.end()) return;
  const std::set<uint64_t> held = it->second;
  for (uint64_t block : held) {
    Free(block);
    ++returned_;
  }
  leases_.erase(rank);
}

void ExampleLedger::RollBack(const std::vector<uint64_t>& resume_steps) {
  for (uint64_t block = 0; block < blocks_.size(); ++block) {
    const Block& b = blocks_[block];
    const uint64_t resume = b.rank < resume_steps.size() ? resume_steps[b.rank] : 0;
    if (b.kind == Kind::kLeased || (b.kind == Kind::kTrained && b.step >= resume))
      Free(block);
  }
  leases_.clear();
}

uint64_t ExampleLedger::LeasedBy(uint32_t rank) const {
  auto it = leases_.find(rank);
  return it == leases_.end() ? 0 : it->second.size();
}

v1::DataProgress ExampleLedger::Progress() const {
  while (lowest_untrained_ < blocks_.size() &&
         blocks_[lowest_untrained_].kind == Kind::kTrained)
    ++lowest_untrained_;
  v1::DataProgress p;
  p.set_blocks_per_epoch(shape_.blocks_per_epoch);
  p.set_total_blocks(shape_.total_blocks);
  p.set_consumed(trained_);
  p.set_leased(leased_);
  if (shape_.blocks_per_epoch > 0)
    p.set_epoch(std::min(lowest_untrained_, shape_.total_blocks - 1) /
                shape_.blocks_per_epoch);
  p.set_returned(returned_);
  p.set_refused_reports(refused_reports_);
  return p;
}

void ExampleLedger::ExportTo(v1::ExampleLedgerState* state) const {
  state->Clear();
  state->set_blocks_per_epoch(shape_.blocks_per_epoch);
  state->set_total_blocks(shape_.total_blocks);
  state->set_next_new(blocks_.size());
  for (uint64_t block = 0; block < blocks_.size(); ++block) {
    const Block& b = blocks_[block];
    if (b.kind == Kind::kTrained) {
      v1::TrainedBlock* t = state->add_trained();
      t->set_block(block);
      t->set_step(b.step);
      state->add_trained_ranks(b.rank);
    } else if (b.kind == Kind::kLeased) {
      state->add_leased_blocks(block);
      state->add_leased_ranks(b.rank);
    }
  }
  for (uint64_t block : free_) state->add_free(block);
  for (auto it = limbo_.begin(); it != limbo_.end();) {
    const uint64_t begin = *it;
    uint64_t end = begin + 1;
    for (++it; it != limbo_.end() && *it == end; ++it) ++end;
    state->add_limbo_ranges(begin);
    state->add_limbo_ranges(end);
  }
  state->set_returned(returned_);
  state->set_refused_reports(refused_reports_);
}

void ExampleLedger::LimboAfterTakeOver() {
  const uint64_t end = std::min(shape_.total_blocks, blocks_.size() + kLimboBlocks);
  for (uint64_t block = blocks_.size(); block < end; ++block) limbo_.insert(block);
  blocks_.resize(end, Block{Kind::kLimbo, 0, 0});
}

absl::Status ExampleLedger::ImportFrom(const v1::ExampleLedgerState& state) {
  auto bad = [](absl::string_view what) {
    return absl::InvalidArgumentError(absl::StrCat("example ledger state: ", what));
  };
  if (state.total_blocks() == 0) {
    *this = ExampleLedger();
    return absl::OkStatus();  // never sized
  }
  if (state.blocks_per_epoch() == 0 || state.next_new() > state.total_blocks())
    return bad("its shape is empty or it handed out more blocks than it has");
  if (state.leased_blocks_size() != state.leased_ranks_size() ||
      state.trained_size() != state.trained_ranks_size())
    return bad("the lists of blocks and ranks differ in length");
  // Each block handed out is listed once; checked before sizing anything by
  // next_new (a corrupt one would otherwise throw from the allocation).
  if (state.limbo_ranges_size() % 2 != 0) return bad("a limbo range has no end");
  uint64_t in_limbo = 0;
  for (int i = 0; i < state.limbo_ranges_size(); i += 2) {
    const uint64_t begin = state.limbo_ranges(i), end = state.limbo_ranges(i + 1);
    if (!(begin < end && end <= state.next_new())) return bad("a limbo range is out of range");
    in_limbo += end - begin;
    if (in_limbo > state.next_new()) return bad("the limbo ranges overlap");
  }
  if (static_cast<uint64_t>(state.trained_size()) + state.leased_blocks_size() +
          state.free_size() + in_limbo !=
      state.next_new())
    return bad("the blocks listed are not those handed out");
  ExampleLedger ledger;
  ledger.shape_ = {state.blocks_per_epoch(), state.total_blocks()};
  ledger.blocks_.resize(state.next_new());
  std::vector<bool> seen(state.next_new(), false);
  auto take = [&](uint64_t block) {
    if (block >= seen.size() || seen[block]) return false;
    seen[block] = true;
    return true;
  };
  for (int i = 0; i < state.trained_size(); ++i) {
    const v1::TrainedBlock& t = state.trained(i);
    if (!take(t.block())) return bad("a trained block is out of range or listed twice");
    ledger.blocks_[t.block()] = Block{Kind::kTrained, state.trained_ranks(i), t.step()};
    ++ledger.trained_;
  }
  for (int i = 0; i < state.leased_blocks_size(); ++i) {
    const uint64_t block = state.leased_blocks(i);
    if (!take(block)) return bad("a leased block is out of range or listed twice");
    ledger.blocks_[block] = Block{Kind::kLeased, state.leased_ranks(i), 0};
    ledger.leases_[state.leased_ranks(i)].insert(block);
    ++ledger.leased_;
  }
  for (uint64_t block : state.free()) {
    if (!take(block)) return bad("a free block is out of range or listed twice");
    ledger.free_.insert(block);
  }
  for (int i = 0; i < state.limbo_ranges_size(); i += 2) {
    for (uint64_t block = state.limbo_ranges(i); block < state.limbo_ranges(i + 1); ++block) {
      if (!take(block)) return bad("a block in limbo is listed twice");
      ledger.blocks_[block].kind = Kind::kLimbo;
      ledger.limbo_.insert(block);
    }
  }
  if (std::find(seen.begin(), seen.end(), false) != seen.end())
    return bad("a block handed out is neither trained, leased, free nor in limbo");
  ledger.returned_ = state.returned();
  ledger.refused_reports_ = state.refused_reports();
  *this = std::move(ledger);
  return absl::OkStatus();
}

}  // namespace grps
