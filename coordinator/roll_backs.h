// RollBacks: the whole job back to a restore order, one of JobStateMachine's
// collaborators. A roll-back takes the job to the next generation
// (Generations) with the order, and in every collaborator that keeps what
// the job did since:
//
//   - the pending checkpoint fails (CheckpointScheduler);
//   - every rank resumes at its step of the order, and finished ranks train
//     again (Membership);
//   - the examples trained since go back to the ledger (ElasticData);
//   - training is not done any more (JobEnding, CheckpointCuts' final cut);
//   - no global step is known until the shards report again (GlobalStep).
//
// Which order: the newest checkpoint that verifies now (Back), a given one
// (To: a re-sharding's cut), or past a member's newer generation (Follow).
// Not thread-safe: every call is made under the machine's mutex.
#ifndef GRPS_COORDINATOR_ROLL_BACKS_H_
#define GRPS_COORDINATOR_ROLL_BACKS_H_

#include <cstdint>
#include <string>

#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "coordinator/checkpoint_cuts.h"
#include "coordinator/checkpoint_scheduler.h"
#include "coordinator/elastic_data.h"
#include "coordinator/generations.h"
#include "coordinator/global_step.h"
#include "coordinator/job_ending.h"
#include "coordinator/membership.h"
#include "proto/grps.pb.h"

namespace grps {

class RollBacks {
 public:
  // The collaborators a roll-back resets (they outlive it).
  struct Parts {
    std::string job_id;
    Generations* generations = nullptr;
    CheckpointScheduler* checkpoints = nullptr;
    Membership* membership = nullptr;
    ElasticData* data = nullptr;
    JobEnding* ending = nullptr;
    CheckpointCuts* cuts = nullptr;
    GlobalStep* global_step = nullptr;
  };
  explicit RollBacks(Parts parts) : p_(std::move(parts)) {}

  // To the newest checkpoint that verifies now (Generations::NewestVerified);
  // `why` is logged.
  void Back(absl::string_view why, absl::Time now);
  // To `next` (its generation is set here).
  void To(v1::RestoreOrder next, absl::string_view why, absl::Time now);
  // A member runs in `generation`, newer than the job's: back past it, so
  // that every member restores the same checkpoint. Nothing for a
  // generation that is not newer.
  void Follow(uint64_t generation, absl::Time now);

  // Training is not done any more: the final evaluation and the final cut
  // start over (also when a rank comes back).
  void ForgetTrainingDone();

 private:
  const Parts p_;
};

}  // namespace grps

#endif  // GRPS_COORDINATOR_ROLL_BACKS_H_
