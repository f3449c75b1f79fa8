// ServerRequests: a server's registration, one of JobStateMachine's
// collaborators: a shard of the map (first, or again after a restart), or,
// in a job with max_servers, a standby for a shard past the map that waits
// until a re-sharding takes it in; and the answer each is given (the shard,
// its incarnation, the config, the map and the restore order).
//
// A registration that rolls the job back (a known shard registering again
// while the job runs, or one that cannot restore the ordered checkpoint)
// says why; the machine rolls back, then answers, so that the answer
// carries the new restore order.
//
// Not thread-safe: every call is made under the machine's mutex, which
// guards the collaborators too; a standby waits on it (`mu`).
#ifndef GRPS_COORDINATOR_SERVER_REQUESTS_H_
#define GRPS_COORDINATOR_SERVER_REQUESTS_H_

#include <cstdint>
#include <functional>
#include <optional>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "coordinator/generations.h"
#include "coordinator/job_model.h"
#include "coordinator/job_phase.h"
#include "coordinator/job_waits.h"
#include "coordinator/membership.h"
#include "coordinator/resharding.h"
#include "proto/grps.pb.h"

namespace grps {

// A server's registration as answered; `rolled_back` when it rolled the job
// back (the caller persists the state before answering). member_secret is
// not set.
struct ServerRegistration {
  v1::RegisterServerResponse response;
  bool rolled_back = false;
};

class ServerRequests {
 public:
  // A standby's call is answered this long before its deadline (a shard
  // handed to a caller that already gave up would be held by nobody).
  static constexpr absl::Duration kStandbyAnswerMargin = absl::Milliseconds(300);

  // The collaborators it reads and records in (they outlive it).
  struct Parts {
    const v1::JobConfig* config = nullptr;
    std::function<absl::Time()> clock;
    JobPhase* phase = nullptr;
    Membership* membership = nullptr;
    Generations* generations = nullptr;
    const JobModel* model = nullptr;
    Resharding* resharding = nullptr;
    JobWaits* waits = nullptr;
  };
  // A registration recorded: the shard and incarnation to answer with, and
  // why the job rolls back, if it does.
  struct Registered {
    uint32_t shard = 0;
    uint64_t incarnation = 0;
    std::optional<std::string> roll_back;
  };

  explicit ServerRequests(Parts parts) : p_(std::move(parts)) {}

  // JobStateMachine::RegisterServer. A standby waits (`wait`, under `mu`)
  // to be taken in; `tick_reshard` is called once it stands by (the
  // re-sharding may wait for it).
  absl::StatusOr<Registered> Register(absl::Mutex* mu, const v1::RegisterServerRequest& request,
                                      const JobWait& wait, absl::Time now,
                                      const std::function<void()>& tick_reshard)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  // The answer for `shard` with `incarnation`.
  ServerRegistration Answer(uint32_t shard, uint64_t incarnation) const;

 private:
  // A standby's registration (shard past the map).
  absl::StatusOr<Registered> StandBy(absl::Mutex* mu, const v1::RegisterServerRequest& request,
                                     uint32_t shard, const JobWait& wait,
                                     const std::function<void()>& tick_reshard)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  // OK once the map has `shard` with `incarnation`.
  absl::Status WaitToBeTakenIn(absl::Mutex* mu, uint32_t shard, uint64_t incarnation,
                               const JobWait& wait) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);

  const Parts p_;
};

}  // namespace grps

#endif  // GRPS_COORDINATOR_SERVER_REQUESTS_H_
