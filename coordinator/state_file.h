// StateFile: where a coordinator keeps the job's CoordinatorState for a
// coordinator started after it to take the job back (JobStateMachine's
// TakeOver), written atomically when it changed: at most every
// kMaterialEvery for a change of what a take-over needs (membership,
// generation, checkpoints, the job's state), every kProgressEvery when only
// progress moved (the workers' figures, the time), and at once when forced.
// One of JobStateMachine's collaborators.
//
// Thread safety: Write serializes its callers; its mutex is taken before
// whatever `current` locks (JobStateMachine's: the state file's, then the
// machine's).
#ifndef GRPS_COORDINATOR_STATE_FILE_H_
#define GRPS_COORDINATOR_STATE_FILE_H_

#include <functional>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "daemon/env.h"
#include "proto/grps.pb.h"

namespace grps {

class StateFile {
 public:
  static constexpr absl::Duration kMaterialEvery = absl::Milliseconds(200);
  static constexpr absl::Duration kProgressEvery = absl::Seconds(5);

  // `path` empty: the job is kept nowhere (Write does nothing).
  StateFile(Env* env, std::string path) : env_(env), path_(std::move(path)) {}

  // Writes the state `current` returns (at `now`) when it changed since the
  // last write and its throttle allows, or, with `force`, when it changed
  // at all. What is written is what `current` returns last.
  absl::Status Write(const std::function<v1::CoordinatorState()>& current, absl::Time now,
                     bool force) ABSL_LOCKS_EXCLUDED(mu_);

 private:
  Env* const env_;
  const std::string path_;
  absl::Mutex mu_;
  // What was last written: the part a take-over needs, the whole (but for
  // the clock), and when.
  std::string material_ ABSL_GUARDED_BY(mu_);
  std::string full_ ABSL_GUARDED_BY(mu_);
  absl::Time written_at_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
};

}  // namespace grps

#endif  // GRPS_COORDINATOR_STATE_FILE_H_
