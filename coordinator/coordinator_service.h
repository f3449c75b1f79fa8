// CoordinatorService: the job's control plane (grps.v1.Coordinator, sync
// gRPC API). It hands out shards and ranks, tracks liveness through
// heartbeats, tells every member the live worker set and the shard map, and
// reports the job's status.
//
// Job state: WAITING until every shard and every rank has registered at least
// once, then RUNNING. Training is done when every rank has reported WorkerDone
// (FINISHED) or is DEAD, at least one FINISHED. The job then stays RUNNING
// for the final evaluation (see below) and becomes COMPLETED when it arrives,
// or without one when no finished worker heartbeats any more (JobStatus.message
// says so, and names the ranks that died before finishing). A job whose ranks
// all died without any finishing stays RUNNING (a restarted worker may come).
// STOPPED by StopJob or Stop(). COMPLETED and STOPPED are final: registrations
// are then refused with FAILED_PRECONDITION and heartbeats answer with the
// final state, which tells the daemons to exit.
//
// The evaluator. While training runs, the lowest ALIVE rank evaluates
// (HeartbeatResponse / JobStatus evaluator_rank). Once training is done, the
// final evaluator is the lowest FINISHED rank still heartbeating (its last
// heartbeat within the timeout; finished workers keep heartbeating until
// they see the job end). Its heartbeat replies carry evaluate_final, but only
// once every ALIVE server has heartbeated again after a reply that carried the
// final (empty) live set, so the servers have applied it before the final
// weights are read. The final evaluation is a WorkerDone with has_final_eval
// from any FINISHED rank once training is done; one that arrives earlier only
// counts as the latest evaluation. After the end, evaluator_rank names the
// rank whose final evaluation was taken, if any.
//
// A restarted worker's RegisterWorker reply carries start_step, its rank's
// resume step (see Membership). A resume step behind the old incarnation's
// last push is harmless: the shards acknowledge those steps as duplicates
// (server/shard_store.h); in sync the worker then joins the others at the
// step they are at (worker/trainer.h).
//
// Checkpoints (with JobConfig.checkpoint_dir; see CheckpointScheduler and
// docs/durability.md). One at a time, asked for every checkpoint_every_steps
// global steps / checkpoint_every_seconds, by CheckpointJob, and once more
// when training is done (the job's end waits for that one, at most
// CheckpointScheduler::kTimeout). Sync: at a version ahead of every shard
// (the highest reported version plus a margin that grows after failures);
// async/ssp: version 0. Each live server's heartbeat replies carry the
// request until its ShardStatus.checkpoint reports it WRITTEN or FAILED;
// once every shard wrote its file, the RPC thread that delivered the last
// report writes the MANIFEST (outside the lock).
//
// Generations. restore_order() says what state the job runs from: a job
// starts at generation 1, one resumed at start (ResumeFrom) at 2. A server that
// registers again for a shard while the job runs (a restart) rolls the job
// back, in every mode: generation + 1 with the newest complete checkpoint
// (or checkpoint 0, the initial values), every rank resumes at its worker
// step (async, ssp: the step recorded in the manifest) and FINISHED ranks
// train again. Heartbeat replies
// always carry the generation, and the restore order to members whose
// request names an older one; their progress is not recorded until they
// follow it.
//
// Never a hang: while RUNNING, a shard DEAD for longer than the recovery
// timeout, or no ALIVE and no FINISHED worker for that long, moves the job
// to FAILED with the reason (DetectFailures).
//
// Coordinator restart: with a state path, PersistState writes the
// CoordinatorState (throttled); TakeOver loads one. A heartbeat from a
// member this coordinator does not know (or from a newer incarnation than
// it knows) is adopted as that member, so a coordinator without a state
// file rebuilds its view too.
//
// Every request that names a job must name this one (FAILED_PRECONDITION
// otherwise); RegisterServer and RegisterWorker also accept an empty job_id.
//
// Thread-safe: gRPC threads, the failure detector and the main thread may
// call any method concurrently. One mutex guards all state; no RPC holds it
// while writing to the network.
#ifndef GRPS_COORDINATOR_COORDINATOR_SERVICE_H_
#define GRPS_COORDINATOR_COORDINATOR_SERVICE_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "coordinator/checkpoint_scheduler.h"
#include "coordinator/membership.h"
#include "daemon/env.h"
#include "daemon/security.h"
#include "proto/grps.grpc.pb.h"
#include "proto/grps.pb.h"

namespace grps {

struct CoordinatorOptions {
  // File access for manifests and the state file; nullptr: Env::Default().
  Env* env = nullptr;
  // Where PersistState writes the CoordinatorState; empty: nowhere.
  std::string state_path;
  // MemberKey(admin token): registrations hand out member secrets under it,
  // and heartbeats and WorkerDone must carry theirs. Empty: authentication
  // is off and no secret is asked for.
  std::string member_key;
};

class CoordinatorService final : public v1::Coordinator::Service {
 public:
  static constexpr int kMaxWatchStreams = 16;

  // The time source for liveness and status figures. Blocking waits
  // (RegisterWorker, WatchJobStatus) always use real time.
  using Clock = std::function<absl::Time()>;

  // `config` must be valid (ValidateJobConfig) and `shard_map` built from it
  // (BuildShardMap with config.num_servers() shards).
  CoordinatorService(v1::JobConfig config, v1::ShardMap shard_map,
                     Clock clock = &absl::Now,
                     CoordinatorOptions options = CoordinatorOptions());
  // Waits for a manifest being written.
  ~CoordinatorService() override;

  // ---- Before serving (from the hosting process, once) ----

  // The job resumes from the complete checkpoint `manifest` in `dir`
  // (already checked against the shard map): generation 2, every rank
  // starts at its worker step, every server restores it.
  void ResumeFrom(const v1::CheckpointManifest& manifest, const std::string& dir)
      ABSL_LOCKS_EXCLUDED(mu_);
  // Checkpoint ids below `id` are taken (folders that exist already).
  void SetNextCheckpointId(uint64_t id) ABSL_LOCKS_EXCLUDED(mu_);
  // Takes the job back from a persisted state of this job whose state is
  // WAITING or RUNNING (INVALID_ARGUMENT otherwise, nothing changes). Every
  // member counts as heartbeating now, and none is declared dead for a
  // grace of the heartbeat timeout plus kMaxReconnectBackoff plus a
  // heartbeat interval: the members' channels must dial the new coordinator
  // again first. `from` names the file, for the log.
  absl::Status TakeOver(const v1::CoordinatorState& state, absl::string_view from)
      ABSL_LOCKS_EXCLUDED(mu_);

  // ---- RPCs (see proto/grps.proto) ----
  grpc::Status RegisterServer(grpc::ServerContext* context,
                              const v1::RegisterServerRequest* request,
                              v1::RegisterServerResponse* response) override;
  // Waits (in real time, until the client's deadline or cancellation) for
  // every shard to register before it takes a rank, so a worker that gives up
  // holds no rank. DEADLINE_EXCEEDED names the missing shards.
  grpc::Status RegisterWorker(grpc::ServerContext* context,
                              const v1::RegisterWorkerRequest* request,
                              v1::RegisterWorkerResponse* response) override;
  grpc::Status Heartbeat(grpc::ServerContext* context,
                         const v1::HeartbeatRequest* request,
                         v1::HeartbeatResponse* response) override;
  grpc::Status WorkerDone(grpc::ServerContext* context,
                          const v1::WorkerDoneRequest* request,
                          v1::WorkerDoneResponse* response) override;
  grpc::Status GetShardMap(grpc::ServerContext* context,
                           const v1::GetShardMapRequest* request,
                           v1::ShardMap* response) override;
  grpc::Status GetJobStatus(grpc::ServerContext* context,
                            const v1::GetJobStatusRequest* request,
                            v1::JobStatus* response) override;
  // A snapshot now and every interval_ms (0 = 1000, at least 100) until the
  // job ends (the final snapshot is sent, then OK) or the client leaves. At
  // most kMaxWatchStreams at once (RESOURCE_EXHAUSTED beyond).
  grpc::Status WatchJobStatus(
      grpc::ServerContext* context, const v1::WatchJobStatusRequest* request,
      grpc::ServerWriter<v1::JobStatus>* writer) override;
  // STOPPED with the reason as message; OK again on a stopped job,
  // FAILED_PRECONDITION on a completed one.
  grpc::Status StopJob(grpc::ServerContext* context,
                       const v1::StopJobRequest* request,
                       v1::StopJobResponse* response) override;
  // FAILED_PRECONDITION without checkpoint_dir or unless RUNNING;
  // UNAVAILABLE while a shard is not alive. Joins the pending checkpoint if
  // there is one. With wait, blocks (real time) until it is COMPLETE or
  // FAILED (DEADLINE_EXCEEDED at the client's deadline).
  grpc::Status CheckpointJob(grpc::ServerContext* context,
                             const v1::CheckpointJobRequest* request,
                             v1::CheckpointJobResponse* response) override;

  // ---- For the process that hosts the service ----

  // Marks members silent for longer than the heartbeat timeout DEAD, fails
  // the job past the recovery timeout, times out and triggers checkpoints,
  // and completes the job when training is done and no finished worker is
  // left to evaluate. Call every heartbeat interval.
  void DetectFailures() ABSL_LOCKS_EXCLUDED(mu_);

  // Stops the job (as StopJob) unless it already ended.
  void Stop(absl::string_view reason) ABSL_LOCKS_EXCLUDED(mu_);

  v1::JobState state() const ABSL_LOCKS_EXCLUDED(mu_);
  v1::JobStatus Status() const ABSL_LOCKS_EXCLUDED(mu_);
  // RegisterWorker calls waiting right now for the shards to register (so
  // a test can act once a call is blocked, not after a guessed sleep).
  int waiting_registrations() const ABSL_LOCKS_EXCLUDED(mu_);

  // Waits up to `timeout` (real time) for the job to end; true if it has.
  bool WaitForEnd(absl::Duration timeout) const ABSL_LOCKS_EXCLUDED(mu_);

  // True once the job has ended and every live server, every live worker and
  // every finished worker still heartbeating has received a heartbeat reply
  // carrying the final state, so each of them knows to exit. A finished
  // worker silent for longer than the heartbeat timeout is not waited for.
  bool EveryLiveMemberSawEnd() const ABSL_LOCKS_EXCLUDED(mu_);

  // The CoordinatorState as of now.
  v1::CoordinatorState ExportState() const ABSL_LOCKS_EXCLUDED(mu_);
  // Writes ExportState() to the state path (no-op without one) when it
  // changed: at most every 200 ms for membership, generation, checkpoint or
  // job state changes, every 5 s for progress alone; `force`: now if it
  // changed at all. File I/O happens outside the service's lock; call from
  // one thread (the main loop), and once more at the end.
  absl::Status PersistState(bool force) ABSL_LOCKS_EXCLUDED(mu_, persist_mu_);

  v1::RestoreOrder restore_order() const ABSL_LOCKS_EXCLUDED(mu_);

  // Ends blocked RegisterWorker and WatchJobStatus calls (UNAVAILABLE) so the
  // gRPC server can shut down. Call before grpc::Server::Shutdown.
  void Shutdown() ABSL_LOCKS_EXCLUDED(mu_);

  // Returns once no checkpoint manifest is being written. Manifests are
  // written on a thread of their own, started by the heartbeat that brings
  // the last shard's report: an fsync may take seconds, and that shard's
  // heartbeat must not wait for it.
  void WaitForManifestWrites() ABSL_LOCKS_EXCLUDED(writer_mu_);

 private:
  // Heartbeat, past the job id check.
  grpc::Status HandleHeartbeat(const v1::HeartbeatRequest& request,
                               v1::HeartbeatResponse* response)
      ABSL_LOCKS_EXCLUDED(mu_);
  bool checkpoints_enabled() const { return !config_.checkpoint_dir().empty(); }
  // Job id check: FAILED_PRECONDITION unless `job_id` is this job's (or
  // empty where `allow_empty`).
  absl::Status CheckJobId(absl::string_view job_id, bool allow_empty) const;
  // Re-derives state_ after a membership change; logs transitions.
  void UpdateStateLocked(absl::Time now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void EndLocked(v1::JobState state, std::string message, absl::Time now)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void NoteRegistrationLocked(absl::Time now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  bool EndedLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  bool EveryLiveMemberSawEndLocked(absl::Time now) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // RUNNING, no rank ALIVE and at least one FINISHED.
  bool TrainingDoneLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // See "The evaluator" above; nullopt when there is none.
  std::optional<uint32_t> EvaluatorLocked(absl::Time now) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Records a server heartbeat for the final-live-set handshake.
  void NoteServerHandleHeartbeat(uint32_t shard) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Every ALIVE server has heartbeated after a reply that carried the final
  // live set.
  bool ServersHeardFinalLiveSetLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // "every worker finished" or "worker 1 died before finishing; ...".
  std::string TrainingDoneMessageLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  v1::JobStatus StatusLocked(absl::Time now) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Why the job is still WAITING.
  std::string WaitingMessageLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // ---- Checkpoints and recovery ----
  // Asks for a checkpoint now (none may be pending). UNAVAILABLE while a
  // shard is not alive.
  absl::StatusOr<v1::CheckpointRequest> StartCheckpointLocked(absl::Time now,
                                                              absl::string_view why)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The sync version a checkpoint asked for now should have.
  uint64_t SyncCheckpointVersionLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The highest total_steps / step any worker reported.
  uint64_t MaxWorkerTotalLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  uint64_t MaxWorkerStepLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Periodic trigger and timeout of checkpoints.
  void TickCheckpointsLocked(absl::Time now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Training is done: the final checkpoint has completed, failed, was not
  // possible, or has been waited for long enough (starts it if needed).
  bool FinalCheckpointSettledLocked(absl::Time now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Writes the manifest of a checkpoint every shard has written, if any
  // (takes the lock, releases it for the file I/O).
  void WriteReadyManifest() ABSL_LOCKS_EXCLUDED(mu_);
  // Runs WriteReadyManifest on the writer thread (again, if it is busy).
  void StartManifestWrite() ABSL_LOCKS_EXCLUDED(writer_mu_);
  // Rolls the whole job back, in the next generation, to the newest
  // checkpoint that verifies now (`why` is logged).
  void RollBackLocked(absl::string_view why, absl::Time now)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A member runs in a generation newer than this coordinator's (it took the
  // job over from an older state file): roll back past it, so that every
  // member restores the same checkpoint.
  void FollowGenerationLocked(uint64_t generation, absl::Time now)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Forgets the training-done phase (final checkpoint, evaluation).
  void ResetTrainingDoneLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The order of a roll-back (generation not set): the newest checkpoint in
  // checkpoint_dir that verifies now (a damaged newer one is refused, and
  // said so), or the initial values when there is none. Reads files under
  // the lock: roll-backs are rare.
  // With per-shard storage only the manifests are on this coordinator's
  // volume: they are what is verified, and the order carries the manifest.
  // Checkpoints in refused_checkpoints_ are skipped.
  v1::RestoreOrder VerifiedRestoreOrderLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The order (generation not set) to restore checkpoint `manifest` from
  // `dir`: its step, each rank's resume step, and with per-shard storage
  // the manifest itself.
  v1::RestoreOrder RestoreOrderFor(const v1::CheckpointManifest& manifest,
                                   const std::string& dir) const;
  // Shard `shard` could not follow the restore order of checkpoint
  // failed.id() (failed.error() says why). When that is the current order's
  // checkpoint it is refused for the rest of the job and true is returned:
  // the caller rolls back, to the checkpoint before it. A stale report (an
  // older order's) is ignored.
  bool RefuseRestoreLocked(uint32_t shard, const v1::ShardCheckpoint& failed)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // RegisterServer past the job id check; sets *rolled_back.
  grpc::Status HandleRegisterServer(const v1::RegisterServerRequest& request,
                                    v1::RegisterServerResponse* response,
                                    bool* rolled_back) ABSL_LOCKS_EXCLUDED(mu_);
  // Tracks the global step (min live shard version) and its rate.
  void NoteGlobalStepLocked(absl::Time now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Fails the job past the recovery timeout.
  void CheckRecoveryLocked(absl::Time now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Adopts the heartbeating member this coordinator does not know.
  absl::Status AdoptLocked(const v1::HeartbeatRequest& request, absl::Time now)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  v1::CoordinatorState ExportStateLocked(absl::Time now) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // RequireRole for acting as a member, then its member secret.
  grpc::Status CheckMember(const grpc::ServerContext& context, MemberKind kind,
                           uint32_t index, uint64_t incarnation) const;
  // Whether the caller of a RegisterWorker for `rank` sent the member secret
  // of that rank's live incarnation (it may then re-register the rank).
  bool HoldsLiveRankLocked(const grpc::ServerContext& context, int32_t rank) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const v1::JobConfig config_;
  const Clock clock_;
  Env* const env_;
  const std::string state_path_;
  const std::string member_key_;
  std::atomic<int> watchers_{0};  // WatchJobStatus streams open

  mutable absl::Mutex mu_;
  // Signalled on every registration, state change and Shutdown().
  mutable absl::CondVar changed_;
  Membership membership_ ABSL_GUARDED_BY(mu_);
  v1::JobState state_ ABSL_GUARDED_BY(mu_) = v1::JOB_STATE_WAITING;
  std::string message_ ABSL_GUARDED_BY(mu_);
  bool has_final_eval_ ABSL_GUARDED_BY(mu_) = false;
  Membership::Evaluation final_eval_ ABSL_GUARDED_BY(mu_);
  uint32_t final_evaluator_rank_ ABSL_GUARDED_BY(mu_) = 0;
  // The final-live-set handshake, by shard: a reply after training was done
  // went to this server incarnation at this membership epoch (the live set
  // it carried), and `heard` once a later heartbeat of the same incarnation
  // arrived at the same epoch. Counted in heartbeats, not time, so two
  // heartbeats within one clock tick still order.
  struct FinalLiveSetAck {
    uint64_t incarnation = 0;
    uint64_t membership_epoch = 0;
    bool heard = false;
  };
  std::map<uint32_t, FinalLiveSetAck> final_live_set_acks_ ABSL_GUARDED_BY(mu_);
  // The last rank told evaluate_final (for logging it once).
  std::optional<uint32_t> final_evaluation_asked_of_ ABSL_GUARDED_BY(mu_);
  // Logged once per training-done phase.
  bool announced_training_done_ ABSL_GUARDED_BY(mu_) = false;
  // First registration and end of the job (InfinitePast/InfiniteFuture
  // until they happen).
  absl::Time started_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
  absl::Time ended_ ABSL_GUARDED_BY(mu_) = absl::InfiniteFuture();
  // Members that received a heartbeat reply with the final state.
  std::set<uint32_t> shards_told_end_ ABSL_GUARDED_BY(mu_);
  std::set<uint32_t> ranks_told_end_ ABSL_GUARDED_BY(mu_);
  bool shutting_down_ ABSL_GUARDED_BY(mu_) = false;
  int waiting_registrations_ ABSL_GUARDED_BY(mu_) = 0;

  CheckpointScheduler checkpoints_ ABSL_GUARDED_BY(mu_);
  v1::RestoreOrder restore_ ABSL_GUARDED_BY(mu_);
  // Checkpoints a shard could not restore (RefuseRestoreLocked).
  std::vector<uint64_t> refused_checkpoints_ ABSL_GUARDED_BY(mu_);
  // The final checkpoint: asked for (its id), settled, and the deadline of
  // the wait for it (InfiniteFuture until training is done).
  uint64_t final_checkpoint_id_ ABSL_GUARDED_BY(mu_) = 0;
  bool final_checkpoint_settled_ ABSL_GUARDED_BY(mu_) = false;
  absl::Time final_checkpoint_deadline_ ABSL_GUARDED_BY(mu_) = absl::InfiniteFuture();
  // The global step (min live shard version), when it last moved, and its
  // rate in steps per second (measured over >= 2 s windows).
  std::optional<uint64_t> global_step_ ABSL_GUARDED_BY(mu_);
  absl::Time global_step_moved_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
  uint64_t rate_anchor_step_ ABSL_GUARDED_BY(mu_) = 0;
  absl::Time rate_anchor_time_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
  double steps_per_second_ ABSL_GUARDED_BY(mu_) = 0;
  // Since when the running job has had no ALIVE and no FINISHED worker.
  absl::Time no_workers_since_ ABSL_GUARDED_BY(mu_) = absl::InfiniteFuture();
  // The generation each rank's current incarnation last heartbeated in.
  std::map<uint32_t, std::pair<uint64_t, uint64_t>> rank_generation_
      ABSL_GUARDED_BY(mu_);
  bool coordinator_restarted_ ABSL_GUARDED_BY(mu_) = false;
  // DetectFailures declares no one dead before this (TakeOver's grace).
  absl::Time no_deaths_before_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
  // Job time before this coordinator took the job over.
  double elapsed_before_ ABSL_GUARDED_BY(mu_) = 0;

  // PersistState: serializes writers; what was last written and when.
  // The manifest writer: one thread at a time; `writer_again_` asks the
  // busy one for one more pass.
  absl::Mutex writer_mu_ ABSL_ACQUIRED_BEFORE(mu_);
  std::thread manifest_writer_ ABSL_GUARDED_BY(writer_mu_);
  bool writer_busy_ ABSL_GUARDED_BY(writer_mu_) = false;
  bool writer_again_ ABSL_GUARDED_BY(writer_mu_) = false;

  absl::Mutex persist_mu_ ABSL_ACQUIRED_BEFORE(mu_);
  std::string persisted_material_ ABSL_GUARDED_BY(persist_mu_);
  std::string persisted_full_ ABSL_GUARDED_BY(persist_mu_);
  absl::Time persisted_at_ ABSL_GUARDED_BY(persist_mu_) = absl::InfinitePast();
};

}  // namespace grps

#endif  // GRPS_COORDINATOR_COORDINATOR_SERVICE_H_
