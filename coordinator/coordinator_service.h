// CoordinatorService: grps.v1.Coordinator (sync gRPC API) over a
// JobStateMachine, which holds the job (see its header). This class checks
// roles, member secrets and job ids, turns requests into calls of the state
// machine and its statuses into gRPC ones, streams WatchJobStatus, persists
// the state after a roll-back, and writes checkpoint manifests on a thread
// of its own so that no heartbeat waits for an fsync.
//
// Every request that names a job must name this one (FAILED_PRECONDITION
// otherwise); RegisterServer and RegisterWorker also accept an empty job_id.
//
// Thread-safe: gRPC threads, the failure detector and the main thread may
// call any method concurrently; no RPC holds a lock while writing to the
// network.
#ifndef GRPS_COORDINATOR_COORDINATOR_SERVICE_H_
#define GRPS_COORDINATOR_COORDINATOR_SERVICE_H_

#include <atomic>
#include <cstdint>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "coordinator/collectives.h"
#include "coordinator/job_state_machine.h"
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
  using Clock = JobStateMachine::Clock;

  // `config` must be valid (ValidateJobConfig) and `shard_map` built from it
  // (BuildShardMap with config.num_servers() shards).
  CoordinatorService(v1::JobConfig config, v1::ShardMap shard_map,
                     Clock clock = &absl::Now,
                     CoordinatorOptions options = CoordinatorOptions());
  // Waits for a manifest being written.
  ~CoordinatorService() override;

  // ---- Before serving (from the hosting process, once); see JobStateMachine ----
  void ResumeFrom(const v1::CheckpointManifest& manifest, const std::string& dir);
  void SetNextCheckpointId(uint64_t id);
  void AddCheckpointWarning(std::string warning);
  absl::Status TakeOver(const v1::CoordinatorState& state, absl::string_view from);

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
  // Role: worker. The model is persisted at once when this call defined it.
  grpc::Status DefineModel(grpc::ServerContext* context, const v1::DefineModelRequest* request,
                           v1::DefineModelResponse* response) override;
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
  grpc::Status DrainWorker(grpc::ServerContext* context, const v1::DrainWorkerRequest* request,
                           v1::DrainWorkerResponse* response) override;
  grpc::Status ScaleServers(grpc::ServerContext* context,
                            const v1::ScaleServersRequest* request,
                            v1::ScaleServersResponse* response) override;
  grpc::Status LeaseExamples(grpc::ServerContext* context,
                             const v1::LeaseExamplesRequest* request,
                             v1::LeaseExamplesResponse* response) override;
  grpc::Status Collective(grpc::ServerContext* context, const v1::CollectiveRequest* request,
                          v1::CollectiveResponse* response) override;

  // ---- For the process that hosts the service; see JobStateMachine ----
  void DetectFailures();
  void Stop(absl::string_view reason);
  v1::JobState state() const;
  v1::JobStatus Status() const;
  // RegisterWorker calls waiting right now for the shards to register (so
  // a test can act once a call is blocked, not after a guessed sleep).
  int waiting_registrations() const;
  bool WaitForEnd(absl::Duration timeout) const;
  bool EveryLiveMemberSawEnd() const;
  v1::CoordinatorState ExportState() const;
  // Call from one thread (the main loop), and once more at the end.
  absl::Status PersistState(bool force);
  v1::RestoreOrder restore_order() const;

  // Ends blocked RegisterWorker, CheckpointJob and WatchJobStatus calls
  // (UNAVAILABLE) so the gRPC server can shut down. Call before
  // grpc::Server::Shutdown.
  void Shutdown();

  // Returns once no checkpoint manifest is being written. Manifests are
  // written on a thread of their own, started by the heartbeat that brings
  // the last shard's report: an fsync may take seconds, and that shard's
  // heartbeat must not wait for it.
  void WaitForManifestWrites() ABSL_LOCKS_EXCLUDED(writer_mu_);

 private:
  // Job id check: FAILED_PRECONDITION unless `job_id` is this job's (or
  // empty where `allow_empty`).
  absl::Status CheckJobId(absl::string_view job_id, bool allow_empty) const;
  // RequireRole for acting as a member, then its member secret.
  grpc::Status CheckMember(const grpc::ServerContext& context, MemberKind kind,
                           uint32_t index, uint64_t incarnation) const;
  // Runs machine_.WriteReadyManifest on the writer thread (again, if it is
  // busy).
  void StartManifestWrite() ABSL_LOCKS_EXCLUDED(writer_mu_);

  const std::string member_key_;
  const Clock clock_;  // for collectives' expiry
  JobStateMachine machine_;
  Collectives collectives_;
  std::atomic<int> watchers_{0};  // WatchJobStatus streams open

  // The manifest writer: one thread at a time; `writer_again_` asks the
  // busy one for one more pass.
  absl::Mutex writer_mu_;
  std::thread manifest_writer_ ABSL_GUARDED_BY(writer_mu_);
  bool writer_busy_ ABSL_GUARDED_BY(writer_mu_) = false;
  bool writer_again_ ABSL_GUARDED_BY(writer_mu_) = false;
};

}  // namespace grps

#endif  // GRPS_COORDINATOR_COORDINATOR_SERVICE_H_
