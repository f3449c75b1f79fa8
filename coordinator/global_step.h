// GlobalStep: the job's global step (the lowest version of the live shards,
// as their heartbeats report it), when it last moved, and the rate it moves
// at: steps a second over windows of at least 500 ms (a first estimate
// after 100 ms, when there is none yet), the fastest of the last
// kRateMemory kept for a sync checkpoint's margin. One of JobStateMachine's
// collaborators; not thread-safe (it is used under the machine's mutex).
#ifndef GRPS_COORDINATOR_GLOBAL_STEP_H_
#define GRPS_COORDINATOR_GLOBAL_STEP_H_

#include <cstdint>
#include <deque>
#include <optional>
#include <utility>

#include "absl/time/time.h"

namespace grps {

class GlobalStep {
 public:
  static constexpr absl::Duration kRateMemory = absl::Seconds(30);

  // The live shards' lowest version at `now`.
  void Note(uint64_t step, absl::Time now);
  // The step counts as moving from `now` (the job starts running, or a
  // coordinator takes it over); what is known of it stays.
  void Restart(absl::Time now) { moved_ = now; }
  // A roll-back: no step is known until the shards report again.
  void Forget(absl::Time now) {
    step_.reset();
    moved_ = now;
  }

  // The newest step noted since the last Forget, if any.
  std::optional<uint64_t> step() const { return step_; }
  // When the step last changed (or Restart, Forget); InfinitePast before.
  absl::Time moved() const { return moved_; }
  // Steps a second, as last estimated (0 before any).
  double rate() const { return rate_; }
  // The fastest rate measured over a whole window within kRateMemory of
  // the newest, or rate() when that is faster.
  double FastestRecentRate() const;
  // Whether a rate was measured over a whole window (since the start, or a
  // take-over: a window is measured by this process).
  bool RateMeasured() const { return !recent_.empty(); }

 private:
  std::optional<uint64_t> step_;
  absl::Time moved_ = absl::InfinitePast();
  uint64_t anchor_step_ = 0;
  absl::Time anchor_time_ = absl::InfinitePast();
  double rate_ = 0;
  std::deque<std::pair<absl::Time, double>> recent_;
};

}  // namespace grps

#endif  // GRPS_COORDINATOR_GLOBAL_STEP_H_
