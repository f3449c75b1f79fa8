#include "worker/worker_session.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "daemon/daemon.h"
#include "job/job_config.h"
#include "job/shard_map.h"
#include "spdlog/spdlog.h"
#include "wire/chunk_codec.h"
#include "worker/parameter_client.h"

namespace grps {
namespace {

// How often a wait logs that it still waits.
constexpr absl::Duration kWaitLogEvery = absl::Seconds(10);

absl::Duration CoordinatorTimeout(const v1::JobConfig& config) {
  return absl::Milliseconds(CoordinatorTimeoutMs(config));
}

bool Ended(v1::JobState state) {
  return state == v1::JOB_STATE_COMPLETED || state == v1::JOB_STATE_STOPPED ||
         state == v1::JOB_STATE_FAILED;
}

}  // namespace

absl::Status CheckRegistration(const v1::RegisterWorkerResponse& reg) {
  absl::Status valid = ValidateJobConfig(reg.config());
  if (valid.ok()) valid = ValidateShardMap(reg.shard_map());
  if (!valid.ok())
    return absl::InvalidArgumentError(
        absl::StrCat("coordinator sent an unusable job: ", valid.message()));
  for (const v1::ShardEndpoint& e : reg.shard_map().shards())
    if (e.address().empty())
      return absl::InvalidArgumentError(absl::StrCat(
          "coordinator sent a shard map without an address for shard ", e.shard()));
  return absl::OkStatus();
}

WorkerSession::WorkerSession(v1::Coordinator::StubInterface* coordinator,
                             const v1::RegisterWorkerResponse& registration,
                             std::unique_ptr<ParameterShards> dense,
                             std::unique_ptr<SparseShards> sparse, Options options)
    : coordinator_(coordinator),
      config_(registration.config()),
      rank_(registration.rank()),
      incarnation_(registration.incarnation()),
      options_(std::move(options)),
      coordinator_timeout_(CoordinatorTimeout(registration.config())),
      dense_(std::move(dense)),
      sparse_(std::move(sparse)),
      map_(registration.shard_map()),
      newest_epoch_(registration.shard_map().epoch()),
      agent_(coordinator,
             {registration.config().job_id(), MemberKind::kWorker, registration.rank(),
              registration.incarnation()},
             absl::Milliseconds(registration.config().heartbeat_interval_ms()),
             absl::Milliseconds(registration.config().heartbeat_interval_ms()) * 4,
             options_.clock) {
  {
    absl::MutexLock lock(&mu_);
    generation_ = registration.generation();
    last_progress_ = Now();
    progress_.set_step(registration.start_step());
    progress_.set_test_accuracy(-1);
    progress_.set_test_loss(-1);
  }
  SetGeneration(registration.generation());
  agent_.Start(HeartbeatHandlers());
}

WorkerSession::~WorkerSession() { agent_.Stop(); }

void WorkerSession::SetGeneration(uint64_t generation) {
  {
    absl::MutexLock lock(&clients_mu_);
    dense_->set_generation(generation);
    if (sparse_ != nullptr) sparse_->set_generation(generation);
  }
  if (options_.on_generation) options_.on_generation(generation);
}

ParameterShards* WorkerSession::Dense() const {
  absl::MutexLock lock(&clients_mu_);
  return dense_.get();
}

SparseShards* WorkerSession::sparse() {
  absl::MutexLock lock(&clients_mu_);
  return sparse_.get();
}

uint64_t WorkerSession::generation() const {
  absl::MutexLock lock(&mu_);
  return generation_;
}

void WorkerSession::UpdateProgress(const std::function<void(v1::WorkerProgress*)>& edit) {
  absl::MutexLock lock(&mu_);
  edit(&progress_);
}

v1::WorkerProgress WorkerSession::progress() const {
  absl::MutexLock lock(&mu_);
  return progress_;
}

std::optional<uint32_t> WorkerSession::evaluator_rank() const {
  absl::MutexLock lock(&mu_);
  return evaluator_rank_;
}

bool WorkerSession::asked_for_final_evaluation() const {
  absl::MutexLock lock(&mu_);
  return evaluate_final_ && evaluator_rank_ == rank_ && evaluation_wanted_again_;
}

v1::JobState WorkerSession::job_state() const {
  absl::MutexLock lock(&mu_);
  return job_state_;
}

bool WorkerSession::finished() const {
  absl::MutexLock lock(&mu_);
  return finished_;
}

WorkerSession::Interrupt WorkerSession::Interrupted() const {
  if (ShutdownRequested() || (options_.interrupted && options_.interrupted()))
    return Interrupt::kSignal;
  const bool leave = grps::LeaveRequested();
  absl::MutexLock lock(&mu_);
  // A rank that finished has nothing left to do before it leaves.
  if (finished_ && (leave || drain_)) return Interrupt::kSignal;
  if (job_state_ == v1::JOB_STATE_FAILED) return Interrupt::kJobFailed;
  if (Ended(job_state_)) return Interrupt::kJobEnded;
  if (restore_.has_value() && restore_->generation() > generation_)
    return Interrupt::kRollBack;
  return Interrupt::kNone;
}

absl::Status WorkerSession::JobFailed() {
  // The heartbeat carries only the state; the reason is in the job status.
  v1::GetJobStatusRequest req;
  v1::JobStatus status;
  grpc::ClientContext ctx;
  ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(2)));
  grpc::Status st = coordinator_->GetJobStatus(&ctx, req, &status);
  return absl::AbortedError(absl::StrCat(
      "job failed: ", st.ok() && !status.message().empty()
                          ? status.message()
                          : std::string("(the coordinator gave no reason)")));
}

bool WorkerSession::TakeRollBack(uint64_t total, uint64_t* step,
                                 std::optional<v1::ShardMap>* replaced_map) {
  v1::RestoreOrder order;
  uint64_t resume = 0;
  {
    absl::MutexLock lock(&mu_);
    if (!restore_.has_value() || restore_->generation() <= generation_) return false;
    order = *restore_;
    restore_.reset();
    if (replaced_map != nullptr) {
      *replaced_map = std::move(replaced_map_);
      replaced_map_.reset();
    }
    resume = rank_ < static_cast<uint32_t>(order.worker_steps_size())
                 ? order.worker_steps(rank_)
                 : order.step();
    resume = std::min(resume, total);
    generation_ = order.generation();
    finished_ = false;
    progress_.set_step(resume);
    last_progress_ = Now();
  }
  SetGeneration(order.generation());
  *step = resume;
  if (order.checkpoint_id() == 0)
    spdlog::warn("rolled back to the initial values: resuming at step {} (generation {})",
                 resume, order.generation());
  else
    spdlog::warn("rolled back to checkpoint {}: resuming at step {} (generation {})",
                 order.checkpoint_id(), resume, order.generation());
  return true;
}

WorkerSession::Clients WorkerSession::ReplaceClients(const v1::ShardMap& map, Clients fresh) {
  Clients old;
  {
    absl::MutexLock lock(&clients_mu_);
    old.dense = std::exchange(dense_, std::move(fresh.dense));
    old.sparse = std::exchange(sparse_, std::move(fresh.sparse));
    map_ = map;
    newest_epoch_ = std::max(newest_epoch_, map.epoch());
  }
  SetGeneration(generation());
  spdlog::info("following shard map epoch {}: {} shards (re-sharded)", map.epoch(),
               map.shards_size());
  // A newer map that came meanwhile was judged against the old clients'
  // layout and kept: one of the new layout (a shard that moved since) is
  // followed now; one that re-places the chunks again waits for its own
  // roll-back.
  std::optional<v1::ShardMap> pending;
  {
    absl::MutexLock lock(&mu_);
    pending = std::move(replaced_map_);
    replaced_map_.reset();
  }
  if (!pending.has_value() || pending->epoch() <= map.epoch()) return old;
  std::optional<v1::ShardMap> keep;
  {
    absl::MutexLock lock(&clients_mu_);
    keep = FollowLocked(*pending);
  }
  if (keep.has_value()) {
    absl::MutexLock lock(&mu_);
    KeepReplacedMap(std::move(*keep));
  }
  return old;
}

bool WorkerSession::StuckWithoutCoordinator() const {
  if (CoordinatorSilence() <= coordinator_timeout_) return false;
  absl::MutexLock lock(&mu_);
  return Now() - last_progress_ > coordinator_timeout_;
}

void WorkerSession::NoteProgress() {
  absl::MutexLock lock(&mu_);
  last_progress_ = Now();
}

MemberAgent::Handlers WorkerSession::HeartbeatHandlers() {
  const absl::Duration interval = absl::Milliseconds(config_.heartbeat_interval_ms());
  MemberAgent::Handlers handlers;
  handlers.fill = [this](v1::HeartbeatRequest* req) {
    {
      absl::MutexLock lock(&clients_mu_);
      req->set_shard_map_epoch(map_.epoch());
    }
    absl::MutexLock lock(&mu_);
    *req->mutable_progress() = progress_;
    req->set_generation(generation_);
    req->set_finished(finished_);
  };
  handlers.on_reply = [this](const v1::HeartbeatResponse& resp) {
    if (said_silent_) spdlog::info("the coordinator answers again");
    said_silent_ = false;
    OnHeartbeatReply(resp);
    return MemberAgent::Next::kGoOn;
  };
  handlers.on_error = [this, interval](const grpc::Status& st) {
    if (st.error_code() != grpc::StatusCode::UNAVAILABLE &&
        st.error_code() != grpc::StatusCode::DEADLINE_EXCEEDED)
      spdlog::warn("heartbeat: {}", st.error_message());
    // Training goes on without a coordinator; say so once.
    if (!said_silent_ && CoordinatorSilence() > interval * 4) {
      spdlog::warn("no answer from the coordinator for {} ({}); training goes on, "
                   "waits that need it give up after {}",
                   absl::FormatDuration(CoordinatorSilence()), st.error_message(),
                   absl::FormatDuration(coordinator_timeout_));
      said_silent_ = true;
    }
    return MemberAgent::Next::kGoOn;
  };
  return handlers;
}

std::optional<v1::ShardMap> WorkerSession::FollowShardMap(const v1::ShardMap& map) {
  absl::MutexLock lock(&clients_mu_);
  if (map.epoch() <= newest_epoch_) return std::nullopt;  // followed, kept or refused
  newest_epoch_ = map.epoch();
  return FollowLocked(map);
}

std::optional<v1::ShardMap> WorkerSession::FollowLocked(const v1::ShardMap& map) {
  absl::StatusOr<MapFit> fit = FitShardMap(map_, map);
  if (fit.ok() && *fit == MapFit::kReplaced) {
    if (options_.follow_replaced_maps) {
      spdlog::debug("shard map epoch {} places the chunks on {} shards: followed at the "
                    "roll-back that comes with it",
                    map.epoch(), map.shards_size());
      return map;
    }
    fit = absl::InvalidArgumentError(absl::StrCat(
        "shard map epoch ", map.epoch(), ": it places the chunks on ", map.shards_size(),
        " shards otherwise, and this worker cannot follow a re-sharding"));
  }
  // The clients are thread-safe: a newer map goes to them at once, so that
  // a push retrying on another thread reaches the shard's new endpoint.
  absl::Status s = fit.ok() ? dense_->UpdateShardMap(map) : fit.status();
  if (!s.ok()) {
    spdlog::error("refused the coordinator's {}", std::string(s.message()));
    return std::nullopt;
  }
  if (sparse_ != nullptr) sparse_->UpdateShardMap(map);
  map_ = map;
  if (options_.on_shard_map) options_.on_shard_map(map);
  spdlog::info("following shard map epoch {}", map.epoch());
  return std::nullopt;
}

void WorkerSession::KeepReplacedMap(v1::ShardMap map) {
  if (!replaced_map_.has_value() || map.epoch() > replaced_map_->epoch())
    replaced_map_ = std::move(map);
}

void WorkerSession::OnHeartbeatReply(const v1::HeartbeatResponse& resp) {
  std::optional<v1::ShardMap> replaced;
  if (resp.has_shard_map()) replaced = FollowShardMap(resp.shard_map());
  if (resp.claim_examples() && options_.on_claim_examples) options_.on_claim_examples();
  absl::MutexLock lock(&mu_);
  // A map that re-places the chunks and the order of its roll-back come in
  // one reply: recorded at once, whichever the reply lists first, so that
  // the roll-back TakeRollBack gives out is the one that follows the map.
  if (replaced.has_value()) KeepReplacedMap(std::move(*replaced));
  job_state_ = resp.job_state();
  evaluator_rank_.reset();
  if (resp.has_evaluator_rank()) evaluator_rank_ = resp.evaluator_rank();
  evaluate_final_ = resp.evaluate_final();
  if (!evaluate_final_) evaluation_wanted_again_ = true;
  if (resp.drain() && !drain_) {
    drain_ = true;
    spdlog::info("drained by an operator: leaving the job after the step in progress");
  }
  if (resp.has_restore() && resp.restore().generation() > generation_ &&
      (!restore_.has_value() || resp.restore().generation() > restore_->generation()))
    restore_ = resp.restore();
}

absl::Status WorkerSession::WaitToPull(absl::string_view what, uint64_t clock,
                                       const std::function<absl::Status()>& attempt) {
  // A pull may wait for other workers (sync, ssp) or for a shard to come
  // back; keep waiting, in slices so that the end of the job or a roll-back
  // is noticed, as long as the job runs and the coordinator answers.
  absl::Time logged = Now();
  while (true) {
    if (Interrupted() != Interrupt::kNone) return absl::CancelledError("interrupted");
    absl::Status s = attempt();
    if (s.ok()) {
      NoteProgress();
      return s;
    }
    if (Interrupted() != Interrupt::kNone) return absl::CancelledError("interrupted");
    if (s.code() == absl::StatusCode::kAborted) return WaitForRestoreOrder(s);
    // RESOURCE_EXHAUSTED: the shard has too many waiting pulls, or its gRPC
    // is short of memory for calls right now. CANCELLED, this worker not
    // interrupted: the shard's server cancelled the call as it went away (a
    // shard a re-sharding retired, heard of a heartbeat before this worker
    // hears of the move); the roll-back comes with the next reply.
    if (s.code() != absl::StatusCode::kDeadlineExceeded &&
        s.code() != absl::StatusCode::kUnavailable &&
        s.code() != absl::StatusCode::kResourceExhausted &&
        s.code() != absl::StatusCode::kCancelled)
      return s;
    if (StuckWithoutCoordinator())
      return absl::UnavailableError(absl::StrCat(
          "no ", what, " for clock ", clock, " and no word from the coordinator for ",
          absl::FormatDuration(coordinator_timeout_), "; giving up (", s.message(), ")"));
    if (Now() - logged >= kWaitLogEvery) {
      spdlog::info("waiting to read the {} of clock {}: {}", std::string(what), clock,
                   std::string(s.message()));
      logged = Now();
    }
    SleepUnlessShutdown(absl::Milliseconds(100));
  }
}

absl::Status WorkerSession::PullWeights(uint64_t clock, float* params) {
  ParameterShards* dense = Dense();
  return WaitToPull("weights", clock, [&] { return dense->Pull(clock, kPullSlice, params); });
}

absl::Status WorkerSession::JoinTheOthers(uint64_t* step, float* params) {
  if (absl::Status s = PullWeights(*step, params); !s.ok()) return s;
  // The highest version: a shard that is a step behind the others (it has
  // not completed the step they pushed everywhere yet) takes this rank's
  // gradient for that step, and the rank stays one step behind there. At
  // the lowest, the rank would be a step ahead on the others, and at the
  // end make a step there that no other shard makes.
  MoveUpTo(Dense()->max_pulled_version(), step);
  return absl::OkStatus();
}

bool WorkerSession::FollowTheWeights(uint64_t* step) {
  if (config_.mode() != v1::MODE_SYNC || config_.backup_workers() > 0) return false;
  return MoveUpTo(Dense()->max_pulled_version(), step);
}

bool WorkerSession::MoveUpTo(uint64_t at, uint64_t* step) {
  if (at <= *step) return false;
  spdlog::info("joining the others at step {}: this rank skips steps [{}, {})", at, *step, at);
  *step = at;
  return true;
}

ParameterShards::RetryPolicy WorkerSession::PushRetry() {
  ParameterShards::RetryPolicy retry;
  retry.retry_for = absl::InfiniteDuration();  // bounded by `stop`
  retry.stop = [this] {
    return Interrupted() != Interrupt::kNone || StuckWithoutCoordinator();
  };
  return retry;
}

absl::StatusOr<ParameterShards::PushOutcome> WorkerSession::PushGradients(uint64_t step,
                                                                          const float* grads,
                                                                          uint32_t samples,
                                                                          float* params) {
  return PushGradients(step, grads, samples, params, nullptr);
}

absl::StatusOr<ParameterShards::PushOutcome> WorkerSession::PushGradients(
    uint64_t step, const float* grads, uint32_t samples, float* params,
    const StartedPush& started) {
  // Fused with the pull of the next clock: the shards reply with the new
  // weights once the mode allows (sync: when the step completes), which saves
  // a round trip per step; if they do not come within a pull slice, the
  // caller pulls as usual.
  const ParameterShards::RetryPolicy retry = PushRetry();
  ParameterShards* dense = Dense();
  absl::Time logged = Now();
  for (bool first = true;; first = false) {
    absl::StatusOr<ParameterShards::PushOutcome> pushed =
        first && started ? started(retry)
                         : dense->PushAndPull(step, grads, samples, params, kPullSlice, retry);
    if (pushed.ok()) {
      NoteProgress();
      return pushed;
    }
    if (absl::Status next = PushFailed(pushed.status(), absl::StrCat("step ", step));
        !next.ok())
      return next;
    if (Now() - logged >= kWaitLogEvery) {
      spdlog::info("retrying the push of step {}: {}", step,
                   std::string(pushed.status().message()));
      logged = Now();
    }
  }
}

absl::StatusOr<SparseShards::PushOutcome> WorkerSession::PushRows(const std::string& table,
                                                                  uint64_t step,
                                                                  absl::Span<const int64_t> ids,
                                                                  const float* grads) {
  const ParameterShards::RetryPolicy retry = PushRetry();
  while (true) {
    absl::StatusOr<SparseShards::PushOutcome> pushed =
        sparse()->Push(table, step, ids, grads, retry);
    if (pushed.ok()) {
      NoteProgress();
      return pushed;
    }
    if (absl::Status next = PushFailed(
            pushed.status(), absl::StrCat("table '", table, "' rows of step ", step));
        !next.ok())
      return next;
  }
}

absl::Status WorkerSession::PushFailed(const absl::Status& s, absl::string_view what) {
  if (Interrupted() != Interrupt::kNone) return s;
  if (s.code() == absl::StatusCode::kAborted) return WaitForRestoreOrder(s);
  if (StuckWithoutCoordinator())
    return absl::UnavailableError(absl::StrCat(
        "cannot push ", what, " and no word from the coordinator for ",
        absl::FormatDuration(coordinator_timeout_), "; giving up (", s.message(), ")"));
  if (s.code() == absl::StatusCode::kCancelled) {
    // Not this worker's interrupt: the shard went away (WaitToPull says
    // more); the heartbeat reply that tells of the move comes soon.
    SleepUnlessShutdown(absl::Milliseconds(20));
    return absl::OkStatus();
  }
  if (s.code() == absl::StatusCode::kDeadlineExceeded ||
      s.code() == absl::StatusCode::kUnavailable)
    return absl::OkStatus();
  return s;
}

absl::Status WorkerSession::WaitForRestoreOrder(const absl::Status& refused) {
  spdlog::info("{}; waiting for the restore order", std::string(refused.message()));
  const absl::Time give_up = Now() + coordinator_timeout_;
  while (Now() < give_up) {
    if (Interrupted() != Interrupt::kNone) return absl::CancelledError("interrupted");
    SleepUnlessShutdown(absl::Milliseconds(20));
  }
  return absl::DeadlineExceededError(absl::StrCat(
      "no restore order within ", absl::FormatDuration(coordinator_timeout_),
      " after: ", refused.message()));
}

bool WorkerSession::LeaveRequested() const {
  if (grps::LeaveRequested()) return true;
  absl::MutexLock lock(&mu_);
  return drain_;
}

absl::Status WorkerSession::Leave(uint64_t step) {
  UpdateProgress([step](v1::WorkerProgress* p) { p->set_step(step); });
  v1::WorkerDoneRequest done;
  done.set_job_id(config_.job_id());
  done.set_worker_rank(rank_);
  done.set_incarnation(incarnation_);
  done.set_leaving(true);
  *done.mutable_progress() = progress();
  Backoff policy;
  policy.give_up_after = kLeaveGrace;
  policy.retry_deadline_exceeded = true;
  policy.retry_resource_exhausted = true;
  absl::Status st = RetryTransient(policy, [&]() -> absl::Status {
    v1::WorkerDoneResponse resp;
    done.set_generation(generation());
    return ToAbsl(agent_.WorkerDone(done, &resp, absl::Seconds(5)));
  });
  if (!st.ok()) return absl::Status(st.code(), absl::StrCat("leaving the job: ", st.message()));
  return absl::OkStatus();
}

absl::Status WorkerSession::CallCoordinator(
    const std::function<absl::Status(uint64_t generation)>& call, bool* gave_up) {
  *gave_up = false;
  // A coordinator that restarted may not know this rank until it has seen
  // its heartbeat: its refusal is retried as long as the silence bound.
  const absl::Time refusals_until = Now() + coordinator_timeout_;
  Backoff policy;
  // These calls never answer RESOURCE_EXHAUSTED themselves: it is the
  // coordinator's memory quota, busy with someone else's big messages.
  policy.retry_resource_exhausted = true;
  // A coordinator that is stopped or overloaded answers late: retried too,
  // as every failure, for as long as the coordinator's silence allows.
  policy.retry_deadline_exceeded = true;
  return RetryTransient(policy, [&]() -> absl::Status {
    if (Interrupted() != Interrupt::kNone) return absl::CancelledError("interrupted");
    if (CoordinatorSilence() > coordinator_timeout_) {
      *gave_up = true;
      return absl::CancelledError("the coordinator is silent");  // ends the retries
    }
    absl::Status s = call(generation());
    if (absl::IsAborted(s)) return s;  // a roll-back: not retried here
    if ((absl::IsFailedPrecondition(s) || absl::IsNotFound(s)) && Now() < refusals_until)
      return absl::UnavailableError(s.message());
    return s;
  });
}

absl::Status WorkerSession::ReportDone(v1::WorkerDoneRequest done) {
  bool gave_up = false;
  absl::Status st = CallCoordinator(
      [&](uint64_t generation) {
        v1::WorkerDoneResponse resp;
        done.set_generation(generation);
        return ToAbsl(agent_.WorkerDone(done, &resp, absl::Seconds(10)));
      },
      &gave_up);
  if (st.ok()) {
    absl::MutexLock lock(&mu_);
    finished_ = true;
    // An answer to the request (a first report's figures, made before any
    // request, answer none).
    if ((done.has_final_eval() || done.no_final_eval()) && evaluate_final_ &&
        evaluator_rank_ == rank_)
      evaluation_wanted_again_ = false;
    return st;
  }
  if (Interrupted() != Interrupt::kNone) return absl::OkStatus();
  if (gave_up)
    return absl::UnavailableError(absl::StrCat(
        "WorkerDone: no word from the coordinator for ",
        absl::FormatDuration(coordinator_timeout_), "; giving up"));
  // The job rolled back after this worker finished: the heartbeat brings
  // the restore order, and the worker trains again.
  if (absl::IsAborted(st)) return WaitForRestoreOrder(st);
  return absl::Status(st.code(), absl::StrCat("WorkerDone: ", st.message()));
}

absl::StatusOr<v1::LeaseExamplesResponse> WorkerSession::LeaseExamples(
    v1::LeaseExamplesRequest request) {
  v1::LeaseExamplesResponse response;
  bool gave_up = false;
  absl::Status st = CallCoordinator(
      [&](uint64_t generation) {
        request.set_generation(generation);
        return ToAbsl(agent_.LeaseExamples(request, &response, absl::Seconds(10)));
      },
      &gave_up);
  if (st.ok()) return response;
  if (gave_up)
    return absl::UnavailableError(absl::StrCat(
        "LeaseExamples: no word from the coordinator for ",
        absl::FormatDuration(coordinator_timeout_), "; giving up"));
  return absl::Status(st.code(), absl::StrCat("LeaseExamples: ", st.message()));
}

absl::StatusOr<v1::CollectiveResponse> WorkerSession::Collective(const std::string& name,
                                                                 std::string payload,
                                                                 absl::Duration timeout) {
  const absl::Time deadline = Now() + timeout;
  v1::CollectiveRequest request;
  request.set_name(name);
  request.set_payload(std::move(payload));
  v1::CollectiveResponse response;
  // Asked again at 1 ms, doubling to 50 ms: a metric's round completes
  // within a few polls of its last contribution.
  absl::Duration pace = absl::Milliseconds(1);
  for (;;) {
    bool gave_up = false;
    absl::Status st = CallCoordinator(
        [&](uint64_t) { return ToAbsl(agent_.Collective(request, &response, absl::Seconds(10))); },
        &gave_up);
    if (!st.ok()) {
      if (gave_up)
        return absl::UnavailableError(absl::StrCat(
            "collective '", name, "': no word from the coordinator for ",
            absl::FormatDuration(coordinator_timeout_), "; giving up"));
      return absl::Status(st.code(), absl::StrCat("collective '", name, "': ", st.message()));
    }
    if (response.complete()) return response;
    if (request.round() == 0) {
      request.clear_payload();
      request.set_round(response.round());
    }
    if (Now() >= deadline)
      return absl::DeadlineExceededError(absl::StrCat(
          "collective '", name, "': not every live worker contributed within ",
          absl::FormatDuration(timeout), " (do all of them make this call?)"));
    absl::SleepFor(pace);
    pace = std::min(pace * 2, absl::Milliseconds(50));
  }
}

absl::StatusOr<bool> WorkerSession::AwaitEndOrFinalEvaluation() {
  return AwaitEndOr(/*final_evaluation=*/true);
}

absl::Status WorkerSession::AwaitEnd() {
  return AwaitEndOr(/*final_evaluation=*/false).status();
}

absl::StatusOr<bool> WorkerSession::AwaitEndOr(bool final_evaluation) {
  while (Interrupted() == Interrupt::kNone) {
    if (CoordinatorSilence() > coordinator_timeout_)
      return absl::UnavailableError(absl::StrCat(
          "finished, but no word from the coordinator for ",
          absl::FormatDuration(coordinator_timeout_), "; giving up"));
    if (final_evaluation && asked_for_final_evaluation()) return true;
    SleepUnlessShutdown(absl::Milliseconds(20));
  }
  return false;
}

}  // namespace grps
