#include "worker/example_leases.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "data/epoch_shuffler.h"

namespace grps {

ExampleLeases::ExampleLeases(LeaseCall call, uint64_t train_examples, uint64_t step_examples,
                             uint64_t seed, uint32_t per_lease)
    : call_(std::move(call)),
      train_examples_(train_examples),
      step_examples_(std::max<uint64_t>(1, step_examples)),
      seed_(seed),
      per_lease_(std::max<uint32_t>(1, per_lease)) {}

absl::StatusOr<v1::LeaseExamplesResponse> ExampleLeases::Call(uint32_t want, bool claim) {
  v1::LeaseExamplesRequest request;
  request.set_want(want);
  request.set_claim(claim);
  request.set_train_examples(train_examples_);
  uint64_t resets;
  size_t sent = 0;
  {
    absl::MutexLock lock(&mu_);
    // The unreported stay unreported until an answer: a call made meanwhile
    // (a claim) carries them too.
    sent = unreported_.size();
    request.mutable_trained()->Add(reported_.begin(), reported_.end());
    request.mutable_trained()->Add(unreported_.begin(), unreported_.end());
    request.mutable_held()->Add(held_.begin(), held_.end());
    for (const auto& [step, block] : assigned_) request.add_held(block);
    resets = reset_count_;
  }
  absl::StatusOr<v1::LeaseExamplesResponse> response = call_(request);
  absl::MutexLock lock(&mu_);
  // Not when a Reset forgot them while the call was in flight.
  if (reset_count_ != resets || !response.ok()) return response;
  // Those this call sent, unless a call made meanwhile moved them already.
  const auto begin = request.trained().end() - static_cast<int>(sent);
  for (auto it = begin; it != request.trained().end(); ++it) {
    auto found = std::find_if(unreported_.begin(), unreported_.end(),
                              [&](const v1::TrainedBlock& t) { return t.block() == it->block(); });
    if (found == unreported_.end()) continue;
    unreported_.erase(found);
    reported_.push_back(*it);
    if (reported_.size() > kResent) reported_.pop_front();
  }
  return response;
}

absl::StatusOr<uint64_t> ExampleLeases::BlockFor(uint64_t step) {
  while (true) {
    uint64_t resets;
    {
      absl::MutexLock lock(&mu_);
      if (auto it = assigned_.find(step); it != assigned_.end()) return it->second;
      if (step < skipped_below_)
        return absl::FailedPreconditionError(
            absl::StrCat("step ", step, " was skipped: it trains no block"));
      if (!held_.empty()) {
        const uint64_t block = held_.front();
        held_.pop_front();
        assigned_[step] = block;
        return block;
      }
      if (exhausted_)
        return absl::OutOfRangeError("every block of the job's examples is trained or leased");
      resets = reset_count_;
    }
    absl::StatusOr<v1::LeaseExamplesResponse> leased = Call(per_lease_);
    if (!leased.ok()) return leased.status();
    {
      absl::MutexLock lock(&mu_);
      if (reset_count_ != resets) continue;  // the coordinator took these back
      blocks_per_epoch_ = leased->blocks_per_epoch();
      held_.insert(held_.end(), leased->blocks().begin(), leased->blocks().end());
      exhausted_ = leased->exhausted();
      if (!held_.empty() || exhausted_) continue;
    }
    // None now, more later (a coordinator that took the job over waits to
    // hear from every worker first).
    absl::SleepFor(kRetryEmpty);
  }
}

uint64_t ExampleLeases::EpochOf(uint64_t block) const {
  absl::MutexLock lock(&mu_);
  return blocks_per_epoch_ == 0 ? 0 : block / blocks_per_epoch_;
}

absl::Span<const int64_t> ExampleLeases::Examples(uint64_t block) {
  uint64_t per_epoch;
  {
    absl::MutexLock lock(&mu_);
    per_epoch = std::max<uint64_t>(1, blocks_per_epoch_);
  }
  const uint64_t epoch = block / per_epoch;
  if (order_epoch_ != epoch) {
    order_ = EpochShuffler(seed_, PartitionRange{0, static_cast<int64_t>(train_examples_)})
                 .Order(epoch);
    order_epoch_ = epoch;
  }
  const uint64_t begin = std::min<uint64_t>((block % per_epoch) * step_examples_, order_.size());
  const uint64_t end = std::min<uint64_t>(begin + step_examples_, order_.size());
  return absl::MakeConstSpan(order_).subspan(begin, end - begin);
}

void ExampleLeases::Trained(uint64_t step) {
  absl::MutexLock lock(&mu_);
  auto it = assigned_.find(step);
  if (it == assigned_.end()) return;
  v1::TrainedBlock t;
  t.set_block(it->second);
  t.set_step(step);
  unreported_.push_back(t);
  assigned_.erase(it);
}

void ExampleLeases::SkipTo(uint64_t step) {
  absl::MutexLock lock(&mu_);
  skipped_below_ = std::max(skipped_below_, step);
  // Back to the front in their steps' order: the first skipped is trained
  // first.
  auto end = assigned_.lower_bound(step);
  for (auto it = std::make_reverse_iterator(end); it != assigned_.rend(); ++it)
    held_.push_front(it->second);
  assigned_.erase(assigned_.begin(), end);
}

absl::Status ExampleLeases::Flush() {
  {
    absl::MutexLock lock(&mu_);
    if (unreported_.empty()) return absl::OkStatus();
  }
  return Call(0).status();
}

absl::Status ExampleLeases::Claim() { return Call(0, /*claim=*/true).status(); }

void ExampleLeases::Reset() {
  absl::MutexLock lock(&mu_);
  held_.clear();
  assigned_.clear();
  unreported_.clear();
  reported_.clear();
  exhausted_ = false;
  skipped_below_ = 0;
  ++reset_count_;
}

}  // namespace grps
