#include "coordinator/take_over.h"

#include <map>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "checkpoint/checkpoint.h"
#include "coordinator/resharding.h"
#include "job/job_config.h"
#include "spdlog/spdlog.h"

namespace grps {

absl::Status CheckTakeOver(const v1::CoordinatorState& state, absl::string_view job_id,
                           absl::string_view from) {
  if (state.config().job_id() != job_id)
    return absl::InvalidArgumentError(
        absl::StrCat(from, " is of job '", state.config().job_id(), "', not '", job_id, "'"));
  if (state.state() != v1::JOB_STATE_WAITING && state.state() != v1::JOB_STATE_RUNNING)
    return absl::InvalidArgumentError(
        absl::StrCat(from, ": job is ", JobStateName(state.state()),
                     "; only a waiting or running job is taken back"));
  return absl::OkStatus();
}

std::optional<v1::CheckpointManifest> NewestCheckpoint(Env* env, const v1::CoordinatorState& state,
                                                       absl::string_view from) {
  const v1::CheckpointSummary& newest = state.last_checkpoint();
  if (newest.id() == 0) return std::nullopt;
  absl::StatusOr<v1::CheckpointManifest> manifest = ReadManifest(env, newest.dir());
  if (manifest.ok() && manifest->id() == newest.id()) return *std::move(manifest);
  spdlog::warn("{}: cannot read the manifest of checkpoint {} in {}: {}", std::string(from),
               newest.id(), newest.dir(),
               manifest.ok() ? "another id" : std::string(manifest.status().message()));
  return std::nullopt;
}

absl::Status AdoptShardCount(const v1::CoordinatorState& state, const v1::JobConfig& config,
                             Membership* membership, CheckpointScheduler* checkpoints,
                             absl::Time now) {
  const uint32_t count = static_cast<uint32_t>(state.shards_size());
  if (count == membership->num_shards() || config.max_servers() == 0) return absl::OkStatus();
  if (count == 0 || count > config.max_servers())
    return absl::InvalidArgumentError(absl::StrCat(
        "the state has ", count, " shards; the job may have 1 to ", config.max_servers()));
  std::map<uint32_t, Membership::Endpoint> servers;
  for (const v1::ShardEndpoint& e : state.shards())
    servers[e.shard()] = Membership::Endpoint{e.address(), e.incarnation()};
  return ReshardMembers(count, servers, config.chunk_bytes(), membership, checkpoints, now)
      .status();
}

}  // namespace grps
