#include "worker/trainer.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <optional>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "daemon/daemon.h"
#include "data/batch_iterator.h"
#include "data/epoch_shuffler.h"
#include "data/partition.h"
#include "job/job_config.h"
#include "tensor/dtype.h"
#include "wire/chunk_codec.h"
#include "worker/job_data.h"
#include "worker/parameter_client.h"
#include "spdlog/spdlog.h"

namespace grps {
namespace {

void AddTraffic(const ParameterShards::Traffic& t, ParameterShards::Traffic* to) {
  to->bytes_pushed += t.bytes_pushed;
  to->bytes_pulled += t.bytes_pulled;
  to->lane_bytes += t.lane_bytes;
  to->push_calls += t.push_calls;
  to->doorbell_calls += t.doorbell_calls;
}

}  // namespace

Trainer::Trainer(v1::Coordinator::StubInterface* coordinator,
                 const v1::RegisterWorkerResponse& registration, Backend* backend,
                 TrainerShards shards, TrainerOptions options)
    : config_(registration.config()),
      rank_(registration.rank()),
      start_step_(registration.start_step()),
      next_step_(registration.start_step()),
      backend_(backend),
      options_(std::move(options)),
      tables_(EmbeddingTables(config_)),
      clip_limits_{config_.clip_value(), config_.clip_norm()},
      scaler_(config_.compute_dtype() == v1::DTYPE_F16, config_.loss_scale()),
      metrics_(rank_),
      start_(options_.clock()) {
  const std::vector<int64_t> widths = LayerWidths(config_);
  const int batch = static_cast<int>(config_.batch_size());
  if (config_.model() == v1::MODEL_EMBEDDING) {
    embedding_ = std::make_unique<EmbeddingModel>(
        backend, config_.embedding_dim(),
        std::vector<int64_t>(widths.begin() + 1, widths.end() - 1), widths.back(),
        config_.embedding_combiner() == v1::COMBINER_MEAN ? EmbeddingCombiner::kMean
                                                          : EmbeddingCombiner::kSum,
        batch, static_cast<int32_t>(tables_.size()));
    // Set before the heartbeat thread starts, which hands them new maps;
    // both or neither (LoadData refuses to train without them).
    if (shards.sparse != nullptr && shards.eval_sparse != nullptr) {
      absl::MutexLock lock(&eval_sparse_mu_);
      eval_sparse_ = std::move(shards.eval_sparse);
    }
  } else {
    model_ = std::make_unique<MlpModel>(backend, widths, batch);
    // Validated by the coordinator: UNSPECIFIED, F32, F16 or BF16.
    model_->set_compute_dtype(
        DTypeFromWire(config_.compute_dtype(), true, "compute_dtype").value_or(DType::kF32));
  }
  host_params_ = HostArray<float>(backend_, shards.dense->num_parameters());
  host_grads_ = HostArray<float>(backend_, shards.dense->num_parameters());
  // A rank that starts mid-job (a restart) joins the others; one that starts
  // with the job is in step with them from the first step. Either follows
  // the weights it pulls after each step (WorkerSession::FollowTheWeights; a
  // straggler behind backup workers keeps its own steps).
  joining_ = config_.mode() == v1::MODE_SYNC && start_step_ > 0;
  if (!options_.curve_csv.empty()) {
    absl::StatusOr<std::unique_ptr<CurveFile>> curve = CurveFile::Create(options_.curve_csv, start_);
    if (curve.ok())
      curve_ = std::move(*curve);
    else
      spdlog::warn("{}", std::string(curve.status().message()));
  }
  // Sets the clients' generation (eval_sparse_'s through SessionOptions) and
  // starts the heartbeats.
  const bool sparse = EvalSparse() != nullptr;
  session_ = std::make_unique<WorkerSession>(coordinator, registration, std::move(shards.dense),
                                             sparse ? std::move(shards.sparse) : nullptr,
                                             SessionOptions());
}

Trainer::~Trainer() {
  evaluator_.reset();  // its callback uses the members below
  session_.reset();    // stops the heartbeats
  if (examples_log_ != nullptr) std::fclose(examples_log_);
}

WorkerSession::Options Trainer::SessionOptions() {
  WorkerSession::Options session;
  session.clock = options_.clock;
  // The evaluation client follows the training client (set together).
  session.on_shard_map = [this](const v1::ShardMap& map) {
    if (std::shared_ptr<SparseShards> eval = EvalSparse(); eval != nullptr)
      eval->UpdateShardMap(map);
  };
  session.on_generation = [this](uint64_t generation) {
    if (std::shared_ptr<SparseShards> eval = EvalSparse(); eval != nullptr)
      eval->set_generation(generation);
  };
  session.follow_replaced_maps = options_.connect_shards != nullptr;
  // A coordinator that took an elastic job over asks what this worker holds
  // and trained; in sync the worker may not lease again by itself until it
  // hears, if another waits for the blocks the coordinator lost track of.
  session.on_claim_examples = [this] {
    if (ExampleLeases* leases = claims_to_.load(); leases != nullptr)
      if (absl::Status s = leases->Claim(); !s.ok())
        spdlog::warn("telling the coordinator what this worker holds: {}",
                     std::string(s.message()));
  };
  return session;
}

std::shared_ptr<SparseShards> Trainer::EvalSparse() const {
  absl::MutexLock lock(&eval_sparse_mu_);
  return eval_sparse_;
}

absl::Status Trainer::FollowReplacedMap(const v1::ShardMap& map) {
  const auto refused = [&map](absl::string_view why) {
    return absl::FailedPreconditionError(
        absl::StrCat("cannot follow shard map epoch ", map.epoch(), ": ", why));
  };
  absl::StatusOr<TrainerShards> fresh = options_.connect_shards(map);
  if (!fresh.ok()) return refused(fresh.status().message());
  if (fresh->dense == nullptr ||
      fresh->dense->num_parameters() != static_cast<int64_t>(host_params_.size()))
    return refused("its dense client does not hold the model's parameters");
  if (EvalSparse() != nullptr) {
    if (fresh->sparse == nullptr || fresh->eval_sparse == nullptr)
      return refused("no clients of its sparse table");
    // The evaluator may be reading rows through the old client: its call
    // keeps it alive until it returns, and the next goes to the new one,
    // in this generation.
    fresh->eval_sparse->set_generation(session_->generation());
    absl::MutexLock lock(&eval_sparse_mu_);
    eval_sparse_ = std::move(fresh->eval_sparse);
  } else {
    fresh->sparse.reset();
  }
  // The training thread's clients have no call in flight: this is a step
  // boundary, after the roll-back ended the step's pulls and pushes.
  WorkerSession::Clients old =
      session_->ReplaceClients(map, {std::move(fresh->dense), std::move(fresh->sparse)});
  AddTraffic(old.dense->traffic(), &retired_dense_);
  if (old.sparse != nullptr) {
    retired_sparse_.bytes_pushed += old.sparse->bytes_pushed();
    retired_sparse_.bytes_pulled += old.sparse->bytes_pulled();
  }
  return absl::OkStatus();
}

bool Trainer::IsEvaluator() const { return session_->evaluator_rank() == rank_; }

void Trainer::OnEvaluation(const Evaluator::Result& result, bool final_eval) {
  if (!result.error.ok()) {
    // The job goes on; the next snapshot is evaluated as usual.
    spdlog::warn("{}evaluation of step {} failed: {}", final_eval ? "final " : "",
                 result.step, std::string(result.error.message()));
    return;
  }
  v1::WorkerProgress snapshot;
  session_->UpdateProgress([&](v1::WorkerProgress* progress) {
    progress->set_test_accuracy(static_cast<float>(result.eval.accuracy));
    progress->set_test_loss(static_cast<float>(result.eval.loss));
    if (result.eval.auc >= 0) {
      progress->set_test_auc(static_cast<float>(result.eval.auc));
    } else {
      progress->clear_test_auc();
    }
    snapshot = *progress;
  });
  WriteCurveRow(result.step, snapshot, /*evaluated=*/true);
  spdlog::info("{}test accuracy {:.4f} loss {:.4f}{} at step {} ({} examples)",
               final_eval ? "final " : "", result.eval.accuracy, result.eval.loss,
               result.eval.auc >= 0 ? absl::StrFormat(" AUC %.4f", result.eval.auc) : "",
               result.step, result.eval.examples);
}

void Trainer::WriteCurveRow(uint64_t step, const v1::WorkerProgress& p,
                            bool evaluated) {
  if (curve_ == nullptr) return;
  CurveRow row;
  row.step = step;
  row.epoch = p.epoch();
  row.loss = p.loss();
  row.samples_per_sec = p.samples_per_sec();
  row.test_accuracy = p.test_accuracy();
  row.test_loss = p.test_loss();
  row.test_auc = p.has_test_auc() ? p.test_auc() : -1;
  row.evaluated = evaluated;
  curve_->Write(row, Now());
}

absl::Status Trainer::LoadData() {
  // Any worker may become the evaluator (the lowest live rank does), so
  // each loads the test set too.
  if (embedding_ == nullptr) {
    absl::StatusOr<DenseData> data = LoadDenseData(config_);
    if (!data.ok()) return data.status();
    train_ = std::move(data->train);
    test_ = std::move(data->test);
    evaluator_ = std::make_unique<Evaluator>(
        LayerWidths(config_), &test_,
        [this](const Evaluator::Result& r) { OnEvaluation(r, false); });
    return absl::OkStatus();
  }
  if (session_->sparse() == nullptr)
    return absl::FailedPreconditionError(
        "the embedding model needs the sparse table's clients (TrainerShards)");
  absl::StatusOr<SparseData> data = LoadSparseData(config_);
  if (!data.ok()) return data.status();
  spdlog::info("{}", data->description);
  hash_rows_ = FeatureHashRows(*data, config_.embedding_rows());
  if (tables_.size() > 1)
    spdlog::info("{} fields, a table each ({} .. {}): a field's values are {}", tables_.size(),
                 tables_.front(), tables_.back(),
                 hash_rows_ == 0 ? std::string("its table's row ids")
                                 : absl::StrCat("hashed into its table's ", hash_rows_, " rows"));
  else if (hash_rows_ == 0)
    spdlog::info("features are the table's row ids (feature space {} {})",
                 std::max(data->train.feature_space(), data->test.feature_space()),
                 config_.embedding_rows() == 0
                     ? std::string("; the table has no row bound")
                     : absl::StrCat("fits the table's ", config_.embedding_rows(), " rows"));
  else
    spdlog::info("features are hashed into the table's {} rows", hash_rows_);
  sparse_train_ = std::move(data->train);
  sparse_test_ = std::move(data->test);
  absl::StatusOr<SparseBatch> test =
      SparseBatch::Create({sparse_test_.offsets(), sparse_test_.all_ids(),
                           sparse_test_.all_values(), sparse_test_.labels()},
                          hash_rows_, static_cast<int32_t>(tables_.size()));
  if (!test.ok()) return test.status();
  const uint32_t dim = config_.embedding_dim();
  RowReader read_rows = [this, dim](int32_t table, absl::Span<const int64_t> ids, uint64_t clock,
                                    float* out) -> absl::Status {
    // In pieces of about 16 MiB, far below a message's limit.
    const size_t piece = std::max<size_t>(1, (size_t{16} << 20) / (dim * sizeof(float)));
    for (size_t first = 0; first < ids.size(); first += piece) {
      const absl::Span<const int64_t> part = ids.subspan(first, piece);
      SparseShards::PullProgress progress;
      absl::Status s = session_->WaitToPull("embedding rows", clock, [&] {
        return EvalSparse()->Pull(tables_[table], part, clock, kPullSlice, out + first * dim,
                                  &progress);
      });
      if (!s.ok()) return s;
    }
    return absl::OkStatus();
  };
  evaluator_ = std::make_unique<Evaluator>(
      MakeEmbeddingEvalTarget(LayerWidths(config_), embedding_->combiner(),
                              std::move(*test), std::move(read_rows)),
      [this](const Evaluator::Result& r) { OnEvaluation(r, false); });
  return absl::OkStatus();
}

int64_t Trainer::TrainExamples() const {
  return embedding_ != nullptr ? sparse_train_.num_examples() : train_.num_examples();
}

absl::StatusOr<float> Trainer::DenseStep(uint64_t step, const StepBatch& batch,
                                         const StepBatch* next) {
  // accumulate_steps local batches of batch_size, averaged on the backend.
  // Each is staged (uploaded) while the one before it computes, and the
  // first of step + 1 while this step's last computes and downloads.
  const int local = static_cast<int>(config_.batch_size());
  const int count = static_cast<int>(AccumulateSteps(config_));
  const int64_t features = train_.num_features();
  const auto tag = [count](uint64_t s, int j) { return s * count + j; };
  const auto stage = [&](uint64_t s, const StepBatch& b, int j) {
    model_->StageBatch(tag(s, j), b.x.data() + j * local * features, b.y.data() + j * local,
                       local);
  };
  // The weights change only between steps (the pulls write them after
  // FinishStep): the model reads them in place where it can.
  model_->UseParameters(host_params_.data());
  while (true) {
    const float scale = scaler_.scale();
    // Staged ahead by the step before, unless it was not ready then (or a
    // roll-back moved the step).
    if (!model_->IsStaged(tag(step, 0))) {
      model_->DropStaged();
      stage(step, batch, 0);
    }
    for (int j = 0; j < count; ++j) {
      if (j + 1 < count) stage(step, batch, j + 1);
      model_->ComputeStaged(tag(step, j), j, count, scale, host_grads_.data());
    }
    if (next != nullptr) stage(step + 1, *next, 0);
    const float loss = model_->FinishStep();
    // f16: a gradient that overflowed is skipped, never pushed; the step's
    // batch is computed again at half the scale, so that the step still
    // brings this worker's gradient (a sync step waits for it).
    const bool finite =
        !scaler_.dynamic() ||
        FirstNonFinite(host_grads_.data(), static_cast<int64_t>(host_grads_.size())) < 0;
    if (scaler_.Update(finite)) {
      Clip({});
      return loss;
    }
    model_->DropStaged();
    if (scale <= 1.0f)
      return absl::InternalError(absl::StrCat(
          "the f16 gradient of step ", step, " is not finite even at loss scale 1"));
    if (scaler_.overflows() <= 10 || scaler_.overflows() % 100 == 0)
      spdlog::info("step {}: the f16 gradient overflowed at loss scale {}; skipped, computing "
                   "it again at {} ({} overflow{} so far)",
                   step, scale, scaler_.scale(), scaler_.overflows(),
                   scaler_.overflows() == 1 ? "" : "s");
  }
}

void Trainer::Clip(absl::Span<float> rows) {
  if (!clip_limits_.active()) return;
  const absl::Span<float> parts[] = {absl::MakeSpan(host_grads_.data(), host_grads_.size()),
                                     rows};
  clip_ = ClipGradient(clip_limits_, parts);
}

absl::StatusOr<float> Trainer::EmbeddingStep(uint64_t step, const StepBatch& batch) {
  const SparseBatch& sparse_batch = batch.sparse;
  const int64_t dim = embedding_->embedding_dim();
  const std::vector<int64_t>& offsets = sparse_batch.table_offsets();
  rows_.resize(sparse_batch.unique_ids().size() * dim);
  // The rows as of this clock, table by table: the pull waits at the shards
  // as the dense one does. An attempt after one that failed reads only
  // what that one did not (SparseShards::Pull).
  SparseShards& sparse = *session_->sparse();
  std::vector<SparseShards::PullProgress> progress(sparse_batch.num_fields());
  auto pull_every_table = [&] {
    absl::Status failed;
    for (int32_t t = 0; t < sparse_batch.num_fields(); ++t) {
      absl::Status pulled = sparse.Pull(tables_[t], sparse_batch.table_ids(t), step, kPullSlice,
                                        rows_.data() + offsets[t] * dim, &progress[t]);
      if (failed.ok()) failed = pulled;
    }
    return failed;
  };
  if (absl::Status s = session_->WaitToPull("embedding rows", step, pull_every_table); !s.ok())
    return s;
  embedding_->SetHeadParameters(host_params_.data());
  // accumulate_steps passes of batch_size over the step's examples.
  const float loss = embedding_->ForwardBackward(sparse_batch, rows_.data(), nullptr,
                                                 static_cast<int>(AccumulateSteps(config_)));
  if (!std::isfinite(loss)) return loss;  // the caller says so; nothing is pushed
  embedding_->GetHeadGradients(host_grads_.data());
  const float* row_grads = embedding_->row_gradients().data();
  if (clip_limits_.active()) {
    row_grads_.assign(embedding_->row_gradients().begin(), embedding_->row_gradients().end());
    Clip(absl::MakeSpan(row_grads_));
    row_grads = row_grads_.data();
  }
  // The rows' gradients first, a push per table: these return at once,
  // while the head's (in PushGradients) may wait for the next weights.
  for (int32_t t = 0; t < sparse_batch.num_fields(); ++t) {
    absl::StatusOr<SparseShards::PushOutcome> pushed = session_->PushRows(
        tables_[t], step, sparse_batch.table_ids(t), row_grads + offsets[t] * dim);
    if (pushed.ok()) continue;
    if (session_->Interrupted() != Interrupt::kNone) return pushed.status();
    return absl::Status(pushed.status().code(),
                        absl::StrCat("pushing the rows of ", tables_[t], " of step ", step, ": ",
                                     pushed.status().message()));
  }
  return loss;
}

absl::Status Trainer::Run() {
  if (absl::Status s = LoadData(); !s.ok()) return s;
  if (!options_.examples_log.empty()) {
    // Appended to: a worker started again for its rank adds its steps to
    // its predecessor's, which a new file lost (the epoch's examples then
    // looked untrained).
    examples_log_ = std::fopen(options_.examples_log.c_str(), "a");
    if (examples_log_ == nullptr)
      return absl::FailedPreconditionError(
          absl::StrCat("cannot write the examples log ", options_.examples_log));
  }
  // The steps a worker of a fixed job trains; an elastic job's workers train
  // until the ledger has no block left, and report this as their estimate.
  const uint64_t estimate = TotalSteps(config_, TrainExamples());
  session_->UpdateProgress([estimate](v1::WorkerProgress* p) { p->set_total_steps(estimate); });
  if (IsElastic(config_))
    leases_ = std::make_unique<ExampleLeases>(
        [this](v1::LeaseExamplesRequest r) { return session_->LeaseExamples(std::move(r)); },
        TrainExamples(), StepExamples(config_), config_.seed());
  claims_to_.store(leases_.get());
  const uint64_t total = leases_ != nullptr ? std::numeric_limits<uint64_t>::max() : estimate;
  // Train, report, wait for the end; a roll-back (also one that comes after
  // WorkerDone) sends the worker back to training.
  while (true) {
    absl::Status s = Train(total);
    if (s.ok() && leaving_) return LeaveJob(total);
    if (s.ok()) s = FinishAndWait();
    switch (session_->Interrupted()) {
      case Interrupt::kSignal:
      case Interrupt::kJobEnded:
        return absl::OkStatus();
      case Interrupt::kJobFailed:
        return session_->JobFailed();
      case Interrupt::kRollBack:
        continue;
      case Interrupt::kNone:
        if (!s.ok()) return s;
        // FinishAndWait returned OK without an interrupt: cannot happen, but
        // never loop on it.
        return absl::OkStatus();
    }
  }
}

absl::StatusOr<Trainer::StepPlan> Trainer::PlanSteps() const {
  StepPlan plan;
  plan.batch = static_cast<int64_t>(StepExamples(config_));
  if (leases_ != nullptr) {
    plan.part = PartitionRange{0, TrainExamples()};
    plan.per_epoch = ExampleLedgerShape(config_, TrainExamples()).blocks_per_epoch;
    if (TrainExamples() < plan.batch)
      return absl::InvalidArgumentError(absl::StrCat(
          "the training set has ", TrainExamples(), " examples, fewer than one step's ",
          plan.batch));
    return plan;
  }
  absl::StatusOr<PartitionRange> part =
      PartitionForRank(TrainExamples(), rank_, config_.num_workers());
  if (!part.ok()) return part.status();
  plan.part = *part;
  // Every worker runs the same number of steps per epoch, so sync steps line
  // up: floor(floor(N / workers) / (batch_size x accumulate_steps)).
  plan.per_epoch =
      std::max<uint64_t>(1, TrainExamples() / config_.num_workers() / plan.batch);
  if (part->size() < plan.batch)
    return absl::InvalidArgumentError(absl::StrCat(
        "worker ", rank_, "'s partition has ", part->size(),
        " examples, fewer than one step's ", plan.batch));
  return plan;
}

void Trainer::LogPlan(const StepPlan& plan, uint64_t step, uint64_t total) const {
  spdlog::info("rank {} trains {} with {}{}{}{}", rank_,
               leases_ != nullptr
                   ? absl::StrFormat("from step %d blocks of %d examples leased from the "
                                     "coordinator's example ledger (%d per epoch)",
                                     step, plan.batch, plan.per_epoch)
                   : absl::StrFormat("steps [%d, %d) (%d per epoch) on examples [%d, %d)", step,
                                     total, plan.per_epoch, plan.part.begin, plan.part.end),
               backend_->Name(),
               model_ != nullptr && model_->compute_dtype() != DType::kF32
                   ? absl::StrCat(", computing in ", std::string(DTypeName(model_->compute_dtype())),
                                  scaler_.dynamic()
                                      ? absl::StrFormat(" (loss scale %.9g)", scaler_.scale())
                                      : std::string())
                   : std::string(),
               AccumulateSteps(config_) > 1
                   ? absl::StrCat("; each step accumulates ", AccumulateSteps(config_),
                                  " batches of ", config_.batch_size())
                   : std::string(),
               options_.straggler.active()
                   ? absl::StrCat("; straggles: ", options_.straggler.Describe())
                   : std::string());
}

BatchLoader<Trainer::StepBatch>::Prepare Trainer::BatchSource(const StepPlan& plan) {
  // The epoch's batch order (shuffled per epoch), made when a step of a new
  // epoch is asked for; on the loader thread or the training thread, never
  // both at once (BatchLoader).
  struct Order {
    explicit Order(EpochShuffler s) : shuffler(std::move(s)) {}
    EpochShuffler shuffler;
    int64_t epoch = -1;
    std::optional<BatchIterator> batches;
  };
  auto order = std::make_shared<Order>(EpochShuffler(config_.seed(), plan.part));
  return [this, plan, order](uint64_t s, StepBatch* out) -> absl::Status {
    absl::Span<const int64_t> idx;
    if (leases_ != nullptr) {
      absl::StatusOr<uint64_t> block = leases_->BlockFor(s);
      if (!block.ok()) return block.status();
      idx = leases_->Examples(*block);
      out->epoch = leases_->EpochOf(*block);
    } else {
      const int64_t epoch = static_cast<int64_t>(s / plan.per_epoch);
      if (epoch != order->epoch) {
        absl::StatusOr<BatchIterator> it =
            BatchIterator::Create(order->shuffler.Order(epoch), plan.batch, LastBatch::kDrop);
        if (!it.ok()) return it.status();
        order->batches.emplace(std::move(*it));
        order->epoch = epoch;
      }
      idx = order->batches->Batch(static_cast<int64_t>(s % plan.per_epoch));
      out->epoch = static_cast<uint64_t>(epoch);
    }
    if (examples_log_ != nullptr) out->examples.assign(idx.begin(), idx.end());
    if (embedding_ == nullptr) {
      out->x.resize(idx.size() * train_.num_features());
      out->y.resize(idx.size());
      return train_.Gather(idx, absl::MakeSpan(out->x), absl::MakeSpan(out->y));
    }
    if (absl::Status st = sparse_train_.Gather(idx, &out->raw); !st.ok()) return st;
    return out->sparse.Build({out->raw.offsets, out->raw.ids, out->raw.values, out->raw.labels},
                             hash_rows_, static_cast<int32_t>(tables_.size()));
  };
}

ParameterShards::Traffic Trainer::DenseTraffic() const {
  ParameterShards::Traffic t = session_->dense().traffic();
  AddTraffic(retired_dense_, &t);
  return t;
}

ParameterShards::Traffic Trainer::TrafficSoFar() const {
  ParameterShards::Traffic t = DenseTraffic();
  AddTraffic(retired_sparse_, &t);
  if (const SparseShards* sparse = session_->sparse(); sparse != nullptr) {
    t.bytes_pushed += sparse->bytes_pushed();
    t.bytes_pulled += sparse->bytes_pulled();
  }
  return t;
}

absl::Status Trainer::Train(uint64_t total) {
  absl::StatusOr<StepPlan> plan = PlanSteps();
  if (!plan.ok()) return plan.status();
  TrainLoop loop;
  loop.plan = *plan;
  loop.total = total;
  loop.step = loop.resumed_at = next_step_;
  // (After a roll-back, TakeRollBack says where training resumes.)
  if (session_->Interrupted() != Interrupt::kRollBack) LogPlan(loop.plan, loop.step, total);
  // The loader thread prepares step + 1's examples while this thread
  // trains on step's.
  loop.loader.emplace(BatchSource(loop.plan));
  loop.stats.window_start = Now();
  loop.stats.overflows_seen = scaler_.overflows();
  loop.stats.traffic_seen = TrafficSoFar();
  while (true) {
    absl::StatusOr<bool> more = BeforeStep(&loop);
    if (more.ok() && *more) more = TrainStep(&loop);
    // A roll-back, the job's end or a signal cut the step short: the next
    // turn takes the roll-back, or ends.
    if (!more.ok() && session_->Interrupted() != Interrupt::kNone) continue;
    if (!more.ok()) return more.status();
    if (!*more) break;
  }
  next_step_ = loop.step;
  spdlog::info("data loading: {} of the {} batches taken were prepared ahead{}",
               loop.loader->prepared_ahead(), loop.batches_taken,
               options_.load_ahead ? "" : " (--load_ahead=false)");
  return absl::OkStatus();
}

absl::StatusOr<bool> Trainer::BeforeStep(TrainLoop* loop) {
  // A roll-back moves the data position and the clock back to the
  // checkpoint's step, as a restart's start_step does; one that came with
  // a re-sharding's map moves the clients to its shards first.
  std::optional<v1::ShardMap> replaced_map;
  if (session_->TakeRollBack(loop->total, &loop->step, &replaced_map)) {
    if (replaced_map.has_value())
      if (absl::Status s = FollowReplacedMap(*replaced_map); !s.ok()) return s;
    loop->resumed_at = loop->step;
    loop->pulled_for.reset();
    // The coordinator took back this rank's leases: no batch prepared
    // from one may be trained.
    if (leases_ != nullptr) {
      leases_->Reset();
      loop->loader.emplace(BatchSource(loop->plan));
    }
  }
  if (session_->Interrupted() != Interrupt::kNone) return false;
  // SIGTERM or a drain: leave at this step boundary (unless none is left).
  if (loop->step < loop->total && session_->LeaveRequested()) {
    leaving_ = true;
    return false;
  }
  if (joining_) {
    if (absl::Status s = session_->JoinTheOthers(&loop->step, host_params_.data()); !s.ok())
      return s;
    // The blocks leased for the steps skipped are trained from here on.
    if (leases_ != nullptr) leases_->SkipTo(loop->step);
    loop->pulled_for = loop->step;
    loop->resumed_at = std::max(loop->resumed_at, loop->step);
  }
  return loop->step < loop->total;
}

absl::StatusOr<bool> Trainer::TrainStep(TrainLoop* loop) {
  const uint64_t step = loop->step;
  const absl::Time step_start = Now();
  absl::StatusOr<StepBatch*> examples = loop->loader->Take(
      step, options_.load_ahead && step + 1 < loop->total ? std::optional<uint64_t>(step + 1)
                                                          : std::nullopt);
  // An elastic job's examples are all trained or leased: done.
  if (absl::IsOutOfRange(examples.status()) && leases_ != nullptr) return false;
  if (absl::IsAborted(examples.status()) && session_->Interrupted() == Interrupt::kNone) {
    // Leased in an older generation: the restore order is on its way.
    if (absl::Status s = session_->WaitForRestoreOrder(examples.status()); !s.ok()) return s;
    return true;
  }
  if (!examples.ok()) return examples.status();
  ++loop->batches_taken;
  absl::StatusOr<float> loss = ComputeStep(
      step, **examples, options_.load_ahead ? loop->loader->PeekReady(step + 1) : nullptr,
      loop->resumed_at, &loop->pulled_for);
  if (!loss.ok()) return loss.status();
  if (!std::isfinite(*loss))
    return absl::InternalError(absl::StrCat("loss is ", *loss, " at step ", step,
                                            " (learning rate too high?)"));
  absl::StatusOr<ParameterShards::PushOutcome> pushed = session_->PushGradients(
      step, host_grads_.data(), static_cast<uint32_t>(loop->plan.batch), host_params_.data());
  if (!pushed.ok()) return pushed.status();
  if (pushed->pulled) loop->pulled_for = step + 1;
  NotePush(step, *pushed, &loop->stats);
  NoteTrained(step, **examples);
  const absl::Time step_end = ReportStep(step, loop->total, loop->plan, (*examples)->epoch, *loss,
                                         *pushed, step_start, &loop->stats);
  // An injected straggler's sleep ends when the worker is to leave or stop
  // (a sleep of 100 s outlived grps-local's 5 s after its SIGTERM).
  if (options_.straggler.active())
    SleepUnlessStopped(options_.straggler.AfterStep(step_end - step_start), [this] {
      return session_->LeaveRequested() ||
             session_->Interrupted() != WorkerSession::Interrupt::kNone;
    });
  ++loop->step;
  if (session_->FollowTheWeights(&loop->step)) {
    if (pushed->pulled) loop->pulled_for = loop->step;
    if (leases_ != nullptr) leases_->SkipTo(loop->step);
  }
  return true;
}

absl::StatusOr<float> Trainer::ComputeStep(uint64_t step, const StepBatch& batch,
                                           const StepBatch* next, uint64_t resumed_at,
                                           std::optional<uint64_t>* pulled_for) {
  if (*pulled_for != step) {
    if (absl::Status s = session_->PullWeights(step, host_params_.data()); !s.ok()) return s;
  }
  pulled_for->reset();
  // The evaluator evaluates the weights of this step on its own thread; a
  // busy evaluator skips rather than hold training up.
  if (config_.eval_every_steps() > 0 && step > resumed_at &&
      step % config_.eval_every_steps() == 0 && IsEvaluator())
    evaluator_->Submit(step, std::vector<float>(host_params_.begin(), host_params_.end()));
  return embedding_ != nullptr ? EmbeddingStep(step, batch) : DenseStep(step, batch, next);
}

void Trainer::NotePush(uint64_t step, const ParameterShards::PushOutcome& pushed,
                       StepStats* stats) {
  // In time for its step: in lock-step with the others from now on.
  if (pushed.late == 0) joining_ = false;
  // Late and too-stale gradients are the mode at work, counted by the
  // shards; the worker carries on.
  if (pushed.late > 0 && stats->late++ % 100 == 0)
    spdlog::info("step {}: gradient arrived after its step completed ({} time{} so far)",
                 step, stats->late, stats->late == 1 ? "" : "s");
  if (pushed.too_stale > 0 && stats->too_stale++ % 100 == 0)
    spdlog::info("step {}: gradient refused as too stale ({} time{} so far)", step,
                 stats->too_stale, stats->too_stale == 1 ? "" : "s");
}

void Trainer::UpdateStepMetrics(float loss, const ParameterShards::PushOutcome& pushed,
                                absl::Duration took, StepStats* stats) {
  stats->loss_ema = stats->loss_ema < 0 ? loss : 0.95 * stats->loss_ema + 0.05 * loss;
  metrics_.step_seconds.Observe(absl::ToDoubleSeconds(took));
  metrics_.steps.Increment();
  metrics_.loss.Set(stats->loss_ema);
  if (pushed.late > 0) metrics_.late_pushes.Increment();
  if (pushed.too_stale > 0) metrics_.too_stale_pushes.Increment();
  if (scaler_.dynamic()) {
    metrics_.loss_scale.Set(scaler_.scale());
    metrics_.overflow_steps.Increment(
        static_cast<double>(scaler_.overflows() - stats->overflows_seen));
    stats->overflows_seen = scaler_.overflows();
  }
  if (clip_.has_value()) {
    stats->norm_ema =
        stats->norm_ema < 0 ? clip_->norm : 0.95 * stats->norm_ema + 0.05 * clip_->norm;
    metrics_.gradient_norm.Set(stats->norm_ema);
    if (clip_->clipped()) metrics_.clipped_steps.Increment();
  }
  const ParameterShards::Traffic now = TrafficSoFar();
  const ParameterShards::Traffic& seen = stats->traffic_seen;
  metrics_.pushed_bytes.Increment(static_cast<double>(now.bytes_pushed - seen.bytes_pushed));
  metrics_.pulled_bytes.Increment(static_cast<double>(now.bytes_pulled - seen.bytes_pulled));
  metrics_.lane_bytes.Increment(static_cast<double>(now.lane_bytes - seen.lane_bytes));
  stats->traffic_seen = now;
}

void Trainer::NoteTrained(uint64_t step, const StepBatch& batch) {
  if (leases_ != nullptr) leases_->Trained(step);
  if (examples_log_ == nullptr) return;
  std::string line =
      absl::StrCat(step, " ", batch.epoch, " ", absl::ToUnixMillis(absl::Now()));
  for (int64_t i : batch.examples) absl::StrAppend(&line, " ", i);
  line += '\n';
  std::fwrite(line.data(), 1, line.size(), examples_log_);
}

absl::Status Trainer::ReportTrainedBlocks() {
  if (examples_log_ != nullptr) std::fflush(examples_log_);
  if (leases_ == nullptr) return absl::OkStatus();
  return leases_->Flush();
}

absl::Time Trainer::ReportStep(uint64_t step, uint64_t total, const StepPlan& plan,
                               uint64_t epoch, float loss,
                               const ParameterShards::PushOutcome& pushed, absl::Time step_start,
                               StepStats* stats) {
  stats->window_samples += plan.batch;
  const absl::Time now = Now();
  metrics_.samples.Increment(plan.batch);
  UpdateStepMetrics(loss, pushed, now - step_start, stats);
  v1::WorkerProgress snapshot;
  session_->UpdateProgress([&](v1::WorkerProgress* progress) {
    progress->set_step(step + 1);
    progress->set_epoch(static_cast<uint32_t>(epoch));
    progress->set_loss(static_cast<float>(stats->loss_ema));
    progress->set_samples(progress->samples() + plan.batch);
    if (scaler_.dynamic()) {
      progress->set_loss_scale(scaler_.scale());
      progress->set_overflow_steps(scaler_.overflows());
    }
    if (clip_.has_value()) {
      progress->set_gradient_norm(static_cast<float>(stats->norm_ema));
      if (clip_->clipped()) progress->set_clipped_steps(progress->clipped_steps() + 1);
    }
    // The rate covers about a second; the last step publishes its window
    // however short, so that a run shorter than a second has a rate too.
    const double window = absl::ToDoubleSeconds(now - stats->window_start);
    if (window >= 1.0 || (step + 1 == total && window > 0)) {
      progress->set_samples_per_sec(static_cast<float>(stats->window_samples / window));
      metrics_.samples_per_second.Set(progress->samples_per_sec());
      stats->window_start = now;
      stats->window_samples = 0;
    }
    snapshot = *progress;
  });
  if ((step + 1) % 50 == 0 || step + 1 == total)
    WriteCurveRow(step + 1, snapshot, /*evaluated=*/false);
  return now;
}

absl::Status Trainer::LeaveJob(uint64_t total) {
  // What it trained is this rank's; what else it leased goes back.
  if (absl::Status s = ReportTrainedBlocks(); !s.ok())
    spdlog::warn("reporting the trained examples: {}", std::string(s.message()));
  if (absl::Status s = session_->Leave(next_step_); !s.ok()) {
    // The coordinator will find out by the heartbeat timeout.
    spdlog::warn("{}; exiting anyway", std::string(s.message()));
    return absl::OkStatus();
  }
  spdlog::info("left the job after {} of {} steps", next_step_,
               leases_ != nullptr ? std::string("an elastic job's") : absl::StrCat(total));
  return absl::OkStatus();
}

absl::Status Trainer::FinishAndWait() {
  if (session_->Interrupted() != Interrupt::kNone) return absl::OkStatus();
  if (absl::Status s = ReportTrainedBlocks(); !s.ok()) {
    if (session_->Interrupted() != Interrupt::kNone) return absl::OkStatus();
    return s;
  }
  v1::WorkerDoneRequest done;
  session_->UpdateProgress([this](v1::WorkerProgress* p) { p->set_step(next_step_); });
  *done.mutable_progress() = session_->progress();
  if (absl::Status s = session_->ReportDone(done); !s.ok()) return s;
  if (session_->Interrupted() != Interrupt::kNone) return absl::OkStatus();
  spdlog::info("finished {} steps{}; waiting for the job to end", next_step_,
               leases_ != nullptr ? " (the example ledger has no block left)" : "");
  constexpr double kMiB = 1 << 20;
  const ParameterShards::Traffic dense = DenseTraffic();
  spdlog::info("dense values: pushed {:.1f} MiB and pulled {:.1f} MiB, {:.1f} MiB of them "
               "through shared-memory lanes; {} of {} push calls rung at lane doorbells",
               dense.bytes_pushed / kMiB, dense.bytes_pulled / kMiB, dense.lane_bytes / kMiB,
               dense.doorbell_calls, dense.push_calls);
  // Asked again when a rank came back after this one's evaluation and
  // training was done again: the evaluation it gave is not final any more.
  while (true) {
    absl::StatusOr<bool> final_turn = session_->AwaitEndOrFinalEvaluation();
    if (!final_turn.ok()) return final_turn.status();
    if (!*final_turn) return absl::OkStatus();
    if (absl::Status s = EvaluateFinal(&done); !s.ok()) return s;
  }
}

absl::Status Trainer::EvaluateFinal(v1::WorkerDoneRequest* done) {
  // Training is over everywhere and the shards have seen it: these are the
  // final weights.
  if (absl::Status s = session_->PullWeights(next_step_, host_params_.data()); !s.ok())
    return session_->Interrupted() != Interrupt::kNone ? absl::OkStatus() : s;
  const Evaluator::Result result = evaluator_->EvaluateNow(
      next_step_, std::vector<float>(host_params_.begin(), host_params_.end()));
  OnEvaluation(result, /*final_eval=*/true);
  if (!result.error.ok())
    return session_->Interrupted() != Interrupt::kNone
               ? absl::OkStatus()
               : absl::Status(result.error.code(),
                              absl::StrCat("final evaluation: ", result.error.message()));
  done->set_has_final_eval(true);
  done->set_final_test_accuracy(static_cast<float>(result.eval.accuracy));
  done->set_final_test_loss(static_cast<float>(result.eval.loss));
  if (result.eval.auc >= 0) done->set_final_test_auc(static_cast<float>(result.eval.auc));
  *done->mutable_progress() = session_->progress();
  return session_->ReportDone(*done);
}

}  // namespace grps
