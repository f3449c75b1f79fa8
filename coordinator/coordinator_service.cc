#include "coordinator/coordinator_service.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <utility>
#include <vector>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "coordinator/job_summary.h"
#include "daemon/daemon.h"
#include "job/job_config.h"
#include "spdlog/spdlog.h"

namespace grps {

namespace {

// How often a blocked RPC looks at its client (cancellation) while waiting.
constexpr absl::Duration kPollInterval = absl::Milliseconds(100);
// How long the final watch snapshot waits for the servers' final reports.
constexpr absl::Duration kFinalReportWait = absl::Seconds(3);
constexpr absl::Duration kDefaultWatchInterval = absl::Seconds(1);
constexpr absl::Duration kMinWatchInterval = absl::Milliseconds(20);
constexpr size_t kMaxReasonBytes = 1024;

absl::Time DeadlineOf(const grpc::ServerContext& context) {
  std::chrono::system_clock::time_point deadline = context.deadline();
  if (deadline == std::chrono::system_clock::time_point::max())
    return absl::InfiniteFuture();
  return absl::FromChrono(deadline);
}

bool IsFinal(v1::JobState state) {
  return state == v1::JOB_STATE_COMPLETED || state == v1::JOB_STATE_STOPPED ||
         state == v1::JOB_STATE_FAILED;
}

// "shard 1" or "shards 0, 1".
std::string Members(absl::string_view noun, const std::vector<uint32_t>& v) {
  return absl::StrCat(noun, v.size() == 1 ? " " : "s ", absl::StrJoin(v, ", "));
}

}  // namespace

CoordinatorService::CoordinatorService(v1::JobConfig config,
                                       v1::ShardMap shard_map, Clock clock)
    : config_(std::move(config)),
      clock_(std::move(clock)),
      membership_(std::move(shard_map), config_.num_workers(),
                  absl::Milliseconds(config_.heartbeat_timeout_ms())) {}

absl::Status CoordinatorService::CheckJobId(absl::string_view job_id,
                                            bool allow_empty) const {
  if (job_id == config_.job_id() || (allow_empty && job_id.empty()))
    return absl::OkStatus();
  return absl::FailedPreconditionError(
      absl::StrCat("request is for job '", absl::CHexEscape(job_id.substr(0, 128)),
                   "', this coordinator runs job '", config_.job_id(), "'"));
}

bool CoordinatorService::EndedLocked() const { return IsFinal(state_); }

void CoordinatorService::NoteRegistrationLocked(absl::Time now) {
  if (started_ == absl::InfinitePast()) started_ = now;
}

void CoordinatorService::EndLocked(v1::JobState state, std::string message,
                                   absl::Time now) {
  state_ = state;
  message_ = std::move(message);
  ended_ = now;
  spdlog::info("job {} {}: {}", config_.job_id(), JobStateName(state), message_);
  changed_.SignalAll();
}

void CoordinatorService::UpdateStateLocked(absl::Time now) {
  if (EndedLocked()) return;
  if (state_ == v1::JOB_STATE_WAITING) {
    if (!membership_.UnregisteredShards().empty() ||
        !membership_.UnregisteredRanks().empty())
      return;
    state_ = v1::JOB_STATE_RUNNING;
    spdlog::info("job {} running: {} servers and {} workers registered",
                 config_.job_id(), config_.num_servers(), config_.num_workers());
    changed_.SignalAll();
  }
  if (!TrainingDoneLocked()) {
    announced_training_done_ = false;
    return;
  }
  if (has_final_eval_) {
    EndLocked(v1::JOB_STATE_COMPLETED, TrainingDoneMessageLocked(), now);
    return;
  }
  if (membership_.FinishedRanksHeartbeating(now).empty()) {
    EndLocked(v1::JOB_STATE_COMPLETED,
              absl::StrCat(TrainingDoneMessageLocked(),
                           "; no final evaluation: no finished worker was "
                           "still heartbeating to run it"),
              now);
    return;
  }
  if (!announced_training_done_) {
    announced_training_done_ = true;
    spdlog::info("job {}: training done ({}); waiting for the final evaluation",
                 config_.job_id(), TrainingDoneMessageLocked());
  }
}

bool CoordinatorService::TrainingDoneLocked() const {
  // RUNNING means every rank registered, so the unfinished ones are ALIVE or
  // DEAD.
  return state_ == v1::JOB_STATE_RUNNING &&
         membership_.RanksInState(v1::MEMBER_STATE_ALIVE).empty() &&
         !membership_.RanksInState(v1::MEMBER_STATE_FINISHED).empty();
}

std::string CoordinatorService::TrainingDoneMessageLocked() const {
  const std::vector<uint32_t> dead = membership_.RanksInState(v1::MEMBER_STATE_DEAD);
  if (dead.empty()) return "every worker finished";
  return absl::StrCat(Members("worker", dead),
                      " died before finishing; the others finished");
}

std::optional<uint32_t> CoordinatorService::EvaluatorLocked(absl::Time now) const {
  if (EndedLocked()) {
    if (has_final_eval_) return final_evaluator_rank_;
    return std::nullopt;
  }
  const std::vector<uint32_t> candidates =
      TrainingDoneLocked() ? membership_.FinishedRanksHeartbeating(now)
                           : membership_.RanksInState(v1::MEMBER_STATE_ALIVE);
  if (candidates.empty()) return std::nullopt;
  return candidates.front();
}

void CoordinatorService::NoteServerHeartbeatLocked(uint32_t shard) {
  if (!TrainingDoneLocked()) return;
  const uint64_t incarnation = membership_.shard_map().shards(shard).incarnation();
  const uint64_t epoch = membership_.membership_epoch();
  auto it = final_live_set_acks_.find(shard);
  if (it != final_live_set_acks_.end() &&
      it->second.incarnation == incarnation &&
      it->second.membership_epoch == epoch) {
    it->second.heard = true;
    return;
  }
  // This reply is the first to carry the final live set to this server.
  final_live_set_acks_[shard] = {incarnation, epoch, /*heard=*/false};
}

bool CoordinatorService::ServersHeardFinalLiveSetLocked() const {
  const uint64_t epoch = membership_.membership_epoch();
  for (uint32_t shard : membership_.ShardsInState(v1::MEMBER_STATE_ALIVE)) {
    auto it = final_live_set_acks_.find(shard);
    if (it == final_live_set_acks_.end() || !it->second.heard ||
        it->second.membership_epoch != epoch ||
        it->second.incarnation !=
            membership_.shard_map().shards(shard).incarnation())
      return false;
  }
  return true;
}

std::string CoordinatorService::WaitingMessageLocked() const {
  std::vector<std::string> missing;
  std::vector<uint32_t> shards = membership_.UnregisteredShards();
  std::vector<uint32_t> ranks = membership_.UnregisteredRanks();
  if (!shards.empty()) missing.push_back(Members("shard", shards));
  if (!ranks.empty()) missing.push_back(Members("worker", ranks));
  return absl::StrCat("waiting for ", absl::StrJoin(missing, " and "),
                      " to register");
}

grpc::Status CoordinatorService::RegisterServer(
    grpc::ServerContext* context, const v1::RegisterServerRequest* request,
    v1::RegisterServerResponse* response) {
  if (absl::Status s = CheckJobId(request->job_id(), true); !s.ok())
    return ToGrpc(s);
  const absl::Time now = clock_();
  absl::MutexLock lock(&mu_);
  if (EndedLocked())
    return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION,
                        absl::StrCat("job ", config_.job_id(), " has ended (",
                                     JobStateName(state_), ")"));
  absl::StatusOr<Membership::Registration> reg = membership_.RegisterServer(
      request->requested_shard(), request->address(), now);
  if (!reg.ok()) return ToGrpc(reg.status());
  NoteRegistrationLocked(now);
  spdlog::info("server {} {} shard {} (incarnation {}); shard map epoch {}",
               request->address(), reg->rejoined ? "re-registered" : "registered",
               reg->slot, reg->incarnation, membership_.shard_map().epoch());
  UpdateStateLocked(now);
  changed_.SignalAll();
  response->set_shard(reg->slot);
  response->set_incarnation(reg->incarnation);
  *response->mutable_config() = config_;
  *response->mutable_shard_map() = membership_.shard_map();
  return grpc::Status::OK;
}

grpc::Status CoordinatorService::RegisterWorker(
    grpc::ServerContext* context, const v1::RegisterWorkerRequest* request,
    v1::RegisterWorkerResponse* response) {
  if (absl::Status s = CheckJobId(request->job_id(), true); !s.ok())
    return ToGrpc(s);
  const absl::Time deadline = DeadlineOf(*context);
  absl::MutexLock lock(&mu_);
  if (absl::Status s = membership_.ValidateWorkerRequest(
          request->requested_rank(), request->host(), request->backend());
      !s.ok())
    return ToGrpc(s);
  // Take no rank before the map is complete: a worker that gives up waiting
  // must not hold one.
  while (!membership_.AllShardsRegistered() && !EndedLocked()) {
    if (shutting_down_)
      return grpc::Status(grpc::StatusCode::UNAVAILABLE,
                          "coordinator is shutting down");
    if (context->IsCancelled())
      return grpc::Status(grpc::StatusCode::CANCELLED, "client cancelled");
    const absl::Time real_now = absl::Now();
    if (real_now >= deadline)
      return grpc::Status(
          grpc::StatusCode::DEADLINE_EXCEEDED,
          absl::StrCat("waiting for ",
                       Members("shard", membership_.UnregisteredShards()),
                       " to register"));
    changed_.WaitWithDeadline(&mu_, std::min(deadline, real_now + kPollInterval));
  }
  if (EndedLocked())
    return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION,
                        absl::StrCat("job ", config_.job_id(), " has ended (",
                                     JobStateName(state_), ")"));
  const absl::Time now = clock_();
  absl::StatusOr<Membership::Registration> reg = membership_.RegisterWorker(
      request->requested_rank(), request->host(), request->backend(), now);
  if (!reg.ok()) return ToGrpc(reg.status());
  NoteRegistrationLocked(now);
  spdlog::info(
      "worker on {} ({}) {} rank {} (incarnation {}, start step {}); membership "
      "epoch {}",
      request->host(), request->backend(),
      reg->rejoined ? "re-registered" : "registered", reg->slot, reg->incarnation,
      reg->start_step, membership_.membership_epoch());
  UpdateStateLocked(now);
  changed_.SignalAll();
  response->set_rank(reg->slot);
  response->set_incarnation(reg->incarnation);
  response->set_start_step(reg->start_step);
  *response->mutable_config() = config_;
  *response->mutable_shard_map() = membership_.shard_map();
  return grpc::Status::OK;
}

grpc::Status CoordinatorService::Heartbeat(grpc::ServerContext* context,
                                           const v1::HeartbeatRequest* request,
                                           v1::HeartbeatResponse* response) {
  if (absl::Status s = CheckJobId(request->job_id(), false); !s.ok())
    return ToGrpc(s);
  const absl::Time now = clock_();
  absl::MutexLock lock(&mu_);
  bool revived = false;
  absl::Status s;
  switch (request->member_case()) {
    case v1::HeartbeatRequest::kWorkerRank:
      s = membership_.WorkerHeartbeat(
          request->worker_rank(), request->incarnation(),
          request->has_progress() ? &request->progress() : nullptr, now, &revived);
      if (s.ok() && revived)
        spdlog::info("worker {} is alive again; membership epoch {}",
                     request->worker_rank(), membership_.membership_epoch());
      break;
    case v1::HeartbeatRequest::kServerShard:
      s = membership_.ServerHeartbeat(request->server_shard(),
                                      request->incarnation(), request->shard(),
                                      now, &revived);
      if (s.ok() && revived)
        spdlog::info("server of shard {} is alive again", request->server_shard());
      if (s.ok()) NoteServerHeartbeatLocked(request->server_shard());
      break;
    default:
      s = absl::InvalidArgumentError(
          "heartbeat must name a worker_rank or a server_shard");
  }
  if (!s.ok()) return ToGrpc(s);

  response->set_job_state(state_);
  Membership::LiveWorkers live = membership_.live_workers();
  response->mutable_live_workers()->Add(live.ranks.begin(), live.ranks.end());
  response->mutable_live_worker_incarnations()->Add(live.incarnations.begin(),
                                                    live.incarnations.end());
  response->set_membership_epoch(membership_.membership_epoch());
  if (std::optional<uint32_t> evaluator = EvaluatorLocked(now);
      evaluator.has_value() && !EndedLocked()) {
    response->set_evaluator_rank(*evaluator);
    if (request->member_case() == v1::HeartbeatRequest::kWorkerRank &&
        request->worker_rank() == *evaluator && TrainingDoneLocked() &&
        ServersHeardFinalLiveSetLocked()) {
      response->set_evaluate_final(true);
      if (final_evaluation_asked_of_ != evaluator) {
        final_evaluation_asked_of_ = evaluator;
        spdlog::info("job {}: worker {} evaluates the final weights",
                     config_.job_id(), *evaluator);
      }
    }
  }
  if (request->shard_map_epoch() < membership_.shard_map().epoch())
    *response->mutable_shard_map() = membership_.shard_map();
  if (EndedLocked()) {
    if (request->member_case() == v1::HeartbeatRequest::kWorkerRank)
      ranks_told_end_.insert(request->worker_rank());
    else if (request->final_report())
      shards_told_end_.insert(request->server_shard());
    changed_.SignalAll();
  }
  return grpc::Status::OK;
}

grpc::Status CoordinatorService::WorkerDone(grpc::ServerContext* context,
                                            const v1::WorkerDoneRequest* request,
                                            v1::WorkerDoneResponse* response) {
  if (absl::Status s = CheckJobId(request->job_id(), false); !s.ok())
    return ToGrpc(s);
  if (request->has_final_eval() &&
      !(request->final_test_accuracy() >= 0 && request->final_test_accuracy() <= 1 &&
        std::isfinite(request->final_test_loss())))
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                        "final_test_accuracy must be in [0, 1] and "
                        "final_test_loss finite");
  const absl::Time now = clock_();
  absl::MutexLock lock(&mu_);
  absl::Status s = membership_.FinishWorker(
      request->worker_rank(), request->incarnation(), request->progress(), now);
  if (!s.ok()) return ToGrpc(s);
  std::string eval_note;
  if (request->has_final_eval() && !EndedLocked()) {
    const Membership::Evaluation eval{request->final_test_accuracy(),
                                      request->final_test_loss()};
    membership_.RecordEvaluation(eval);
    // Only weights read after training was done are final.
    const bool final = TrainingDoneLocked();
    if (final) {
      has_final_eval_ = true;
      final_eval_ = eval;
      final_evaluator_rank_ = request->worker_rank();
    }
    eval_note = absl::StrCat(
        final ? "; final test accuracy " : "; test accuracy (not final: training "
                                           "is not done) ",
        eval.accuracy, ", loss ", eval.loss);
  }
  spdlog::info("worker {} finished at step {}{}", request->worker_rank(),
               request->progress().step(), eval_note);
  UpdateStateLocked(now);
  return grpc::Status::OK;
}

grpc::Status CoordinatorService::GetShardMap(grpc::ServerContext* context,
                                             const v1::GetShardMapRequest* request,
                                             v1::ShardMap* response) {
  absl::MutexLock lock(&mu_);
  *response = membership_.shard_map();
  return grpc::Status::OK;
}

grpc::Status CoordinatorService::GetJobStatus(grpc::ServerContext* context,
                                              const v1::GetJobStatusRequest* request,
                                              v1::JobStatus* response) {
  *response = Status();
  return grpc::Status::OK;
}

grpc::Status CoordinatorService::WatchJobStatus(
    grpc::ServerContext* context, const v1::WatchJobStatusRequest* request,
    grpc::ServerWriter<v1::JobStatus>* writer) {
  const absl::Duration interval =
      request->interval_ms() == 0
          ? kDefaultWatchInterval
          : std::max(kMinWatchInterval, absl::Milliseconds(request->interval_ms()));
  while (true) {
    v1::JobStatus snapshot;
    bool ended = false;
    {
      absl::MutexLock lock(&mu_);
      if (shutting_down_)
        return grpc::Status(grpc::StatusCode::UNAVAILABLE,
                            "coordinator is shutting down");
      snapshot = StatusLocked(clock_());
      ended = EndedLocked();
    }
    if (ended) {
      // The last snapshot carries every live server's final report, so a
      // watcher sees the job's true final figures (bounded wait).
      const absl::Time give_up = absl::Now() + kFinalReportWait;
      absl::MutexLock lock(&mu_);
      while (!EveryLiveMemberSawEndLocked(clock_()) && !shutting_down_ &&
             absl::Now() < give_up && !context->IsCancelled())
        changed_.WaitWithDeadline(&mu_, std::min(give_up, absl::Now() + kPollInterval));
      snapshot = StatusLocked(clock_());
    }
    if (!writer->Write(snapshot))
      return grpc::Status(grpc::StatusCode::CANCELLED, "client left");
    if (ended) return grpc::Status::OK;
    const absl::Time next = absl::Now() + interval;
    absl::MutexLock lock(&mu_);
    while (!EndedLocked() && !shutting_down_) {
      if (context->IsCancelled())
        return grpc::Status(grpc::StatusCode::CANCELLED, "client cancelled");
      const absl::Time real_now = absl::Now();
      if (real_now >= next) break;
      changed_.WaitWithDeadline(&mu_, std::min(next, real_now + kPollInterval));
    }
  }
}

grpc::Status CoordinatorService::StopJob(grpc::ServerContext* context,
                                         const v1::StopJobRequest* request,
                                         v1::StopJobResponse* response) {
  if (request->reason().size() > kMaxReasonBytes)
    return grpc::Status(
        grpc::StatusCode::INVALID_ARGUMENT,
        absl::StrCat("stop reason must be at most ", kMaxReasonBytes, " bytes"));
  absl::MutexLock lock(&mu_);
  if (state_ == v1::JOB_STATE_STOPPED) return grpc::Status::OK;
  if (EndedLocked())
    return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION,
                        absl::StrCat("job ", config_.job_id(), " already ",
                                     JobStateName(state_)));
  EndLocked(v1::JOB_STATE_STOPPED,
            request->reason().empty() ? "stopped by an operator"
                                      : request->reason(),
            clock_());
  return grpc::Status::OK;
}

void CoordinatorService::DetectFailures() {
  const absl::Time now = clock_();
  absl::MutexLock lock(&mu_);
  Membership::Failures failures = membership_.DetectFailures(now);
  for (uint32_t shard : failures.shards)
    spdlog::warn("server of shard {} missed its heartbeats for {} ms: dead",
                 shard, config_.heartbeat_timeout_ms());
  for (uint32_t rank : failures.ranks)
    spdlog::warn("worker {} missed its heartbeats for {} ms: dead; membership "
                 "epoch {}",
                 rank, config_.heartbeat_timeout_ms(),
                 membership_.membership_epoch());
  // Also when nothing died: a finished worker's silence is judged here.
  UpdateStateLocked(now);
}

void CoordinatorService::Stop(absl::string_view reason) {
  const absl::Time now = clock_();
  absl::MutexLock lock(&mu_);
  if (EndedLocked()) return;
  EndLocked(v1::JOB_STATE_STOPPED, std::string(reason), now);
}

v1::JobState CoordinatorService::state() const {
  absl::MutexLock lock(&mu_);
  return state_;
}

v1::JobStatus CoordinatorService::Status() const {
  const absl::Time now = clock_();
  absl::MutexLock lock(&mu_);
  return StatusLocked(now);
}

v1::JobStatus CoordinatorService::StatusLocked(absl::Time now) const {
  v1::JobStatus status;
  status.set_job_id(config_.job_id());
  status.set_state(state_);
  status.set_mode(config_.mode());
  *status.mutable_config() = config_;
  for (v1::WorkerStatus& w : membership_.WorkerStatuses(now))
    *status.add_workers() = std::move(w);
  for (v1::ShardStatus& s : membership_.ShardStatuses(now))
    *status.add_shards() = std::move(s);
  SummarizeJobStatus(&status);
  if (std::optional<uint32_t> evaluator = EvaluatorLocked(now); evaluator.has_value())
    status.set_evaluator_rank(*evaluator);
  std::optional<Membership::Evaluation> eval = membership_.latest_evaluation();
  status.set_test_accuracy(eval.has_value() ? eval->accuracy : -1);
  status.set_test_loss(eval.has_value() ? eval->loss : -1);
  status.set_has_final_eval(has_final_eval_);
  if (has_final_eval_) {
    status.set_final_test_accuracy(final_eval_.accuracy);
    status.set_final_test_loss(final_eval_.loss);
  }
  if (started_ != absl::InfinitePast())
    status.set_elapsed_seconds(
        std::max(0.0, absl::ToDoubleSeconds(std::min(now, ended_) - started_)));
  status.set_message(state_ == v1::JOB_STATE_WAITING ? WaitingMessageLocked()
                                                     : message_);
  status.set_membership_epoch(membership_.membership_epoch());
  return status;
}

bool CoordinatorService::WaitForEnd(absl::Duration timeout) const {
  const absl::Time deadline = absl::Now() + timeout;
  absl::MutexLock lock(&mu_);
  while (!EndedLocked()) {
    if (changed_.WaitWithDeadline(&mu_, deadline)) break;  // timed out
  }
  return EndedLocked();
}

bool CoordinatorService::EveryLiveMemberSawEnd() const {
  absl::MutexLock lock(&mu_);
  return EveryLiveMemberSawEndLocked(clock_());
}

bool CoordinatorService::EveryLiveMemberSawEndLocked(absl::Time now) const {
  if (!EndedLocked()) return false;
  for (uint32_t shard : membership_.ShardsInState(v1::MEMBER_STATE_ALIVE))
    if (shards_told_end_.count(shard) == 0) return false;
  for (uint32_t rank : membership_.RanksInState(v1::MEMBER_STATE_ALIVE))
    if (ranks_told_end_.count(rank) == 0) return false;
  for (uint32_t rank : membership_.FinishedRanksHeartbeating(now))
    if (ranks_told_end_.count(rank) == 0) return false;
  return true;
}

void CoordinatorService::Shutdown() {
  absl::MutexLock lock(&mu_);
  shutting_down_ = true;
  changed_.SignalAll();
}

}  // namespace grps
