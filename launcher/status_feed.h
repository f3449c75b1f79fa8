// StatusFeed: follows a job's status from a background thread, so that the
// launcher's main thread (which supervises processes) only reads snapshots.
//
// It streams JobClient::Watch rather than polling: the coordinator sends the
// snapshot that ends the job the moment it ends, then exits as soon as every
// daemon has heard, which a poller could miss. While the coordinator cannot
// be reached the thread retries; after the ending snapshot it stops.
//
// Thread safety: every method may be called from any thread.
#ifndef GRPS_LAUNCHER_STATUS_FEED_H_
#define GRPS_LAUNCHER_STATUS_FEED_H_

#include <optional>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "client/job_client.h"
#include "proto/grps.pb.h"

namespace grps {

class StatusFeed {
 public:
  // Starts following the coordinator at `target`, a snapshot per `interval`.
  StatusFeed(const std::string& target, absl::Duration interval);
  // Stop().
  ~StatusFeed();

  StatusFeed(const StatusFeed&) = delete;
  StatusFeed& operator=(const StatusFeed&) = delete;

  // The newest snapshot, if any arrived.
  std::optional<v1::JobStatus> Latest() const;
  // The newest snapshot that carries the final evaluation (has_final_eval).
  std::optional<v1::JobStatus> WithFinalEval() const;
  // Snapshots received so far (a caller redraws when this moves).
  uint64_t count() const;

  // Ends the thread and returns once it has. Returns within about one
  // interval while the coordinator streams, and at once when the coordinator
  // is gone (the launcher calls it after the coordinator exited).
  void Stop();

 private:
  void Run();

  const JobClient client_;
  const absl::Duration interval_;
  mutable absl::Mutex mu_;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::optional<v1::JobStatus> latest_ ABSL_GUARDED_BY(mu_);
  std::optional<v1::JobStatus> final_ ABSL_GUARDED_BY(mu_);
  uint64_t count_ ABSL_GUARDED_BY(mu_) = 0;
  std::thread thread_;  // last: starts once the rest is initialized
};

}  // namespace grps

#endif  // GRPS_LAUNCHER_STATUS_FEED_H_
