#include "job/job_config.h"

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "data/criteo.h"
#include "job/shard_map.h"
#include "job/sparse_tables.h"
#include "job/user_model.h"

namespace grps {

v1::JobConfig DefaultJobConfig() {
  v1::JobConfig c;
  c.set_job_id("grps-job");
  c.set_mode(v1::MODE_SYNC);
  c.set_staleness_bound(3);
  c.set_model(v1::MODEL_MLP);
  c.add_hidden_units(256);
  c.add_hidden_units(128);
  c.mutable_dataset()->set_format("idx");
  c.mutable_dataset()->set_path("/usr/share/datasets/fashion-mnist");
  v1::OptimizerConfig* opt = c.mutable_optimizer();
  opt->set_kind(v1::OPTIMIZER_MOMENTUM);
  opt->set_learning_rate(0.05f);
  opt->set_momentum(0.9f);
  opt->set_beta1(0.9f);
  opt->set_beta2(0.999f);
  opt->set_epsilon(1e-8f);
  // Halve the learning rate about once an epoch of the default job
  // (60,000 examples / 2 workers / batch 64 = 468 steps).
  opt->set_decay_steps(468);
  opt->set_decay_rate(0.5f);
  c.set_batch_size(64);
  c.set_epochs(3);
  c.set_num_servers(2);
  c.set_num_workers(2);
  c.set_seed(42);
  c.set_chunk_bytes(256 * 1024);
  c.set_wire_dtype(v1::DTYPE_F32);
  c.set_compute_dtype(v1::DTYPE_F32);
  c.set_eval_every_steps(200);
  c.set_late_gradients(v1::LATE_GRADIENTS_FOLD);
  c.set_heartbeat_interval_ms(500);
  c.set_heartbeat_timeout_ms(5000);
  c.set_input_features(784);
  c.set_num_classes(10);
  return c;
}

uint32_t RecoveryTimeoutMs(const v1::JobConfig& config) {
  return config.recovery_timeout_ms() == 0 ? 30000 : config.recovery_timeout_ms();
}

uint32_t CoordinatorTimeoutMs(const v1::JobConfig& config) {
  return config.coordinator_timeout_ms() == 0 ? 60000
                                              : config.coordinator_timeout_ms();
}

namespace {

// "job config: <what>" as InvalidArgument.
absl::Status Bad(absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat("job config: ", what));
}

// The data set's fields, for the model that reads it.
absl::Status ValidateDataset(const v1::JobConfig& c) {
  if (c.model() == v1::MODEL_USER) return absl::OkStatus();  // the worker's own
  auto bad = [](absl::string_view what) {
    return absl::InvalidArgumentError(absl::StrCat("job config: dataset.", what));
  };
  const v1::DatasetConfig& d = c.dataset();
  const std::string& f = d.format();
  if (c.model() == v1::MODEL_EMBEDDING) {
    if (f != "idx-sparse" && f != "libsvm" && f != "synthetic" && f != "criteo")
      return bad(
          "format must be idx-sparse, libsvm, synthetic or criteo for the embedding "
          "model");
    if (f == "criteo" && c.num_classes() != 2)
      return Bad("num_classes must be 2 for criteo data (a click or not)");
  } else if (f != "idx" && f != "csv") {
    return bad("format must be idx or csv for a dense model (mlp, softmax)");
  }
  if (f != "synthetic" && d.path().empty()) return bad("path is empty");
  if ((f == "csv" || f == "libsvm" || f == "criteo") && d.test_path().empty())
    return bad(absl::StrCat("test_path is empty (", f, " reads the test set from it)"));
  if (d.path().size() > 4096 || d.test_path().size() > 4096)
    return bad("path and test_path must be at most 4096 bytes");
  if (d.sparse_buckets() > 256) return bad("sparse_buckets must be in [0, 256]");
  if (f != "synthetic") return absl::OkStatus();
  // The generator's own limits (data/synthetic_sparse.h), checked here so
  // that a bad job is refused at the coordinator, not by every worker.
  const v1::SyntheticDataConfig& s = d.synthetic();
  const uint64_t vocabulary = s.vocabulary() > 0 ? s.vocabulary() : 10000;
  const uint64_t k = s.features_per_example() > 0 ? s.features_per_example() : 10;
  if (vocabulary * c.num_classes() > (1ull << 28) || vocabulary > (1ull << 28))
    return bad("synthetic.vocabulary x num_classes must be at most 2^28");
  if (k > vocabulary) return bad("synthetic.features_per_example must be at most vocabulary");
  if (s.num_train() > (1ull << 30) / k || s.num_test() > (1ull << 30) / k)
    return bad("synthetic: num_train and num_test x features_per_example must be at most 2^30");
  if (!(s.zipf_exponent() >= 0 && s.zipf_exponent() <= 4))
    return bad("synthetic.zipf_exponent must be in [0, 4]");
  if (!(s.margin() >= 0 && s.margin() <= 10)) return bad("synthetic.margin must be in [0, 10]");
  if (!(s.label_noise() >= 0 && s.label_noise() < 1))
    return bad("synthetic.label_noise must be in [0, 1)");
  return absl::OkStatus();
}

// The mode and the model's shape.
absl::Status ValidateModel(const v1::JobConfig& c) {
  if (c.job_id().empty()) return Bad("job_id is empty");
  if (c.mode() != v1::MODE_SYNC && c.mode() != v1::MODE_ASYNC &&
      c.mode() != v1::MODE_SSP)
    return Bad("mode must be sync, async or ssp");
  if (c.mode() == v1::MODE_SSP && c.staleness_bound() > 1000000)
    return Bad("staleness_bound must be at most 1000000");
  if (c.model() != v1::MODEL_MLP && c.model() != v1::MODEL_SOFTMAX &&
      c.model() != v1::MODEL_EMBEDDING && c.model() != v1::MODEL_USER)
    return Bad("model must be mlp, softmax, embedding or user");
  if (c.model() == v1::MODEL_USER) {
    // The worker's program reads its own data and sets its own shape.
    if (c.model_tensors_size() == 0) return absl::OkStatus();
    if (absl::Status s = ValidateUserModel(c.model_tensors()); !s.ok())
      return Bad(absl::StrCat("model_tensors: ", s.message()));
    return absl::OkStatus();
  }
  if (c.model_tensors_size() > 0) return Bad("model_tensors belong to a user model only");
  if (c.model() == v1::MODEL_SOFTMAX && c.hidden_units_size() > 0)
    return Bad("softmax regression has no hidden layers");
  for (uint32_t h : c.hidden_units())
    if (h == 0 || h > (1u << 16)) return Bad("hidden_units must be in [1, 65536]");
  if (c.model() != v1::MODEL_EMBEDDING &&
      (c.input_features() == 0 || c.input_features() > (1u << 24)))
    return Bad("input_features must be in [1, 2^24]");
  if (c.num_classes() < 2 || c.num_classes() > 100000)
    return Bad("num_classes must be in [2, 100000]");
  // What the shards hold, bounded as a user model's is (16 GiB of f32): a
  // 65536 x 65536 layer was taken, and its worker grew past the machine's
  // memory until the kernel killed it. (Each width is at most 2^24 here:
  // no product overflows.)
  uint64_t elements = 0;
  for (const v1::TensorSpec& t : ModelTensors(c)) elements += NumElements(t);
  if (elements > kMaxUserModelElements)
    return Bad(absl::StrCat("the model has ", elements,
                            " parameters, past the 2^32 (16 GiB of f32) the shards hold"));
  return absl::OkStatus();
}

absl::Status ValidateOptimizer(const v1::OptimizerConfig& o) {
  if (o.kind() < v1::OPTIMIZER_SGD || o.kind() > v1::OPTIMIZER_WORKERS)
    return Bad("optimizer kind is unknown");
  if (!(o.learning_rate() > 0) || !std::isfinite(o.learning_rate()))
    return Bad("learning_rate must be a positive number");
  if (o.momentum() < 0 || o.momentum() >= 1) return Bad("momentum must be in [0, 1)");
  if (o.beta1() < 0 || o.beta1() >= 1 || o.beta2() < 0 || o.beta2() >= 1)
    return Bad("beta1 and beta2 must be in [0, 1)");
  if (o.weight_decay() < 0) return Bad("weight_decay must be >= 0");
  if (o.decay_steps() > 0 && !(o.decay_rate() > 0 && o.decay_rate() <= 1))
    return Bad("decay_rate must be in (0, 1]");
  if (o.decoupled_weight_decay() && o.kind() != v1::OPTIMIZER_ADAM)
    return Bad("decoupled_weight_decay (AdamW's) is for the adam optimizer only");
  return absl::OkStatus();
}

bool SameOptimizerState(v1::OptimizerKind a, v1::OptimizerKind b) {
  auto family = [](v1::OptimizerKind k) {
    return k == v1::OPTIMIZER_NESTEROV ? v1::OPTIMIZER_MOMENTUM : k;
  };
  return family(a) == family(b);
}

}  // namespace

absl::Status CheckProgramOptimizer(const v1::OptimizerConfig& job,
                                   const v1::OptimizerConfig& program) {
  if (job.kind() == v1::OPTIMIZER_WORKERS || program.kind() == v1::OPTIMIZER_WORKERS)
    return absl::InvalidArgumentError(
        "the job's optimizer runs on the workers: a push names no optimizer for the servers");
  if (!SameOptimizerState(job.kind(), program.kind()))
    return absl::InvalidArgumentError(absl::StrCat(
        "the program's optimizer is ", OptimizerName(program.kind()), " but the job's is ",
        OptimizerName(job.kind()), ", whose state the servers keep (start the job with "
        "--optimizer=", OptimizerName(program.kind()), ")"));
  const float values[] = {program.learning_rate(), program.momentum(), program.beta1(),
                          program.beta2(), program.epsilon(), program.weight_decay()};
  for (float v : values)
    if (!std::isfinite(v) || v < 0)
      return absl::InvalidArgumentError(
          "the program's optimizer has a hyperparameter that is negative or not a finite number");
  if (program.momentum() >= 1 || program.beta1() >= 1 || program.beta2() >= 1)
    return absl::InvalidArgumentError(
        "the program's optimizer's momentum, beta1 and beta2 must be below 1");
  if (program.warmup_steps() != 0 || program.decay_steps() != 0)
    return absl::InvalidArgumentError(
        "the program's optimizer carries a schedule: its learning_rate is the update's own");
  if (program.decoupled_weight_decay() && program.kind() != v1::OPTIMIZER_ADAM)
    return absl::InvalidArgumentError(
        "decoupled_weight_decay (AdamW's) is for the adam optimizer only");
  return absl::OkStatus();
}

namespace {

// How many members, steps and bytes: the job's size.
absl::Status ValidateSize(const v1::JobConfig& c) {
  if (c.batch_size() == 0 || c.batch_size() > 65536)
    return Bad("batch_size must be in [1, 65536]");
  // A user model's workers decide when they are done (gt.done()).
  if (c.steps() == 0 && c.epochs() == 0 && c.model() != v1::MODEL_USER)
    return Bad("set steps or epochs");
  if (c.num_servers() == 0 || c.num_servers() > 256)
    return Bad("num_servers must be in [1, 256]");
  if (c.num_workers() == 0 || c.num_workers() > 1024)
    return Bad("num_workers must be in [1, 1024]");
  if (c.max_workers() > 1024) return Bad("max_workers must be in [0, 1024] (0: not elastic)");
  if (c.max_workers() > 0 && c.max_workers() < c.num_workers())
    return Bad("max_workers must be at least num_workers (the workers that start the job)");
  if (c.min_workers() > c.num_workers())
    return Bad("min_workers must be at most num_workers (the workers that start the job)");
  if (c.min_workers() > 0 && c.max_workers() == 0)
    return Bad("min_workers needs max_workers (an elastic job)");
  if (c.max_workers() > 0 && c.model() == v1::MODEL_USER && c.steps() == 0 && c.epochs() == 0)
    return Bad("max_workers: a user model's elastic job needs --epochs or --steps, the size "
               "of its example ledger (docs/pytorch.md)");
  if (c.max_servers() > 256) return Bad("max_servers must be in [0, 256] (0: a fixed count)");
  if (c.max_servers() > 0 && c.max_servers() < c.num_servers())
    return Bad("max_servers must be at least num_servers (the shards that start the job)");
  if (c.max_servers() > 0 && c.checkpoint_dir().empty())
    return Bad("max_servers needs checkpoint_dir: a re-sharding moves the shards' state "
               "through a checkpoint (docs/elasticity.md)");
  if (c.max_servers() > 0 && c.checkpoint_storage() == v1::CHECKPOINT_STORAGE_PER_SHARD)
    return Bad("max_servers needs shared checkpoint storage: a shard of the new map reads "
               "the files of every old shard (docs/elasticity.md)");
  // At most 16 MiB: a chunk goes whole in one message (a pull's reply, a
  // top-k push of twice its values, two optimizer slots of its state), and
  // every message stays under the 64 MiB limit. (A chunk of 64 MiB was
  // accepted, and its pull was refused for size on every try: the job hung
  // at step 0.)
  if (c.chunk_bytes() < 1024 || c.chunk_bytes() > (16u << 20))
    return Bad("chunk_bytes must be in [1 KiB, 16 MiB]");
  // At most 16 MiB: a top-k part carries an index beside each value it
  // keeps, twice its f32 values at most, within a message's 64 MiB.
  if (c.part_bytes() != 0 && (c.part_bytes() < (16u << 10) || c.part_bytes() > (16u << 20)))
    return Bad("part_bytes must be 0 (by the link) or in [16 KiB, 16 MiB]");
  if (c.wire_dtype() != v1::DTYPE_F32 && c.wire_dtype() != v1::DTYPE_F16 &&
      c.wire_dtype() != v1::DTYPE_BF16)
    return Bad("wire_dtype must be f32, f16 or bf16");
  if (c.local_transport() != v1::LOCAL_TRANSPORT_SHARED_MEMORY &&
      c.local_transport() != v1::LOCAL_TRANSPORT_GRPC)
    return Bad("local_transport is not a transport");
  return absl::OkStatus();
}

// What a worker does to its gradient before the push, and how it computes.
absl::Status ValidateGradients(const v1::JobConfig& c) {
  if (!(c.gradient_topk() >= 0 && c.gradient_topk() <= 1))
    return Bad("gradient_topk must be in [0, 1] (0: send gradients whole)");
  if (c.accumulate_steps() > 1024) return Bad("accumulate_steps must be in [0, 1024]");
  if (static_cast<uint64_t>(c.batch_size()) * AccumulateSteps(c) > 65536)
    return Bad("batch_size x accumulate_steps must be at most 65536");
  if (!(c.clip_norm() >= 0) || !std::isfinite(c.clip_norm()))
    return Bad("clip_norm must be a number >= 0 (0: no clipping by norm)");
  if (!(c.clip_value() >= 0) || !std::isfinite(c.clip_value()))
    return Bad("clip_value must be a number >= 0 (0: no clipping by value)");
  if (c.compute_dtype() != v1::DTYPE_UNSPECIFIED && c.compute_dtype() != v1::DTYPE_F32 &&
      c.compute_dtype() != v1::DTYPE_F16 && c.compute_dtype() != v1::DTYPE_BF16)
    return Bad("compute_dtype must be f32, f16 or bf16");
  if ((c.compute_dtype() == v1::DTYPE_F16 || c.compute_dtype() == v1::DTYPE_BF16) &&
      c.model() == v1::MODEL_EMBEDDING)
    return Bad("compute_dtype f16 and bf16 apply to dense models (mlp, softmax) only");
  // Below 1 a scale shrinks the f16 gradients it exists to keep from
  // underflowing (1e-5 was taken, and the job ended worse than untrained).
  if (!(c.loss_scale() == 0 || c.loss_scale() >= 1) || !std::isfinite(c.loss_scale()) ||
      c.loss_scale() > 16777216)
    return Bad("loss_scale must be 0 (65536) or in [1, 2^24]");
  if (c.loss_scale() != 0 && c.compute_dtype() != v1::DTYPE_F16)
    return Bad("loss_scale applies to compute_dtype f16 only (f32 and bf16 need no scale)");
  if (c.backup_workers() > 0 && c.mode() != v1::MODE_SYNC)
    return Bad("backup_workers applies to sync mode only");
  // A sync step's gradients are all of its version: nothing is stale.
  if ((c.max_staleness() > 0 || c.staleness_aware_lr()) && c.mode() == v1::MODE_SYNC)
    return Bad("max_staleness and staleness_aware_lr apply to async and ssp modes only");
  if (c.backup_workers() >= c.num_workers())
    return Bad("backup_workers must be less than num_workers");
  if (c.late_gradients() != v1::LATE_GRADIENTS_UNSPECIFIED &&
      c.late_gradients() != v1::LATE_GRADIENTS_FOLD &&
      c.late_gradients() != v1::LATE_GRADIENTS_DROP)
    return Bad("late_gradients must be fold or drop");
  // Every worker's examples must hold a step's (Trainer::PlanSteps): with
  // train_limit 3 and 4 workers of batch 1, rank 3 had none and failed at
  // its start, and the job failed or went on without it, by the timing.
  const uint64_t limit = c.dataset().train_limit();
  if (c.model() != v1::MODEL_USER && limit > 0) {
    const uint64_t each = IsElastic(c) ? limit : limit / c.num_workers();
    if (each < StepExamples(c))
      return Bad(absl::StrCat("dataset.train_limit ", limit, " gives ",
                              IsElastic(c) ? "the job" : "each worker", " ", each,
                              " examples, fewer than one step's ", StepExamples(c),
                              " (batch_size x accumulate_steps)"));
  }
  return absl::OkStatus();
}

// Heartbeats, timeouts and checkpoints: how the job survives faults.
absl::Status ValidateFaultTolerance(const v1::JobConfig& c) {
  // A member is dead after kLeastHeartbeatsMissed intervals without a word,
  // and never sooner than kLeastHeartbeatTimeoutMs: a heartbeat of 1 ms
  // and a timeout of 2 ms was taken, and its members were declared dead 71
  // times in a short sync job, which then ended on other weights.
  if (c.heartbeat_interval_ms() == 0 ||
      c.heartbeat_timeout_ms() < kLeastHeartbeatsMissed * uint64_t{c.heartbeat_interval_ms()} ||
      c.heartbeat_timeout_ms() < kLeastHeartbeatTimeoutMs)
    return Bad(absl::StrCat("heartbeat_timeout_ms must be at least ", kLeastHeartbeatsMissed,
                            " x heartbeat_interval_ms (> 0) and at least ",
                            kLeastHeartbeatTimeoutMs));
  if (c.checkpoint_dir().size() > 4096)
    return Bad("checkpoint_dir must be at most 4096 bytes");
  if ((c.checkpoint_every_steps() > 0 || c.checkpoint_every_seconds() > 0) &&
      c.checkpoint_dir().empty())
    return Bad("checkpoint_every_steps and checkpoint_every_seconds need a "
               "checkpoint_dir");
  if (c.checkpoint_full_every() > 0 && c.checkpoint_dir().empty())
    return Bad("checkpoint_full_every needs a checkpoint_dir");
  if (c.checkpoint_full_every() > 1000)
    return Bad("checkpoint_full_every must be at most 1000 (a restore reads every file of "
               "the chain)");
  if (c.checkpoint_part_kib() > 2047 * 1024)
    return Bad(
        "checkpoint_part_kib must be at most 2096128 (2047 MiB: a checkpoint file is "
        "one protocol buffer message, under 2 GiB)");
  if (c.checkpoint_storage() != v1::CHECKPOINT_STORAGE_SHARED &&
      c.checkpoint_storage() != v1::CHECKPOINT_STORAGE_PER_SHARD)
    return Bad("checkpoint_storage is not a storage kind");
  if (c.recovery_timeout_ms() > 0 &&
      c.recovery_timeout_ms() < c.heartbeat_timeout_ms())
    return Bad("recovery_timeout_ms must be 0 (30000) or at least "
               "heartbeat_timeout_ms");
  if (c.coordinator_timeout_ms() > 0 &&
      c.coordinator_timeout_ms() <= c.heartbeat_interval_ms())
    return Bad("coordinator_timeout_ms must be 0 (60000) or exceed "
               "heartbeat_interval_ms");
  return absl::OkStatus();
}

// The embedding model's table.
absl::Status ValidateEmbedding(const v1::JobConfig& c) {
  if (c.embedding_dim() == 0 || c.embedding_dim() > 4096)
    return Bad("embedding_dim must be in [1, 4096]");
  if (c.embedding_rows() > static_cast<uint64_t>(INT64_MAX))
    return Bad("embedding_rows must be at most 2^63 - 1 (ids are int64)");
  if (c.embedding_combiner() != v1::COMBINER_UNSPECIFIED &&
      c.embedding_combiner() != v1::COMBINER_SUM &&
      c.embedding_combiner() != v1::COMBINER_MEAN)
    return Bad("embedding_combiner must be sum or mean");
  for (const std::string& name : EmbeddingTables(c)) {
    const v1::SparseTableSpec* table = FindSparseTable(c, name);
    if (table == nullptr)
      return Bad(absl::StrCat("the embedding model needs the sparse table \"", name, "\""));
    if (table->dim() != c.embedding_dim() || table->rows() != c.embedding_rows())
      return Bad(absl::StrCat("sparse table \"", name, "\" is ", table->rows(), " rows x ",
                              table->dim(), ", the model's embedding ", c.embedding_rows(), " x ",
                              c.embedding_dim()));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status ValidateJobConfig(const v1::JobConfig& c) {
  for (absl::Status (*check)(const v1::JobConfig&) :
       {ValidateModel, ValidateDataset, ValidateSize, ValidateGradients,
        ValidateFaultTolerance, ValidateSparseTables}) {
    if (absl::Status s = check(c); !s.ok()) return s;
  }
  if (absl::Status s = ValidateOptimizer(c.optimizer()); !s.ok()) return s;
  if (c.optimizer().kind() == v1::OPTIMIZER_WORKERS && c.model() != v1::MODEL_USER)
    return Bad("optimizer 'workers' (the program's optimizer on the workers) is for a user "
               "model: grps-worker's models have the servers' optimizers only");
  if (c.optimizer().kind() == v1::OPTIMIZER_WORKERS && c.sparse_tables_size() > 0)
    return Bad("optimizer 'workers': the rows of sparse tables are updated by the servers' "
               "optimizer; a job with sparse tables needs one (sgd, momentum, adam, adagrad)");
  if (c.model() != v1::MODEL_EMBEDDING) return absl::OkStatus();
  return ValidateEmbedding(c);
}

absl::Status JobEndedError(absl::string_view job_id, v1::JobState state) {
  return absl::FailedPreconditionError(
      absl::StrCat("job ", job_id, " has ended (", JobStateName(state), ")"));
}

bool IsJobEnded(const absl::Status& status) {
  return absl::IsFailedPrecondition(status) &&
         absl::StartsWith(status.message(), "job ") &&
         absl::StrContains(status.message(), " has ended (");
}

std::vector<std::string> EmbeddingTables(const v1::JobConfig& config) {
  if (config.dataset().format() != "criteo") return {kEmbeddingTable};
  std::vector<std::string> tables;
  for (int j = 1; j <= kCriteoTables; ++j) tables.push_back(absl::StrCat(kEmbeddingTable, ".C", j));
  tables.push_back(absl::StrCat(kEmbeddingTable, ".I"));  // kCriteoDenseField
  return tables;
}

std::vector<int64_t> LayerWidths(const v1::JobConfig& config) {
  std::vector<int64_t> widths{config.model() == v1::MODEL_EMBEDDING
                                  ? static_cast<int64_t>(config.embedding_dim()) *
                                        static_cast<int64_t>(EmbeddingTables(config).size())
                                  : config.input_features()};
  if (config.model() == v1::MODEL_MLP || config.model() == v1::MODEL_EMBEDDING)
    for (uint32_t h : config.hidden_units()) widths.push_back(h);
  widths.push_back(config.num_classes());
  return widths;
}

std::vector<v1::TensorSpec> ModelTensors(const v1::JobConfig& config) {
  if (config.model() == v1::MODEL_USER)
    return {config.model_tensors().begin(), config.model_tensors().end()};
  std::vector<int64_t> widths = LayerWidths(config);
  std::vector<v1::TensorSpec> tensors;
  for (size_t l = 0; l + 1 < widths.size(); ++l) {
    v1::TensorSpec w;
    w.set_name(absl::StrCat("dense_", l, "/weight"));
    w.add_shape(widths[l]);
    w.add_shape(widths[l + 1]);
    w.set_initializer("glorot_uniform");
    tensors.push_back(w);
    v1::TensorSpec b;
    b.set_name(absl::StrCat("dense_", l, "/bias"));
    b.add_shape(widths[l + 1]);
    b.set_initializer("zeros");
    tensors.push_back(b);
  }
  return tensors;
}

namespace {
template <typename E>
absl::StatusOr<E> Lookup(absl::string_view name, absl::string_view what,
                         std::initializer_list<std::pair<const char*, E>> table) {
  std::string lower = absl::AsciiStrToLower(name);
  std::string known;
  for (const auto& [n, e] : table) {
    if (lower == n) return e;
    absl::StrAppend(&known, known.empty() ? "" : ", ", n);
  }
  return absl::InvalidArgumentError(
      absl::StrCat("unknown ", what, " '", name, "' (one of: ", known, ")"));
}
}  // namespace

absl::StatusOr<v1::ConsistencyMode> ParseMode(absl::string_view name) {
  return Lookup<v1::ConsistencyMode>(
      name, "mode",
      {{"sync", v1::MODE_SYNC}, {"async", v1::MODE_ASYNC}, {"ssp", v1::MODE_SSP}});
}

absl::StatusOr<v1::LateGradientPolicy> ParseLateGradients(absl::string_view name) {
  return Lookup<v1::LateGradientPolicy>(
      name, "late gradient policy",
      {{"fold", v1::LATE_GRADIENTS_FOLD}, {"drop", v1::LATE_GRADIENTS_DROP}});
}

std::string LateGradientsName(v1::LateGradientPolicy policy) {
  return policy == v1::LATE_GRADIENTS_DROP ? "drop" : "fold";
}

absl::StatusOr<v1::CheckpointStorage> ParseCheckpointStorage(absl::string_view name) {
  return Lookup<v1::CheckpointStorage>(name, "checkpoint storage",
                                       {{"shared", v1::CHECKPOINT_STORAGE_SHARED},
                                        {"per_shard", v1::CHECKPOINT_STORAGE_PER_SHARD}});
}

std::string CheckpointStorageName(v1::CheckpointStorage storage) {
  return storage == v1::CHECKPOINT_STORAGE_PER_SHARD ? "per_shard" : "shared";
}

absl::StatusOr<v1::LocalTransport> ParseLocalTransport(absl::string_view name) {
  return Lookup<v1::LocalTransport>(name, "local transport",
                                    {{"shm", v1::LOCAL_TRANSPORT_SHARED_MEMORY},
                                     {"grpc", v1::LOCAL_TRANSPORT_GRPC}});
}

std::string LocalTransportName(v1::LocalTransport transport) {
  return transport == v1::LOCAL_TRANSPORT_GRPC ? "grpc" : "shm";
}

absl::StatusOr<v1::ModelKind> ParseModel(absl::string_view name) {
  return Lookup<v1::ModelKind>(
      name, "model",
      {{"mlp", v1::MODEL_MLP}, {"softmax", v1::MODEL_SOFTMAX}, {"embedding", v1::MODEL_EMBEDDING},
       {"user", v1::MODEL_USER}});
}

absl::StatusOr<v1::OptimizerKind> ParseOptimizer(absl::string_view name) {
  return Lookup<v1::OptimizerKind>(name, "optimizer",
                                   {{"sgd", v1::OPTIMIZER_SGD},
                                    {"momentum", v1::OPTIMIZER_MOMENTUM},
                                    {"nesterov", v1::OPTIMIZER_NESTEROV},
                                    {"adam", v1::OPTIMIZER_ADAM},
                                    {"adagrad", v1::OPTIMIZER_ADAGRAD},
                                    {"workers", v1::OPTIMIZER_WORKERS}});
}

absl::StatusOr<std::vector<uint32_t>> ParseHiddenUnits(absl::string_view csv) {
  std::vector<uint32_t> units;
  // "" and "none": no hidden layer. An empty width between commas is a
  // typo, not "none" ("--hidden=," trained softmax regression, silently).
  const absl::string_view stripped = absl::StripAsciiWhitespace(csv);
  if (stripped.empty() || stripped == "none") return units;
  for (absl::string_view part : absl::StrSplit(csv, ',')) {
    uint32_t v = 0;
    if (!absl::SimpleAtoi(part, &v) || v == 0)
      return absl::InvalidArgumentError(
          absl::StrCat("hidden units must be positive integers, got '", part, "'"));
    units.push_back(v);
  }
  return units;
}

std::string ModeName(v1::ConsistencyMode mode) {
  switch (mode) {
    case v1::MODE_SYNC: return "sync";
    case v1::MODE_ASYNC: return "async";
    case v1::MODE_SSP: return "ssp";
    default: return "unspecified";
  }
}

std::string ModelName(v1::ModelKind model) {
  switch (model) {
    case v1::MODEL_MLP: return "mlp";
    case v1::MODEL_SOFTMAX: return "softmax";
    case v1::MODEL_EMBEDDING: return "embedding";
    case v1::MODEL_USER: return "user";
    default: return "unspecified";
  }
}

uint32_t OptimizerStateSlots(v1::OptimizerKind kind) {
  switch (kind) {
    case v1::OPTIMIZER_MOMENTUM:
    case v1::OPTIMIZER_NESTEROV:
    case v1::OPTIMIZER_ADAGRAD:
      return 1;
    case v1::OPTIMIZER_ADAM:
      return 2;
    default:
      return 0;
  }
}

std::string OptimizerName(v1::OptimizerKind kind) {
  switch (kind) {
    case v1::OPTIMIZER_SGD: return "sgd";
    case v1::OPTIMIZER_MOMENTUM: return "momentum";
    case v1::OPTIMIZER_NESTEROV: return "nesterov";
    case v1::OPTIMIZER_ADAM: return "adam";
    case v1::OPTIMIZER_ADAGRAD: return "adagrad";
    case v1::OPTIMIZER_WORKERS: return "workers";
    default: return "unspecified";
  }
}

std::string JobStateName(v1::JobState state) {
  switch (state) {
    case v1::JOB_STATE_WAITING: return "waiting";
    case v1::JOB_STATE_RUNNING: return "running";
    case v1::JOB_STATE_COMPLETED: return "completed";
    case v1::JOB_STATE_FAILED: return "failed";
    case v1::JOB_STATE_STOPPED: return "stopped";
    default: return "unspecified";
  }
}

std::string MemberStateName(v1::MemberState state) {
  switch (state) {
    case v1::MEMBER_STATE_ALIVE: return "alive";
    case v1::MEMBER_STATE_DEAD: return "dead";
    case v1::MEMBER_STATE_FINISHED: return "finished";
    case v1::MEMBER_STATE_LEFT: return "left";
    default: return "unspecified";
  }
}

float ScheduledLearningRate(const v1::OptimizerConfig& opt, uint64_t step) {
  double lr = opt.learning_rate();
  if (opt.warmup_steps() > 0 && step < opt.warmup_steps())
    lr *= static_cast<double>(step + 1) / opt.warmup_steps();
  if (opt.decay_steps() > 0 && opt.decay_rate() > 0) {
    uint64_t after = step >= opt.warmup_steps() ? step - opt.warmup_steps() : 0;
    lr *= std::pow(static_cast<double>(opt.decay_rate()),
                   static_cast<double>(after / opt.decay_steps()));
  }
  return static_cast<float>(lr);
}

float AsyncLearningRate(const v1::JobConfig& config, uint64_t version,
                        uint64_t staleness, const v1::OptimizerConfig* program) {
  const uint32_t workers = std::max<uint32_t>(1, config.num_workers());
  float lr = (program != nullptr ? program->learning_rate()
                                 : ScheduledLearningRate(config.optimizer(), version / workers)) /
             workers;
  if (config.staleness_aware_lr()) lr /= static_cast<float>(1 + staleness);
  return lr;
}

uint32_t AccumulateSteps(const v1::JobConfig& config) {
  return std::max<uint32_t>(1, config.accumulate_steps());
}

uint64_t StepExamples(const v1::JobConfig& config) {
  return static_cast<uint64_t>(std::max<uint32_t>(1, config.batch_size())) *
         AccumulateSteps(config);
}

uint32_t JobRanks(const v1::JobConfig& config) {
  return std::max(config.num_workers(), config.max_workers());
}

bool IsElastic(const v1::JobConfig& config) { return config.max_workers() > 0; }

LedgerShape ExampleLedgerShape(const v1::JobConfig& config, uint64_t train_examples) {
  LedgerShape shape;
  shape.blocks_per_epoch = std::max<uint64_t>(1, train_examples / StepExamples(config));
  shape.total_blocks = config.steps() > 0
                           ? config.steps() * std::max<uint32_t>(1, config.num_workers())
                           : shape.blocks_per_epoch * std::max<uint32_t>(1, config.epochs());
  return shape;
}

uint64_t TotalSteps(const v1::JobConfig& config, uint64_t train_examples) {
  if (config.steps() > 0) return config.steps();
  uint64_t per_worker = train_examples / std::max<uint32_t>(1, config.num_workers());
  uint64_t per_epoch = per_worker / StepExamples(config);
  return std::max<uint64_t>(1, per_epoch * config.epochs());
}

}  // namespace grps
