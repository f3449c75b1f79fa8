// BatchLoader: a thread that prepares the next step's batch on the CPU (for
// the dense model: gathering its examples out of the data set; for the
// embedding model: also hashing its features into row ids) while the
// training thread computes and pushes the current one.
//
// The training thread calls Take(step, next): it gets step's batch, the one
// the loader prepared if it was asked for that step, else one prepared now
// in the calling thread (the first step, a roll-back), and the loader then
// starts on `next`. Two batches take turns: the one the caller holds stays
// valid, untouched, until its next Take.
//
// Thread safety: Take is called by one thread (the training thread). The
// batch being prepared is the loader's alone until it reports it ready;
// Take waits for that before it reads it or prepares one itself.
#ifndef GRPS_WORKER_BATCH_LOADER_H_
#define GRPS_WORKER_BATCH_LOADER_H_

#include <cstdint>
#include <functional>
#include <optional>
#include <thread>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"

namespace grps {

template <typename Batch>
class BatchLoader {
 public:
  // Fills *out with step's batch (reusing its buffers). Called on the
  // loader thread or the training thread, never on both at once.
  using Prepare = std::function<absl::Status(uint64_t step, Batch* out)>;

  explicit BatchLoader(Prepare prepare)
      : prepare_(std::move(prepare)), thread_([this] { Loop(); }) {}
  ~BatchLoader() {
    {
      absl::MutexLock lock(&mu_);
      stop_ = true;
    }
    thread_.join();
  }
  BatchLoader(const BatchLoader&) = delete;
  BatchLoader& operator=(const BatchLoader&) = delete;

  // Step's batch, valid until the next Take; then prepares `next`, if any,
  // on the loader thread. An error of preparing step is returned here (one
  // of preparing another step ahead is dropped with that batch).
  absl::StatusOr<Batch*> Take(uint64_t step, std::optional<uint64_t> next) {
    mu_.LockWhen(absl::Condition(this, &BatchLoader::Idle));
    const bool ready = ready_step_ == step && ready_status_.ok();
    ready_step_.reset();
    mu_.Unlock();
    if (ready) {
      ++ahead_hits_;
      std::swap(current_, ahead_);
    } else if (absl::Status s = prepare_(step, &current_); !s.ok()) {
      return s;
    }
    if (next.has_value()) {
      absl::MutexLock lock(&mu_);
      wanted_ = next;
    }
    return &current_;
  }

  // Step's batch if the loader has it prepared now, else null; never waits.
  // It stays unchanged until the next Take, which returns it for step
  // (training thread).
  const Batch* PeekReady(uint64_t step) {
    absl::MutexLock lock(&mu_);
    if (!Idle() || ready_step_ != step || !ready_status_.ok()) return nullptr;
    return &ahead_;
  }

  // How many Takes found their batch prepared ahead (training thread).
  uint64_t prepared_ahead() const { return ahead_hits_; }

 private:
  bool Idle() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return !busy_ && !wanted_.has_value();
  }
  bool HasWork() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return stop_ || wanted_.has_value();
  }

  void Loop() {
    while (true) {
      mu_.LockWhen(absl::Condition(this, &BatchLoader::HasWork));
      if (stop_) {
        mu_.Unlock();
        return;
      }
      const uint64_t step = *wanted_;
      wanted_.reset();
      busy_ = true;
      mu_.Unlock();
      absl::Status s = prepare_(step, &ahead_);  // ahead_ is this thread's now
      absl::MutexLock lock(&mu_);
      busy_ = false;
      ready_step_ = step;
      ready_status_ = std::move(s);
    }
  }

  const Prepare prepare_;
  Batch current_;  // the training thread's
  // The loader's while busy_ or wanted_ is set; the training thread's once
  // Take has seen it idle.
  Batch ahead_;
  uint64_t ahead_hits_ = 0;
  absl::Mutex mu_;
  std::optional<uint64_t> wanted_ ABSL_GUARDED_BY(mu_);  // to prepare next
  bool busy_ ABSL_GUARDED_BY(mu_) = false;               // preparing ahead_
  std::optional<uint64_t> ready_step_ ABSL_GUARDED_BY(mu_);
  absl::Status ready_status_ ABSL_GUARDED_BY(mu_);
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;  // last: starts once the rest is made
};

}  // namespace grps

#endif  // GRPS_WORKER_BATCH_LOADER_H_
