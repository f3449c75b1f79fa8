// Straggler: injected slowness for experiments and tests. A worker made a
// straggler sleeps after each step: a fixed delay, and/or (factor - 1) times
// an average of its own step time measured without the sleep, so that with
// factor F it steps F times slower than it would. The sleeps are real (the
// caller sleeps); this class only says how long.
//
// Thread safety: one thread (the training loop).
#ifndef GRPS_WORKER_STRAGGLER_H_
#define GRPS_WORKER_STRAGGLER_H_

#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace grps {

class Straggler {
 public:
  // INVALID_ARGUMENT unless factor >= 1 (finite) and delay >= 0.
  static absl::StatusOr<Straggler> Create(double factor, absl::Duration delay);

  // No slowness: every step sleeps zero.
  Straggler() = default;

  bool active() const { return factor_ > 1 || delay_ > absl::ZeroDuration(); }
  // "5x its own step time + 20ms per step".
  std::string Describe() const;

  // The sleep that follows a step whose own work (without the sleep) took
  // `step_time`; updates the average.
  absl::Duration AfterStep(absl::Duration step_time);

 private:
  Straggler(double factor, absl::Duration delay)
      : factor_(factor), delay_(delay) {}

  double factor_ = 1;
  absl::Duration delay_ = absl::ZeroDuration();
  // Exponential moving average of the step time, in seconds; < 0 until the
  // first step.
  double average_s_ = -1;
};

}  // namespace grps

#endif  // GRPS_WORKER_STRAGGLER_H_
