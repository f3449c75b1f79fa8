// What a shard restores from: the state a restore order names (a
// checkpoint, or the initial values), read from shared or per-shard
// checkpoint storage and checked against the job, and the store built from
// it. grps-server's registration, roll-backs and re-shardings all go
// through here (ShardAgent).
#ifndef GRPS_SERVER_SHARD_RESTORE_H_
#define GRPS_SERVER_SHARD_RESTORE_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "checkpoint/checkpoint.h"
#include "member/member_agent.h"
#include "proto/grps.pb.h"
#include "server/shard_store.h"

namespace grps {

// Whether each server keeps its own shard's checkpoint files
// (--checkpoint_storage=per_shard) rather than one shared folder.
bool PerShardStorage(const v1::JobConfig& config);

// The folder of checkpoint `id` where this shard's file is: the
// coordinator's (`dir`, the request's or order's) with shared storage; with
// per-shard storage the job's path on this server's own volume, or under
// `own_dir` (grps-server's --checkpoint_dir) when that is set.
std::string OwnCheckpointFolder(const v1::JobConfig& config, uint64_t id, const std::string& dir,
                                const std::string& own_dir);

// The states of `shard`'s chunks and sparse tables for `order`: none (the
// initial values) when it names no checkpoint, else read from the
// checkpoint's files, whose chunk layout and tables must be this job's
// (`config`, `map`). Per-shard storage: the manifest comes with the order
// (it is on the coordinator's volume); the shard checks and loads its own
// file only, in OwnCheckpointFolder.
absl::StatusOr<ShardState> LoadRestore(const v1::RestoreOrder& order, const v1::JobConfig& config,
                                       const v1::ShardMap& map, uint32_t shard,
                                       const std::string& own_dir);

// The member a server's registration made.
MemberAgent::Identity ServerIdentity(const v1::RegisterServerResponse& registration);
// A server's heartbeat deadline in a job of `config`: its heartbeat
// interval, at least 1 s.
absl::Duration HeartbeatCallTimeout(const v1::JobConfig& config);

// While it lives, heartbeats of `member` every heartbeat interval of
// `config` that say only that the server is restoring
// (HeartbeatRequest.restoring): a large table's restore outlasts the
// heartbeat timeout, and a shard the coordinator does not hear from is
// declared dead, then the job fails. Its replies and errors are not read.
class RestoringHeartbeats {
 public:
  RestoringHeartbeats(v1::Coordinator::StubInterface* coordinator,
                      const MemberAgent::Identity& member, const v1::JobConfig& config);
  ~RestoringHeartbeats() { agent_.Stop(); }

 private:
  MemberAgent agent_;
};

// What a shard reports of a restore order it could not follow (`why`).
v1::ShardCheckpoint RestoreFailure(const v1::RestoreOrder& order, uint32_t shard,
                                   const absl::Status& why);

// The store of `options`, in the generation of `order`, from the state
// `loaded` from what the order names.
absl::StatusOr<std::unique_ptr<ShardStore>> CreateStore(ShardStore::Options options,
                                                        const v1::RestoreOrder& order,
                                                        ShardState loaded);

// The counts a restored state brought (v1::StateCounters), for the logs:
// summed over the shards a checkpoint was restored into, they are the
// checkpoint's (a re-sharding conserves them).
std::string StateCounts(const v1::ShardStatus& s);

}  // namespace grps

#endif  // GRPS_SERVER_SHARD_RESTORE_H_
