#include "coordinator/job_waits.h"

#include <algorithm>

namespace grps {

absl::Status JobWaits::Until(absl::Mutex* mu, const JobWait& wait, const Outcome& outcome,
                             const std::function<absl::Status()>& at_deadline,
                             absl::Duration margin, int* waiting) {
  const absl::Time deadline = wait.deadline - margin;
  while (true) {
    if (std::optional<absl::Status> over = outcome(); over.has_value()) return *std::move(over);
    if (released_) return absl::UnavailableError("coordinator is shutting down");
    if (wait.cancelled()) return absl::CancelledError("client cancelled");
    const absl::Time real_now = absl::Now();
    if (real_now >= deadline) return at_deadline();
    if (waiting != nullptr) ++*waiting;
    changed_.WaitWithDeadline(mu, std::min(deadline, real_now + kPoll));
    if (waiting != nullptr) --*waiting;
  }
}

}  // namespace grps
