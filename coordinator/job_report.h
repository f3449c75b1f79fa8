// JobReport: what the job says of itself, one of JobStateMachine's
// collaborators: its status (grpsctl, watchers, metrics) and its persisted
// state (what a coordinator that takes the job over reads), each assembled
// from the collaborators that keep its parts. It only reads.
//
// Not thread-safe: every call is made under the machine's mutex, which
// guards the collaborators.
#ifndef GRPS_COORDINATOR_JOB_REPORT_H_
#define GRPS_COORDINATOR_JOB_REPORT_H_

#include <string>

#include "absl/time/time.h"
#include "coordinator/checkpoint_scheduler.h"
#include "coordinator/elastic_data.h"
#include "coordinator/generations.h"
#include "coordinator/global_step.h"
#include "coordinator/job_ending.h"
#include "coordinator/job_model.h"
#include "coordinator/job_phase.h"
#include "coordinator/membership.h"
#include "coordinator/resharding.h"
#include "proto/grps.pb.h"

namespace grps {

class JobReport {
 public:
  // The collaborators it reads (they outlive it).
  struct Parts {
    const v1::JobConfig* config = nullptr;
    const JobPhase* phase = nullptr;
    const Membership* membership = nullptr;
    const JobModel* model = nullptr;
    const JobEnding* ending = nullptr;
    const CheckpointScheduler* checkpoints = nullptr;
    const Generations* generations = nullptr;
    const GlobalStep* global_step = nullptr;
    const ElasticData* data = nullptr;
    const Resharding* resharding = nullptr;
  };
  explicit JobReport(Parts parts) : p_(std::move(parts)) {}

  // The config members are handed: with the user model's tensors, once
  // defined, for the shards the job has now.
  v1::JobConfig MemberConfig() const;
  // The status at `now`; `training_done` as the machine derives it.
  v1::JobStatus Status(bool training_done, absl::Time now) const;
  // The state a coordinator that takes the job over reads; once the job
  // ended, with the status it ended with (Status's).
  v1::CoordinatorState State(bool training_done, absl::Time now) const;

 private:
  // Why the job is still WAITING: the shards and ranks that never
  // registered.
  std::string WaitingMessage() const;

  const Parts p_;
};

}  // namespace grps

#endif  // GRPS_COORDINATOR_JOB_REPORT_H_
