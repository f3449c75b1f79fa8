// GlobalStep: the job's global step (the lowest version of the live shards,
// as their heartbeats report it), when it last moved, and the rate the
// shards move at, for a sync checkpoint's margin: steps a second of the
// highest version (the freshest) over windows of at least 500 ms, the
// fastest of the last kRateMemory. A window in which the step stood still
// measures nothing, and the first one after it may give a fraction of the
// rate (it does not make the rate measured); a first estimate after 100 ms
// when there is none yet. One of
// JobStateMachine's collaborators; not thread-safe (it is used under the
// machine's mutex).
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

  // The live shards' lowest and highest versions at `now`, when a shard
  // reported its version: the lowest is the step, the highest (the version
  // just reported, the freshest) measures the rate.
  void Note(uint64_t lowest, uint64_t highest, absl::Time now);
  // Every live shard at `step`.
  void Note(uint64_t step, absl::Time now) { Note(step, step, now); }
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
  // Steps a second, as last estimated while the step moved (0 before any).
  double rate() const { return rate_; }
  // The fastest rate measured over a whole window within kRateMemory of
  // the newest, or rate() when that is faster.
  double FastestRecentRate() const;
  // Whether a rate was measured over a whole window in which the step moved
  // from its start (by this process: not before the second window after
  // the step first moves, when the job starts, or after a take-over).
  bool RateMeasured() const { return measured_; }

 private:
  std::optional<uint64_t> step_;
  absl::Time moved_ = absl::InfinitePast();
  uint64_t anchor_step_ = 0;
  absl::Time anchor_time_ = absl::InfinitePast();
  double rate_ = 0;
  // The window from anchor_time_ began where the step stood still.
  bool from_standstill_ = true;
  bool measured_ = false;
  std::deque<std::pair<absl::Time, double>> recent_;
};

}  // namespace grps

#endif  // GRPS_COORDINATOR_GLOBAL_STEP_H_
