#include "coordinator/recovery.h"

#include "absl/strings/str_cat.h"
#include "coordinator/words.h"
#include "job/job_config.h"

namespace grps {

std::optional<std::string> RecoveryFailure(const Membership& membership,
                                           const v1::JobConfig& config, JobPhase* phase,
                                           absl::Time now) {
  if (!phase->running()) return std::nullopt;
  const absl::Duration recovery = absl::Milliseconds(RecoveryTimeoutMs(config));
  const absl::Duration timeout = absl::Milliseconds(config.heartbeat_timeout_ms());
  for (const v1::ShardStatus& shard : membership.ShardStatuses(now)) {
    if (shard.state() != v1::MEMBER_STATE_DEAD) continue;
    const absl::Duration dead_for = absl::Milliseconds(shard.last_heartbeat_ms_ago()) - timeout;
    if (dead_for >= recovery)
      return absl::StrCat("shard ", shard.shard(), " has been dead for ", WholeSeconds(dead_for),
                          " and no server took it over");
  }
  const bool none = membership.RanksInState(v1::MEMBER_STATE_ALIVE).empty() &&
                    membership.RanksInState(v1::MEMBER_STATE_FINISHED).empty();
  if (phase->WithoutWorkers(none, now) < recovery) return std::nullopt;
  return absl::StrCat("every worker ",
                      membership.RanksInState(v1::MEMBER_STATE_LEFT).empty() ? "died"
                                                                             : "died or left",
                      " before finishing; none came back within ", WholeSeconds(recovery));
}

}  // namespace grps
