// JobStateMachine: the job as the coordinator runs it, without the network.
// It hands out shards and ranks (through Membership), tracks liveness,
// decides the job's state, its evaluator, its checkpoints and roll-backs, and
// what a restarted coordinator takes over. CoordinatorService translates the
// RPCs of grps.v1.Coordinator to its methods; the requests reach it past the
// edge's checks (role, member secret, job id).
//
// States: WAITING until every shard and rank registered once, then RUNNING.
// Training is done when every rank is FINISHED or DEAD, at least one
// FINISHED; the job stays RUNNING for the final checkpoint (at most
// CheckpointScheduler::kTimeout) and the final evaluation, and becomes
// COMPLETED when the evaluation arrives, or without one once no finished
// worker heartbeats any more. A job whose ranks all died without finishing
// stays RUNNING (a restarted worker may come) until the recovery timeout.
// STOPPED by StopJob or Stop(); FAILED by DetectFailures (a shard dead, or no
// worker left, for longer than the recovery timeout). COMPLETED, STOPPED and
// FAILED are final: registrations are refused, heartbeats carry the state.
//
// The evaluator: while training, the lowest ALIVE rank; once training is
// done, the lowest FINISHED rank still heartbeating, told evaluate_final only
// once every ALIVE server heartbeated again after a reply that carried the
// final (empty) live set. Only a final evaluation from after training was
// done is final.
//
// Checkpoints (with checkpoint_dir; see CheckpointScheduler and
// docs/durability.md): one at a time, periodic, by CheckpointJob, and a final
// one. Each live server's heartbeat replies carry the request until the
// shard reports it; once every shard wrote its file, WriteReadyManifest
// writes the MANIFEST (outside the lock).
//
// Generations (restore_order()): a job starts at 1, one resumed (ResumeFrom)
// at 2. A server that registers again while the job runs, a shard that cannot
// restore the ordered checkpoint, or a member of a newer generation rolls the
// job back: generation + 1 with the newest checkpoint that verifies, every
// rank resumes at its worker step and FINISHED ranks train again. A member
// whose heartbeat names an older generation gets the restore order and its
// progress is not recorded until it follows.
//
// A restarted coordinator: ExportState / PersistState write what TakeOver
// reads; a heartbeat from a member it does not know is adopted. After
// TakeOver nobody is declared dead for a grace period (see TakeOver).
//
// The machine decides the job's phase and orders each event's steps; the
// state of each concern, and the work of each step, is a collaborator's:
// the members' requests (ServerRequests, WorkerRequests, Heartbeats), the
// state kept (JobPhase, Membership, Generations, CheckpointScheduler,
// Resharding, JobEnding, ElasticData, JobModel, GlobalStep), the job-wide
// operations (RollBacks, CheckpointCuts, RecoveryFailure, take_over.h), what
// the job says (JobReport) and how callers wait (JobWaits); the map of them
// is in docs/architecture.md.
//
// Time: `clock` for liveness, timeouts and status figures; blocking waits
// (Wait) use real time. Thread-safe: one mutex guards the machine and every
// collaborator (none has a lock of its own; the lock order is in
// docs/architecture.md, "The coordinator's locks"); file I/O of manifests
// and the state file happens outside it.
#ifndef GRPS_COORDINATOR_JOB_STATE_MACHINE_H_
#define GRPS_COORDINATOR_JOB_STATE_MACHINE_H_

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "coordinator/checkpoint_cuts.h"
#include "coordinator/checkpoint_scheduler.h"
#include "coordinator/elastic_data.h"
#include "coordinator/generations.h"
#include "coordinator/global_step.h"
#include "coordinator/heartbeats.h"
#include "coordinator/job_ending.h"
#include "coordinator/job_model.h"
#include "coordinator/job_phase.h"
#include "coordinator/job_report.h"
#include "coordinator/job_waits.h"
#include "coordinator/membership.h"
#include "coordinator/resharding.h"
#include "coordinator/roll_backs.h"
#include "coordinator/server_requests.h"
#include "coordinator/state_file.h"
#include "coordinator/worker_requests.h"
#include "job/user_model.h"
#include "daemon/env.h"
#include "proto/grps.pb.h"

namespace grps {

class JobStateMachine {
 public:
  using Clock = std::function<absl::Time()>;

  struct Options {
    // File access for manifests, roll-backs and the state file; nullptr:
    // Env::Default().
    Env* env = nullptr;
    // Where PersistState writes the CoordinatorState; empty: nowhere.
    std::string state_path;
    // The longest a member's channel waits between attempts to dial the
    // coordinator again (part of TakeOver's grace).
    absl::Duration reconnect_backoff = absl::Seconds(1);
  };

  // How a blocking call waits: until `deadline` (real time), unless
  // `cancelled` says the caller left, or ReleaseWaiters is called.
  using Wait = JobWait;

  // A server's registration; `rolled_back` when it rolled the job back (the
  // caller persists the state before answering). member_secret is not set.
  using ServerRegistration = grps::ServerRegistration;

  // `config` must be valid (ValidateJobConfig) and `shard_map` built from it.
  JobStateMachine(v1::JobConfig config, v1::ShardMap shard_map, Clock clock,
                  Options options);

  // The job's config as the flags set it: a user model's tensors are not
  // in it (JobConfig() has them).
  const v1::JobConfig& config() const { return config_; }
  // The config members are handed: with the user model's tensors, once
  // defined.
  v1::JobConfig JobConfig() const ABSL_LOCKS_EXCLUDED(mu_);
  // The ranks alive now (ALIVE and ready: what a sync step waits for).
  std::vector<uint32_t> LiveWorkerRanks() const ABSL_LOCKS_EXCLUDED(mu_);

  // ---- Before serving (once) ----

  // The job resumes from the complete checkpoint `manifest` in `dir`
  // (already checked against the shard map): generation 2, every rank
  // starts at its worker step.
  void ResumeFrom(const v1::CheckpointManifest& manifest, const std::string& dir)
      ABSL_LOCKS_EXCLUDED(mu_);
  // Checkpoint ids below `id` are taken.
  void SetNextCheckpointId(uint64_t id) ABSL_LOCKS_EXCLUDED(mu_);
  // A warning the job's status carries from now on (what its resume refused;
  // CheckpointScheduler::AddWarning).
  void AddCheckpointWarning(std::string warning) ABSL_LOCKS_EXCLUDED(mu_);
  // Takes the job back from a persisted state of this job whose state is
  // WAITING or RUNNING (INVALID_ARGUMENT otherwise, nothing changes). Every
  // member counts as heartbeating now, and none is declared dead before the
  // heartbeat timeout plus reconnect_backoff plus a heartbeat interval: the
  // members must dial the new coordinator first. `from` names the file.
  absl::Status TakeOver(const v1::CoordinatorState& state, absl::string_view from)
      ABSL_LOCKS_EXCLUDED(mu_);

  // ---- Members (requests of proto/grps.proto) ----

  // A user model's tensors (MODEL_USER), from a worker: the first offer
  // defines the job's layout (true); an equal offer later changes nothing
  // (false). FAILED_PRECONDITION for a built-in model, an ended job, or an
  // offer that differs (naming the first tensor that does);
  // INVALID_ARGUMENT for tensors ValidateUserModel refuses. Servers
  // register only once the model is defined. `optimizer` (not UNSPECIFIED):
  // the program's optimizer kind, the job's from the offer that defines the
  // model on (DefineModelRequest.optimizer); a later offer's is ignored.
  absl::StatusOr<bool> DefineModel(const TensorSpecs& tensors,
                                   v1::OptimizerKind optimizer = v1::OPTIMIZER_UNSPECIFIED)
      ABSL_LOCKS_EXCLUDED(mu_);

  // FAILED_PRECONDITION once the job ended. A known shard registering again
  // while RUNNING rolls the job back; so does restore_failed naming the
  // current order's checkpoint (refused for the rest of the job).
  //
  // Jobs with max_servers: a request for a shard past the map (below
  // max_servers) is a standby's. It waits (`wait`) until a re-sharding takes
  // the shard in, and is answered with the new map and its restore order;
  // at the deadline UNAVAILABLE "standby: ..." (the server asks again, and
  // keeps its place for Resharding::kStandbyFresh).
  absl::StatusOr<ServerRegistration> RegisterServer(
      const v1::RegisterServerRequest& request, const Wait& wait) ABSL_LOCKS_EXCLUDED(mu_);
  // ... with no deadline.
  absl::StatusOr<ServerRegistration> RegisterServer(const v1::RegisterServerRequest& request)
      ABSL_LOCKS_EXCLUDED(mu_);
  // Waits (`wait`) until every shard registered before it takes a rank, so
  // a caller that gives up holds none: DEADLINE_EXCEEDED names the missing
  // shards, CANCELLED, UNAVAILABLE after ReleaseWaiters. `proves(incarnation)`
  // says whether the caller holds the requested rank's live incarnation (it
  // may then register the rank again). member_secret is not set.
  absl::StatusOr<v1::RegisterWorkerResponse> RegisterWorker(
      const v1::RegisterWorkerRequest& request, const Wait& wait,
      const std::function<bool(uint64_t incarnation)>& proves)
      ABSL_LOCKS_EXCLUDED(mu_);
  absl::StatusOr<v1::HeartbeatResponse> Heartbeat(const v1::HeartbeatRequest& request)
      ABSL_LOCKS_EXCLUDED(mu_);
  // ABORTED for a rank that finished in a generation the job rolled back
  // from (it trains again). A final evaluation must be in range (checked at
  // the edge).
  absl::Status WorkerDone(const v1::WorkerDoneRequest& request)
      ABSL_LOCKS_EXCLUDED(mu_);

  // Elastic jobs (max_workers): records the blocks a live rank trained and
  // leases it more (ExampleLedger; the first request sizes the ledger from
  // its train_examples). FAILED_PRECONDITION for a job that is not elastic,
  // an incarnation that is not live, or a training set of another size;
  // ABORTED for an older generation (the job rolled back: the worker
  // follows the restore order first); the ledger's INVALID_ARGUMENT.
  absl::StatusOr<v1::LeaseExamplesResponse> LeaseExamples(
      const v1::LeaseExamplesRequest& request) ABSL_LOCKS_EXCLUDED(mu_);

  // ---- Operators ----

  // STOPPED with `reason`; OK on a stopped job, FAILED_PRECONDITION on one
  // that ended otherwise.
  absl::Status StopJob(absl::string_view reason) ABSL_LOCKS_EXCLUDED(mu_);
  // Stops the job unless it already ended.
  void Stop(absl::string_view reason) ABSL_LOCKS_EXCLUDED(mu_);
  // Asks a live worker to leave after its step in progress (its heartbeat
  // replies say drain). FAILED_PRECONDITION unless RUNNING or the rank is
  // ALIVE; NOT_FOUND for a rank out of range.
  // Elastic jobs also refuse (FAILED_PRECONDITION) a drain that would
  // leave fewer live workers than min_workers.
  absl::Status DrainWorker(uint32_t rank) ABSL_LOCKS_EXCLUDED(mu_);
  // Jobs with max_servers: re-shard the running job to `num_servers`
  // shards (docs/elasticity.md). Answers at once with the progress; the
  // move waits for a standby of every new shard, cuts a checkpoint, and
  // publishes the new map with a roll-back to the cut (one generation).
  // FAILED_PRECONDITION without max_servers or unless RUNNING and training;
  // INVALID_ARGUMENT out of [1, max_servers].
  absl::StatusOr<v1::ReshardProgress> ScaleServers(uint32_t num_servers)
      ABSL_LOCKS_EXCLUDED(mu_);

  // Asks for a checkpoint (or joins the pending one). FAILED_PRECONDITION
  // without checkpoint_dir or unless RUNNING; UNAVAILABLE while a shard is
  // not alive. With `wait_for_it`, waits until it is COMPLETE or FAILED
  // (DEADLINE_EXCEEDED at the deadline).
  absl::StatusOr<v1::CheckpointSummary> CheckpointJob(bool wait_for_it,
                                                      const Wait& wait)
      ABSL_LOCKS_EXCLUDED(mu_);
  // A watcher's snapshot: the status now, or once the job ended, the status
  // once every live member saw the end (at most 3 s, or until cancelled).
  // UNAVAILABLE after ReleaseWaiters.
  absl::StatusOr<v1::JobStatus> WatchSnapshot(const Wait& wait)
      ABSL_LOCKS_EXCLUDED(mu_);
  // Returns at wait.deadline or when the job ends (OK), CANCELLED when the
  // caller left; OK at once after ReleaseWaiters.
  absl::Status WaitForNextSnapshot(const Wait& wait) ABSL_LOCKS_EXCLUDED(mu_);

  // ---- For the hosting process ----

  // Marks members silent for longer than the heartbeat timeout DEAD (not
  // during TakeOver's grace), fails the job past the recovery timeout, times
  // out and triggers checkpoints, and completes the job when training is
  // done and no finished worker is left to evaluate. Call every heartbeat
  // interval.
  void DetectFailures() ABSL_LOCKS_EXCLUDED(mu_);
  // Writes the manifest of a checkpoint every shard has written, if any
  // (the file I/O outside the lock). Call after a shard's checkpoint report.
  void WriteReadyManifest() ABSL_LOCKS_EXCLUDED(mu_);
  // Writes ExportState() to the state path (no-op without one) when it
  // changed: at most every 200 ms for membership, generation, checkpoint or
  // job state changes, every 5 s for progress alone; `force`: now if it
  // changed at all. Call from one thread at a time.
  absl::Status PersistState(bool force) ABSL_LOCKS_EXCLUDED(mu_);
  // Ends every blocking wait (UNAVAILABLE) and refuses new ones.
  void ReleaseWaiters() ABSL_LOCKS_EXCLUDED(mu_);

  v1::JobState state() const ABSL_LOCKS_EXCLUDED(mu_);
  v1::JobStatus Status() const ABSL_LOCKS_EXCLUDED(mu_);
  v1::ShardMap shard_map() const ABSL_LOCKS_EXCLUDED(mu_);
  v1::RestoreOrder restore_order() const ABSL_LOCKS_EXCLUDED(mu_);
  v1::CoordinatorState ExportState() const ABSL_LOCKS_EXCLUDED(mu_);
  // RegisterWorker calls waiting right now for the shards to register.
  int waiting_registrations() const ABSL_LOCKS_EXCLUDED(mu_);
  // Waits up to `timeout` (real time) for the job to end; true if it has.
  bool WaitForEnd(absl::Duration timeout) const ABSL_LOCKS_EXCLUDED(mu_);
  // True once the job ended and every live server, live worker and finished
  // worker still heartbeating got a heartbeat reply carrying the final state,
  // and every registration refused because its rank was alive has asked
  // again (what the coordinator lingers for).
  bool EveryLiveMemberSawEnd() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  // ---- Job state ----
  // Re-derives the phase after a change; logs transitions.
  void UpdateStateLocked(absl::Time now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void EndLocked(v1::JobState state, std::string message, absl::Time now)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  bool EveryLiveMemberSawEndLocked(absl::Time now) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // RUNNING, no rank ALIVE and at least one FINISHED.
  bool TrainingDoneLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Tracks the global step (min live shard version) and its rate.
  void NoteGlobalStepLocked(absl::Time now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Fails the job past the recovery timeout.
  void CheckRecoveryLocked(absl::Time now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // ---- Heartbeats ----
  // A restoring server's (HeartbeatRequest.restoring): alive, nothing else.
  absl::StatusOr<v1::HeartbeatResponse> RestoringHeartbeatLocked(
      const v1::HeartbeatRequest& request, absl::Time now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Records the heartbeat (Heartbeats), adopting a member this coordinator
  // does not know (or a newer incarnation of one it knows) and following
  // its generation.
  absl::Status RecordHeartbeatLocked(const v1::HeartbeatRequest& request,
                                     bool current_generation, absl::Time now)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A server's restore failure, version and checkpoint report; false when
  // the server is no longer in the current generation.
  bool ServerHeartbeatLocked(const v1::HeartbeatRequest& request,
                             bool current_generation, absl::Time now,
                             v1::HeartbeatResponse* response)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // ---- Checkpoints ----
  bool checkpoints_enabled() const { return !config_.checkpoint_dir().empty(); }
  // The job as a checkpoint cut sees it now.
  CheckpointCuts::Job CutJobLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // ---- Re-sharding (the machine's side of Resharding) ----
  // Resharding::Tick with the job as it is now.
  void TickReshardLocked(absl::Time now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The cut `manifest` (in `dir`) completed: if it is the re-sharding's,
  // the new map and the roll-back to the cut go out together. True if so
  // (the caller persists the state at once).
  bool PublishReshardLocked(const v1::CheckpointManifest& manifest, const std::string& dir,
                            absl::Time now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // ---- The user model ----
  // DefineModel's work, also for a model adopted from a persisted state or
  // a checkpoint.
  absl::StatusOr<bool> DefineModelLocked(const TensorSpecs& tensors, v1::OptimizerKind optimizer)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A user model a checkpoint or a persisted state defines (nothing for a
  // built-in model, or a config without the model's tensors).
  absl::Status AdoptModelLocked(const v1::JobConfig& persisted) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const v1::JobConfig config_;
  const Clock clock_;
  Env* const env_;
  // PersistState's (its lock before mu_).
  StateFile state_file_;
  const absl::Duration reconnect_backoff_;

  mutable absl::Mutex mu_;
  // The blocking calls' waits: told of every registration, state change,
  // checkpoint change, and ReleaseWaiters().
  mutable JobWaits waits_ ABSL_GUARDED_BY(mu_);
  // The phase, the job's time, the take-over and its grace, the leaves and
  // joins.
  JobPhase phase_ ABSL_GUARDED_BY(mu_);
  Membership membership_ ABSL_GUARDED_BY(mu_);

  CheckpointScheduler checkpoints_ ABSL_GUARDED_BY(mu_);
  // The user model's tensors and the program's optimizer.
  JobModel model_ ABSL_GUARDED_BY(mu_);
  // The generation, its restore order, the refused checkpoints.
  Generations generations_ ABSL_GUARDED_BY(mu_);
  // The global step (min live shard version), when it last moved, and its
  // rate. A sync cut's margin takes the highest rate of the last 30 s, so
  // that a slow spell (a worker's restart, a loaded machine) does not leave
  // it a few steps wide when the job speeds up again.
  GlobalStep global_step_ ABSL_GUARDED_BY(mu_);

  // Elastic jobs: the example ledger, the leases, the limbo after a
  // take-over.
  ElasticData data_ ABSL_GUARDED_BY(mu_);
  // Re-sharding (max_servers): the target, the standbys, the cut.
  Resharding resharding_ ABSL_GUARDED_BY(mu_);
  // Where and when checkpoints are cut, and the final one (reads
  // membership_ and global_step_, asks checkpoints_).
  CheckpointCuts cuts_ ABSL_GUARDED_BY(mu_);
  // The final live set, the evaluator, the final evaluation, who heard the
  // end (reads membership_).
  JobEnding ending_ ABSL_GUARDED_BY(mu_);
  // The job's status and persisted state.
  JobReport report_ ABSL_GUARDED_BY(mu_);
  // The whole job back to a restore order.
  RollBacks roll_backs_ ABSL_GUARDED_BY(mu_);
  // A heartbeat's records and its reply; the quorum counts.
  Heartbeats heartbeats_ ABSL_GUARDED_BY(mu_);
  // A server's registration, a standby's wait, the answer.
  ServerRequests servers_ ABSL_GUARDED_BY(mu_);
  // A worker's registration, leases, end and drain; the ranks awaited.
  WorkerRequests workers_ ABSL_GUARDED_BY(mu_);
};

}  // namespace grps

#endif  // GRPS_COORDINATOR_JOB_STATE_MACHINE_H_
