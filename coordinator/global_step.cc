#include "coordinator/global_step.h"

#include <algorithm>

namespace grps {

void GlobalStep::Note(uint64_t lowest, uint64_t highest, absl::Time now) {
  if (!step_.has_value() || *step_ != lowest) moved_ = now;
  step_ = lowest;
  // The rate is measured on the highest version, the one just reported: the
  // lowest may be a heartbeat old (two shards' heartbeats 3 ms apart made the
  // lowest at the first of them the other's version of 500 ms before, and a
  // window closed there measured a quarter of the rate).
  if (anchor_time_ == absl::InfinitePast() || highest < anchor_step_) {
    // The first note, or a roll-back: a window starts here.
    anchor_time_ = now;
    anchor_step_ = highest;
    from_standstill_ = true;
  } else if (now - anchor_time_ >= absl::Milliseconds(500)) {
    if (highest == anchor_step_) {
      // A whole window in which the step stood still (the workers have not
      // started, or wait) is no rate: one counted from before would measure
      // a fraction of the rate the step moves at once it moves.
      anchor_time_ = now;
      from_standstill_ = true;
      return;
    }
    rate_ = static_cast<double>(highest - anchor_step_) / absl::ToDoubleSeconds(now - anchor_time_);
    anchor_time_ = now;
    anchor_step_ = highest;
    // A window from a standstill may measure a fraction of the rate (the
    // step started moving at some time within it: as the workers started,
    // 0.45 s into one, which measured 68 steps a second of 700); it counts
    // for the fastest rate, but the rate is measured only by the next.
    measured_ = measured_ || !from_standstill_;
    from_standstill_ = false;
    recent_.emplace_back(now, rate_);
    while (now - recent_.front().first > kRateMemory) recent_.pop_front();
  } else if (rate_ == 0 && highest > anchor_step_ &&
             now - anchor_time_ >= absl::Milliseconds(100)) {
    // No estimate yet (the job just started or rolled back): a first one
    // from what there is, so that an early checkpoint's margin is not blind.
    rate_ = static_cast<double>(highest - anchor_step_) / absl::ToDoubleSeconds(now - anchor_time_);
  }
}

double GlobalStep::FastestRecentRate() const {
  double rate = rate_;
  for (const auto& [when, measured] : recent_) rate = std::max(rate, measured);
  return rate;
}

}  // namespace grps
