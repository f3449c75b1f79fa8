// ShardAgent: a shard's life in its job once its server has registered,
// driven by the coordinator's heartbeat replies (through the MemberAgent):
// it heartbeats as the shard's member, reporting the store's status, until
// the job ends, another server takes the shard over, the coordinator has
// been silent past the job's coordinator_timeout_ms, a re-sharding retires
// the shard, or a signal arrives; and it follows what the replies carry:
//
//   - a roll-back to a checkpoint for the shard's chunks as they are placed
//     now: the store restores in place (a checkpoint it cannot load is
//     reported in every heartbeat, and the coordinator orders the one
//     before; the store keeps its state and generation meanwhile);
//   - a shard map that places the shard's chunks otherwise (a re-sharding),
//     with its roll-back to the cut: a new store for the new map, loaded
//     from the cut, replaces the current one (Replace);
//   - a map without the shard: it retires, sending its final figures;
//   - a checkpoint request (ShardCheckpointer, a thread of its own);
//   - the live workers, which a sync step's quorum counts.
//
// RegisterAndLoad is the part before: a registration, and the state its
// restore order names, loaded (refusing a checkpoint it cannot load back to
// the coordinator, which answers with the one before).
//
// grps-server (server_main.cc) parses its flags, serves the gRPC service
// and wires these together; the tests drive them with a fake coordinator
// and clock (shard_agent_test.cc).
//
// Thread safety: a ShardAgent is used by the thread that calls Run (its
// heartbeats, through MemberAgent::Run), but for JoinCheckpoints.
#ifndef GRPS_SERVER_SHARD_AGENT_H_
#define GRPS_SERVER_SHARD_AGENT_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "member/member_agent.h"
#include "proto/grps.grpc.pb.h"
#include "server/shard_checkpointer.h"
#include "server/shard_restore.h"
#include "server/shard_store.h"

namespace grps {

// How the shard's part in the job ended: the process's exit code and why.
struct ShardEnding {
  int exit_code = 0;
  std::string reason = "signal received";
};

// The stores of this process's shard: the one it serves, and those that
// re-shardings replaced. A replaced store is shut down but kept until the
// process exits: RPC handlers may still hold a raw pointer to it (a
// PullReactor keeps its ShardStore*).
struct ShardStores {
  std::unique_ptr<ShardStore> current;
  std::vector<std::unique_ptr<ShardStore>> retired;
};

// What a server registers as.
struct ShardRegistration {
  std::string coordinator_address;  // for the messages
  std::string address;              // where workers reach this server
  int32_t requested_shard = -1;     // -1: any
  // grps-server's --checkpoint_dir (per-shard storage's own folder).
  std::string own_checkpoint_dir;
  RegisterOptions options;
};

// A registration, and the state its restore order names, loaded.
struct RegisteredShard {
  v1::RegisterServerResponse registration;
  ShardState loaded;
  // Say the shard is restoring until the holder has built its store.
  std::unique_ptr<RestoringHeartbeats> heard;
};

// How often a starting server reports a checkpoint it cannot load before it
// gives up (each report sends the job one checkpoint further back).
inline constexpr int kMaxRestoreRefusals = 64;

// Registers with the coordinator and loads the state the answer's restore
// order names. A checkpoint this shard cannot load (a damaged or missing
// file) is reported by registering again: the coordinator refuses it and
// answers with the one before it, down to the initial values, which always
// load. On failure, *exit_code is how the process ends (0: a signal
// cancelled the registration, or the job had ended; 2: an own checkpoint
// folder for a job with shared storage; else 1).
std::optional<RegisteredShard> RegisterAndLoad(v1::Coordinator::StubInterface& coordinator,
                                               const ShardRegistration& registration,
                                               int* exit_code);

// The options of the store of a registration's shard, but for its state.
ShardStore::Options StoreOptionsOf(const v1::RegisterServerResponse& registration,
                                   const std::string& address);

class ShardAgent {
 public:
  struct Options {
    std::string address;              // this server's, for a new store
    std::string coordinator_address;  // for the messages
    std::string own_checkpoint_dir;   // ShardRegistration's
    // Serves a store that replaces the current one (a re-sharding), before
    // the current one is shut down.
    std::function<void(ShardStore&)> attach;
    // The store's status as heartbeats report it (the service adds its
    // own counts).
    std::function<v1::ShardStatus(const ShardStore&)> status;
  };

  // `stores.current` is the store the shard serves now.
  ShardAgent(MemberAgent& agent, ShardStores& stores, Options options);

  // Heartbeats until the end; how the shard's part ended. Call once.
  ShardEnding Run();
  // Ends the checkpoint thread. Call once the store has been shut down,
  // which ends a capture that waits.
  void JoinCheckpoints() { checkpointer_->Join(); }

 private:
  ShardStore& store() const { return *stores_.current; }

  void Fill(v1::HeartbeatRequest* request) const;
  MemberAgent::Next OnError(const grpc::Status& status);
  MemberAgent::Next OnReply(const v1::HeartbeatResponse& response);
  // Leaves the coordinator this shard's final figures.
  void SendFinalReport();
  // The reply's shard map and roll-back order: a newer map is remembered;
  // a roll-back is followed in place, or by a new store when the map
  // places the shard's chunks otherwise. An ending when the shard ends.
  std::optional<ShardEnding> FollowMap(const v1::HeartbeatResponse& response);
  std::optional<ShardEnding> RollBack(const v1::RestoreOrder& order);
  ShardEnding Retire();
  std::optional<ShardEnding> Reshard(const v1::RestoreOrder& order);
  // A roll-back order the shard could not follow (`why`): recorded in
  // restore_failed_, which every heartbeat reports until the coordinator
  // orders another. An ending when the order was the initial values, which
  // leave nothing further back.
  std::optional<ShardEnding> RefuseRestore(const v1::RestoreOrder& order,
                                           const absl::Status& why);
  void Replace(std::unique_ptr<ShardStore> next);

  MemberAgent& agent_;
  ShardStores& stores_;
  const Options options_;
  const absl::Duration coordinator_timeout_;
  std::unique_ptr<ShardCheckpointer> checkpointer_;
  // The newest map the coordinator sent (its epoch is the one reported). It
  // differs from the store's in placement while a re-sharding's roll-back
  // is refused: the next order rebuilds for it.
  v1::ShardMap map_;
  std::optional<v1::ShardCheckpoint> restore_failed_;
  int failures_ = 0;
  ShardEnding ending_;
};

}  // namespace grps

#endif  // GRPS_SERVER_SHARD_AGENT_H_
