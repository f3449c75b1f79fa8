// Resharding: a running job's move to another shard count (JobConfig.
// max_servers; docs/elasticity.md), as one of JobStateMachine's
// collaborators: the target asked for, the standbys waiting for the new
// shards, the checkpoint cut the move restores, what the last moves were.
// Not thread-safe (it is used under the machine's mutex); the machine owns
// the map, the roll-back and the waits.
//
//   1. Ask(K) records the target.
//   2. Every new shard (K above the count) needs a standby: a server that
//      asked to register for it (StandBy; the machine holds its call).
//   3. Tick cuts a checkpoint (or adopts the pending one): in sync at one
//      step for the whole model, in async and ssp each chunk as it is.
//   4. Once the cut's manifest is written (CutWritten), under the machine's
//      lock: the map of K shards (the same chunks, placed again; epoch + 1)
//      with the standbys' endpoints, and a roll-back of a new generation to
//      the cut (Moved). Every member hears both in its next heartbeat reply:
//      the kept shards rebuild their store from the cut for the new map, the
//      standbys' calls are answered with it, the shards past K are told they
//      are retired, and the workers go back to their steps at the cut with
//      clients of the new map.
//
// A cut that fails is cut again; a coordinator that takes the job over cuts
// again too (the target is in its state file). What a move costs: the steps
// since the cut are computed again (the cut is a few steps ahead of the
// fastest shard when it is asked for), plus the rebuild.
#ifndef GRPS_COORDINATOR_RESHARDING_H_
#define GRPS_COORDINATOR_RESHARDING_H_

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "coordinator/checkpoint_scheduler.h"
#include "coordinator/membership.h"
#include "proto/grps.pb.h"

namespace grps {

class Resharding {
 public:
  // How long a standby keeps its place after its registration call ended.
  static constexpr absl::Duration kStandbyFresh = absl::Seconds(3);

  // `config` must be valid; without max_servers the job never re-shards.
  explicit Resharding(const v1::JobConfig& config);

  bool enabled() const { return max_servers_ > 0; }
  // A move is asked for and not done.
  bool asked() const { return target_ != 0; }

  // FAILED_PRECONDITION without max_servers; INVALID_ARGUMENT unless
  // `num_servers` is in [1, max_servers].
  absl::Status CheckTarget(uint32_t num_servers) const;
  // Records a checked target (a job of `shards` shards asked for as many,
  // with no move under way: nothing to do).
  void Ask(uint32_t num_servers, uint32_t shards);

  // What the job is doing now, for Tick.
  struct Job {
    uint32_t shards = 0;
    bool ended = false;
    bool training = false;  // RUNNING and not done training
  };
  // Starts a checkpoint (CheckpointScheduler::Start through the machine);
  // `why` is logged.
  using CutStarter = std::function<absl::StatusOr<v1::CheckpointRequest>(const std::string& why)>;
  // Moves an asked-for move on: waits for the standbys, cuts the
  // checkpoint, notes a failed cut. Call on every change that may let it go.
  void Tick(const Job& job, const CheckpointScheduler& checkpoints, const CutStarter& cut,
            absl::Time now);

  // Checkpoint `id` was written: the shard count to move to now when it is
  // this move's cut, nullopt otherwise (also when the job of `shards` shards
  // was asked back to where it is meanwhile: the move is over).
  std::optional<uint32_t> CutWritten(uint64_t id, uint32_t shards);
  // The machine published the map of `to` shards restoring the cut at
  // `step`: the move is done.
  void Moved(uint32_t from, uint32_t to, uint64_t step, absl::Time now);
  // The move cannot be made (its map cannot be built): forgotten.
  void Abandon() { target_ = 0; }

  // What a written checkpoint did to the move.
  struct Publication {
    // The members moved from `from` to `to` shards: the machine rolls the
    // job back to the cut.
    bool moved = false;
    uint32_t from = 0;
    uint32_t to = 0;
    // A standby left meanwhile: wait for one again, then cut again (Tick).
    bool wait_again = false;
  };
  // Steps 4 in one: checkpoint `manifest` was written; when it is this
  // move's cut (CutWritten), the members move onto the new count with the
  // fresh standbys (ReshardMembers) and the move is done (Moved); a map
  // that cannot be built abandons it.
  Publication Publish(const v1::CheckpointManifest& manifest, uint64_t chunk_bytes,
                      Membership* membership, CheckpointScheduler* checkpoints, absl::Time now);

  // ---- Standbys (servers for shards past the map) ----
  // A server at `address` stands by for `shard` (< max_servers, checked by
  // the caller; the job has `shards`): the incarnation it holds the place
  // with (`reserve` gives a new one when the address is new to the place).
  // Its call waits until StandbyCallEnded.
  uint64_t StandBy(uint32_t shard, const std::string& address, uint32_t shards,
                   const std::function<uint64_t()>& reserve);
  // The incarnation that holds `shard`'s place now (0: none).
  uint64_t StandbyIncarnation(uint32_t shard) const;
  // The call of `incarnation` for `shard` ended; `taken` when it got the
  // shard or its caller left (the place is given up).
  void StandbyCallEnded(uint32_t shard, uint64_t incarnation, bool taken);
  // A standby the last move took in (the map's `incarnation` for `shard`)
  // asking again from `address`: true, and its place is given up.
  bool TakenInAgain(uint32_t shard, const std::string& address, uint64_t incarnation);
  // Standbys that are waiting or called within kStandbyFresh, by shard.
  std::map<uint32_t, Membership::Endpoint> FreshStandbys() const;

  v1::ReshardProgress Progress() const;
  // A persisted state's target (the move goes on with a new cut) and record.
  void TakeOver(const v1::CoordinatorState& state);
  void ExportTo(v1::CoordinatorState* state) const;

 private:
  const std::string job_id_;
  const uint32_t max_servers_;

  // The shard count asked for (0: none); the cut it restores (0: not asked
  // yet) and when the first cut was asked for; the phase shown in
  // JobStatus; what the done moves were.
  uint32_t target_ = 0;
  uint64_t cut_ = 0;
  absl::Time asked_ = absl::InfiniteFuture();
  std::string phase_;
  v1::ReshardProgress done_;
  struct Standby {
    Membership::Endpoint endpoint;
    int calls_waiting = 0;
    absl::Time last_call = absl::InfinitePast();  // real time
  };
  std::map<uint32_t, Standby> standbys_;
};

// The job's members onto `count` shards, each new one served by its server
// in `servers` (by shard); later checkpoints need `count` reports. Returns
// the shards dropped, with their servers' incarnations. FAILED_PRECONDITION
// when the map of `count` shards cannot be built (the move cannot happen);
// Membership::Reshard's INVALID_ARGUMENT, nothing changed, when a new shard
// has no server.
absl::StatusOr<std::map<uint32_t, uint64_t>> ReshardMembers(
    uint32_t count, const std::map<uint32_t, Membership::Endpoint>& servers,
    uint64_t chunk_bytes, Membership* membership, CheckpointScheduler* checkpoints,
    absl::Time now);

}  // namespace grps

#endif  // GRPS_COORDINATOR_RESHARDING_H_
