// WaitingPulls: the pulls of a shard that wait for their targets, and the
// one timer thread that ends them at their deadlines. A waiting pull holds
// no thread: Add queues it and returns; it is completed (its Finish called)
// by whichever thread makes it ready and then calls Wake (a push, a
// live-set change, another pull's read), or by the timer thread at its
// deadline.
//
// Exactly one thread examines the pulls at a time (the `examine` function
// given at construction, called without any lock of this class); a Wake
// that finds another thread examining leaves it a note to look again and
// returns. Finish is called outside every lock.
//
// Thread safety: every method may be called from any thread; `examine` may
// call LookAgain. Lock order: the pulls' mutex is never held with a
// target's.
#ifndef GRPS_SERVER_WAITING_PULLS_H_
#define GRPS_SERVER_WAITING_PULLS_H_

#include <cstddef>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace grps {

// One waiting pull: what it waits for is its owner's (see `examine`).
class WaitingPull {
 public:
  virtual ~WaitingPull() = default;
  // When the timer thread examines it whatever happens.
  virtual absl::Time deadline() const = 0;
  // The pull ends with `status` instead of an answer.
  void Fail(absl::Status status) { error = std::move(status); }
  // Called once, outside every lock: hands the answer (or `error`) to the
  // pull's callback.
  virtual void Finish() = 0;

  absl::Time start;  // set by Add
  absl::Status error;
};

class WaitingPulls {
 public:
  // Looks at one pull: true when it has its answer (or has failed), false
  // to go on waiting.
  using Examine = std::function<bool(WaitingPull&)>;

  // At most `max_waiting` pulls wait at once; `owner` names the shard in the
  // refusal. Starts the timer thread.
  WaitingPulls(size_t max_waiting, std::string owner, Examine examine);
  // Stop()s.
  ~WaitingPulls();
  WaitingPulls(const WaitingPulls&) = delete;
  WaitingPulls& operator=(const WaitingPulls&) = delete;

  // Queues `pull` and examines the pulls; finishes it at once with
  // RESOURCE_EXHAUSTED when max_waiting pulls wait already.
  void Add(std::unique_ptr<WaitingPull> pull) ABSL_LOCKS_EXCLUDED(mu_);
  // Examines every waiting pull and finishes those that have their answer;
  // loops while another thread asked for a look.
  void Wake() ABSL_LOCKS_EXCLUDED(mu_);
  // Called by `examine` when what it did may have made other pulls ready
  // (a read that applied held updates): the examining thread looks again.
  void LookAgain() ABSL_LOCKS_EXCLUDED(mu_);
  // Pulls waiting now (those being examined included).
  size_t size() const ABSL_LOCKS_EXCLUDED(mu_);
  // Ends the timer thread (after it, pulls wait for a Wake only).
  // Idempotent.
  void Stop() ABSL_LOCKS_EXCLUDED(mu_);

 private:
  void TimerLoop() ABSL_LOCKS_EXCLUDED(mu_);

  const size_t max_waiting_;
  const std::string owner_;
  const Examine examine_;

  mutable absl::Mutex mu_;
  absl::CondVar timer_wake_;
  std::vector<std::unique_ptr<WaitingPull>> waiting_ ABSL_GUARDED_BY(mu_);
  // Pulls taken out by the examining thread (for size()).
  size_t in_scan_ ABSL_GUARDED_BY(mu_) = 0;
  bool scanning_ ABSL_GUARDED_BY(mu_) = false;
  bool look_again_ ABSL_GUARDED_BY(mu_) = false;
  bool stop_timer_ ABSL_GUARDED_BY(mu_) = false;
  // When the timer thread wakes next by itself: a pull due earlier wakes it
  // (timer_wake_); one due later does not (each wake is a thread switch,
  // and every sync step adds a pull per worker).
  absl::Time timer_at_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
  std::thread timer_;
};

}  // namespace grps

#endif  // GRPS_SERVER_WAITING_PULLS_H_
