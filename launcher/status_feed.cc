#include "launcher/status_feed.h"

namespace grps {
namespace {

// Pause between attempts while the coordinator cannot be reached.
constexpr absl::Duration kRetryPause = absl::Milliseconds(100);

}  // namespace

StatusFeed::StatusFeed(const std::string& target, absl::Duration interval)
    : client_(target, absl::Seconds(2)),
      interval_(interval),
      thread_([this] { Run(); }) {}

StatusFeed::~StatusFeed() { Stop(); }

std::optional<v1::JobStatus> StatusFeed::Latest() const {
  absl::MutexLock lock(&mu_);
  return latest_;
}

std::optional<v1::JobStatus> StatusFeed::WithFinalEval() const {
  absl::MutexLock lock(&mu_);
  return final_;
}

uint64_t StatusFeed::count() const {
  absl::MutexLock lock(&mu_);
  return count_;
}

void StatusFeed::Stop() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
  }
  if (thread_.joinable()) thread_.join();
}

void StatusFeed::Run() {
  while (true) {
    bool ended = false;
    // The stream's own error only means "try again": the coordinator may not
    // be serving yet, or has gone (then Stop() is on its way).
    client_.Watch(interval_, [&](const v1::JobStatus& status) {
      absl::MutexLock lock(&mu_);
      latest_ = status;
      if (status.has_final_eval()) final_ = status;
      ++count_;
      ended = JobEnded(status.state());
      return !stop_;
    }).IgnoreError();
    if (ended) return;
    absl::MutexLock lock(&mu_);
    // Wakes early when Stop() is called.
    if (mu_.AwaitWithTimeout(absl::Condition(&stop_), kRetryPause)) return;
  }
}

}  // namespace grps
