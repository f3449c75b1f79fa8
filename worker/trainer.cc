#include "worker/trainer.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "daemon/daemon.h"
#include "data/batch_iterator.h"
#include "data/epoch_shuffler.h"
#include "data/partition.h"
#include "job/job_config.h"
#include "spdlog/spdlog.h"

namespace grps {

namespace {

// After WorkerDone, how long a worker keeps trying to hear the job's end
// from a coordinator that does not answer.
constexpr absl::Duration kCoordinatorPatience = absl::Seconds(60);

absl::StatusOr<Dataset> LoadSplit(const v1::JobConfig& config, DatasetSplit split,
                                  uint64_t limit) {
  absl::StatusOr<Dataset> data = LoadIdxDirectory(
      config.dataset().path(), split, static_cast<int32_t>(config.num_classes()));
  if (!data.ok()) return data.status();
  if (data->num_features() != config.input_features())
    return absl::InvalidArgumentError(absl::StrCat(
        "dataset has ", data->num_features(), " features per example, the job's model ",
        config.input_features()));
  if (limit > 0 && static_cast<int64_t>(limit) < data->num_examples())
    return data->Subset(0, limit);
  return data;
}

bool Ended(v1::JobState state) {
  return state == v1::JOB_STATE_COMPLETED || state == v1::JOB_STATE_STOPPED ||
         state == v1::JOB_STATE_FAILED;
}

}  // namespace

Trainer::Trainer(v1::Coordinator::Stub* coordinator,
                 const v1::RegisterWorkerResponse& registration,
                 Backend* backend, TrainerOptions options)
    : coordinator_(coordinator),
      config_(registration.config()),
      rank_(registration.rank()),
      incarnation_(registration.incarnation()),
      start_step_(registration.start_step()),
      backend_(backend),
      options_(std::move(options)),
      model_(backend, LayerWidths(config_), static_cast<int>(config_.batch_size())),
      params_(config_, registration.shard_map(), rank_, incarnation_) {
  host_params_.resize(params_.num_parameters());
  host_grads_.resize(params_.num_parameters());
  progress_.set_test_accuracy(-1);
  progress_.set_test_loss(-1);
  progress_.set_step(start_step_);
  if (!options_.curve_csv.empty()) {
    absl::MutexLock lock(&curve_mu_);
    curve_ = std::fopen(options_.curve_csv.c_str(), "w");
    if (curve_ != nullptr)
      std::fprintf(curve_,
                   "step,epoch,elapsed_s,unix_time,loss,samples_per_sec,"
                   "test_accuracy,test_loss,evaluated\n");
    else
      spdlog::warn("cannot write curve to {}", options_.curve_csv);
  }
  heartbeat_ = std::thread([this] { HeartbeatLoop(); });
}

Trainer::~Trainer() {
  evaluator_.reset();  // its callback uses the members below
  stop_heartbeat_ = true;
  if (heartbeat_.joinable()) heartbeat_.join();
  absl::MutexLock lock(&curve_mu_);
  if (curve_ != nullptr) std::fclose(curve_);
}

bool Trainer::Stopping() const {
  if (ShutdownRequested()) return true;
  absl::MutexLock lock(&mu_);
  return job_state_ == v1::JOB_STATE_STOPPED || job_state_ == v1::JOB_STATE_FAILED;
}

bool Trainer::IsEvaluator() const {
  absl::MutexLock lock(&mu_);
  return evaluator_rank_.has_value() && *evaluator_rank_ == rank_;
}

void Trainer::HeartbeatLoop() {
  const absl::Duration interval = absl::Milliseconds(config_.heartbeat_interval_ms());
  while (!stop_heartbeat_) {
    v1::HeartbeatRequest req;
    req.set_job_id(config_.job_id());
    req.set_worker_rank(rank_);
    req.set_incarnation(incarnation_);
    {
      absl::MutexLock lock(&mu_);
      *req.mutable_progress() = progress_;
    }
    grpc::ClientContext ctx;
    ctx.set_deadline(absl::ToChronoTime(absl::Now() + interval * 4));
    v1::HeartbeatResponse resp;
    grpc::Status st = coordinator_->Heartbeat(&ctx, req, &resp);
    if (st.ok()) {
      absl::MutexLock lock(&mu_);
      job_state_ = resp.job_state();
      evaluator_rank_.reset();
      if (resp.has_evaluator_rank()) evaluator_rank_ = resp.evaluator_rank();
      evaluate_final_ = resp.evaluate_final();
      last_heartbeat_ok_ = absl::Now();
    } else if (st.error_code() != grpc::StatusCode::UNAVAILABLE &&
               st.error_code() != grpc::StatusCode::DEADLINE_EXCEEDED) {
      // Training goes on without a coordinator; only log what is unexpected.
      spdlog::warn("heartbeat: {}", st.error_message());
    }
    for (absl::Duration slept; slept < interval && !stop_heartbeat_;
         slept += absl::Milliseconds(20))
      absl::SleepFor(absl::Milliseconds(20));
  }
}

absl::Status Trainer::PullWeights(uint64_t clock) {
  // A pull may wait for other workers (sync, ssp); keep waiting, in slices
  // so that a stop is noticed, as long as the job runs.
  while (true) {
    absl::Status s = params_.Pull(clock, absl::Seconds(5), host_params_.data());
    if (s.ok()) {
      model_.SetParameters(host_params_.data());
      return s;
    }
    if (Stopping()) return absl::CancelledError("job stopped");
    if (s.code() != absl::StatusCode::kDeadlineExceeded &&
        s.code() != absl::StatusCode::kUnavailable)
      return s;
    spdlog::info("waiting to read the weights of clock {}: {}", clock,
                 std::string(s.message()));
    absl::SleepFor(absl::Milliseconds(100));
  }
}

void Trainer::OnEvaluation(const Evaluator::Result& result, bool final_eval) {
  v1::WorkerProgress snapshot;
  {
    absl::MutexLock lock(&mu_);
    progress_.set_test_accuracy(static_cast<float>(result.eval.accuracy));
    progress_.set_test_loss(static_cast<float>(result.eval.loss));
    snapshot = progress_;
  }
  WriteCurveRow(result.step, snapshot, /*evaluated=*/true);
  spdlog::info("{}test accuracy {:.4f} loss {:.4f} at step {} ({} examples)",
               final_eval ? "final " : "", result.eval.accuracy, result.eval.loss,
               result.step, result.eval.examples);
}

void Trainer::WriteCurveRow(uint64_t step, const v1::WorkerProgress& p,
                            bool evaluated) {
  const absl::Time now = absl::Now();
  absl::MutexLock lock(&curve_mu_);
  if (curve_ == nullptr) return;
  std::fprintf(curve_, "%llu,%u,%.3f,%.3f,%.6f,%.1f,%.6f,%.6f,%d\n",
               static_cast<unsigned long long>(step), p.epoch(),
               absl::ToDoubleSeconds(now - start_), absl::ToDoubleSeconds(now - absl::UnixEpoch()),
               p.loss(), p.samples_per_sec(), p.test_accuracy(), p.test_loss(),
               evaluated ? 1 : 0);
  std::fflush(curve_);
}

absl::Status Trainer::LoadData() {
  absl::StatusOr<Dataset> train =
      LoadSplit(config_, DatasetSplit::kTrain, config_.dataset().train_limit());
  if (!train.ok()) return train.status();
  train_ = std::move(*train);
  // Any worker may become the evaluator (the lowest live rank does).
  absl::StatusOr<Dataset> test =
      LoadSplit(config_, DatasetSplit::kTest, config_.dataset().test_limit());
  if (!test.ok()) return test.status();
  test_ = std::move(*test);
  evaluator_ = std::make_unique<Evaluator>(
      LayerWidths(config_), &test_,
      [this](const Evaluator::Result& r) { OnEvaluation(r, false); });
  return absl::OkStatus();
}

absl::Status Trainer::Run() {
  if (absl::Status s = LoadData(); !s.ok()) return s;
  const uint64_t total = TotalSteps(config_, train_.num_examples());
  {
    absl::MutexLock lock(&mu_);
    progress_.set_total_steps(total);
  }
  if (absl::Status s = Train(total); !s.ok()) return Stopping() ? absl::OkStatus() : s;
  if (Stopping()) return absl::OkStatus();
  return FinishAndWait(total);
}

absl::Status Trainer::Train(uint64_t total) {
  const int64_t batch = config_.batch_size();
  absl::StatusOr<PartitionRange> part =
      PartitionForRank(train_.num_examples(), rank_, config_.num_workers());
  if (!part.ok()) return part.status();
  // Every worker runs the same number of steps per epoch, so sync steps line
  // up: floor(floor(N / workers) / batch).
  const uint64_t per_epoch = std::max<uint64_t>(
      1, train_.num_examples() / config_.num_workers() / batch);
  if (part->size() < batch)
    return absl::InvalidArgumentError(absl::StrCat(
        "worker ", rank_, "'s partition has ", part->size(),
        " examples, fewer than one batch of ", batch));
  EpochShuffler shuffler(config_.seed(), *part);
  std::vector<float> x(batch * train_.num_features());
  std::vector<int32_t> y(batch);
  spdlog::info("rank {} trains steps [{}, {}) ({} per epoch) on examples [{}, {}) with {}{}",
               rank_, start_step_, total, per_epoch, part->begin, part->end,
               backend_->Name(),
               options_.straggler.active()
                   ? absl::StrCat("; straggles: ", options_.straggler.Describe())
                   : std::string());

  absl::Time window_start = absl::Now();
  uint64_t window_samples = 0;
  double loss_ema = -1;
  int64_t epoch_loaded = -1;
  uint64_t late = 0, too_stale = 0;
  std::unique_ptr<BatchIterator> batches;
  for (uint64_t step = start_step_; step < total; ++step) {
    if (Stopping()) return absl::OkStatus();
    const absl::Time step_start = absl::Now();
    const int64_t epoch = step / per_epoch;
    if (epoch != epoch_loaded) {
      absl::StatusOr<BatchIterator> it =
          BatchIterator::Create(shuffler.Order(epoch), batch, LastBatch::kDrop);
      if (!it.ok()) return it.status();
      batches = std::make_unique<BatchIterator>(std::move(*it));
      epoch_loaded = epoch;
    }
    if (absl::Status s = PullWeights(step); !s.ok()) return s;
    // The evaluator evaluates the weights of this step on its own thread; a
    // busy evaluator skips rather than hold training up.
    if (config_.eval_every_steps() > 0 && step > start_step_ &&
        step % config_.eval_every_steps() == 0 && IsEvaluator())
      evaluator_->Submit(step, host_params_);
    absl::Span<const int64_t> idx = batches->Batch(step % per_epoch);
    if (absl::Status s = train_.Gather(idx, absl::MakeSpan(x), absl::MakeSpan(y)); !s.ok())
      return s;
    const float loss = model_.ForwardBackward(x.data(), y.data(), batch, nullptr);
    if (!std::isfinite(loss))
      return absl::InternalError(absl::StrCat("loss is ", loss, " at step ", step,
                                              " (learning rate too high?)"));
    model_.GetGradients(host_grads_.data());
    absl::StatusOr<ParameterClient::PushOutcome> pushed =
        params_.Push(step, host_grads_.data(), batch, absl::Seconds(60));
    if (!pushed.ok()) return pushed.status();
    // Late and too-stale gradients are the mode at work, counted by the
    // shards; the worker carries on.
    if (pushed->late > 0 && late++ % 100 == 0)
      spdlog::info("step {}: gradient arrived after its step completed ({} time{} so far)",
                   step, late, late == 1 ? "" : "s");
    if (pushed->too_stale > 0 && too_stale++ % 100 == 0)
      spdlog::info("step {}: gradient refused as too stale ({} time{} so far)", step,
                   too_stale, too_stale == 1 ? "" : "s");

    loss_ema = loss_ema < 0 ? loss : 0.95 * loss_ema + 0.05 * loss;
    window_samples += batch;
    const absl::Time now = absl::Now();
    v1::WorkerProgress snapshot;
    {
      absl::MutexLock lock(&mu_);
      progress_.set_step(step + 1);
      progress_.set_epoch(static_cast<uint32_t>(epoch));
      progress_.set_loss(static_cast<float>(loss_ema));
      progress_.set_samples(progress_.samples() + batch);
      const double window = absl::ToDoubleSeconds(now - window_start);
      if (window >= 1.0) {
        progress_.set_samples_per_sec(static_cast<float>(window_samples / window));
        window_start = now;
        window_samples = 0;
      }
      snapshot = progress_;
    }
    if ((step + 1) % 50 == 0 || step + 1 == total)
      WriteCurveRow(step + 1, snapshot, /*evaluated=*/false);
    if (options_.straggler.active())
      SleepUnlessShutdown(options_.straggler.AfterStep(now - step_start));
  }
  return absl::OkStatus();
}

absl::Status Trainer::ReportDone(const v1::WorkerDoneRequest& done) {
  Backoff policy;
  policy.give_up_after = absl::Seconds(90);
  absl::Status st = RetryTransient(policy, [&] {
    grpc::ClientContext ctx;
    ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(10)));
    v1::WorkerDoneResponse resp;
    return ToAbsl(coordinator_->WorkerDone(&ctx, done, &resp));
  });
  if (st.ok()) return st;
  return absl::Status(st.code(), absl::StrCat("WorkerDone: ", st.message()));
}

absl::Status Trainer::FinishAndWait(uint64_t total) {
  v1::WorkerDoneRequest done;
  done.set_job_id(config_.job_id());
  done.set_worker_rank(rank_);
  done.set_incarnation(incarnation_);
  {
    absl::MutexLock lock(&mu_);
    *done.mutable_progress() = progress_;
  }
  if (absl::Status s = ReportDone(done); !s.ok()) return s;
  spdlog::info("finished {} steps; waiting for the job to end", total);

  bool evaluated = false;
  while (!ShutdownRequested()) {
    bool final_turn = false;
    {
      absl::MutexLock lock(&mu_);
      if (Ended(job_state_)) break;
      if (absl::Now() - last_heartbeat_ok_ > kCoordinatorPatience) {
        spdlog::warn("no word from the coordinator for {}; exiting",
                     absl::FormatDuration(kCoordinatorPatience));
        break;
      }
      final_turn = evaluate_final_ && evaluator_rank_ == rank_;
    }
    if (final_turn && !evaluated) {
      // Training is over everywhere and the shards have seen it: these are
      // the final weights.
      if (absl::Status s = PullWeights(total); !s.ok())
        return Stopping() ? absl::OkStatus() : s;
      const Evaluator::Result result = evaluator_->EvaluateNow(total, host_params_);
      OnEvaluation(result, /*final_eval=*/true);
      done.set_has_final_eval(true);
      done.set_final_test_accuracy(static_cast<float>(result.eval.accuracy));
      done.set_final_test_loss(static_cast<float>(result.eval.loss));
      {
        absl::MutexLock lock(&mu_);
        *done.mutable_progress() = progress_;
      }
      if (absl::Status s = ReportDone(done); !s.ok()) return s;
      evaluated = true;
    }
    absl::SleepFor(absl::Milliseconds(20));
  }
  return absl::OkStatus();
}

}  // namespace grps
