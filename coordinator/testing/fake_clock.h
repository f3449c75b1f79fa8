// FakeClock: a JobStateMachine::Clock for tests and fuzzing that moves
// only when told, so liveness and timeouts need no real waiting.
// Thread-safe: RPC threads read it while the test advances it.
#ifndef GRPS_COORDINATOR_TESTING_FAKE_CLOCK_H_
#define GRPS_COORDINATOR_TESTING_FAKE_CLOCK_H_

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace grps {

class FakeClock {
 public:
  explicit FakeClock(absl::Time start = absl::FromUnixSeconds(1'700'000'000))
      : now_(start) {}

  absl::Time Now() {
    absl::MutexLock lock(&mu_);
    return now_;
  }
  void Advance(absl::Duration d) {
    absl::MutexLock lock(&mu_);
    now_ += d;
  }

 private:
  absl::Mutex mu_;
  absl::Time now_ ABSL_GUARDED_BY(mu_);
};

}  // namespace grps

#endif  // GRPS_COORDINATOR_TESTING_FAKE_CLOCK_H_
