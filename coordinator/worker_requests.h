// WorkerRequests: what a worker asks of the job, one of JobStateMachine's
// collaborators: a rank (once every shard registered), example leases
// (elastic jobs), its end (done, or leaving the job), and an operator's
// drain of a rank. Each request is checked against the collaborators it is
// given and recorded in them; the machine then re-derives the job's phase
// (JobStateMachine::UpdateStateLocked) and tells the waits of the change.
//
// Its own state: the ranks a registration was refused because they were
// alive (a restarted worker waiting for its rank: the coordinator lingers
// for it at the end, so that it exits rather than retry a coordinator that
// is gone), and how many registrations wait for the shards.
//
// Not thread-safe: every call is made under the machine's mutex, which
// guards the collaborators too; Register waits on it (`mu`).
#ifndef GRPS_COORDINATOR_WORKER_REQUESTS_H_
#define GRPS_COORDINATOR_WORKER_REQUESTS_H_

#include <cstdint>
#include <functional>
#include <set>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "coordinator/elastic_data.h"
#include "coordinator/generations.h"
#include "coordinator/job_ending.h"
#include "coordinator/job_model.h"
#include "coordinator/job_phase.h"
#include "coordinator/job_waits.h"
#include "coordinator/membership.h"
#include "proto/grps.pb.h"

namespace grps {

class WorkerRequests {
 public:
  // The collaborators it reads and records in (they outlive it).
  struct Parts {
    const v1::JobConfig* config = nullptr;
    std::function<absl::Time()> clock;
    JobPhase* phase = nullptr;
    Membership* membership = nullptr;
    const Generations* generations = nullptr;
    const JobModel* model = nullptr;
    ElasticData* data = nullptr;
    JobEnding* ending = nullptr;
    JobWaits* waits = nullptr;
  };
  explicit WorkerRequests(Parts parts) : p_(std::move(parts)) {}

  // JobStateMachine::RegisterWorker: waits (`wait`, under `mu`) until every
  // shard registered before it takes a rank.
  absl::StatusOr<v1::RegisterWorkerResponse> Register(
      absl::Mutex* mu, const v1::RegisterWorkerRequest& request, const JobWait& wait,
      const std::function<bool(uint64_t incarnation)>& proves) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  // JobStateMachine::WorkerDone.
  absl::Status Done(const v1::WorkerDoneRequest& request, absl::Time now);
  // JobStateMachine::LeaseExamples.
  absl::StatusOr<v1::LeaseExamplesResponse> Lease(const v1::LeaseExamplesRequest& request);
  // JobStateMachine::DrainWorker.
  absl::Status Drain(uint32_t rank);

  // Registrations refused because their rank was alive, still unanswered.
  bool ranks_awaited() const { return !ranks_awaited_.empty(); }
  // Register calls waiting right now for the shards.
  int waiting() const { return waiting_; }

 private:
  // WorkerDone with `leaving`: the rank is LEFT, out of the live set.
  absl::Status Leave(const v1::WorkerDoneRequest& request, absl::Time now);
  // The lowest progress step of the live ranks other than `except` (0 if
  // none): where a rank joining an elastic job starts its clock.
  uint64_t SlowestLiveStep(uint32_t except) const;

  const v1::JobConfig& config() const { return *p_.config; }

  const Parts p_;
  std::set<uint32_t> ranks_awaited_;
  int waiting_ = 0;
};

}  // namespace grps

#endif  // GRPS_COORDINATOR_WORKER_REQUESTS_H_
