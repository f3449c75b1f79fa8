// WorkerSession: a registered worker's standing in its job, for whoever
// computes its gradients: grps-worker's Trainer (the built-in models) and
// the grps Python package (a user's PyTorch model, python/grps). It holds
// the member agent (heartbeats carrying the holder's progress), follows
// what the replies say (a newer shard map, the job's state, the evaluator,
// a roll-back's restore order), and makes every wait of a step bounded the
// same way:
//
// - a pull waits in slices while the shards hold it (sync, ssp) or a shard
//   is away, as long as the job runs and the coordinator answers;
// - a push retries while a shard is away, deduplicated by the shards;
// - a refusal from an older generation (ABORTED) waits for the restore
//   order, which TakeRollBack then applies;
// - nothing waits past the job's end, a roll-back, a signal, the holder's
//   own stop (`interrupted`), or coordinator_timeout_ms of silence.
//
// Shard maps: a newer map of the same layout (a shard moved) goes to the
// clients at once. One that places the same chunks on other shards (a
// re-sharding, JobConfig.max_servers) comes with the order of a roll-back
// to a checkpoint; a holder that follows such maps (Options::
// follow_replaced_maps) gets it from TakeRollBack with that order, builds
// clients for it and hands them to ReplaceClients. Any other map (another
// model) is refused, and the clients keep theirs.
//
// Thread safety: every method may be called from any thread, except
// ReplaceClients; the pulls and pushes are one training thread's
// (ParameterShards' rule), and so is ReplaceClients.
#ifndef GRPS_WORKER_WORKER_SESSION_H_
#define GRPS_WORKER_WORKER_SESSION_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "member/member_agent.h"
#include "proto/grps.grpc.pb.h"
#include "worker/parameter_shards.h"
#include "worker/sparse_shards.h"

namespace grps {

// A pull waits at the shards at most this long per attempt (then the
// session looks at the job again).
inline constexpr absl::Duration kPullSlice = absl::Seconds(2);

// The job and shard map a registration brought, checked before a worker
// trusts them: INVALID_ARGUMENT ("coordinator sent an unusable job: ...").
absl::Status CheckRegistration(const v1::RegisterWorkerResponse& registration);

class WorkerSession {
 public:
  // What ends a wait besides its own success.
  enum class Interrupt {
    kNone,
    kSignal,     // SIGINT / SIGTERM, or the holder's `interrupted`
    kJobEnded,   // COMPLETED or STOPPED
    kJobFailed,  // FAILED
    kRollBack,   // a restore order of a newer generation is pending
  };

  struct Options {
    // Measures the coordinator's silence and the bounds of every wait
    // (tests drive it); sleeps and gRPC deadlines are real time.
    MemberAgent::Clock clock = &absl::Now;
    // The holder's own reason to stop waiting (Python: a KeyboardInterrupt
    // pending); polled from the waiting thread. Null: signals only.
    std::function<bool()> interrupted;
    // For clients of the same shards that the holder keeps besides the
    // session's (the Trainer's evaluation client), so that they follow the
    // session's. Either may be null.
    // on_shard_map: a newer shard map of the same layout the session's
    // clients took, called after them: on the heartbeat thread, or in
    // ReplaceClients (one that came while the clients were replaced).
    std::function<void(const v1::ShardMap&)> on_shard_map;
    // on_generation: the generation the session's clients were just set to,
    // called after them: in the constructor (the registration's) and in
    // TakeRollBack (the order's) and ReplaceClients, on the caller's thread.
    std::function<void(uint64_t)> on_generation;
    // on_claim_examples: a heartbeat reply asked this worker to say what it
    // holds and trained (HeartbeatResponse.claim_examples); called on the
    // heartbeat thread. Null: ignored.
    std::function<void()> on_claim_examples;
    // The holder replaces the clients for a map that places the chunks on
    // other shards (TakeRollBack's replaced_map, ReplaceClients). False:
    // such a map is refused as one of another model is (UserWorker's).
    bool follow_replaced_maps = false;
  };

  // The session's clients of the shards: dense required, sparse may be null.
  struct Clients {
    std::unique_ptr<ParameterShards> dense;
    std::unique_ptr<SparseShards> sparse;
  };

  // `registration` is the coordinator's answer (validated by the caller);
  // `dense` (required) and `sparse` (may be null) reach the shards of its
  // map as its rank and incarnation; the session sets their generation and
  // hands them newer maps. Heartbeats start at once. *coordinator must
  // outlive the session.
  WorkerSession(v1::Coordinator::StubInterface* coordinator,
                const v1::RegisterWorkerResponse& registration,
                std::unique_ptr<ParameterShards> dense, std::unique_ptr<SparseShards> sparse,
                Options options);
  ~WorkerSession();  // stops the heartbeats

  WorkerSession(const WorkerSession&) = delete;
  WorkerSession& operator=(const WorkerSession&) = delete;

  const v1::JobConfig& config() const { return config_; }
  uint32_t rank() const { return rank_; }
  uint64_t incarnation() const { return incarnation_; }
  // The clients in use. Valid until ReplaceClients, which only the
  // training thread calls.
  ParameterShards& dense() ABSL_LOCKS_EXCLUDED(clients_mu_) { return *Dense(); }
  SparseShards* sparse() ABSL_LOCKS_EXCLUDED(clients_mu_);
  uint64_t generation() const ABSL_LOCKS_EXCLUDED(mu_);

  // ---- What the heartbeats carry ----

  // Edits the progress the next heartbeat reports (under the session's lock).
  void UpdateProgress(const std::function<void(v1::WorkerProgress*)>& edit)
      ABSL_LOCKS_EXCLUDED(mu_);
  v1::WorkerProgress progress() const ABSL_LOCKS_EXCLUDED(mu_);
  // The rank the coordinator names as evaluator now, if any; whether it asks
  // this rank to evaluate the final weights.
  std::optional<uint32_t> evaluator_rank() const ABSL_LOCKS_EXCLUDED(mu_);
  bool asked_for_final_evaluation() const ABSL_LOCKS_EXCLUDED(mu_);

  // ---- Bounded waits ----

  Interrupt Interrupted() const ABSL_LOCKS_EXCLUDED(mu_);
  // The worker should leave the job at its next step boundary: SIGTERM
  // (daemon's LeaveOnSigterm) or the coordinator drained this rank. Not an
  // interrupt: the step in progress completes.
  bool LeaveRequested() const ABSL_LOCKS_EXCLUDED(mu_);
  // WorkerDone with `leaving` and the progress so far, at `step` (the steps
  // this rank completed): the rank is out of the live set at once. Retried
  // while the coordinator is unreachable, for at most kLeaveGrace (the
  // coordinator otherwise declares the rank dead after its heartbeat timeout).
  absl::Status Leave(uint64_t step);
  // The error for a FAILED job, with the coordinator's reason.
  absl::Status JobFailed();
  // If a restore order of a newer generation is pending: switches to its
  // generation, sets *step to where this rank resumes (at most `total`),
  // logs, returns true. With follow_replaced_maps, *replaced_map is then the
  // newest map that places the chunks on other shards, if one came (with
  // the order, or before it), else empty: the caller follows it with
  // ReplaceClients before its next pull.
  bool TakeRollBack(uint64_t total, uint64_t* step,
                    std::optional<v1::ShardMap>* replaced_map = nullptr)
      ABSL_LOCKS_EXCLUDED(mu_);
  // Follows `map` (TakeRollBack's replaced_map): `fresh` reaches its shards
  // as this rank and incarnation. Sets their generation to the session's
  // and makes them the session's clients (on_generation is called), logs,
  // and returns the clients they replace, which no call of the session
  // uses any more. Training thread only, between its pulls and pushes.
  Clients ReplaceClients(const v1::ShardMap& map, Clients fresh)
      ABSL_LOCKS_EXCLUDED(mu_, clients_mu_);
  // Retries `attempt` (a pull that may wait at the shards for `clock`, at
  // most kPullSlice at a time) until it succeeds, the job ends or rolls back
  // (CANCELLED), it fails otherwise than by waiting or an unavailable shard,
  // or the coordinator has been silent too long. `what` names what is read.
  absl::Status WaitToPull(absl::string_view what, uint64_t clock,
                          const std::function<absl::Status()>& attempt);
  // The dense weights for `clock` into `params`, as WaitToPull waits.
  absl::Status PullWeights(uint64_t clock, float* params);
  // A restarted rank in sync: pulls the weights for *step and moves *step
  // up to where the others are (FollowTheWeights).
  absl::Status JoinTheOthers(uint64_t* step, float* params);
  // In sync without backup workers, a rank's clock is the step of the
  // weights it holds: moves *step up to the highest version it pulled and
  // returns whether it moved. A shard completes a step without a rank only
  // while the rank is not counted (a restarted rank, until the step the
  // coordinator named), and the weights that rank reads next may then be a
  // step or more further on. A clock left behind them pushed, at the job's
  // last steps, gradients computed on the last version: a step past the end
  // on the shards they reached (and the job's final checkpoint failed). A
  // straggler behind backup workers keeps its own steps (its late gradients
  // are the mode at work): false.
  bool FollowTheWeights(uint64_t* step);
  // The retry policy of every push: as long as the job runs and the
  // coordinator answers.
  ParameterShards::RetryPolicy PushRetry();
  // Pushes step's dense gradient, fused with the pull of step + 1 into
  // `params`, retrying as PushRetry says and while the push outlives its
  // deadline (the shards deduplicate it).
  absl::StatusOr<ParameterShards::PushOutcome> PushGradients(uint64_t step, const float* grads,
                                                             uint32_t samples, float* params);
  // The same, where the push is already on its way (UserWorker's staged
  // push): `started` waits for it, with the retry policy, as the first
  // attempt; the later ones push all of `grads` again.
  using StartedPush = std::function<absl::StatusOr<ParameterShards::PushOutcome>(
      const ParameterShards::RetryPolicy&)>;
  absl::StatusOr<ParameterShards::PushOutcome> PushGradients(uint64_t step, const float* grads,
                                                             uint32_t samples, float* params,
                                                             const StartedPush& started);
  // Step's gradients of `ids` (distinct) of sparse table `table` (grads:
  // ids.size() x dim floats), retried as PushGradients retries.
  absl::StatusOr<SparseShards::PushOutcome> PushRows(const std::string& table, uint64_t step,
                                                     absl::Span<const int64_t> ids,
                                                     const float* grads);
  // A push or pull refused as from an older generation: waits (at most
  // coordinator_timeout_ms) until the restore order arrives; CANCELLED then
  // (or at any other interrupt).
  absl::Status WaitForRestoreOrder(const absl::Status& refused);
  // WorkerDone with `done` (job, rank, incarnation and generation are set
  // here), retried while the coordinator may still answer. OK also when an
  // interrupt ended it; a roll-back after this rank finished waits for the
  // restore order.
  absl::Status ReportDone(v1::WorkerDoneRequest done);
  // Elastic jobs: reports the blocks trained and leases more
  // (Coordinator.LeaseExamples; the session sets job, rank, incarnation and
  // generation), retried as ReportDone is. CANCELLED on an interrupt,
  // ABORTED when the job rolled back, UNAVAILABLE when the coordinator is
  // silent too long; the coordinator's refusal otherwise.
  absl::StatusOr<v1::LeaseExamplesResponse> LeaseExamples(v1::LeaseExamplesRequest request);
  // Contributes `payload` to the job's collective `name` (Coordinator.
  // Collective) and waits until every live worker has, asking again every
  // few milliseconds: the complete round, every contributor's payload in
  // rank order. Retried as LeaseExamples is; DEADLINE_EXCEEDED after
  // `timeout`, CANCELLED on an interrupt, NOT_FOUND when the coordinator
  // lost the round (it restarted).
  absl::StatusOr<v1::CollectiveResponse> Collective(const std::string& name,
                                                    std::string payload,
                                                    absl::Duration timeout);
  // After ReportDone: waits until the job ends, a roll-back comes, or the
  // coordinator asks this rank for the final evaluation (true): again after
  // one was reported (ReportDone with has_final_eval or no_final_eval) only
  // once a reply stopped asking in between. The coordinator's silence past
  // coordinator_timeout_ms is an error.
  absl::StatusOr<bool> AwaitEndOrFinalEvaluation();
  // As AwaitEndOrFinalEvaluation, without stopping for the final evaluation
  // (after it was reported): OK once an interrupt ends the wait.
  absl::Status AwaitEnd();
  bool finished() const ABSL_LOCKS_EXCLUDED(mu_);
  // The job's state as the last heartbeat reply said.
  v1::JobState job_state() const ABSL_LOCKS_EXCLUDED(mu_);

  // How long the coordinator has not answered a heartbeat.
  absl::Duration CoordinatorSilence() const { return agent_.Silence(); }
  absl::Duration coordinator_timeout() const { return coordinator_timeout_; }
  // A wait that has made no progress for coordinator_timeout while the
  // coordinator was silent as long: give up.
  bool StuckWithoutCoordinator() const ABSL_LOCKS_EXCLUDED(mu_);
  void NoteProgress() ABSL_LOCKS_EXCLUDED(mu_);
  absl::Time Now() const { return options_.clock(); }

 private:
  MemberAgent::Handlers HeartbeatHandlers();
  // Moves *step up to `at` (logging the steps skipped); whether it moved.
  static bool MoveUpTo(uint64_t at, uint64_t* step);
  // What a push that failed with `s` does next: OK to send it again (an
  // unavailable shard; a push past its deadline, which the shards
  // deduplicate; one that a shard a re-sharding retired cancelled as it
  // went away, before this worker heard of the move: the roll-back comes
  // with a heartbeat reply), or the status to return. `what` names it.
  absl::Status PushFailed(const absl::Status& s, absl::string_view what);
  void OnHeartbeatReply(const v1::HeartbeatResponse& resp) ABSL_LOCKS_EXCLUDED(mu_);
  // A shard map from a heartbeat reply: the clients follow it, or it is
  // refused, or (returned) it re-places the chunks and waits for its
  // roll-back. Maps not newer than the newest seen are ignored.
  std::optional<v1::ShardMap> FollowShardMap(const v1::ShardMap& map)
      ABSL_LOCKS_EXCLUDED(clients_mu_);
  // FollowShardMap's choice, for any map newer than the clients'.
  std::optional<v1::ShardMap> FollowLocked(const v1::ShardMap& map)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(clients_mu_);
  // Keeps `map` for the next roll-back unless a newer one is kept.
  void KeepReplacedMap(v1::ShardMap map) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  ParameterShards* Dense() const ABSL_LOCKS_EXCLUDED(clients_mu_);
  void SetGeneration(uint64_t generation) ABSL_LOCKS_EXCLUDED(clients_mu_);
  // The wait of AwaitEnd*: true when `final_evaluation` and the coordinator
  // asks for it.
  absl::StatusOr<bool> AwaitEndOr(bool final_evaluation);
  // Retries `call` (given the generation now) while the coordinator is
  // unreachable, and its refusals FAILED_PRECONDITION and NOT_FOUND (a
  // restarted coordinator that has not heard this rank yet) for the
  // silence bound; ABORTED is not retried. *gave_up: the coordinator was
  // silent too long.
  absl::Status CallCoordinator(const std::function<absl::Status(uint64_t generation)>& call,
                               bool* gave_up);

  v1::Coordinator::StubInterface* const coordinator_;
  const v1::JobConfig config_;
  const uint32_t rank_;
  const uint64_t incarnation_;
  const Options options_;
  const absl::Duration coordinator_timeout_;

  // The clients and the map they follow: replaced by the training thread
  // (ReplaceClients), used by the heartbeat thread under the lock. Calls
  // that may wait (pulls, pushes) are made without it.
  mutable absl::Mutex clients_mu_;
  std::unique_ptr<ParameterShards> dense_ ABSL_GUARDED_BY(clients_mu_);
  std::unique_ptr<SparseShards> sparse_ ABSL_GUARDED_BY(clients_mu_);
  v1::ShardMap map_ ABSL_GUARDED_BY(clients_mu_);
  // The newest epoch followed, kept or refused: an older map is ignored.
  uint64_t newest_epoch_ ABSL_GUARDED_BY(clients_mu_) = 0;

  mutable absl::Mutex mu_;
  v1::WorkerProgress progress_ ABSL_GUARDED_BY(mu_);
  uint64_t generation_ ABSL_GUARDED_BY(mu_) = 0;
  std::optional<v1::RestoreOrder> restore_ ABSL_GUARDED_BY(mu_);  // pending
  // A map that re-places the chunks, for the next roll-back: recorded with
  // the order of the same reply, so TakeRollBack sees both or neither.
  std::optional<v1::ShardMap> replaced_map_ ABSL_GUARDED_BY(mu_);
  v1::JobState job_state_ ABSL_GUARDED_BY(mu_) = v1::JOB_STATE_RUNNING;
  std::optional<uint32_t> evaluator_rank_ ABSL_GUARDED_BY(mu_);
  bool evaluate_final_ ABSL_GUARDED_BY(mu_) = false;
  // No final evaluation was reported while asked for one, or a heartbeat
  // reply since said the coordinator no longer asks: a request now is a new
  // one (training done again after a rank came back; the last evaluation is
  // not final).
  bool evaluation_wanted_again_ ABSL_GUARDED_BY(mu_) = true;
  bool finished_ ABSL_GUARDED_BY(mu_) = false;  // WorkerDone answered
  bool drain_ ABSL_GUARDED_BY(mu_) = false;     // a heartbeat reply said drain
  absl::Time last_progress_ ABSL_GUARDED_BY(mu_);
  // The heartbeat thread's own.
  bool said_silent_ = false;

  MemberAgent agent_;  // last: its thread uses the members above
};

}  // namespace grps

#endif  // GRPS_WORKER_WORKER_SESSION_H_
