// Recovery: whether a running job that lost members can still recover, as
// JobStateMachine::DetectFailures asks every heartbeat interval. The job
// fails when, for longer than its recovery timeout (RecoveryTimeoutMs),
//
//   - a shard has been dead (past its heartbeat timeout) and no server took
//     it over, or
//   - no worker was ALIVE or FINISHED (every one died or left).
//
// A job that is not running never fails here.
#ifndef GRPS_COORDINATOR_RECOVERY_H_
#define GRPS_COORDINATOR_RECOVERY_H_

#include <optional>
#include <string>

#include "absl/time/time.h"
#include "coordinator/job_phase.h"
#include "coordinator/membership.h"
#include "proto/grps.pb.h"

namespace grps {

// Why the job fails at `now` (the message of its end), or nullopt. Keeps
// the time without workers in `phase`.
std::optional<std::string> RecoveryFailure(const Membership& membership,
                                           const v1::JobConfig& config, JobPhase* phase,
                                           absl::Time now);

}  // namespace grps

#endif  // GRPS_COORDINATOR_RECOVERY_H_
