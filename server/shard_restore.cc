#include "server/shard_restore.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "daemon/env.h"
#include "job/shard_map.h"

namespace grps {
namespace {

absl::StatusOr<ShardState> LoadOwnRestore(const v1::RestoreOrder& order,
                                          const v1::JobConfig& config, const v1::ShardMap& map,
                                          uint32_t shard, const std::string& own_dir) {
  const v1::CheckpointManifest& manifest = order.manifest();
  if (manifest.id() != order.checkpoint_id())
    return absl::FailedPreconditionError(absl::StrCat(
        "the restore order of checkpoint ", order.checkpoint_id(),
        " carries no manifest (the coordinator is not set up for per-shard storage?)"));
  const std::string dir =
      OwnCheckpointFolder(config, order.checkpoint_id(), order.dir(), own_dir);
  if (absl::Status s = CheckManifest(manifest, dir); !s.ok()) return s;
  if (absl::Status s = CheckSameChunks(manifest.shard_map(), map); !s.ok()) return s;
  if (absl::Status s = CheckSameShards(manifest.shard_map(), map); !s.ok()) return s;
  if (absl::Status s = CheckSameTables(manifest.config(), config); !s.ok()) return s;
  if (absl::Status s = VerifyShardFile(Env::Default(), dir, manifest, shard); !s.ok()) return s;
  return LoadShardState(Env::Default(), dir, manifest, ChunksOfShard(map, shard),
                        static_cast<uint32_t>(map.shards_size()), shard);
}

}  // namespace

bool PerShardStorage(const v1::JobConfig& config) {
  return config.checkpoint_storage() == v1::CHECKPOINT_STORAGE_PER_SHARD;
}

std::string OwnCheckpointFolder(const v1::JobConfig& config, uint64_t id, const std::string& dir,
                                const std::string& own_dir) {
  if (!PerShardStorage(config)) return dir;
  return CheckpointFolder(own_dir.empty() ? config.checkpoint_dir() : own_dir, id);
}

absl::StatusOr<ShardState> LoadRestore(const v1::RestoreOrder& order, const v1::JobConfig& config,
                                       const v1::ShardMap& map, uint32_t shard,
                                       const std::string& own_dir) {
  if (order.checkpoint_id() == 0) return ShardState{};
  if (PerShardStorage(config)) return LoadOwnRestore(order, config, map, shard, own_dir);
  absl::StatusOr<v1::CheckpointManifest> manifest =
      VerifyCheckpoint(Env::Default(), order.dir(), "");
  if (!manifest.ok()) return manifest.status();
  if (absl::Status s = CheckSameChunks(manifest->shard_map(), map); !s.ok()) return s;
  if (absl::Status s = CheckSameTables(manifest->config(), config); !s.ok()) return s;
  return LoadShardState(Env::Default(), order.dir(), *manifest, ChunksOfShard(map, shard),
                        static_cast<uint32_t>(map.shards_size()), shard);
}

MemberAgent::Identity ServerIdentity(const v1::RegisterServerResponse& registration) {
  return {registration.config().job_id(), MemberKind::kServer, registration.shard(),
          registration.incarnation()};
}

absl::Duration HeartbeatCallTimeout(const v1::JobConfig& config) {
  return std::max(absl::Milliseconds(config.heartbeat_interval_ms()), absl::Seconds(1));
}

RestoringHeartbeats::RestoringHeartbeats(v1::Coordinator::StubInterface* coordinator,
                                         const MemberAgent::Identity& member,
                                         const v1::JobConfig& config)
    : agent_(coordinator, member, absl::Milliseconds(config.heartbeat_interval_ms()),
             HeartbeatCallTimeout(config)) {
  MemberAgent::Handlers handlers;
  handlers.fill = [](v1::HeartbeatRequest* request) { request->set_restoring(true); };
  agent_.Start(std::move(handlers));
}

v1::ShardCheckpoint RestoreFailure(const v1::RestoreOrder& order, uint32_t shard,
                                   const absl::Status& why) {
  v1::ShardCheckpoint failed;
  failed.set_id(order.checkpoint_id());
  failed.set_shard(shard);
  failed.set_state(v1::CHECKPOINT_STATE_FAILED);
  failed.set_error(std::string(why.message()));
  return failed;
}

absl::StatusOr<std::unique_ptr<ShardStore>> CreateStore(ShardStore::Options options,
                                                        const v1::RestoreOrder& order,
                                                        ShardState loaded) {
  options.generation = order.generation();
  options.restored_checkpoint = order.checkpoint_id();
  options.resume_steps.assign(order.worker_steps().begin(), order.worker_steps().end());
  options.restore = std::move(loaded.chunks);
  options.restore_tables = std::move(loaded.tables);
  return ShardStore::Create(std::move(options));
}

std::string StateCounts(const v1::ShardStatus& s) {
  return absl::StrCat(s.updates_applied(), " updates, ", s.pushes(), " pushes (",
                      s.duplicate_pushes(), " duplicate, ", s.too_stale(), " too stale, ",
                      s.late_gradients(), " late)");
}

}  // namespace grps
