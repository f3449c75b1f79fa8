#include "coordinator/job_state_machine.h"

#include <algorithm>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "checkpoint/checkpoint.h"
#include "coordinator/recovery.h"
#include "coordinator/take_over.h"
#include "job/job_config.h"
#include "spdlog/spdlog.h"

namespace grps {

namespace {

// How long the final watch snapshot waits for the servers' final reports.
constexpr absl::Duration kFinalReportWait = absl::Seconds(3);

std::string MiB(uint64_t bytes) {
  return absl::StrFormat("%.1f MiB", static_cast<double>(bytes) / (1 << 20));
}

}  // namespace

JobStateMachine::JobStateMachine(v1::JobConfig config, v1::ShardMap shard_map, Clock clock,
                                 Options options)
    : config_(std::move(config)),
      clock_(std::move(clock)),
      env_(options.env != nullptr ? options.env : Env::Default()),
      state_file_(env_, std::move(options.state_path)),
      reconnect_backoff_(options.reconnect_backoff),
      phase_(config_.job_id()),
      membership_(std::move(shard_map), JobRanks(config_),
                  absl::Milliseconds(config_.heartbeat_timeout_ms()), config_.num_workers()),
      checkpoints_(config_, config_.num_servers()),
      model_(config_),
      generations_(config_, env_),
      resharding_(config_),
      cuts_(config_, &checkpoints_, &membership_, &global_step_),
      ending_(config_.job_id(), &membership_),
      report_({.config = &config_,
               .phase = &phase_,
               .membership = &membership_,
               .model = &model_,
               .ending = &ending_,
               .checkpoints = &checkpoints_,
               .generations = &generations_,
               .global_step = &global_step_,
               .data = &data_,
               .resharding = &resharding_}),
      roll_backs_({.job_id = config_.job_id(),
                   .generations = &generations_,
                   .checkpoints = &checkpoints_,
                   .membership = &membership_,
                   .data = &data_,
                   .ending = &ending_,
                   .cuts = &cuts_,
                   .global_step = &global_step_}),
      heartbeats_({.config = &config_,
                   .phase = &phase_,
                   .membership = &membership_,
                   .generations = &generations_,
                   .checkpoints = &checkpoints_,
                   .ending = &ending_,
                   .data = &data_,
                   .global_step = &global_step_,
                   .resharding = &resharding_}),
      servers_({.config = &config_,
                .clock = clock_,
                .phase = &phase_,
                .membership = &membership_,
                .generations = &generations_,
                .model = &model_,
                .resharding = &resharding_,
                .waits = &waits_}),
      workers_({.config = &config_,
                .clock = clock_,
                .phase = &phase_,
                .membership = &membership_,
                .generations = &generations_,
                .model = &model_,
                .data = &data_,
                .ending = &ending_,
                .waits = &waits_}) {
  // Real time, not clock_: tests run coordinators one after another on a
  // fake clock.
  checkpoints_.set_coordinator_incarnation(
      static_cast<uint64_t>(std::max<int64_t>(1, absl::ToUnixNanos(absl::Now()))));
}

void JobStateMachine::ResumeFrom(const v1::CheckpointManifest& manifest, const std::string& dir) {
  const absl::Time now = clock_();
  absl::MutexLock lock(&mu_);
  // A user model is the checkpoint's (its chunks were checked against it).
  if (absl::Status s = AdoptModelLocked(manifest.config()); !s.ok())
    spdlog::error("checkpoint {}: {}", manifest.id(), std::string(s.message()));
  generations_.ResumeFrom(manifest, dir);
  checkpoints_.SetNewestComplete(manifest, dir, 0);
  if (IsElastic(config_)) data_.ResumeFrom(manifest);
  const v1::RestoreOrder& order = generations_.order();
  membership_.ResetResumeSteps({order.worker_steps().begin(), order.worker_steps().end()}, now);
}

v1::JobConfig JobStateMachine::JobConfig() const {
  absl::MutexLock lock(&mu_);
  return report_.MemberConfig();
}

std::vector<uint32_t> JobStateMachine::LiveWorkerRanks() const {
  absl::MutexLock lock(&mu_);
  return membership_.live_workers().ranks;
}

absl::StatusOr<bool> JobStateMachine::DefineModel(const TensorSpecs& tensors,
                                                  v1::OptimizerKind optimizer) {
  absl::MutexLock lock(&mu_);
  if (phase_.ended()) return phase_.EndedError();
  return DefineModelLocked(tensors, optimizer);
}

absl::StatusOr<bool> JobStateMachine::DefineModelLocked(const TensorSpecs& tensors,
                                                        v1::OptimizerKind optimizer) {
  absl::StatusOr<std::optional<v1::ShardMap>> layout =
      model_.Define(tensors, optimizer, membership_.num_shards());
  if (!layout.ok()) return layout.status();
  if (!layout->has_value()) return false;
  membership_.SetLayout(**layout);
  waits_.Changed();
  return true;
}

absl::Status JobStateMachine::AdoptModelLocked(const v1::JobConfig& persisted) {
  if (config_.model() != v1::MODEL_USER || persisted.model_tensors().empty())
    return absl::OkStatus();
  return DefineModelLocked(persisted.model_tensors(), persisted.optimizer().kind()).status();
}

void JobStateMachine::SetNextCheckpointId(uint64_t id) {
  absl::MutexLock lock(&mu_);
  checkpoints_.SetNextId(id);
}

void JobStateMachine::AddCheckpointWarning(std::string warning) {
  absl::MutexLock lock(&mu_);
  checkpoints_.AddWarning(std::move(warning));
}

absl::Status JobStateMachine::TakeOver(const v1::CoordinatorState& state, absl::string_view from) {
  const absl::Time now = clock_();
  if (absl::Status s = CheckTakeOver(state, config_.job_id(), from); !s.ok()) return s;
  const std::optional<v1::CheckpointManifest> newest = NewestCheckpoint(env_, state, from);
  absl::MutexLock lock(&mu_);
  if (absl::Status s = AdoptModelLocked(state.config()); !s.ok())
    return absl::InvalidArgumentError(absl::StrCat(from, ": ", s.message()));
  absl::StatusOr<ExampleLedger> ledger = ElasticData::Read(state);
  if (!ledger.ok())
    return absl::InvalidArgumentError(absl::StrCat(from, ": ", ledger.status().message()));
  if (absl::Status s = AdoptShardCount(state, config_, &membership_, &checkpoints_, now); !s.ok())
    return absl::InvalidArgumentError(absl::StrCat(from, ": ", s.message()));
  if (absl::Status s = membership_.ImportFrom(state, now); !s.ok())
    return absl::InvalidArgumentError(absl::StrCat(from, ": ", s.message()));
  data_.TakeOver(*std::move(ledger), membership_.live_workers().ranks);
  // Members reconnect within reconnect_backoff_ of our return, then
  // heartbeat: nobody is silent before that.
  phase_.TakeOver(state, now,
                  absl::Milliseconds(config_.heartbeat_timeout_ms()) + reconnect_backoff_ +
                      absl::Milliseconds(config_.heartbeat_interval_ms()));
  generations_.TakeOver(state);
  checkpoints_.TakeOver(state, newest);
  resharding_.TakeOver(state);
  global_step_.Restart(now);
  spdlog::info(
      "took over job {} at generation {} from {} ({}, {} checkpoints complete, "
      "next id {})",
      config_.job_id(), generations_.current(), std::string(from), JobStateName(phase_.state()),
      checkpoints_.completed(), checkpoints_.next_id());
  return absl::OkStatus();
}

v1::RestoreOrder JobStateMachine::restore_order() const {
  absl::MutexLock lock(&mu_);
  return generations_.order();
}

void JobStateMachine::EndLocked(v1::JobState state, std::string message, absl::Time now) {
  phase_.End(state, std::move(message), now);
  spdlog::info("job {} {}: {}", config_.job_id(), JobStateName(state), phase_.message());
  const v1::JobStatus ended = report_.Status(TrainingDoneLocked(), now);
  for (const std::string& warning : ended.warnings())
    spdlog::warn("job {}: {}", config_.job_id(), warning);
  waits_.Changed();
}

void JobStateMachine::UpdateStateLocked(absl::Time now) {
  if (phase_.ended()) return;
  if (phase_.waiting()) {
    if (!membership_.UnregisteredShards().empty() || !membership_.UnregisteredRanks().empty())
      return;
    phase_.Run();
    global_step_.Restart(now);
    spdlog::info("job {} running: {} servers and {} workers registered", config_.job_id(),
                 config_.num_servers(), config_.num_workers());
    waits_.Changed();
  }
  if (!TrainingDoneLocked()) {
    if (ending_.training_was_done()) roll_backs_.ForgetTrainingDone();
    return;
  }
  if (ending_.NoteTrainingDone())
    spdlog::info("job {}: training done ({}); waiting for the final evaluation{}", config_.job_id(),
                 ending_.TrainingDoneMessage(),
                 checkpoints_.enabled() ? " and the final checkpoint" : "");
  if (!cuts_.FinalSettled(CutJobLocked(), now)) return;
  if (std::optional<std::string> completed = ending_.Completion(now))
    EndLocked(v1::JOB_STATE_COMPLETED, *std::move(completed), now);
}

void JobStateMachine::WriteReadyManifest() {
  std::optional<v1::CheckpointManifest> manifest;
  {
    absl::MutexLock lock(&mu_);
    manifest =
        checkpoints_.TakeManifestToWrite(membership_.shard_map(), report_.MemberConfig(), clock_());
    if (manifest.has_value()) data_.CutInto(&*manifest);
  }
  if (!manifest.has_value()) return;
  const std::string dir = CheckpointFolder(config_.checkpoint_dir(), manifest->id());
  const absl::Status status = WriteManifest(env_, dir, *manifest);
  const absl::Time now = clock_();
  bool resharded = false;
  {
    absl::MutexLock lock(&mu_);
    checkpoints_.FinishWrite(manifest->id(), status, now);
    const v1::CheckpointSummary summary = checkpoints_.SummaryOf(manifest->id());
    if (summary.state() == v1::CHECKPOINT_STATE_COMPLETE) {
      spdlog::info("checkpoint {} complete at step {}: {} shards, {}, {:.2f} s", summary.id(),
                   summary.step(), manifest->shards_size(), MiB(summary.bytes()),
                   summary.seconds());
      resharded = PublishReshardLocked(*manifest, dir, now);
    } else {
      spdlog::warn("checkpoint {} failed: {}", summary.id(), summary.error());
      TickReshardLocked(now);
    }
    UpdateStateLocked(now);
    waits_.Changed();
  }
  // The new map goes to disk at once: a coordinator that takes over must
  // not hand out the old one to members that follow the new.
  if (resharded) {
    if (absl::Status s = PersistState(/*force=*/true); !s.ok())
      spdlog::warn("state file: {}", std::string(s.message()));
  }
}

// ---- Re-sharding (Resharding: the target, the standbys, the cut) ----

absl::StatusOr<v1::ReshardProgress> JobStateMachine::ScaleServers(uint32_t num_servers) {
  const absl::Time now = clock_();
  absl::MutexLock lock(&mu_);
  if (absl::Status s = resharding_.CheckTarget(num_servers); !s.ok()) return s;
  if (!phase_.running() || TrainingDoneLocked())
    return absl::FailedPreconditionError(
        absl::StrCat("job ", config_.job_id(), " is ",
                     TrainingDoneLocked() ? "done training" : JobStateName(phase_.state()),
                     "; only a training job re-shards"));
  resharding_.Ask(num_servers, membership_.num_shards());
  TickReshardLocked(now);
  waits_.Changed();
  return resharding_.Progress();
}

void JobStateMachine::TickReshardLocked(absl::Time now) {
  resharding_.Tick(
      {membership_.num_shards(), phase_.ended(), phase_.running() && !TrainingDoneLocked()},
      checkpoints_,
      [this, now](const std::string& why)
          ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return cuts_.Start(CutJobLocked(), now, why); },
      now);
}

bool JobStateMachine::PublishReshardLocked(const v1::CheckpointManifest& manifest,
                                           const std::string& dir, absl::Time now) {
  const Resharding::Publication move =
      resharding_.Publish(manifest, config_.chunk_bytes(), &membership_, &checkpoints_, now);
  if (move.wait_again) TickReshardLocked(now);
  if (!move.moved) return false;
  roll_backs_.To(generations_.OrderFor(manifest, dir),
                 absl::StrCat("re-sharded from ", move.from, " to ", move.to,
                              " shards (shard map epoch ", membership_.shard_map().epoch(), ")"),
                 now);
  waits_.Changed();
  return true;
}

void JobStateMachine::NoteGlobalStepLocked(absl::Time now) {
  const std::vector<uint64_t> versions = membership_.LiveShardVersions();
  if (versions.empty()) return;
  const auto [lowest, highest] = std::minmax_element(versions.begin(), versions.end());
  global_step_.Note(*lowest, *highest, now);
}

void JobStateMachine::CheckRecoveryLocked(absl::Time now) {
  if (std::optional<std::string> failed = RecoveryFailure(membership_, config_, &phase_, now))
    EndLocked(v1::JOB_STATE_FAILED, *std::move(failed), now);
}

bool JobStateMachine::TrainingDoneLocked() const { return phase_.TrainingDone(membership_); }

absl::StatusOr<JobStateMachine::ServerRegistration> JobStateMachine::RegisterServer(
    const v1::RegisterServerRequest& request) {
  return RegisterServer(request, Wait());
}

absl::StatusOr<JobStateMachine::ServerRegistration> JobStateMachine::RegisterServer(
    const v1::RegisterServerRequest& request, const Wait& wait) {
  const absl::Time now = clock_();
  absl::MutexLock lock(&mu_);
  absl::StatusOr<ServerRequests::Registered> reg =
      servers_.Register(&mu_, request, wait, now, [this] {
        mu_.AssertHeld();
        TickReshardLocked(clock_());
      });
  if (!reg.ok()) return reg.status();
  if (reg->roll_back.has_value()) roll_backs_.Back(*reg->roll_back, now);
  UpdateStateLocked(now);
  waits_.Changed();
  ServerRegistration answer = servers_.Answer(reg->shard, reg->incarnation);
  answer.rolled_back = reg->roll_back.has_value();
  return answer;
}

absl::StatusOr<v1::HeartbeatResponse> JobStateMachine::Heartbeat(
    const v1::HeartbeatRequest& request) {
  if (request.member_case() == v1::HeartbeatRequest::MEMBER_NOT_SET)
    return absl::InvalidArgumentError("heartbeat must name a worker_rank or a server_shard");
  const absl::Time now = clock_();
  absl::MutexLock lock(&mu_);
  if (std::optional<v1::HeartbeatResponse> retired = heartbeats_.RetiredReply(request))
    return *std::move(retired);
  if (request.restoring()) return RestoringHeartbeatLocked(request, now);
  // A member that has not followed the newest restore order yet: its
  // progress belongs to a state the job left.
  // (0: a client that does not say; taken as current.)
  bool current_generation = !generations_.IsOlder(request.generation());
  if (absl::Status s = RecordHeartbeatLocked(request, current_generation, now); !s.ok()) return s;
  if (request.generation() > generations_.current() && !phase_.ended()) {
    // A member this coordinator knows from an older state file runs in a
    // newer generation: every member rolls back past it (this one too).
    roll_backs_.Follow(request.generation(), now);
    current_generation = false;
  }
  v1::HeartbeatResponse response;
  if (request.member_case() == v1::HeartbeatRequest::kServerShard) {
    current_generation = ServerHeartbeatLocked(request, current_generation, now, &response);
  } else {
    heartbeats_.WorkerReport(request, current_generation, now);
  }
  UpdateStateLocked(now);
  heartbeats_.Reply(request,
                    {.training_done = TrainingDoneLocked(),
                     .current_generation = current_generation,
                     .sync_version =
                         [this] {
                           mu_.AssertHeld();
                           return cuts_.SyncVersion(CutJobLocked());
                         }},
                    now, &response);
  if (phase_.ended()) waits_.Changed();  // a member heard the end
  return response;
}

absl::StatusOr<v1::HeartbeatResponse> JobStateMachine::RestoringHeartbeatLocked(
    const v1::HeartbeatRequest& request, absl::Time now) {
  if (request.member_case() != v1::HeartbeatRequest::kServerShard)
    return absl::InvalidArgumentError("only a server restores");
  bool revived = false;
  if (absl::Status s =
          membership_.ServerAlive(request.server_shard(), request.incarnation(), now, &revived);
      !s.ok())
    return s;
  if (revived)
    spdlog::info("server of shard {} is alive again (restoring)", request.server_shard());
  UpdateStateLocked(now);
  if (revived) waits_.Changed();
  v1::HeartbeatResponse response;
  response.set_job_state(phase_.state());
  response.set_generation(generations_.current());
  return response;
}

absl::Status JobStateMachine::RecordHeartbeatLocked(const v1::HeartbeatRequest& request,
                                                    bool current_generation, absl::Time now) {
  const absl::Status s = heartbeats_.Record(request, current_generation, now);
  // A member this coordinator never registered (it restarted), or a newer
  // incarnation of one it knows: take it in, follow its generation, then
  // record the heartbeat.
  if (!Heartbeats::Adoptable(request, s)) return s;
  if (absl::Status adopted = heartbeats_.Adopt(request, now); !adopted.ok())
    return absl::IsNotFound(s) ? adopted : s;
  roll_backs_.Follow(request.generation(), now);
  UpdateStateLocked(now);
  waits_.Changed();
  return heartbeats_.Record(request, current_generation, now);
}

bool JobStateMachine::ServerHeartbeatLocked(const v1::HeartbeatRequest& request,
                                            bool current_generation, absl::Time now,
                                            v1::HeartbeatResponse* response) {
  const uint32_t shard = request.server_shard();
  if (TrainingDoneLocked()) ending_.NoteServerHeartbeat(shard);
  if (request.shard().has_restore_failed() &&
      generations_.Refuse(shard, request.shard().restore_failed())) {
    roll_backs_.Back(absl::StrCat("shard ", shard, " cannot restore checkpoint ",
                                  request.shard().restore_failed().id()),
                     now);
    current_generation = false;
  }
  NoteGlobalStepLocked(now);
  if (!current_generation) return false;
  if (heartbeats_.ServerReport(request, now, response)) waits_.Changed();  // a checkpoint failed
  return true;
}

// ---- A worker's requests (WorkerRequests) ----

absl::StatusOr<v1::RegisterWorkerResponse> JobStateMachine::RegisterWorker(
    const v1::RegisterWorkerRequest& request, const Wait& wait,
    const std::function<bool(uint64_t incarnation)>& proves) {
  absl::MutexLock lock(&mu_);
  absl::StatusOr<v1::RegisterWorkerResponse> response =
      workers_.Register(&mu_, request, wait, proves);
  if (response.ok()) {
    UpdateStateLocked(clock_());
    waits_.Changed();
  }
  return response;
}

absl::Status JobStateMachine::WorkerDone(const v1::WorkerDoneRequest& request) {
  const absl::Time now = clock_();
  absl::MutexLock lock(&mu_);
  const absl::Status done = workers_.Done(request, now);
  UpdateStateLocked(now);
  waits_.Changed();
  return done;
}

absl::StatusOr<v1::LeaseExamplesResponse> JobStateMachine::LeaseExamples(
    const v1::LeaseExamplesRequest& request) {
  absl::MutexLock lock(&mu_);
  return workers_.Lease(request);
}

absl::Status JobStateMachine::DrainWorker(uint32_t rank) {
  absl::MutexLock lock(&mu_);
  return workers_.Drain(rank);
}

int JobStateMachine::waiting_registrations() const {
  absl::MutexLock lock(&mu_);
  return workers_.waiting();
}

v1::ShardMap JobStateMachine::shard_map() const {
  absl::MutexLock lock(&mu_);
  return membership_.shard_map();
}

absl::StatusOr<v1::JobStatus> JobStateMachine::WatchSnapshot(const Wait& wait) {
  absl::MutexLock lock(&mu_);
  if (waits_.released()) return absl::UnavailableError("coordinator is shutting down");
  if (!phase_.ended()) return report_.Status(TrainingDoneLocked(), clock_());
  // The last snapshot carries every live server's final report, so a
  // watcher sees the job's true final figures (bounded wait).
  waits_
      .UntilDone(
          &mu_, {.deadline = absl::Now() + kFinalReportWait, .cancelled = wait.cancelled},
          [&]()
              ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return EveryLiveMemberSawEndLocked(clock_()); },
          [] { return absl::OkStatus(); })
      .IgnoreError();  // the status as it is, whatever ended the wait
  return report_.Status(TrainingDoneLocked(), clock_());
}

absl::Status JobStateMachine::WaitForNextSnapshot(const Wait& wait) {
  absl::MutexLock lock(&mu_);
  return waits_.UntilDone(
      &mu_, wait,
      [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return phase_.ended() || waits_.released(); },
      [] { return absl::OkStatus(); });
}

absl::Status JobStateMachine::StopJob(absl::string_view reason) {
  const absl::Time now = clock_();
  absl::MutexLock lock(&mu_);
  if (phase_.state() == v1::JOB_STATE_STOPPED) return absl::OkStatus();
  if (phase_.ended())
    return absl::FailedPreconditionError(
        absl::StrCat("job ", config_.job_id(), " already ", JobStateName(phase_.state())));
  EndLocked(v1::JOB_STATE_STOPPED, std::string(reason), now);
  return absl::OkStatus();
}

absl::StatusOr<v1::CheckpointSummary> JobStateMachine::CheckpointJob(bool wait_for_it,
                                                                     const Wait& wait) {
  if (!checkpoints_enabled())
    return absl::FailedPreconditionError(
        absl::StrCat("job ", config_.job_id(),
                     " has no checkpoint_dir (start the coordinator with --checkpoint_dir)"));
  const absl::Time now = clock_();
  absl::MutexLock lock(&mu_);
  if (!phase_.running())
    return absl::FailedPreconditionError(absl::StrCat(
        "job ", config_.job_id(), " is ", JobStateName(phase_.state()), ", not running"));
  absl::StatusOr<uint64_t> joined = cuts_.Join(CutJobLocked(), now, "asked for by an operator");
  if (!joined.ok()) return joined.status();
  const uint64_t id = *joined;
  waits_.Changed();
  if (!wait_for_it) return checkpoints_.SummaryOf(id);
  if (absl::Status s = waits_.UntilDone(
          &mu_, wait,
          [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
            return checkpoints_.SummaryOf(id).state() != v1::CHECKPOINT_STATE_PENDING;
          },
          [&] {
            return absl::DeadlineExceededError(
                absl::StrCat("checkpoint ", id, " is still pending"));
          });
      !s.ok())
    return s;
  return checkpoints_.SummaryOf(id);
}

void JobStateMachine::DetectFailures() {
  const absl::Time now = clock_();
  absl::MutexLock lock(&mu_);
  Membership::Failures failures;
  if (phase_.MayDeclareDeaths(now)) failures = membership_.DetectFailures(now);
  for (uint32_t shard : failures.shards)
    spdlog::warn("server of shard {} missed its heartbeats for {} ms: dead", shard,
                 config_.heartbeat_timeout_ms());
  for (uint32_t rank : failures.ranks) {
    spdlog::warn("worker {} missed its heartbeats for {} ms: dead; membership epoch {}", rank,
                 config_.heartbeat_timeout_ms(), membership_.membership_epoch());
    data_.ReturnLeases(rank);
  }
  data_.ReleaseLimbo(membership_.live_workers().ranks, phase_.MayDeclareDeaths(now));
  // Also when nothing died: a finished worker's silence is judged here.
  UpdateStateLocked(now);
  CheckRecoveryLocked(now);
  cuts_.Tick(CutJobLocked(), phase_.running() && !TrainingDoneLocked(), now);
  TickReshardLocked(now);
  waits_.Changed();  // a checkpoint asked for, failed, or a member dead
}

CheckpointCuts::Job JobStateMachine::CutJobLocked() const {
  const bool done = TrainingDoneLocked();
  return {.training_done = done,
          .taken_over = phase_.taken_over(),
          .versions_final = done && ending_.ServersHeardFinalLiveSet()};
}

void JobStateMachine::Stop(absl::string_view reason) {
  const absl::Time now = clock_();
  absl::MutexLock lock(&mu_);
  if (phase_.ended()) return;
  EndLocked(v1::JOB_STATE_STOPPED, std::string(reason), now);
}

v1::JobState JobStateMachine::state() const {
  absl::MutexLock lock(&mu_);
  return phase_.state();
}

v1::JobStatus JobStateMachine::Status() const {
  const absl::Time now = clock_();
  absl::MutexLock lock(&mu_);
  return report_.Status(TrainingDoneLocked(), now);
}

bool JobStateMachine::WaitForEnd(absl::Duration timeout) const {
  const absl::Time deadline = absl::Now() + timeout;
  absl::MutexLock lock(&mu_);
  while (!phase_.ended()) {
    if (waits_.Sleep(&mu_, deadline)) break;  // timed out
  }
  return phase_.ended();
}

bool JobStateMachine::EveryLiveMemberSawEnd() const {
  absl::MutexLock lock(&mu_);
  return EveryLiveMemberSawEndLocked(clock_()) && !workers_.ranks_awaited();
}

bool JobStateMachine::EveryLiveMemberSawEndLocked(absl::Time now) const {
  return phase_.ended() && ending_.EveryLiveMemberSawEnd(now);
}

v1::CoordinatorState JobStateMachine::ExportState() const {
  const absl::Time now = clock_();
  absl::MutexLock lock(&mu_);
  return report_.State(TrainingDoneLocked(), now);
}

absl::Status JobStateMachine::PersistState(bool force) {
  return state_file_.Write([this] { return ExportState(); }, clock_(), force);
}

void JobStateMachine::ReleaseWaiters() {
  absl::MutexLock lock(&mu_);
  waits_.Release();
}

}  // namespace grps
