// The take-over of a job from a persisted CoordinatorState (the state file
// a coordinator before this one wrote; JobStateMachine::TakeOver): what is
// checked and read before the collaborators take their parts of it. Each
// refusal names `from` (the file).
#ifndef GRPS_COORDINATOR_TAKE_OVER_H_
#define GRPS_COORDINATOR_TAKE_OVER_H_

#include <optional>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "coordinator/checkpoint_scheduler.h"
#include "coordinator/membership.h"
#include "daemon/env.h"
#include "proto/grps.pb.h"

namespace grps {

// OK when `state` is of job `job_id` and WAITING or RUNNING (only such a
// job is taken back); INVALID_ARGUMENT otherwise.
absl::Status CheckTakeOver(const v1::CoordinatorState& state, absl::string_view job_id,
                           absl::string_view from);

// The manifest of the state's newest complete checkpoint (its worker steps
// are the restore order's); nullopt when it has none, or, with a warning,
// when the manifest cannot be read or is of another checkpoint.
std::optional<v1::CheckpointManifest> NewestCheckpoint(Env* env,
                                                       const v1::CoordinatorState& state,
                                                       absl::string_view from);

// A state of another shard count than `membership`'s (the job was
// re-sharded, max_servers): the membership re-sharded onto the state's
// servers, the checkpoints of as many shards. OK, nothing changed, for the
// same count or a job that does not re-shard; INVALID_ARGUMENT for a count
// out of [1, max_servers] or servers that do not cover it.
absl::Status AdoptShardCount(const v1::CoordinatorState& state, const v1::JobConfig& config,
                             Membership* membership, CheckpointScheduler* checkpoints,
                             absl::Time now);

}  // namespace grps

#endif  // GRPS_COORDINATOR_TAKE_OVER_H_
