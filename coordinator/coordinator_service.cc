#include "coordinator/coordinator_service.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <numeric>
#include <utility>

#include "absl/strings/str_cat.h"
#include "daemon/daemon.h"
#include "spdlog/spdlog.h"

namespace grps {

namespace {

// How long before a waiting RPC's deadline its handler gives up, so that
// its answer reaches a caller that is still waiting.
constexpr absl::Duration kAnswerMargin = absl::Milliseconds(100);
constexpr absl::Duration kDefaultWatchInterval = absl::Seconds(1);
constexpr absl::Duration kMinWatchInterval = absl::Milliseconds(100);
constexpr size_t kMaxReasonBytes = 1024;

absl::Time DeadlineOf(const grpc::ServerContext& context) {
  std::chrono::system_clock::time_point deadline = context.deadline();
  if (deadline == std::chrono::system_clock::time_point::max())
    return absl::InfiniteFuture();
  return absl::FromChrono(deadline);
}

// The state machine waits until the client's deadline (less `margin`) or
// its cancellation.
JobStateMachine::Wait WaitFor(grpc::ServerContext* context,
                              absl::Duration margin = absl::ZeroDuration()) {
  JobStateMachine::Wait wait;
  wait.deadline = DeadlineOf(*context) - margin;
  wait.cancelled = [context] { return context->IsCancelled(); };
  return wait;
}

JobStateMachine::Options MachineOptions(CoordinatorOptions options) {
  JobStateMachine::Options out;
  out.env = options.env;
  out.state_path = std::move(options.state_path);
  out.reconnect_backoff = kMaxReconnectBackoff;
  return out;
}

}  // namespace

CoordinatorService::CoordinatorService(v1::JobConfig config, v1::ShardMap shard_map,
                                       Clock clock, CoordinatorOptions options)
    : member_key_(options.member_key),
      clock_(clock),
      machine_(std::move(config), std::move(shard_map), std::move(clock),
               MachineOptions(std::move(options))) {}

CoordinatorService::~CoordinatorService() { WaitForManifestWrites(); }

absl::Status CoordinatorService::CheckJobId(absl::string_view job_id,
                                            bool allow_empty) const {
  const std::string& ours = machine_.config().job_id();
  if (job_id == ours || (allow_empty && job_id.empty())) return absl::OkStatus();
  return absl::FailedPreconditionError(
      absl::StrCat("request is for job '", QuoteUntrusted(job_id),
                   "', this coordinator runs job '", ours, "'"));
}

grpc::Status CoordinatorService::CheckMember(const grpc::ServerContext& context,
                                             MemberKind kind, uint32_t index,
                                             uint64_t incarnation) const {
  grpc::Status role = RequireRole(
      context, kind == MemberKind::kServer ? Role::kAdmin : Role::kWorker);
  if (!role.ok()) return role;
  return CheckMemberSecret(member_key_, machine_.config().job_id(), kind, index,
                           incarnation, CallerMemberSecret(context));
}

grpc::Status CoordinatorService::RegisterServer(
    grpc::ServerContext* context, const v1::RegisterServerRequest* request,
    v1::RegisterServerResponse* response) {
  if (grpc::Status role = RequireRole(*context, Role::kAdmin); !role.ok()) return role;
  if (absl::Status s = CheckJobId(request->job_id(), true); !s.ok()) return ToGrpc(s);
  absl::StatusOr<JobStateMachine::ServerRegistration> reg =
      machine_.RegisterServer(*request, WaitFor(context));
  if (!reg.ok()) return ToGrpc(reg.status());
  *response = std::move(reg->response);
  response->set_member_secret(MemberSecret(member_key_, machine_.config().job_id(),
                                           MemberKind::kServer, response->shard(),
                                           response->incarnation()));
  // A roll-back goes to disk at once, before the restarted server hears of
  // it (the others hear within a heartbeat): a coordinator that takes over
  // must not hand out the older generation's order.
  if (reg->rolled_back) {
    if (absl::Status s = PersistState(/*force=*/true); !s.ok())
      spdlog::warn("state file: {}", std::string(s.message()));
  }
  return grpc::Status::OK;
}

grpc::Status CoordinatorService::RegisterWorker(
    grpc::ServerContext* context, const v1::RegisterWorkerRequest* request,
    v1::RegisterWorkerResponse* response) {
  if (grpc::Status role = RequireRole(*context, Role::kWorker); !role.ok()) return role;
  if (absl::Status s = CheckJobId(request->job_id(), true); !s.ok()) return ToGrpc(s);
  const std::string& job_id = machine_.config().job_id();
  const int32_t rank = request->has_requested_rank() ? request->requested_rank() : -1;
  // Whether the caller sent the member secret of the rank's live incarnation
  // (without authentication there are no secrets, so nothing proves it).
  auto proves = [&](uint64_t incarnation) {
    return !member_key_.empty() &&
           CheckMemberSecret(member_key_, job_id, MemberKind::kWorker, rank, incarnation,
                             CallerMemberSecret(*context))
               .ok();
  };
  // The wait ends kAnswerMargin before the caller's deadline: a rank given
  // just as the caller gives up would be held by nobody until the heartbeat
  // timeout (the handler's deadline is later than the caller's by the
  // request's transit, and its cancellation arrives later still).
  absl::StatusOr<v1::RegisterWorkerResponse> reg =
      machine_.RegisterWorker(*request, WaitFor(context, kAnswerMargin), proves);
  if (!reg.ok()) return ToGrpc(reg.status());
  *response = std::move(*reg);
  response->set_member_secret(MemberSecret(member_key_, job_id, MemberKind::kWorker,
                                           response->rank(), response->incarnation()));
  return grpc::Status::OK;
}

grpc::Status CoordinatorService::Heartbeat(grpc::ServerContext* context,
                                           const v1::HeartbeatRequest* request,
                                           v1::HeartbeatResponse* response) {
  if (absl::Status s = CheckJobId(request->job_id(), false); !s.ok()) return ToGrpc(s);
  if (request->member_case() != v1::HeartbeatRequest::MEMBER_NOT_SET) {
    const bool worker = request->member_case() == v1::HeartbeatRequest::kWorkerRank;
    if (grpc::Status member = CheckMember(
            *context, worker ? MemberKind::kWorker : MemberKind::kServer,
            worker ? request->worker_rank() : request->server_shard(),
            request->incarnation());
        !member.ok())
      return member;
  }
  absl::StatusOr<v1::HeartbeatResponse> reply = machine_.Heartbeat(*request);
  if (!reply.ok()) return ToGrpc(reply.status());
  *response = std::move(*reply);
  // A shard's report may have been the last one a checkpoint waited for.
  if (request->member_case() == v1::HeartbeatRequest::kServerShard &&
      request->shard().has_checkpoint())
    StartManifestWrite();
  return grpc::Status::OK;
}

void CoordinatorService::StartManifestWrite() {
  absl::MutexLock lock(&writer_mu_);
  if (writer_busy_) {
    writer_again_ = true;
    return;
  }
  if (manifest_writer_.joinable()) manifest_writer_.join();  // it has returned
  writer_busy_ = true;
  manifest_writer_ = std::thread([this] {
    while (true) {
      machine_.WriteReadyManifest();
      absl::MutexLock lock(&writer_mu_);
      if (!writer_again_) {
        writer_busy_ = false;
        return;
      }
      writer_again_ = false;
    }
  });
}

void CoordinatorService::WaitForManifestWrites() {
  absl::MutexLock lock(&writer_mu_);
  writer_mu_.Await(absl::Condition(
      +[](bool* busy) { return !*busy; }, &writer_busy_));
  if (manifest_writer_.joinable()) manifest_writer_.join();
}

grpc::Status CoordinatorService::WorkerDone(grpc::ServerContext* context,
                                            const v1::WorkerDoneRequest* request,
                                            v1::WorkerDoneResponse* response) {
  if (absl::Status s = CheckJobId(request->job_id(), false); !s.ok()) return ToGrpc(s);
  if (grpc::Status member = CheckMember(*context, MemberKind::kWorker,
                                        request->worker_rank(), request->incarnation());
      !member.ok())
    return member;
  if (request->has_final_eval() &&
      !(request->final_test_accuracy() >= 0 && request->final_test_accuracy() <= 1 &&
        std::isfinite(request->final_test_loss()) &&
        (!request->has_final_test_auc() ||
         (request->final_test_auc() >= 0 && request->final_test_auc() <= 1))))
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                        "final_test_accuracy (and final_test_auc) must be in [0, 1] and "
                        "final_test_loss finite");
  if (request->leaving() && request->has_final_eval())
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                        "a worker that leaves reports no final evaluation");
  if (request->no_final_eval() && (request->has_final_eval() || request->leaving()))
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                        "no_final_eval goes with neither has_final_eval nor leaving");
  return ToGrpc(machine_.WorkerDone(*request));
}

grpc::Status CoordinatorService::Collective(grpc::ServerContext* context,
                                            const v1::CollectiveRequest* request,
                                            v1::CollectiveResponse* response) {
  if (absl::Status s = CheckJobId(request->job_id(), false); !s.ok()) return ToGrpc(s);
  if (grpc::Status member = CheckMember(*context, MemberKind::kWorker,
                                        request->worker_rank(), request->incarnation());
      !member.ok())
    return member;
  // While the job waits for its members, every rank will come: a round
  // waits for all of them, not for those that registered first.
  std::vector<uint32_t> live = machine_.LiveWorkerRanks();
  if (machine_.state() == v1::JOB_STATE_WAITING) {
    live.resize(machine_.config().num_workers());
    std::iota(live.begin(), live.end(), 0);
  }
  absl::StatusOr<Collectives::Answer> answer =
      request->round() == 0
          ? collectives_.Contribute(request->name(), request->worker_rank(),
                                    request->payload(), live, clock_())
          : collectives_.Result(request->round(), request->worker_rank(), live, clock_());
  if (!answer.ok()) return ToGrpc(answer.status());
  response->set_round(answer->round);
  response->set_complete(answer->complete);
  response->mutable_ranks()->Add(answer->ranks.begin(), answer->ranks.end());
  for (std::string& payload : answer->payloads) response->add_payloads(std::move(payload));
  return grpc::Status::OK;
}

grpc::Status CoordinatorService::LeaseExamples(grpc::ServerContext* context,
                                               const v1::LeaseExamplesRequest* request,
                                               v1::LeaseExamplesResponse* response) {
  if (absl::Status s = CheckJobId(request->job_id(), false); !s.ok()) return ToGrpc(s);
  if (grpc::Status member = CheckMember(*context, MemberKind::kWorker,
                                        request->worker_rank(), request->incarnation());
      !member.ok())
    return member;
  // The request is checked whole (its counts, its blocks against the
  // ledger's shape, train_examples against the job) before anything changes.
  absl::StatusOr<v1::LeaseExamplesResponse> leased = machine_.LeaseExamples(*request);
  if (!leased.ok()) return ToGrpc(leased.status());
  *response = std::move(*leased);
  return grpc::Status::OK;
}

grpc::Status CoordinatorService::DefineModel(grpc::ServerContext* context,
                                             const v1::DefineModelRequest* request,
                                             v1::DefineModelResponse* response) {
  if (grpc::Status role = RequireRole(*context, Role::kWorker); !role.ok()) return role;
  if (absl::Status s = CheckJobId(request->job_id(), true); !s.ok()) return ToGrpc(s);
  absl::StatusOr<bool> defined = machine_.DefineModel(request->tensors(), request->optimizer());
  if (!defined.ok()) return ToGrpc(defined.status());
  response->set_defined(*defined);
  // The layout goes to disk before any server registers with it: a
  // coordinator that takes over hands out the same chunks.
  if (*defined) {
    if (absl::Status s = PersistState(/*force=*/true); !s.ok())
      spdlog::warn("state file: {}", std::string(s.message()));
  }
  return grpc::Status::OK;
}

grpc::Status CoordinatorService::GetShardMap(grpc::ServerContext* context,
                                             const v1::GetShardMapRequest* request,
                                             v1::ShardMap* response) {
  *response = machine_.shard_map();
  return grpc::Status::OK;
}

grpc::Status CoordinatorService::GetJobStatus(grpc::ServerContext* context,
                                              const v1::GetJobStatusRequest* request,
                                              v1::JobStatus* response) {
  *response = machine_.Status();
  return grpc::Status::OK;
}

grpc::Status CoordinatorService::WatchJobStatus(
    grpc::ServerContext* context, const v1::WatchJobStatusRequest* request,
    grpc::ServerWriter<v1::JobStatus>* writer) {
  // Each stream holds a gRPC thread and builds a status per interval.
  if (watchers_.fetch_add(1) >= kMaxWatchStreams) {
    watchers_.fetch_sub(1);
    return grpc::Status(grpc::StatusCode::RESOURCE_EXHAUSTED,
                        absl::StrCat("at most ", kMaxWatchStreams,
                                     " WatchJobStatus streams at once; poll "
                                     "GetJobStatus instead"));
  }
  struct Leave {
    std::atomic<int>* n;
    ~Leave() { n->fetch_sub(1); }
  } leave{&watchers_};
  const absl::Duration interval =
      request->interval_ms() == 0
          ? kDefaultWatchInterval
          : std::max(kMinWatchInterval, absl::Milliseconds(request->interval_ms()));
  while (true) {
    absl::StatusOr<v1::JobStatus> snapshot = machine_.WatchSnapshot(WaitFor(context));
    if (!snapshot.ok()) return ToGrpc(snapshot.status());
    if (!writer->Write(*snapshot))
      return grpc::Status(grpc::StatusCode::CANCELLED, "client left");
    const v1::JobState state = snapshot->state();
    if (state == v1::JOB_STATE_COMPLETED || state == v1::JOB_STATE_STOPPED ||
        state == v1::JOB_STATE_FAILED)
      return grpc::Status::OK;
    JobStateMachine::Wait next = WaitFor(context);
    next.deadline = absl::Now() + interval;
    if (absl::Status s = machine_.WaitForNextSnapshot(next); !s.ok()) return ToGrpc(s);
  }
}

grpc::Status CoordinatorService::StopJob(grpc::ServerContext* context,
                                         const v1::StopJobRequest* request,
                                         v1::StopJobResponse* response) {
  if (grpc::Status role = RequireRole(*context, Role::kAdmin); !role.ok()) return role;
  if (request->reason().size() > kMaxReasonBytes)
    return grpc::Status(
        grpc::StatusCode::INVALID_ARGUMENT,
        absl::StrCat("stop reason must be at most ", kMaxReasonBytes, " bytes"));
  return ToGrpc(machine_.StopJob(request->reason().empty() ? "stopped by an operator"
                                                           : request->reason()));
}

grpc::Status CoordinatorService::CheckpointJob(grpc::ServerContext* context,
                                               const v1::CheckpointJobRequest* request,
                                               v1::CheckpointJobResponse* response) {
  if (grpc::Status role = RequireRole(*context, Role::kAdmin); !role.ok()) return role;
  absl::StatusOr<v1::CheckpointSummary> summary =
      machine_.CheckpointJob(request->wait(), WaitFor(context));
  if (!summary.ok()) return ToGrpc(summary.status());
  *response->mutable_checkpoint() = std::move(*summary);
  return grpc::Status::OK;
}

grpc::Status CoordinatorService::DrainWorker(grpc::ServerContext* context,
                                             const v1::DrainWorkerRequest* request,
                                             v1::DrainWorkerResponse* response) {
  if (grpc::Status role = RequireRole(*context, Role::kAdmin); !role.ok()) return role;
  return ToGrpc(machine_.DrainWorker(request->rank()));
}

grpc::Status CoordinatorService::ScaleServers(grpc::ServerContext* context,
                                              const v1::ScaleServersRequest* request,
                                              v1::ScaleServersResponse* response) {
  if (grpc::Status role = RequireRole(*context, Role::kAdmin); !role.ok()) return role;
  absl::StatusOr<v1::ReshardProgress> progress = machine_.ScaleServers(request->num_servers());
  if (!progress.ok()) return ToGrpc(progress.status());
  // The target goes to disk before the answer: a coordinator that takes
  // over must not forget a re-sharding the operator was told is under way.
  if (absl::Status s = PersistState(/*force=*/true); !s.ok())
    spdlog::warn("state file: {}", std::string(s.message()));
  *response->mutable_reshard() = std::move(*progress);
  return grpc::Status::OK;
}

void CoordinatorService::ResumeFrom(const v1::CheckpointManifest& manifest,
                                    const std::string& dir) {
  machine_.ResumeFrom(manifest, dir);
}

void CoordinatorService::SetNextCheckpointId(uint64_t id) {
  machine_.SetNextCheckpointId(id);
}

void CoordinatorService::AddCheckpointWarning(std::string warning) {
  machine_.AddCheckpointWarning(std::move(warning));
}

absl::Status CoordinatorService::TakeOver(const v1::CoordinatorState& state,
                                          absl::string_view from) {
  return machine_.TakeOver(state, from);
}

void CoordinatorService::DetectFailures() { machine_.DetectFailures(); }

void CoordinatorService::Stop(absl::string_view reason) { machine_.Stop(reason); }

v1::JobState CoordinatorService::state() const { return machine_.state(); }

v1::JobStatus CoordinatorService::Status() const { return machine_.Status(); }

int CoordinatorService::waiting_registrations() const {
  return machine_.waiting_registrations();
}

bool CoordinatorService::WaitForEnd(absl::Duration timeout) const {
  return machine_.WaitForEnd(timeout);
}

bool CoordinatorService::EveryLiveMemberSawEnd() const {
  return machine_.EveryLiveMemberSawEnd();
}

v1::CoordinatorState CoordinatorService::ExportState() const {
  return machine_.ExportState();
}

absl::Status CoordinatorService::PersistState(bool force) {
  return machine_.PersistState(force);
}

v1::RestoreOrder CoordinatorService::restore_order() const {
  return machine_.restore_order();
}

void CoordinatorService::Shutdown() { machine_.ReleaseWaiters(); }

}  // namespace grps
