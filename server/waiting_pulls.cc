#include "server/waiting_pulls.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"

namespace grps {

WaitingPulls::WaitingPulls(size_t max_waiting, std::string owner, Examine examine)
    : max_waiting_(max_waiting), owner_(std::move(owner)), examine_(std::move(examine)) {
  timer_ = std::thread([this] { TimerLoop(); });
}

WaitingPulls::~WaitingPulls() { Stop(); }

void WaitingPulls::Stop() {
  {
    absl::MutexLock lock(&mu_);
    stop_timer_ = true;
    timer_wake_.SignalAll();
  }
  if (timer_.joinable()) timer_.join();
}

size_t WaitingPulls::size() const {
  absl::MutexLock lock(&mu_);
  return waiting_.size() + in_scan_;
}

void WaitingPulls::LookAgain() {
  absl::MutexLock lock(&mu_);
  look_again_ = true;
}

void WaitingPulls::Add(std::unique_ptr<WaitingPull> pull) {
  pull->start = absl::Now();
  bool full;
  {
    absl::MutexLock lock(&mu_);
    full = waiting_.size() + in_scan_ >= max_waiting_;
    if (!full) {
      if (pull->deadline() < timer_at_) timer_wake_.Signal();
      waiting_.push_back(std::move(pull));
    }
  }
  if (full) {  // answered outside the lock
    pull->Fail(absl::ResourceExhaustedError(absl::StrCat(
        owner_, " has ", max_waiting_, " pulls waiting already (its limit); try again later")));
    pull->Finish();
    return;
  }
  Wake();
}

void WaitingPulls::Wake() {
  {
    absl::MutexLock lock(&mu_);
    look_again_ = true;
    if (scanning_) return;  // that thread will look again
    scanning_ = true;
  }
  while (true) {
    std::vector<std::unique_ptr<WaitingPull>> batch;
    {
      absl::MutexLock lock(&mu_);
      if (!look_again_) {
        scanning_ = false;
        return;
      }
      look_again_ = false;
      batch.swap(waiting_);
      in_scan_ = batch.size();
    }
    std::vector<std::unique_ptr<WaitingPull>> still_waiting;
    std::vector<std::unique_ptr<WaitingPull>> answered;
    for (std::unique_ptr<WaitingPull>& pull : batch)
      (examine_(*pull) ? answered : still_waiting).push_back(std::move(pull));
    {
      absl::MutexLock lock(&mu_);
      bool sooner = false;
      for (std::unique_ptr<WaitingPull>& pull : still_waiting) {
        sooner |= pull->deadline() < timer_at_;
        waiting_.push_back(std::move(pull));
      }
      in_scan_ = 0;
      if (sooner) timer_wake_.Signal();
    }
    for (std::unique_ptr<WaitingPull>& pull : answered) pull->Finish();
  }
}

void WaitingPulls::TimerLoop() {
  absl::MutexLock lock(&mu_);
  while (!stop_timer_) {
    absl::Time next = absl::InfiniteFuture();
    for (const std::unique_ptr<WaitingPull>& pull : waiting_) next = std::min(next, pull->deadline());
    if (next > absl::Now()) {
      timer_at_ = next;
      timer_wake_.WaitWithDeadline(&mu_, next);
      timer_at_ = absl::InfinitePast();  // awake: it looks at every pull
      continue;
    }
    mu_.Unlock();
    Wake();
    mu_.Lock();
    // A pull past its deadline may still be in another thread's scan; give
    // that thread a moment rather than spin.
    timer_at_ = absl::Now() + absl::Milliseconds(1);
    timer_wake_.WaitWithTimeout(&mu_, absl::Milliseconds(1));
    timer_at_ = absl::InfinitePast();
  }
}

}  // namespace grps
