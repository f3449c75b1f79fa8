// Membership: who takes part in a job. Parameter servers by shard and workers
// by rank, with their incarnations, liveness and latest reports, and the
// shard map whose endpoints the servers' registrations fill in.
//
// Slots. A registration takes the requested slot, or else the lowest slot
// never registered, or else the lowest DEAD one. A live rank is not handed
// over: a worker registration that names an ALIVE rank is refused
// (ALREADY_EXISTS) unless the caller proved it is that rank's current
// incarnation (its member secret), so a restarted worker takes its rank once
// the old incarnation is declared DEAD, within a heartbeat timeout. A server
// may take its live shard back (servers hold the admin token; a restarted
// server rolls the job back). A server that registers again from the address
// its shard already has gets that shard back. A slot that is re-taken gets a
// new incarnation, which fences off the previous process: its heartbeats and
// WorkerDone calls get FAILED_PRECONDITION.
// Incarnations only grow, also across coordinator restarts (they start at
// the registration's Unix time in milliseconds).
//
// Liveness. A member is ALIVE from registration until it is silent for
// longer than the heartbeat timeout, when DetectFailures marks it DEAD. A
// heartbeat from a DEAD member with its current incarnation makes it ALIVE
// again: the process evidently lives (a restarted process registers instead).
// A worker that leaves on purpose (WorkerDone with `leaving`: SIGTERM, or a
// drain an operator asked for, which its heartbeat replies carry) is LEFT:
// out of the live set at once, not revived by a heartbeat; its rank is free
// for a new worker, which resumes at the rank's step.
// A worker that calls WorkerDone is FINISHED and stays so; it may go on
// heartbeating (its last heartbeat is recorded, DetectFailures never marks it
// DEAD) and calling WorkerDone, so FinishedRanksHeartbeating tells which
// finished workers still run.
//
// Resuming. A rank remembers the highest progress step any of its
// incarnations reported; a re-registration hands it back as start_step.
//
// Roll-back. ResetResumeSteps sets every rank's resume step (a job resumed
// from, or rolled back to, a checkpoint) and brings FINISHED ranks that have
// steps left back to ALIVE: they train again from there.
//
// Adoption. A restarted coordinator learns of members from their heartbeats
// (AdoptServer, AdoptWorker) or from its persisted state (ImportFrom). An
// adopted incarnation must be newer than the one the slot has, so an old
// process never displaces a newer one.
//
// Epochs. membership_epoch() bumps whenever the set of live workers or their
// incarnations changes; the shard map's epoch bumps whenever an endpoint
// changes. Both start at 0.
//
// Time is passed in (`now`), so tests drive the clock.
// Not thread-safe: the caller (JobStateMachine) serializes every call.
#ifndef GRPS_COORDINATOR_MEMBERSHIP_H_
#define GRPS_COORDINATOR_MEMBERSHIP_H_

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "proto/grps.pb.h"

namespace grps {


class Membership {
 public:
  // The slot a registration got.
  struct Registration {
    uint32_t slot = 0;  // shard or rank
    uint64_t incarnation = 0;
    // The slot had been registered before (a restart or a take-over).
    bool rejoined = false;
    // Workers: the highest progress step the rank's earlier incarnations
    // reported (0 for a first registration); the new one resumes there.
    uint64_t start_step = 0;
  };

  // Members whose state DetectFailures changed to DEAD.
  struct Failures {
    std::vector<uint32_t> shards;
    std::vector<uint32_t> ranks;
    bool empty() const { return shards.empty() && ranks.empty(); }
  };

  // Live workers (ALIVE and not joining), ascending by rank, with their
  // incarnations (parallel).
  struct LiveWorkers {
    std::vector<uint32_t> ranks;
    std::vector<uint64_t> incarnations;
  };

  // A test evaluation a worker reported.
  struct Evaluation {
    float accuracy = 0;
    float loss = 0;
    std::optional<float> auc;  // two-class models
  };

  // `shard_map` fixes the shards (its endpoint list is rebuilt, one empty
  // endpoint per shard, epoch 0); `num_workers` the ranks, of which the
  // first `start_workers` (0: all) must register before the job starts; the
  // others may join it later (an elastic job). Requires num_workers > 0 and
  // a timeout > 0.
  Membership(v1::ShardMap shard_map, uint32_t num_workers,
             absl::Duration heartbeat_timeout, uint32_t start_workers = 0);

  Membership(const Membership&) = delete;
  Membership& operator=(const Membership&) = delete;

  // A user model's layout, once its first worker defined it: the tensors and
  // chunks of `built` (BuildShardMap over the same shard count) replace the
  // map's; endpoints and epoch stay.
  void SetLayout(const v1::ShardMap& built);

  // Re-sharding (JobConfig.max_servers): the shards become those of `built`
  // (BuildShardMap of the same tensors and chunk size over another shard
  // count), the map's epoch bumps. Shards below both counts keep their
  // servers; each new shard takes its server from `joining` (by shard:
  // address and incarnation, ReserveIncarnation's), ALIVE with a heartbeat
  // at `now`. Returns the shards dropped (at or past the new count) with
  // their servers' incarnations. INVALID_ARGUMENT, nothing changed, when
  // `built` cuts the model into other chunks or a new shard has no server.
  struct Endpoint {
    std::string address;
    uint64_t incarnation = 0;
  };
  absl::StatusOr<std::map<uint32_t, uint64_t>> Reshard(
      const v1::ShardMap& built, const std::map<uint32_t, Endpoint>& joining, absl::Time now);
  // A server incarnation handed out before the shard exists (a standby).
  uint64_t ReserveIncarnation(absl::Time now) { return NextIncarnation(now); }

  // Registers a server listening on `address` ("host:port") for
  // `requested_shard` (-1: any). INVALID_ARGUMENT for a malformed address or
  // a shard out of range; FAILED_PRECONDITION when the address already
  // serves another live shard; RESOURCE_EXHAUSTED when no shard is free.
  absl::StatusOr<Registration> RegisterServer(int32_t requested_shard,
                                              absl::string_view address,
                                              absl::Time now);

  // INVALID_ARGUMENT for a rank out of range or an oversized host/backend:
  // the checks of RegisterWorker that do not depend on the current members.
  absl::Status ValidateWorkerRequest(int32_t requested_rank,
                                     absl::string_view host,
                                     absl::string_view backend) const;

  // Registers a worker for `requested_rank` (-1: any). The errors of
  // ValidateWorkerRequest; FAILED_PRECONDITION for a rank that already
  // finished; ALREADY_EXISTS for an ALIVE rank unless `holds_live_rank` (the
  // caller proved it is the incarnation LiveIncarnation names);
  // RESOURCE_EXHAUSTED when no rank is free.
  // A `joining` rank is out of live_workers() until MarkReady.
  absl::StatusOr<Registration> RegisterWorker(int32_t requested_rank,
                                              absl::string_view host,
                                              absl::string_view backend,
                                              absl::Time now,
                                              bool holds_live_rank, bool joining = false);
  // A joining rank is ready to train (an elastic job's worker leased its
  // first examples, its data loaded): it enters the live set, and the
  // membership epoch bumps. False if it was not joining.
  bool MarkReady(uint32_t rank);

  // The incarnation of `rank` while it is ALIVE; nullopt for a rank out of
  // range, never registered, DEAD or FINISHED.
  std::optional<uint64_t> LiveIncarnation(uint32_t rank) const;

  // Records a heartbeat and the server's latest status (its shard, address
  // and incarnation fields are replaced by the registered ones). NOT_FOUND
  // for a shard that never registered, FAILED_PRECONDITION for a stale
  // incarnation; on error nothing changes. Sets *revived when the server was
  // DEAD.
  absl::Status ServerHeartbeat(uint32_t shard, uint64_t incarnation,
                               const v1::ShardStatus& status, absl::Time now,
                               bool* revived);
  // The same for a server that is restoring (HeartbeatRequest.restoring):
  // the heartbeat only; its last status stays.
  absl::Status ServerAlive(uint32_t shard, uint64_t incarnation, absl::Time now, bool* revived);

  // Records a heartbeat and, when `progress` is set, the worker's progress.
  // Errors as for ServerHeartbeat, plus INVALID_ARGUMENT for implausible
  // progress (negative or non-finite samples/s, accuracy outside [-1, 1]).
  absl::Status WorkerHeartbeat(uint32_t rank, uint64_t incarnation,
                               const v1::WorkerProgress* progress,
                               absl::Time now, bool* revived);

  // Marks the worker FINISHED with its final progress. Idempotent. Errors as
  // for WorkerHeartbeat.
  absl::Status FinishWorker(uint32_t rank, uint64_t incarnation,
                            const v1::WorkerProgress& progress, absl::Time now);

  // Marks the worker LEFT with its last progress (ALIVE or DEAD before;
  // idempotent). FAILED_PRECONDITION for a FINISHED rank; errors as for
  // FinishWorker otherwise.
  absl::Status LeaveWorker(uint32_t rank, uint64_t incarnation,
                           const v1::WorkerProgress& progress, absl::Time now);

  // Asks an ALIVE rank to leave after its step in progress (until it leaves
  // or the rank is registered again). NOT_FOUND out of range,
  // FAILED_PRECONDITION unless ALIVE.
  absl::Status RequestDrain(uint32_t rank);
  bool DrainRequested(uint32_t rank) const;

  // Takes in a member this coordinator never registered (a restarted
  // coordinator hearing a heartbeat): the slot gets `incarnation`, ALIVE
  // (or FINISHED for a worker that says it finished), heartbeat at `now`;
  // a server's endpoint gets `address` and the map epoch bumps.
  // INVALID_ARGUMENT for a slot out of range or a bad address;
  // FAILED_PRECONDITION when the slot already has this or a newer
  // incarnation. Later incarnations keep growing past the adopted one.
  absl::Status AdoptServer(uint32_t shard, uint64_t incarnation,
                           absl::string_view address, absl::Time now);
  absl::Status AdoptWorker(uint32_t rank, uint64_t incarnation, bool finished,
                           const v1::WorkerProgress* progress, absl::Time now);

  // Sets rank r's resume step (start_step of its next registration) to
  // worker_steps[r] (0 where the vector is short), and its progress step too.
  // FINISHED ranks whose step is now below their total steps become ALIVE
  // with a heartbeat at `now`; they are returned, ascending.
  std::vector<uint32_t> ResetResumeSteps(const std::vector<uint64_t>& worker_steps,
                                         absl::Time now);

  // The members as CoordinatorState records them (shards, workers,
  // map_epoch, membership_epoch), and back: every registered member becomes
  // ALIVE with a heartbeat at `now`, except FINISHED workers, which stay
  // FINISHED. ImportFrom requires a state of this job's shape
  // (INVALID_ARGUMENT otherwise, and nothing changes).
  void ExportTo(v1::CoordinatorState* state) const;
  absl::Status ImportFrom(const v1::CoordinatorState& state, absl::Time now);

  // Versions of the ALIVE shards that reported chunks, by shard.
  std::vector<uint64_t> LiveShardVersions() const;
  // ALIVE shards that have not reported a status to this coordinator yet
  // (registered, or adopted by ImportFrom, with no heartbeat since).
  std::vector<uint32_t> LiveShardsUnheard() const;

  // Records a final evaluation (from WorkerDone) as the latest evaluation.
  void RecordEvaluation(Evaluation evaluation);

  // Marks every ALIVE member silent for longer than the timeout as DEAD.
  Failures DetectFailures(absl::Time now);

  // Every shard has registered at least once (the map has every endpoint).
  bool AllShardsRegistered() const;
  // Shards / ranks that never registered, ascending.
  std::vector<uint32_t> UnregisteredShards() const;
  // (Ranks: of those that start the job.)
  std::vector<uint32_t> UnregisteredRanks() const;
  // Ranks / shards in `state`, ascending (never-registered ones have none).
  std::vector<uint32_t> RanksInState(v1::MemberState state) const;
  // No rank ALIVE and at least one FINISHED: a running job is done
  // training.
  bool TrainingOver() const;
  // FINISHED ranks whose last heartbeat (or WorkerDone) is at most the
  // heartbeat timeout before `now`, ascending.
  std::vector<uint32_t> FinishedRanksHeartbeating(absl::Time now) const;
  std::vector<uint32_t> ShardsInState(v1::MemberState state) const;

  LiveWorkers live_workers() const;
  uint64_t membership_epoch() const { return membership_epoch_; }
  const v1::ShardMap& shard_map() const { return shard_map_; }
  uint32_t num_shards() const { return static_cast<uint32_t>(servers_.size()); }
  uint32_t num_workers() const { return static_cast<uint32_t>(workers_.size()); }

  // The evaluation most recently reported (a new one in a worker's progress,
  // or a final one), if any.
  std::optional<Evaluation> latest_evaluation() const { return latest_eval_; }

  // One entry per rank / shard, in order, as of `now`. Workers carry no
  // straggler flag (see SummarizeJobStatus). A shard that never reported
  // status has only shard/address/incarnation/state set.
  std::vector<v1::WorkerStatus> WorkerStatuses(absl::Time now) const;
  std::vector<v1::ShardStatus> ShardStatuses(absl::Time now) const;

 private:
  struct Server {
    bool registered = false;
    uint64_t incarnation = 0;
    std::string address;
    v1::MemberState state = v1::MEMBER_STATE_UNSPECIFIED;
    absl::Time last_heartbeat;
    std::optional<v1::ShardStatus> status;
  };
  struct Worker {
    bool registered = false;
    uint64_t incarnation = 0;
    std::string host;
    std::string backend;
    v1::MemberState state = v1::MEMBER_STATE_UNSPECIFIED;
    absl::Time last_heartbeat;
    std::optional<v1::WorkerProgress> progress;
    // Highest progress step reported by any incarnation of this rank.
    uint64_t resume_step = 0;
    bool drain = false;  // RequestDrain, until it leaves or re-registers
    // Registered into a running elastic job: ALIVE, but out of the live set
    // (the quorum) until MarkReady.
    bool joining = false;
  };

  // The slot a registration takes, or an error.
  absl::StatusOr<uint32_t> PickShard(int32_t requested,
                                     absl::string_view address) const;
  absl::StatusOr<uint32_t> PickRank(int32_t requested, bool holds_live_rank,
                                    absl::Time now) const;
  // Checks that (rank, incarnation) names the current worker of that rank.
  absl::Status CheckWorker(uint32_t rank, uint64_t incarnation) const;
  // The same for the server of a shard.
  absl::Status CheckServer(uint32_t shard, uint64_t incarnation) const;
  uint64_t NextIncarnation(absl::Time now);
  // Records progress and notices a new evaluation in it.
  void RecordProgress(Worker* worker, const v1::WorkerProgress& progress);

  const absl::Duration heartbeat_timeout_;
  const uint32_t start_workers_;  // ranks that register before the job starts
  std::vector<Server> servers_;  // by shard
  std::vector<Worker> workers_;  // by rank
  v1::ShardMap shard_map_;
  uint64_t membership_epoch_ = 0;
  uint64_t last_incarnation_ = 0;
  std::optional<Evaluation> latest_eval_;
};

}  // namespace grps

#endif  // GRPS_COORDINATOR_MEMBERSHIP_H_
