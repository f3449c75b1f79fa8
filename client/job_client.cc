#include "client/job_client.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "daemon/daemon.h"

namespace grps {

bool JobEnded(v1::JobState state) {
  return state == v1::JOB_STATE_COMPLETED || state == v1::JOB_STATE_FAILED ||
         state == v1::JOB_STATE_STOPPED;
}

JobClient::JobClient(const std::string& target, absl::Duration rpc_timeout)
    : JobClient(MakeChannel(target), target, rpc_timeout) {}

JobClient::JobClient(std::shared_ptr<grpc::ChannelInterface> channel,
                     std::string target, absl::Duration rpc_timeout)
    : target_(std::move(target)),
      rpc_timeout_(rpc_timeout),
      stub_(v1::Coordinator::NewStub(std::move(channel))) {}

std::unique_ptr<grpc::ClientContext> JobClient::UnaryContext() const {
  auto context = std::make_unique<grpc::ClientContext>();
  context->set_deadline(absl::ToChronoTime(absl::Now() + rpc_timeout_));
  return context;
}

absl::Status JobClient::Error(const char* call, const grpc::Status& status) const {
  absl::Status s = ToAbsl(status);
  if (s.code() == absl::StatusCode::kUnavailable)
    return absl::UnavailableError(absl::StrCat("cannot reach coordinator ", target_, " (", call,
                                               "): ", s.message(),
                                               TlsHint(s.message(), ProcessSecurity())));
  return absl::Status(s.code(), absl::StrCat(call, " to coordinator ", target_,
                                             ": ", s.message()));
}

JobClient::ScaleWait JobClient::JudgeScaleWait(const v1::JobStatus& status, uint32_t servers,
                                               uint64_t completed) {
  const v1::ReshardProgress& r = status.reshard();
  ScaleWait wait;
  const uint32_t now = status.config().num_servers();
  if (r.target_servers() != 0 && r.target_servers() != servers) {
    wait.outcome = ScaleWait::kSuperseded;
    wait.other = r.target_servers();
  } else if (r.target_servers() == 0 && r.completed() > completed && now != servers) {
    wait.outcome = ScaleWait::kSuperseded;
    wait.other = now;
  } else if (r.target_servers() == 0 && now == servers) {
    wait.outcome = r.completed() == completed ? ScaleWait::kAskedBack : ScaleWait::kDone;
  }
  return wait;
}

absl::StatusOr<v1::JobStatus> JobClient::GetStatus() const {
  auto context = UnaryContext();
  v1::JobStatus reply;
  grpc::Status s = stub_->GetJobStatus(context.get(), v1::GetJobStatusRequest(),
                                       &reply);
  if (!s.ok()) return Error("GetJobStatus", s);
  return reply;
}

absl::Status JobClient::Watch(
    absl::Duration interval,
    const std::function<bool(const v1::JobStatus&)>& on_status) const {
  grpc::ClientContext context;
  v1::WatchJobStatusRequest request;
  request.set_interval_ms(
      static_cast<uint32_t>(std::max<int64_t>(1, absl::ToInt64Milliseconds(interval))));
  std::unique_ptr<grpc::ClientReader<v1::JobStatus>> reader =
      stub_->WatchJobStatus(&context, request);
  v1::JobStatus status;
  bool done = false;  // we end the stream ourselves: its status is ours to drop
  while (reader->Read(&status)) {
    if (!on_status(status) || JobEnded(status.state())) {
      done = true;
      context.TryCancel();
      break;
    }
  }
  grpc::Status s = reader->Finish();
  if (done || s.ok()) return absl::OkStatus();
  return Error("WatchJobStatus", s);
}

absl::StatusOr<v1::ShardMap> JobClient::GetShardMap() const {
  auto context = UnaryContext();
  v1::ShardMap reply;
  grpc::Status s = stub_->GetShardMap(context.get(), v1::GetShardMapRequest(),
                                      &reply);
  if (!s.ok()) return Error("GetShardMap", s);
  return reply;
}

absl::Status JobClient::Stop(const std::string& reason) const {
  auto context = UnaryContext();
  v1::StopJobRequest request;
  request.set_reason(reason);
  v1::StopJobResponse reply;
  grpc::Status s = stub_->StopJob(context.get(), request, &reply);
  if (!s.ok()) return Error("StopJob", s);
  return absl::OkStatus();
}

absl::Status JobClient::Drain(uint32_t rank) const {
  auto context = UnaryContext();
  v1::DrainWorkerRequest request;
  request.set_rank(rank);
  v1::DrainWorkerResponse reply;
  grpc::Status s = stub_->DrainWorker(context.get(), request, &reply);
  if (!s.ok()) return Error("DrainWorker", s);
  return absl::OkStatus();
}

absl::StatusOr<v1::ReshardProgress> JobClient::ScaleServers(uint32_t num_servers) const {
  auto context = UnaryContext();
  v1::ScaleServersRequest request;
  request.set_num_servers(num_servers);
  v1::ScaleServersResponse reply;
  grpc::Status s = stub_->ScaleServers(context.get(), request, &reply);
  if (!s.ok()) return Error("ScaleServers", s);
  return reply.reshard();
}

absl::StatusOr<v1::CheckpointSummary> JobClient::Checkpoint(
    bool wait, absl::Duration wait_timeout) const {
  grpc::ClientContext context;
  context.set_deadline(
      absl::ToChronoTime(absl::Now() + (wait ? wait_timeout : rpc_timeout_)));
  v1::CheckpointJobRequest request;
  request.set_wait(wait);
  v1::CheckpointJobResponse reply;
  grpc::Status s = stub_->CheckpointJob(&context, request, &reply);
  if (!s.ok()) return Error("CheckpointJob", s);
  return reply.checkpoint();
}

}  // namespace grps
