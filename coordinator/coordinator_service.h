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
// A restarted worker's RegisterWorker reply carries start_step (see
// Membership).
//
// Every request that names a job must name this one (FAILED_PRECONDITION
// otherwise); RegisterServer and RegisterWorker also accept an empty job_id.
//
// Thread-safe: gRPC threads, the failure detector and the main thread may
// call any method concurrently. One mutex guards all state; no RPC holds it
// while writing to the network.
#ifndef GRPS_COORDINATOR_COORDINATOR_SERVICE_H_
#define GRPS_COORDINATOR_COORDINATOR_SERVICE_H_

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "coordinator/membership.h"
#include "proto/grps.grpc.pb.h"
#include "proto/grps.pb.h"

namespace grps {


class CoordinatorService final : public v1::Coordinator::Service {
 public:
  // The time source for liveness and status figures. Blocking waits
  // (RegisterWorker, WatchJobStatus) always use real time.
  using Clock = std::function<absl::Time()>;

  // `config` must be valid (ValidateJobConfig) and `shard_map` built from it
  // (BuildShardMap with config.num_servers() shards).
  CoordinatorService(v1::JobConfig config, v1::ShardMap shard_map,
                     Clock clock = &absl::Now);

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
  // A snapshot now and every interval_ms (0 = 1000, at least 20) until the
  // job ends (the final snapshot is sent, then OK) or the client leaves.
  grpc::Status WatchJobStatus(
      grpc::ServerContext* context, const v1::WatchJobStatusRequest* request,
      grpc::ServerWriter<v1::JobStatus>* writer) override;
  // STOPPED with the reason as message; OK again on a stopped job,
  // FAILED_PRECONDITION on a completed one.
  grpc::Status StopJob(grpc::ServerContext* context,
                       const v1::StopJobRequest* request,
                       v1::StopJobResponse* response) override;

  // ---- For the process that hosts the service ----

  // Marks members silent for longer than the heartbeat timeout DEAD, and
  // completes the job when training is done and no finished worker is left
  // to evaluate. Call every heartbeat interval.
  void DetectFailures() ABSL_LOCKS_EXCLUDED(mu_);

  // Stops the job (as StopJob) unless it already ended.
  void Stop(absl::string_view reason) ABSL_LOCKS_EXCLUDED(mu_);

  v1::JobState state() const ABSL_LOCKS_EXCLUDED(mu_);
  v1::JobStatus Status() const ABSL_LOCKS_EXCLUDED(mu_);

  // Waits up to `timeout` (real time) for the job to end; true if it has.
  bool WaitForEnd(absl::Duration timeout) const ABSL_LOCKS_EXCLUDED(mu_);

  // True once the job has ended and every live server, every live worker and
  // every finished worker still heartbeating has received a heartbeat reply
  // carrying the final state, so each of them knows to exit. A finished
  // worker silent for longer than the heartbeat timeout is not waited for.
  bool EveryLiveMemberSawEnd() const ABSL_LOCKS_EXCLUDED(mu_);

  // Ends blocked RegisterWorker and WatchJobStatus calls (UNAVAILABLE) so the
  // gRPC server can shut down. Call before grpc::Server::Shutdown.
  void Shutdown() ABSL_LOCKS_EXCLUDED(mu_);

 private:
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
  void NoteServerHeartbeatLocked(uint32_t shard) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Every ALIVE server has heartbeated after a reply that carried the final
  // live set.
  bool ServersHeardFinalLiveSetLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // "every worker finished" or "worker 1 died before finishing; ...".
  std::string TrainingDoneMessageLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  v1::JobStatus StatusLocked(absl::Time now) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Why the job is still WAITING.
  std::string WaitingMessageLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const v1::JobConfig config_;
  const Clock clock_;

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
};

}  // namespace grps

#endif  // GRPS_COORDINATOR_COORDINATOR_SERVICE_H_
