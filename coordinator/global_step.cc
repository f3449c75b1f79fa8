#include "coordinator/global_step.h"

#include <algorithm>

namespace grps {

void GlobalStep::Note(uint64_t step, absl::Time now) {
  if (!step_.has_value() || *step_ != step) moved_ = now;
  if (anchor_time_ == absl::InfinitePast() || step < anchor_step_) {
    anchor_time_ = now;
    anchor_step_ = step;
  } else if (now - anchor_time_ >= absl::Milliseconds(500)) {
    rate_ = static_cast<double>(step - anchor_step_) / absl::ToDoubleSeconds(now - anchor_time_);
    anchor_time_ = now;
    anchor_step_ = step;
    recent_.emplace_back(now, rate_);
    while (now - recent_.front().first > kRateMemory) recent_.pop_front();
  } else if (rate_ == 0 && step > anchor_step_ && now - anchor_time_ >= absl::Milliseconds(100)) {
    // No estimate yet (the job just started or rolled back): a first one
    // from what there is, so that an early checkpoint's margin is not blind.
    rate_ = static_cast<double>(step - anchor_step_) / absl::ToDoubleSeconds(now - anchor_time_);
  }
  step_ = step;
}

double GlobalStep::FastestRecentRate() const {
  double rate = rate_;
  for (const auto& [when, measured] : recent_) rate = std::max(rate, measured);
  return rate;
}

}  // namespace grps
