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

}  // namespace

Trainer::Trainer(v1::Coordinator::Stub* coordinator,
                 const v1::RegisterWorkerResponse& registration,
                 Backend* backend, TrainerOptions options)
    : coordinator_(coordinator),
      config_(registration.config()),
      rank_(registration.rank()),
      incarnation_(registration.incarnation()),
      backend_(backend),
      options_(std::move(options)),
      model_(backend, LayerWidths(config_), static_cast<int>(config_.batch_size())),
      params_(config_, registration.shard_map(), rank_, incarnation_) {
  host_params_.resize(params_.num_parameters());
  host_grads_.resize(params_.num_parameters());
  progress_.set_test_accuracy(-1);
  progress_.set_test_loss(-1);
  if (!options_.curve_csv.empty()) {
    curve_ = std::fopen(options_.curve_csv.c_str(), "w");
    if (curve_ != nullptr)
      std::fprintf(curve_, "step,epoch,elapsed_s,loss,samples_per_sec,test_accuracy,test_loss\n");
    else
      spdlog::warn("cannot write curve to {}", options_.curve_csv);
  }
  heartbeat_ = std::thread([this] { HeartbeatLoop(); });
}

Trainer::~Trainer() {
  stop_heartbeat_ = true;
  if (heartbeat_.joinable()) heartbeat_.join();
  if (curve_ != nullptr) std::fclose(curve_);
}

bool Trainer::Stopping() const {
  if (ShutdownRequested()) return true;
  absl::MutexLock lock(&mu_);
  return job_state_ == v1::JOB_STATE_STOPPED || job_state_ == v1::JOB_STATE_FAILED;
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
      live_workers_.assign(resp.live_workers().begin(), resp.live_workers().end());
      heartbeat_seen_ = true;
    } else if (st.error_code() != grpc::StatusCode::UNAVAILABLE &&
               st.error_code() != grpc::StatusCode::DEADLINE_EXCEEDED) {
      // Training goes on without a coordinator; only log what is unexpected.
      spdlog::warn("heartbeat: {}", st.error_message());
    }
    for (absl::Duration slept; slept < interval && !stop_heartbeat_;
         slept += absl::Milliseconds(50))
      absl::SleepFor(absl::Milliseconds(50));
  }
}

absl::Status Trainer::PullWeights(uint64_t min_version) {
  // A sync pull waits for the slowest live worker; keep waiting (in slices,
  // so a stop is noticed) as long as the job runs.
  while (true) {
    absl::Status s = params_.Pull(min_version, absl::Seconds(5), host_params_.data());
    if (s.ok()) {
      model_.SetParameters(host_params_.data());
      return s;
    }
    if (Stopping()) return absl::CancelledError("job stopped");
    if (s.code() != absl::StatusCode::kDeadlineExceeded &&
        s.code() != absl::StatusCode::kUnavailable)
      return s;
    spdlog::info("waiting for version {}: {}", min_version, std::string(s.message()));
    absl::SleepFor(absl::Milliseconds(100));
  }
}

void Trainer::Evaluate(EvalResult* out) {
  *out = model_.Evaluate(test_.features().data(), test_.labels().data(),
                         test_.num_examples());
}

void Trainer::WriteCurveRow(uint64_t step, const v1::WorkerProgress& p,
                            double elapsed) {
  if (curve_ == nullptr) return;
  std::fprintf(curve_, "%llu,%u,%.3f,%.6f,%.1f,%.6f,%.6f\n",
               static_cast<unsigned long long>(step), p.epoch(), elapsed, p.loss(),
               p.samples_per_sec(), p.test_accuracy(), p.test_loss());
  std::fflush(curve_);
}

absl::Status Trainer::Run() {
  absl::StatusOr<Dataset> train =
      LoadSplit(config_, DatasetSplit::kTrain, config_.dataset().train_limit());
  if (!train.ok()) return train.status();
  train_ = std::move(*train);
  if (rank_ == 0) {
    absl::StatusOr<Dataset> test =
        LoadSplit(config_, DatasetSplit::kTest, config_.dataset().test_limit());
    if (!test.ok()) return test.status();
    test_ = std::move(*test);
  }
  const bool sync = config_.mode() == v1::MODE_SYNC;
  const int64_t batch = config_.batch_size();
  const uint64_t total = TotalSteps(config_, train_.num_examples());
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
  spdlog::info("rank {} trains {} steps ({} per epoch) on examples [{}, {}) with {}",
               rank_, total, per_epoch, part->begin, part->end, backend_->Name());
  {
    absl::MutexLock lock(&mu_);
    progress_.set_total_steps(total);
  }

  const absl::Time start = absl::Now();
  absl::Time window_start = start;
  uint64_t window_samples = 0;
  double loss_ema = -1;
  int64_t epoch_loaded = -1;
  std::unique_ptr<BatchIterator> batches;
  for (uint64_t step = 0; step < total; ++step) {
    if (Stopping()) return absl::OkStatus();
    const int64_t epoch = step / per_epoch;
    if (epoch != epoch_loaded) {
      absl::StatusOr<BatchIterator> it =
          BatchIterator::Create(shuffler.Order(epoch), batch, LastBatch::kDrop);
      if (!it.ok()) return it.status();
      batches = std::make_unique<BatchIterator>(std::move(*it));
      epoch_loaded = epoch;
    }
    absl::Status s = PullWeights(sync ? step : 0);
    if (!s.ok()) return Stopping() ? absl::OkStatus() : s;
    absl::Span<const int64_t> idx = batches->Batch(step % per_epoch);
    s = train_.Gather(idx, absl::MakeSpan(x), absl::MakeSpan(y));
    if (!s.ok()) return s;
    float loss = model_.ForwardBackward(x.data(), y.data(), batch, nullptr);
    if (!std::isfinite(loss))
      return absl::InternalError(absl::StrCat("loss is ", loss, " at step ", step,
                                              " (learning rate too high?)"));
    model_.GetGradients(host_grads_.data());
    s = params_.Push(step, host_grads_.data(), batch, absl::Seconds(60));
    if (!s.ok()) return Stopping() ? absl::OkStatus() : s;

    loss_ema = loss_ema < 0 ? loss : 0.95 * loss_ema + 0.05 * loss;
    window_samples += batch;
    const absl::Time now = absl::Now();
    const bool eval_now = rank_ == 0 && config_.eval_every_steps() > 0 &&
                          (step + 1) % config_.eval_every_steps() == 0;
    EvalResult eval;
    if (eval_now) Evaluate(&eval);
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
      if (eval_now) {
        progress_.set_test_accuracy(static_cast<float>(eval.accuracy));
        progress_.set_test_loss(static_cast<float>(eval.loss));
      }
      snapshot = progress_;
    }
    if (eval_now || (step + 1) % 50 == 0 || step + 1 == total)
      WriteCurveRow(step + 1, snapshot, absl::ToDoubleSeconds(now - start));
    if (eval_now)
      spdlog::info("step {}/{} loss {:.4f} test accuracy {:.4f}", step + 1, total,
                   loss_ema, eval.accuracy);
  }

  v1::WorkerDoneRequest done;
  done.set_job_id(config_.job_id());
  done.set_worker_rank(rank_);
  done.set_incarnation(incarnation_);
  if (rank_ == 0) {
    // The final weights are those after every worker's last update: wait
    // until the other workers have finished (or been declared dead).
    while (!Stopping()) {
      {
        absl::MutexLock lock(&mu_);
        if (heartbeat_seen_ &&
            std::all_of(live_workers_.begin(), live_workers_.end(),
                        [this](uint32_t r) { return r == rank_; }))
          break;
      }
      absl::SleepFor(absl::Milliseconds(100));
    }
    if (Stopping()) return absl::OkStatus();
    absl::Status s = PullWeights(sync ? total : 0);
    if (!s.ok()) return Stopping() ? absl::OkStatus() : s;
    EvalResult eval;
    Evaluate(&eval);
    done.set_has_final_eval(true);
    done.set_final_test_accuracy(static_cast<float>(eval.accuracy));
    done.set_final_test_loss(static_cast<float>(eval.loss));
    absl::MutexLock lock(&mu_);
    progress_.set_test_accuracy(static_cast<float>(eval.accuracy));
    progress_.set_test_loss(static_cast<float>(eval.loss));
    spdlog::info("final test accuracy {:.4f} loss {:.4f} on {} examples",
                 eval.accuracy, eval.loss, eval.examples);
  }
  {
    absl::MutexLock lock(&mu_);
    *done.mutable_progress() = progress_;
    // The final evaluation gets a row of its own.
    if (done.has_final_eval())
      WriteCurveRow(progress_.step(), progress_,
                    absl::ToDoubleSeconds(absl::Now() - start));
  }
  Backoff policy;
  policy.give_up_after = absl::Seconds(90);
  absl::Status st = RetryTransient(policy, [&] {
    grpc::ClientContext ctx;
    ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(10)));
    v1::WorkerDoneResponse resp;
    return ToAbsl(coordinator_->WorkerDone(&ctx, done, &resp));
  });
  if (st.ok()) return absl::OkStatus();
  return absl::Status(st.code(), absl::StrCat("WorkerDone: ", st.message()));
}

}  // namespace grps
