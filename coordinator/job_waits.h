// JobWaits: how the coordinator's blocking calls wait, one of
// JobStateMachine's collaborators. A registration waiting for the shards, a
// standby waiting to be taken in, a checkpoint waited for, a watcher waiting
// for its next snapshot: each waits on one condition variable under the
// machine's mutex until its outcome is known, its caller leaves, its
// deadline passes, or the coordinator shuts down (Release), whichever comes
// first, and looks again at least every kPoll (a caller's cancellation is
// polled, not signalled).
//
// Not thread-safe by itself: every call is made under the mutex that Until
// and Sleep are given (the machine's), which guards its state too.
#ifndef GRPS_COORDINATOR_JOB_WAITS_H_
#define GRPS_COORDINATOR_JOB_WAITS_H_

#include <functional>
#include <optional>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace grps {

// How a blocking call waits: until `deadline` (real time), unless
// `cancelled` says the caller left, or the waits are released.
struct JobWait {
  absl::Time deadline = absl::InfiniteFuture();
  std::function<bool()> cancelled = [] { return false; };
};

class JobWaits {
 public:
  // How often a wait looks at its caller and its outcome.
  static constexpr absl::Duration kPoll = absl::Milliseconds(100);

  // What a wait is for: nullopt while it must go on, the status to return
  // once it is over.
  using Outcome = std::function<std::optional<absl::Status>()>;

  // Something changed that a wait may be for: every wait looks again.
  void Changed() { changed_.SignalAll(); }
  // Ends every wait (UNAVAILABLE) and refuses new ones.
  void Release() {
    released_ = true;
    changed_.SignalAll();
  }
  bool released() const { return released_; }

  // Waits under `mu` (held) until `outcome` says what to return. Else, in
  // this order: UNAVAILABLE once released, CANCELLED once the caller left,
  // `at_deadline()` at `margin` before wait.deadline. `waiting`, if given,
  // counts the callers inside the wait.
  absl::Status Until(absl::Mutex* mu, const JobWait& wait, const Outcome& outcome,
                     const std::function<absl::Status()>& at_deadline,
                     absl::Duration margin = absl::ZeroDuration(),
                     int* waiting = nullptr) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);

  // Until with an outcome of OK once `done()`.
  absl::Status UntilDone(absl::Mutex* mu, const JobWait& wait, const std::function<bool()>& done,
                         const std::function<absl::Status()>& at_deadline,
                         int* waiting = nullptr) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    return Until(
        mu, wait,
        [&done]() -> std::optional<absl::Status> {
          if (done()) return absl::OkStatus();
          return std::nullopt;
        },
        at_deadline, absl::ZeroDuration(), waiting);
  }

  // One wait under `mu` (held) for a change, until `deadline` at the
  // latest (real time); true if the deadline passed. Released waits do not
  // end it.
  bool Sleep(absl::Mutex* mu, absl::Time deadline) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    return changed_.WaitWithDeadline(mu, deadline);
  }

 private:
  absl::CondVar changed_;
  bool released_ = false;
};

}  // namespace grps

#endif  // GRPS_COORDINATOR_JOB_WAITS_H_
