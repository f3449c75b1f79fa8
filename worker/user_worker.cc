#include "worker/user_worker.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "daemon/daemon.h"
#include "daemon/security.h"
#include "job/job_config.h"
#include "member/member_agent.h"
#include "spdlog/spdlog.h"
#include "tensor/dtype.h"
#include "wire/chunk_codec.h"
#include "worker/parameter_client.h"
#include "worker/sparse_client.h"
#include "worker/sparse_shards.h"

namespace grps {
namespace {

// The dense client, and the sparse one when the job has tables, of `map`
// for this rank and incarnation.
WorkerSession::Clients ClientsOf(const v1::JobConfig& config, const v1::ShardMap& map,
                                 uint32_t rank, uint64_t incarnation) {
  WorkerSession::Clients clients;
  clients.dense = std::make_unique<ParameterClient>(config, map, rank, incarnation);
  if (config.sparse_tables_size() > 0)
    clients.sparse = std::make_unique<SparseClient>(config, map, rank, incarnation);
  return clients;
}

// DefineModel, retried as a registration is (member_agent.h), for at most
// `patience`. Whether this offer defined the job's model.
absl::StatusOr<bool> OfferModel(v1::Coordinator::Stub* stub, const std::string& job_id,
                                const TensorSpecs& model, v1::OptimizerKind optimizer,
                                absl::Duration patience) {
  v1::DefineModelRequest request;
  request.set_job_id(job_id);
  *request.mutable_tensors() = model;
  request.set_optimizer(optimizer);
  RegisterOptions options;
  options.patience = patience;
  options.retry_resource_exhausted = true;
  absl::StatusOr<v1::DefineModelResponse> response = DefineModel(stub, request, options);
  if (!response.ok()) return response.status();
  return response->defined();
}

absl::StatusOr<v1::RegisterWorkerResponse> RegisterAs(v1::Coordinator::Stub* stub,
                                                      const UserWorker::Options& options) {
  RegisterOptions patience;
  patience.patience = options.register_timeout;
  return RegisterWorker(
      stub, WorkerRegistration(options.job_id, options.rank, options.host, options.backend),
      patience);
}

}  // namespace

absl::StatusOr<std::unique_ptr<UserWorker>> UserWorker::Join(const Options& options,
                                                             const TensorSpecs& model) {
  if (absl::Status s = ValidateUserModel(model); !s.ok()) return s;
  auto stub = v1::Coordinator::NewStub(MakeChannel(options.coordinator));
  const std::string where = absl::StrCat("the coordinator at ", options.coordinator);
  absl::StatusOr<bool> defined =
      OfferModel(stub.get(), options.job_id, model, options.optimizer, options.register_timeout);
  if (!defined.ok())
    return absl::Status(defined.status().code(), absl::StrCat(where, " refused the model: ",
                                                              defined.status().message()));
  absl::StatusOr<v1::RegisterWorkerResponse> reg = RegisterAs(stub.get(), options);
  if (!reg.ok())
    return absl::Status(reg.status().code(), absl::StrCat("cannot register with ", where, ": ",
                                                          reg.status().message()));
  if (absl::Status s = CheckRegistration(*reg); !s.ok()) return s;
  if (reg->config().model() != v1::MODEL_USER)
    return absl::FailedPreconditionError(absl::StrCat(
        "job ", reg->config().job_id(), " trains a built-in model, not this one"));
  if (const std::string d = FirstModelDifference(reg->config().model_tensors(), model);
      !d.empty())
    return ModelMismatchError(reg->config().job_id(), d);
  SetMemberSecret(reg->member_secret());
  spdlog::info("registered as rank {} of {} (incarnation {}) of job {}{}", reg->rank(),
               reg->config().num_workers(), reg->incarnation(), reg->config().job_id(),
               reg->start_step() > 0 ? absl::StrCat("; resuming at step ", reg->start_step())
                                     : std::string());
  return std::unique_ptr<UserWorker>(new UserWorker(std::move(stub), *reg, options, *defined));
}

UserWorker::UserWorker(std::unique_ptr<v1::Coordinator::Stub> stub,
                       const v1::RegisterWorkerResponse& registration, const Options& options,
                       bool defined_model)
    : stub_(std::move(stub)), defined_model_(defined_model), step_(registration.start_step()) {
  WorkerSession::Clients clients =
      ClientsOf(registration.config(), registration.shard_map(), registration.rank(),
                registration.incarnation());
  WorkerSession::Options session_options;
  session_options.interrupted = options.interrupted;
  session_options.follow_replaced_maps = true;
  // A coordinator that took an elastic job over asks what this worker holds
  // and trained.
  session_options.on_claim_examples = [this] {
    if (ExampleLeases* leases = claims_to_.load(); leases != nullptr)
      if (absl::Status s = leases->Claim(); !s.ok())
        spdlog::warn("telling the coordinator what this worker holds: {}",
                     std::string(s.message()));
  };
  session_ = std::make_unique<WorkerSession>(stub_.get(), registration, std::move(clients.dense),
                                             std::move(clients.sparse),
                                             std::move(session_options));
  window_start_ = session_->Now();
  if (total_steps() > 0)
    session_->UpdateProgress([&](v1::WorkerProgress* p) { p->set_total_steps(total_steps()); });
  tensor_offset_.push_back(0);
  for (const v1::TensorSpec& t : registration.config().model_tensors()) {
    int64_t n = 1;
    for (int64_t d : t.shape()) n *= d;
    tensor_offset_.push_back(tensor_offset_.back() + n);
  }
}

UserWorker::~UserWorker() {
  AbandonStep();  // no call of a staged step outlives the worker (nor writes in its params)
  session_.reset();
}

void UserWorker::FollowReplacedMap(const v1::ShardMap& map) {
  // The clients replaced go now: Step's calls through them have returned.
  session_->ReplaceClients(map, ClientsOf(config(), map, rank(), session_->incarnation()));
  // Checked when they were set: the new client has the same tensors.
  (void)client().SetOptimizers(optimizers_, optimizer_by_tensor_);
}

absl::Status UserWorker::SetOptimizers(std::vector<v1::OptimizerConfig> optimizers,
                                       std::vector<uint32_t> by_tensor) {
  for (size_t i = 0; i < optimizers.size(); ++i)
    if (absl::Status s = CheckProgramOptimizer(config().optimizer(), optimizers[i]); !s.ok())
      return absl::InvalidArgumentError(absl::StrCat("param group ", i, ": ", s.message()));
  if (absl::Status s = client().SetOptimizers(optimizers, by_tensor); !s.ok()) return s;
  optimizers_ = std::move(optimizers);
  optimizer_by_tensor_ = std::move(by_tensor);
  return absl::OkStatus();
}

absl::Status UserWorker::InterruptStatus(const absl::Status& cause) {
  switch (session_->Interrupted()) {
    case WorkerSession::Interrupt::kJobEnded:
      return JobEndedError(config().job_id(), session_->job_state());
    case WorkerSession::Interrupt::kJobFailed:
      return session_->JobFailed();
    case WorkerSession::Interrupt::kSignal:
      return absl::CancelledError("interrupted");
    case WorkerSession::Interrupt::kRollBack:
    case WorkerSession::Interrupt::kNone:
      break;
  }
  return cause;
}

absl::StatusOr<uint64_t> UserWorker::SetTotalSteps(uint64_t steps) {
  if (steps == 0) return absl::InvalidArgumentError("the job's steps must be at least 1");
  declared_total_ = steps;
  if (IsElastic(config()))
    spdlog::info("this program trains {} steps; the job is elastic: its example ledger says "
                 "when it ends", steps);
  else if (config().steps() > 0 && config().steps() != steps)
    spdlog::warn("this program trains {} steps, the job {} (--steps): the job's count holds",
                 steps, config().steps());
  const uint64_t total = total_steps();
  session_->UpdateProgress([&](v1::WorkerProgress* p) { p->set_total_steps(total); });
  return total;
}

bool UserWorker::PastTheEnd() const {
  return total_steps() > 0 && step_ >= total_steps();
}

absl::Status UserWorker::PastTheEndError(absl::string_view what) const {
  // IsJobEnded's form: the Python package raises grps.JobEnded.
  return absl::FailedPreconditionError(absl::StrCat(
      "job ", config().job_id(), " has ended (its ", total_steps(),
      " steps are done): rank ", rank(), " is at step ", step_, ", and ", what,
      " was not pushed (a program that loops while gt.step() < gt.total_steps() stops "
      "there: docs/pytorch.md)"));
}

absl::Status UserWorker::Begin(float* params, const float* initial) {
  params_ = params;
  if (initial != nullptr && rank() == 0) {
    initial_.assign(initial, initial + num_parameters());
    if (absl::Status s = GiveInitialValues(); !s.ok()) return InterruptStatus(s);
  }
  joining_ = config().mode() == v1::MODE_SYNC && step_ > 0;
  absl::Status s = joining_ ? session_->JoinTheOthers(&step_, params)
                            : session_->PullWeights(step_, params);
  if (!s.ok()) return InterruptStatus(s);
  session_->UpdateProgress([&](v1::WorkerProgress* p) { p->set_step(step_); });
  return absl::OkStatus();
}

absl::Status UserWorker::GiveInitialValues() {
  if (!initial_.empty()) {
    absl::Status s = client().GiveInitialValues(initial_.data(), session_->PushRetry());
    if (!s.ok())
      return absl::Status(s.code(), absl::StrCat("giving the initial values: ", s.message()));
  }
  if (!loaded_state_.has_value() || step_ > 0) return absl::OkStatus();
  absl::Status s = client().LoadOptimizerState(*loaded_state_, kStateCallTimeout);
  // Another rank's update came first (async): the job goes on from it.
  if (absl::IsFailedPrecondition(s)) {
    spdlog::warn("the saved optimizer state was not loaded again after the roll-back: {}",
                 std::string(s.message()));
    return absl::OkStatus();
  }
  return s;
}

absl::StatusOr<ParameterClient::OptimizerState> UserWorker::ReadOptimizerState() {
  return client().ReadOptimizerState(kStateCallTimeout);
}

absl::Status UserWorker::LoadOptimizerState(ParameterClient::OptimizerState state) {
  if (absl::Status s = client().LoadOptimizerState(state, kStateCallTimeout); !s.ok()) return s;
  loaded_state_ = std::move(state);
  return absl::OkStatus();
}

ParameterClient& UserWorker::client() {
  return static_cast<ParameterClient&>(session_->dense());
}

bool UserWorker::CanOverlap() const {
  return static_cast<const ParameterClient&>(session_->dense()).CanStage();
}

absl::Status UserWorker::CheckFinite(const float* grads, int64_t begin, int64_t end) const {
  const int64_t bad = FirstNonFinite(grads + begin, end - begin);
  if (bad < 0) return absl::OkStatus();
  const int64_t i = begin + bad;
  return absl::InvalidArgumentError(absl::StrCat(
      "element ", i, " of step ", step_, "'s gradient is ", grads[i],
      staged_.has_value() ? ": it was not pushed, the tensors whose gradients were final "
                            "before it were"
                          : ": nothing was pushed"));
}

absl::Status UserWorker::TensorReady(uint32_t t, const float* grads, float* params) {
  if (t + 1 >= tensor_offset_.size())
    return absl::InvalidArgumentError(absl::StrCat("the model has no tensor ", t));
  if (absl::Status s = CheckFinite(grads, tensor_offset_[t], tensor_offset_[t + 1]); !s.ok())
    return s;
  // A restarted rank joining the others in sync pushes whole steps at Step,
  // as grps-worker's does, until one is in time: it learns at each push
  // whether the others have moved on.
  // Nor one whose rows a roll-back replaced (PullRows): its gradients were
  // computed on weights of two steps, and this step is not pushed.
  if (joining_ || PastTheEnd() || rolled_back_in_rows_) return absl::OkStatus();
  if (!staged_.has_value())
    staged_ = client().StagePush(step_, grads, last_samples_, params, kPullSlice);
  return client().TensorReady(*staged_, t);
}

void UserWorker::AbandonStep() {
  if (!staged_.has_value()) return;
  client().Discard(*staged_);
  staged_.reset();
}

absl::StatusOr<UserWorker::StepOutcome> UserWorker::Step(const float* grads, uint32_t samples,
                                                         float* params) {
  if (std::exchange(rolled_back_in_rows_, false)) {
    AbandonStep();
    StepOutcome outcome;
    outcome.rolled_back = true;
    // The restore's weights went into the last Begin's or Step's params.
    const bool elsewhere = params != params_;
    params_ = params;
    if (elsewhere)
      if (absl::Status s = session_->PullWeights(step_, params); !s.ok()) return InterruptStatus(s);
    return outcome;
  }
  params_ = params;
  if (absl::Status s = CheckFinite(grads, 0, num_parameters()); !s.ok()) {
    AbandonStep();
    return s;
  }
  if (PastTheEnd()) {
    AbandonStep();
    return PastTheEndError("its gradient");
  }
  last_samples_ = std::max<uint32_t>(1, samples);
  std::optional<ParameterClient::Ticket> staged = std::exchange(staged_, std::nullopt);
  WorkerSession::StartedPush started;
  if (staged.has_value())
    started = [&](const ParameterShards::RetryPolicy& retry) {
      return client().Wait(*staged, retry);
    };
  StepOutcome outcome;
  absl::StatusOr<ParameterShards::PushOutcome> pushed =
      session_->PushGradients(step_, grads, last_samples_, params, started);
  absl::Status s = pushed.status();
  if (s.ok()) {
    outcome.late = pushed->late;
    outcome.too_stale = pushed->too_stale;
    if (leases_ != nullptr) leases_->Trained(step_);
    ++step_;
    // In time for its step: in lock-step with the others from now on.
    if (pushed->late == 0) joining_ = false;
    if (joining_) {
      s = session_->JoinTheOthers(&step_, params);
      // The blocks leased for the steps skipped are trained from here on.
      if (s.ok() && leases_ != nullptr) leases_->SkipTo(step_);
    } else {
      if (!pushed->pulled) s = session_->PullWeights(step_, params);
      if (s.ok() && session_->FollowTheWeights(&step_) && leases_ != nullptr)
        leases_->SkipTo(step_);
    }
  }
  s = TakeRollBacks(s, params, &outcome.rolled_back);
  if (!s.ok()) return InterruptStatus(s);
  samples_ += samples;
  window_samples_ += samples;
  const absl::Time now = session_->Now();
  const double seconds = absl::ToDoubleSeconds(now - window_start_);
  session_->UpdateProgress([&](v1::WorkerProgress* p) {
    p->set_step(step_);
    p->set_samples(samples_);
    if (seconds >= 1) p->set_samples_per_sec(static_cast<float>(window_samples_ / seconds));
  });
  if (seconds >= 1) {
    window_start_ = now;
    window_samples_ = 0;
  }
  return outcome;
}

absl::Status UserWorker::TakeRollBacks(absl::Status s, float* params, bool* taken) {
  std::optional<v1::ShardMap> replaced_map;
  while (!s.ok() && session_->Interrupted() == WorkerSession::Interrupt::kRollBack &&
         session_->TakeRollBack(total_steps() > 0 ? total_steps()
                                                  : std::numeric_limits<uint64_t>::max(),
                                &step_, &replaced_map)) {
    *taken = true;
    // The coordinator took back this rank's leases and what it trained
    // after the restore's step.
    if (leases_ != nullptr) leases_->Reset();
    if (replaced_map.has_value()) FollowReplacedMap(*std::exchange(replaced_map, std::nullopt));
    s = GiveInitialValues();
    if (s.ok()) s = session_->PullWeights(step_, params);
  }
  return s;
}

absl::StatusOr<uint32_t> UserWorker::TableDim(const std::string& table) const {
  for (const v1::SparseTableSpec& t : config().sparse_tables())
    if (t.name() == table) return t.dim();
  return absl::InvalidArgumentError(absl::StrCat(
      "the job has no sparse table '", table, "' (grps-local --sparse_tables NAME:ROWS:DIM)"));
}

absl::Status UserWorker::PullRows(const std::string& table, absl::Span<const int64_t> ids,
                                  float* out) {
  if (absl::StatusOr<uint32_t> dim = TableDim(table); !dim.ok()) return dim.status();
  while (true) {
    // The sparse client of the map at hand (a roll-back may replace it).
    SparseShards* sparse = session_->sparse();
    const uint64_t clock = step_;
    SparseShards::PullProgress progress;  // an attempt reads what those before did not
    absl::Status s = session_->WaitToPull(
        "rows", clock, [&] { return sparse->Pull(table, ids, clock, kPullSlice, out, &progress); });
    if (s.ok()) return s;
    // Pushes a hook started (a program that reads rows after backward())
    // end before the roll-back's pull fills `params_`.
    if (session_->Interrupted() == WorkerSession::Interrupt::kRollBack) AbandonStep();
    bool taken = false;
    if (params_ != nullptr) s = TakeRollBacks(s, params_, &taken);
    if (!taken || !s.ok()) return InterruptStatus(s);
    // The rows again, as of the restore's step; this step is not pushed.
    spdlog::info("a roll-back ended step {}'s pull of table '{}' rows: that step is not "
                 "pushed, training goes on at step {}", clock, table, step_);
    rolled_back_in_rows_ = true;
  }
}

absl::Status UserWorker::PushRows(const std::string& table, absl::Span<const int64_t> ids,
                                  const float* grads) {
  absl::StatusOr<uint32_t> dim = TableDim(table);
  if (!dim.ok()) return dim.status();
  if (rolled_back_in_rows_) return absl::OkStatus();  // this step is not taken
  if (PastTheEnd()) return PastTheEndError(absl::StrCat("table '", table, "''s rows"));
  if (const int64_t bad = FirstNonFinite(grads, static_cast<int64_t>(ids.size() * *dim));
      bad >= 0)
    return absl::InvalidArgumentError(absl::StrCat("a gradient of table '", table, "' row ",
                                                   ids[bad / *dim],
                                                   " is not finite: nothing was pushed"));
  absl::StatusOr<SparseShards::PushOutcome> pushed = session_->PushRows(table, step_, ids, grads);
  if (!pushed.ok() && params_ != nullptr &&
      session_->Interrupted() == WorkerSession::Interrupt::kRollBack) {
    // The hooks' pushes first: their fused pulls write `params_`, which
    // the roll-back fills with the restore's weights next.
    AbandonStep();
    const uint64_t step = step_;
    bool taken = false;
    absl::Status s = TakeRollBacks(pushed.status(), params_, &taken);
    if (!taken || !s.ok()) return InterruptStatus(s);
    spdlog::info("a roll-back ended step {}'s push of table '{}' rows: that step is not "
                 "pushed, training goes on at step {}", step, table, step_);
    rolled_back_in_rows_ = true;
    return absl::OkStatus();
  }
  if (!pushed.ok()) return InterruptStatus(pushed.status());
  return absl::OkStatus();
}

void UserWorker::ReportLoss(float loss) {
  session_->UpdateProgress([&](v1::WorkerProgress* p) { p->set_loss(loss); });
}

absl::Status UserWorker::Done(const std::optional<Evaluation>& evaluation, bool declined) {
  if (leases_ != nullptr)
    if (absl::Status s = leases_->Flush(); !s.ok()) return InterruptStatus(s);
  v1::WorkerDoneRequest done;
  session_->UpdateProgress([&](v1::WorkerProgress* p) {
    p->set_total_steps(step_);
    if (evaluation.has_value()) {
      p->set_test_accuracy(evaluation->accuracy);
      p->set_test_loss(evaluation->loss);
      if (evaluation->auc >= 0) {
        p->set_test_auc(evaluation->auc);
      } else {
        p->clear_test_auc();
      }
    }
  });
  *done.mutable_progress() = session_->progress();
  if (evaluation.has_value()) {
    done.set_has_final_eval(true);
    done.set_final_test_accuracy(evaluation->accuracy);
    done.set_final_test_loss(evaluation->loss);
    if (evaluation->auc >= 0) done.set_final_test_auc(evaluation->auc);
  } else if (declined) {
    done.set_no_final_eval(true);
  }
  if (absl::Status s = session_->ReportDone(done); !s.ok()) return InterruptStatus(s);
  return absl::OkStatus();
}

absl::Status UserWorker::Leave() {
  AbandonStep();  // gradients a hook pushed for a step that is not taken
  if (leases_ != nullptr)
    if (absl::Status s = leases_->Flush(); !s.ok()) return InterruptStatus(s);
  return session_->Leave(step_);
}

absl::StatusOr<bool> UserWorker::AwaitEnd() {
  absl::StatusOr<bool> asked = session_->AwaitEndOrFinalEvaluation();
  if (!asked.ok()) return asked;
  if (*asked) return true;
  switch (session_->Interrupted()) {
    case WorkerSession::Interrupt::kJobFailed:
      return session_->JobFailed();
    case WorkerSession::Interrupt::kRollBack:
      return absl::AbortedError(
          "the job rolled back after this worker finished; its program has no steps left to "
          "train again (start it again for its rank)");
    default:
      return false;
  }
}

absl::Status UserWorker::PullFinal(float* params) {
  if (absl::Status s = session_->PullWeights(step_, params); !s.ok()) return InterruptStatus(s);
  return absl::OkStatus();
}

absl::StatusOr<UserWorker::Block> UserWorker::LeaseBlock(uint64_t train_examples,
                                                         uint64_t step) {
  if (!IsElastic(config()))
    return absl::FailedPreconditionError(absl::StrCat(
        "job ", config().job_id(), " is not elastic (--max_workers): its workers' data is "
        "split by rank"));
  const uint64_t block = StepExamples(config());
  if (train_examples < block)
    return absl::InvalidArgumentError(absl::StrCat(
        "the training set has ", train_examples, " examples, fewer than one step's ", block,
        " (the job's --batch)"));
  if (leases_ == nullptr) {
    leases_ = std::make_unique<ExampleLeases>(
        [this](v1::LeaseExamplesRequest r) { return session_->LeaseExamples(std::move(r)); },
        train_examples, block, config().seed());
    lease_examples_ = train_examples;
    claims_to_.store(leases_.get());
    // The steps a worker of the fixed job would train: the heartbeats' estimate.
    const uint64_t estimate = TotalSteps(config(), train_examples);
    session_->UpdateProgress([&](v1::WorkerProgress* p) { p->set_total_steps(estimate); });
    spdlog::info("rank {} trains from step {} blocks of {} examples leased from the "
                 "coordinator's example ledger ({} per epoch)", rank(), step, block,
                 ExampleLedgerShape(config(), train_examples).blocks_per_epoch);
  } else if (train_examples != lease_examples_) {
    return absl::InvalidArgumentError(absl::StrCat(
        "a training set of ", train_examples, " examples; this worker leased from one of ",
        lease_examples_, " before"));
  }
  absl::StatusOr<uint64_t> leased = leases_->BlockFor(step);
  if (!leased.ok())
    return absl::IsOutOfRange(leased.status()) ? leased.status()
                                               : InterruptStatus(leased.status());
  Block out;
  const absl::Span<const int64_t> examples = leases_->Examples(*leased);
  out.examples.assign(examples.begin(), examples.end());
  out.epoch = leases_->EpochOf(*leased);
  return out;
}

absl::StatusOr<std::vector<std::pair<uint32_t, std::string>>> UserWorker::Collective(
    const std::string& name, std::string payload, absl::Duration timeout) {
  absl::StatusOr<v1::CollectiveResponse> round =
      session_->Collective(name, std::move(payload), timeout);
  if (!round.ok()) return InterruptStatus(round.status());
  if (round->ranks_size() != round->payloads_size())
    return absl::InternalError("collective: the coordinator's reply pairs no rank with each "
                               "payload");
  std::vector<std::pair<uint32_t, std::string>> all;
  for (int i = 0; i < round->ranks_size(); ++i)
    all.emplace_back(round->ranks(i), std::move(*round->mutable_payloads(i)));
  return all;
}

}  // namespace grps
