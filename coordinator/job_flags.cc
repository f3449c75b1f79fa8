#include "coordinator/job_flags.h"

#include <algorithm>
#include <cstdint>
#include <string>

#include "absl/flags/commandlineflag.h"
#include "absl/flags/flag.h"
#include "absl/flags/reflection.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "data/synthetic_sparse.h"
#include "job/job_config.h"
#include "job/sparse_tables.h"
#include "tensor/dtype.h"
#include "wire/chunk_codec.h"

namespace {

// Flag defaults come from here, so `--help` shows the real defaults.
const grps::v1::JobConfig& Defaults() {
  static const grps::v1::JobConfig* config =
      new grps::v1::JobConfig(grps::DefaultJobConfig());
  return *config;
}

// A wire dtype by its name in tensor/ ("f32", "f16", "bf16").
std::string DTypeFlagName(grps::v1::DType dtype) {
  return std::string(grps::DTypeName(*grps::DTypeFromWire(dtype, true, "wire_dtype")));
}

}  // namespace

ABSL_FLAG(std::string, job_id, Defaults().job_id(),
          "job name; every daemon's requests must carry it");
ABSL_FLAG(std::string, mode, grps::ModeName(Defaults().mode()),
          "consistency mode: sync (BSP), async (ASP) or ssp (bounded staleness)");
ABSL_FLAG(uint32_t, staleness, Defaults().staleness_bound(),
          "ssp: how many clocks a worker may run ahead of the slowest live one");
ABSL_FLAG(std::string, model, grps::ModelName(Defaults().model()),
          "model: mlp, softmax (softmax regression, no hidden layers) or embedding "
          "(sparse features -> embedding bag -> the mlp head of --hidden)");
ABSL_FLAG(std::string, hidden, absl::StrJoin(Defaults().hidden_units(), ","),
          "mlp hidden layer widths, comma-separated (\"\" or none for none)");
ABSL_FLAG(std::string, dataset, Defaults().dataset().path(),
          "idx and idx-sparse: directory of IDX files "
          "({train,t10k}-{images-idx3,labels-idx1}-ubyte[.gz]); csv and libsvm: the "
          "training set's file; criteo: the training set's TSV file (plain or gzip)");
ABSL_FLAG(std::string, data_format, "",
          "dataset format: idx or csv (dense models); idx-sparse, libsvm, synthetic or "
          "criteo (the embedding model; criteo: a table per field, 27); \"\" = idx for a "
          "dense model, idx-sparse for the embedding model");
ABSL_FLAG(std::string, test_data, Defaults().dataset().test_path(),
          "csv, libsvm and criteo: the test set's file (--dataset is the training set's)");
ABSL_FLAG(bool, csv_header, Defaults().dataset().csv_header(),
          "csv: the first line is a header");
ABSL_FLAG(int32_t, csv_label_column, Defaults().dataset().csv_label_column(),
          "csv: the label's column, from 0 (-1: the last)");
ABSL_FLAG(bool, libsvm_zero_based, Defaults().dataset().libsvm_zero_based(),
          "libsvm: ids are numbered from 0 (default: from 1, as libsvm writes them)");
ABSL_FLAG(uint32_t, sparse_buckets, Defaults().dataset().sparse_buckets(),
          "idx-sparse: intensity buckets per pixel, each its own feature id (0 = 4)");
ABSL_FLAG(uint64_t, synthetic_train, 0,
          "synthetic: training examples (0 = the generator's 100000)");
ABSL_FLAG(uint64_t, synthetic_test, 0, "synthetic: test examples (0 = 10000)");
ABSL_FLAG(uint64_t, synthetic_vocabulary, 0,
          "synthetic: distinct feature ids (0 = 10000)");
ABSL_FLAG(uint32_t, synthetic_features, 0,
          "synthetic: feature ids per example (0 = 10)");
ABSL_FLAG(double, synthetic_zipf, -1,
          "synthetic: skew of the ids' frequencies, in [0, 4] (-1 = 0.5)");
ABSL_FLAG(double, synthetic_margin, -1,
          "synthetic: examples nearer the true boundary are redrawn, in [0, 10] "
          "(-1 = 1.25)");
ABSL_FLAG(double, synthetic_noise, -1,
          "synthetic: chance a label is redrawn at random, in [0, 1) (-1 = 0.1)");
ABSL_FLAG(uint32_t, classes, Defaults().num_classes(), "classes of the data set");
ABSL_FLAG(uint32_t, features, Defaults().input_features(),
          "dense models: features per example");
ABSL_FLAG(uint32_t, embedding_dim, 64, "embedding model: floats per embedding row");
ABSL_FLAG(uint64_t, embedding_rows, 0,
          "embedding model: rows of the table (0 = ids unbounded); a feature is its "
          "own row id when the data's feature space fits, else features are hashed "
          "into the rows");
ABSL_FLAG(std::string, embedding_combiner, "sum",
          "embedding model: how an example's rows are pooled, sum or mean");
ABSL_FLAG(uint64_t, embedding_max_rows_per_shard, 0,
          "embedding model: rows one shard may hold of a table (0 = no limit); past it a push is "
          "refused, or rows leave with --embedding_eviction");
ABSL_FLAG(std::string, embedding_eviction, "none",
          "embedding model: past --embedding_max_rows_per_shard, none (refuse the push), lru "
          "(the least recently updated rows leave) or lfu (the least often updated)");
ABSL_FLAG(uint32_t, embedding_admit_after, 0,
          "embedding model: a row is created by the K-th update naming its id; the earlier "
          "ones are dropped (0 or 1: the first)");
ABSL_FLAG(uint64_t, embedding_evict_after, 0,
          "embedding model: rows not updated in this many of the table's updates on their "
          "shard leave (0 = never)");
ABSL_FLAG(std::string, sparse_tables, "",
          "user model (--model=user): the job's sparse tables, "
          "NAME:ROWS:DIM[:INIT_SCALE][:KEY=VALUE...] separated by commas (ROWS 0: any int64 "
          "id; KEY max_rows, eviction=none|lru|lfu, admit_after or evict_after, as the "
          "--embedding_ flags, or rowwise_adagrad=1: one AdaGrad accumulator a row); a worker's gt.EmbeddingBag(NAME, DIM) reads and trains them");
ABSL_FLAG(uint64_t, train_limit, Defaults().dataset().train_limit(),
          "use only the first N training examples (0 = all); at least a step's for "
          "each worker (workers x batch x accumulate_steps)");
ABSL_FLAG(uint64_t, test_limit, Defaults().dataset().test_limit(),
          "use only the first N test examples (0 = all)");
ABSL_FLAG(std::string, optimizer, grps::OptimizerName(Defaults().optimizer().kind()),
          "optimizer: sgd, momentum, nesterov, adam or adagrad (on the servers), or workers "
          "(a user model's program runs its own: the servers average, or add changes)");
ABSL_FLAG(float, lr, Defaults().optimizer().learning_rate(), "learning rate");
ABSL_FLAG(float, momentum, Defaults().optimizer().momentum(),
          "momentum (momentum and nesterov optimizers)");
ABSL_FLAG(float, weight_decay, Defaults().optimizer().weight_decay(),
          "weight decay, added to the gradient as wd * parameter");
ABSL_FLAG(uint32_t, warmup_steps, Defaults().optimizer().warmup_steps(),
          "linear learning-rate warm-up over this many updates");
ABSL_FLAG(uint32_t, decay_steps, Defaults().optimizer().decay_steps(),
          "after warm-up, multiply the learning rate by --decay_rate every this "
          "many updates (0 = no decay)");
ABSL_FLAG(float, decay_rate, Defaults().optimizer().decay_rate(),
          "learning-rate decay factor, in (0, 1]");
ABSL_FLAG(uint32_t, batch, Defaults().batch_size(), "examples per worker per step");
ABSL_FLAG(uint32_t, epochs, Defaults().epochs(),
          "passes over each worker's data partition (used when --steps=0)");
ABSL_FLAG(uint64_t, steps, Defaults().steps(),
          "steps per worker (0 = derive from --epochs)");
ABSL_FLAG(uint32_t, servers, Defaults().num_servers(), "parameter server shards");
ABSL_FLAG(uint32_t, workers, Defaults().num_workers(),
          "workers that start the job (all of them, unless --max_workers)");
ABSL_FLAG(uint32_t, max_workers, 0,
          "elastic job: ranks up to this many may join while it trains, and the data is "
          "leased from the coordinator (0: exactly --workers; docs/elasticity.md)");
ABSL_FLAG(uint32_t, max_servers, 0,
          "servers scale live: grpsctl scale --servers K re-shards the running job to up to "
          "this many shards (0: exactly --servers; needs --checkpoint_dir; "
          "docs/elasticity.md)");
ABSL_FLAG(uint32_t, min_workers, 0,
          "elastic job: a drain that would leave fewer live workers is refused (0: 1)");
ABSL_FLAG(uint64_t, seed, Defaults().seed(), "seed for initialization and shuffling");
ABSL_FLAG(uint64_t, chunk_kb, Defaults().chunk_bytes() / 1024,
          "target dense chunk size in KiB (f32): a few ms of the slowest link (256: 10 ms at "
          "200 Mbit/s; 4096 suits 10 Gbit/s, or gRPC on one machine)");
ABSL_FLAG(uint64_t, part_kb, 0,
          "the most KiB of values a worker sends a shard in one request (0: by the link, 4096 "
          "to shards at an address of the worker's machine, 256 to others; docs/performance.md)");
ABSL_FLAG(std::string, wire_dtype, DTypeFlagName(Defaults().wire_dtype()),
          "dtype of pushed gradients and pulled weights: f32, f16 or bf16");
ABSL_FLAG(float, topk, Defaults().gradient_topk(),
          "push only this fraction of each chunk's gradient elements, the largest, "
          "keeping the rest on the worker for its next push (top-k with error "
          "feedback); 0 = whole gradients");
ABSL_FLAG(uint32_t, accumulate_steps, Defaults().accumulate_steps(),
          "each push carries the mean gradient of this many local batches of "
          "--batch (gradient accumulation; 0 or 1 = one)");
ABSL_FLAG(float, clip_norm, Defaults().clip_norm(),
          "scale each worker's gradient down to this global L2 norm before the "
          "push when it is longer (0 = no clipping by norm)");
ABSL_FLAG(float, clip_value, Defaults().clip_value(),
          "clamp each gradient element to [-v, v] before the push (0 = no "
          "clipping by value)");
ABSL_FLAG(std::string, compute_dtype, DTypeFlagName(Defaults().compute_dtype()),
          "dense models: the workers' forward and backward passes compute in f32, "
          "bf16 or f16 (mixed precision: the servers keep f32 weights; f16 scales "
          "the loss dynamically)");
ABSL_FLAG(float, loss_scale, Defaults().loss_scale(),
          "f16 compute: the initial loss scale, 0 (65536) or in [1, 2^24]; it halves "
          "when a gradient overflows and doubles after 2000 finite steps");
ABSL_FLAG(uint32_t, eval_every, Defaults().eval_every_steps(),
          "evaluate test accuracy every this many steps (0 = only at the end)");
ABSL_FLAG(uint32_t, heartbeat_ms, Defaults().heartbeat_interval_ms(),
          "heartbeat interval of every daemon, in ms");
ABSL_FLAG(uint32_t, heartbeat_timeout_ms, Defaults().heartbeat_timeout_ms(),
          "a member silent this long (ms) is declared dead; at least 3 x --heartbeat_ms "
          "and 100");
ABSL_FLAG(uint32_t, max_staleness, Defaults().max_staleness(),
          "async and ssp: reject gradients staler than this (0 = no limit)");
ABSL_FLAG(bool, staleness_aware_lr, Defaults().staleness_aware_lr(),
          "async and ssp: scale the learning rate by 1 / (1 + staleness)");
ABSL_FLAG(uint32_t, backup_workers, Defaults().backup_workers(),
          "sync: complete a step with the first (live workers - this) gradients");
ABSL_FLAG(std::string, late_gradients,
          grps::LateGradientsName(Defaults().late_gradients()),
          "sync: a gradient that arrives after its step completed is counted "
          "and then folded into the next step (fold) or dropped (drop)");
ABSL_FLAG(std::string, checkpoint_dir, Defaults().checkpoint_dir(),
          "folder for checkpoints, reachable by every server and the "
          "coordinator (empty: no checkpoints); a job started with one "
          "resumes from its newest complete checkpoint");
ABSL_FLAG(std::string, checkpoint_storage,
          grps::CheckpointStorageName(Defaults().checkpoint_storage()),
          "shared: --checkpoint_dir is one folder that every server and the coordinator "
          "reach; per_shard: each server keeps its own shard's files (at the same path on "
          "a volume of its own, or at its --checkpoint_dir) and the coordinator only the "
          "manifests (a checkpoint then restores only into as many shards)");
ABSL_FLAG(std::string, local_transport,
          grps::LocalTransportName(Defaults().local_transport()),
          "how a worker's dense pushes and fused pulls reach a shard on the same machine: "
          "shm (through the worker's shared-memory lane, where the shard can map it; "
          "gRPC messages otherwise) or grpc (every byte through gRPC)");
ABSL_FLAG(uint64_t, checkpoint_every_steps, Defaults().checkpoint_every_steps(),
          "take a checkpoint every this many global steps (0 = not by steps); one is in "
          "flight at a time, so a fast job gets one per checkpoint's round trip (about 2 s; "
          "docs/durability.md)");
ABSL_FLAG(uint32_t, checkpoint_every_s, Defaults().checkpoint_every_seconds(),
          "take a checkpoint every this many seconds (0 = not by time)");
ABSL_FLAG(uint32_t, checkpoint_full_every, Defaults().checkpoint_full_every(),
          "incremental checkpoints: after a full checkpoint, up to this many in which each "
          "shard writes only the sparse rows changed since its previous one (dense chunks "
          "whole), then a full one again (0 = every checkpoint full)");
ABSL_FLAG(uint32_t, checkpoint_part_kib, Defaults().checkpoint_part_kib(),
          "a shard's file of a checkpoint holds at most this many KiB: past it, the rows of "
          "its sparse tables go to part files beside it (0 = 1 GiB; at most 2096128)");
ABSL_FLAG(uint32_t, recovery_timeout_ms, Defaults().recovery_timeout_ms(),
          "a shard dead this long, or no live and no finished worker for this "
          "long, fails the job (0 = 30000)");
ABSL_FLAG(uint32_t, coordinator_timeout_ms, Defaults().coordinator_timeout_ms(),
          "servers and workers that hear nothing from the coordinator this "
          "long exit non-zero (0 = 60000)");

namespace grps {

namespace {

// Declared in this file (__FILE__ as the build names it).
bool IsJobFlag(const absl::CommandLineFlag& flag) {
  return absl::EndsWith(flag.Filename(), "coordinator/job_flags.cc");
}

absl::Status FlagError(absl::string_view flag, const absl::Status& status) {
  return absl::InvalidArgumentError(absl::StrCat("--", flag, ": ", status.message()));
}

absl::StatusOr<v1::DType> ParseWireDType(absl::string_view name) {
  const std::string lower = absl::AsciiStrToLower(name);
  absl::StatusOr<DType> dtype = ParseDType(lower);
  if (!dtype.ok()) return dtype.status();
  return DTypeToWire(*dtype);
}

absl::Status SetDataset(v1::ModelKind model, v1::DatasetConfig* d) {
  std::string format = absl::AsciiStrToLower(absl::GetFlag(FLAGS_data_format));
  if (format.empty()) format = model == v1::MODEL_EMBEDDING ? "idx-sparse" : "idx";
  d->set_format(format);
  d->set_path(absl::GetFlag(FLAGS_dataset));
  d->set_test_path(absl::GetFlag(FLAGS_test_data));
  d->set_train_limit(absl::GetFlag(FLAGS_train_limit));
  d->set_test_limit(absl::GetFlag(FLAGS_test_limit));
  d->set_csv_header(absl::GetFlag(FLAGS_csv_header));
  d->set_csv_label_column(absl::GetFlag(FLAGS_csv_label_column));
  d->set_libsvm_zero_based(absl::GetFlag(FLAGS_libsvm_zero_based));
  d->set_sparse_buckets(absl::GetFlag(FLAGS_sparse_buckets));
  if (format != "synthetic") return absl::OkStatus();
  v1::SyntheticDataConfig* s = d->mutable_synthetic();
  s->set_num_train(absl::GetFlag(FLAGS_synthetic_train));
  s->set_num_test(absl::GetFlag(FLAGS_synthetic_test));
  s->set_vocabulary(absl::GetFlag(FLAGS_synthetic_vocabulary));
  s->set_features_per_example(absl::GetFlag(FLAGS_synthetic_features));
  // -1 is the generator's default; a flag set to another negative is
  // refused by validation.
  const SyntheticSparseOptions defaults;
  auto or_default = [](double flag, double fallback) { return flag == -1 ? fallback : flag; };
  s->set_zipf_exponent(or_default(absl::GetFlag(FLAGS_synthetic_zipf), defaults.zipf_exponent));
  s->set_margin(or_default(absl::GetFlag(FLAGS_synthetic_margin), defaults.margin));
  s->set_label_noise(or_default(absl::GetFlag(FLAGS_synthetic_noise), defaults.label_noise));
  return absl::OkStatus();
}

absl::Status SetEmbedding(v1::JobConfig* c) {
  const std::string combiner = absl::AsciiStrToLower(absl::GetFlag(FLAGS_embedding_combiner));
  if (combiner == "sum") {
    c->set_embedding_combiner(v1::COMBINER_SUM);
  } else if (combiner == "mean") {
    c->set_embedding_combiner(v1::COMBINER_MEAN);
  } else {
    return absl::InvalidArgumentError(absl::StrCat(
        "--embedding_combiner: unknown combiner '", combiner, "' (one of: sum, mean)"));
  }
  c->set_embedding_dim(absl::GetFlag(FLAGS_embedding_dim));
  c->set_embedding_rows(absl::GetFlag(FLAGS_embedding_rows));
  // One table per field of the data, each with the same shape and policies.
  for (const std::string& name : EmbeddingTables(*c)) {
    v1::SparseTableSpec* table = c->add_sparse_tables();
    table->set_name(name);
    table->set_dim(c->embedding_dim());
    table->set_rows(c->embedding_rows());
    table->set_max_rows_per_shard(absl::GetFlag(FLAGS_embedding_max_rows_per_shard));
    table->set_admit_after(absl::GetFlag(FLAGS_embedding_admit_after));
    table->set_evict_after_updates(absl::GetFlag(FLAGS_embedding_evict_after));
    if (absl::Status s = SetTableOption("eviction", absl::GetFlag(FLAGS_embedding_eviction), table);
        !s.ok())
      return FlagError("embedding_eviction", s);
  }
  return absl::OkStatus();
}

absl::Status SetModel(v1::JobConfig* c) {
  absl::StatusOr<v1::ModelKind> model = ParseModel(absl::GetFlag(FLAGS_model));
  if (!model.ok()) return FlagError("model", model.status());
  c->set_model(*model);
  c->clear_hidden_units();
  if (*model == v1::MODEL_MLP || *model == v1::MODEL_EMBEDDING) {
    absl::StatusOr<std::vector<uint32_t>> hidden =
        ParseHiddenUnits(absl::GetFlag(FLAGS_hidden));
    if (!hidden.ok()) return FlagError("hidden", hidden.status());
    for (uint32_t units : *hidden) c->add_hidden_units(units);
  }
  c->set_num_classes(absl::GetFlag(FLAGS_classes));
  c->set_input_features(absl::GetFlag(FLAGS_features));
  if (absl::Status s = SetDataset(*model, c->mutable_dataset()); !s.ok()) return s;
  if (*model == v1::MODEL_EMBEDDING) return SetEmbedding(c);
  const std::string tables = absl::GetFlag(FLAGS_sparse_tables);
  if (tables.empty()) return absl::OkStatus();
  if (*model != v1::MODEL_USER)
    return absl::InvalidArgumentError(
        "--sparse_tables: a built-in model has its own table (--model=embedding)");
  absl::StatusOr<std::vector<v1::SparseTableSpec>> parsed = ParseSparseTables(tables);
  if (!parsed.ok()) return FlagError("sparse_tables", parsed.status());
  for (v1::SparseTableSpec& t : *parsed) *c->add_sparse_tables() = std::move(t);
  return absl::OkStatus();
}

absl::Status SetOptimizer(v1::OptimizerConfig* opt) {
  absl::StatusOr<v1::OptimizerKind> kind = ParseOptimizer(absl::GetFlag(FLAGS_optimizer));
  if (!kind.ok()) return FlagError("optimizer", kind.status());
  opt->set_kind(*kind);
  opt->set_learning_rate(absl::GetFlag(FLAGS_lr));
  opt->set_momentum(absl::GetFlag(FLAGS_momentum));
  opt->set_weight_decay(absl::GetFlag(FLAGS_weight_decay));
  opt->set_warmup_steps(absl::GetFlag(FLAGS_warmup_steps));
  opt->set_decay_steps(absl::GetFlag(FLAGS_decay_steps));
  opt->set_decay_rate(absl::GetFlag(FLAGS_decay_rate));
  return absl::OkStatus();
}

// The job's size, its wire and what a worker does to a gradient.
absl::Status SetShapeAndGradients(v1::JobConfig* c) {
  c->set_batch_size(absl::GetFlag(FLAGS_batch));
  c->set_epochs(absl::GetFlag(FLAGS_epochs));
  c->set_steps(absl::GetFlag(FLAGS_steps));
  c->set_num_servers(absl::GetFlag(FLAGS_servers));
  c->set_num_workers(absl::GetFlag(FLAGS_workers));
  c->set_max_workers(absl::GetFlag(FLAGS_max_workers));
  c->set_min_workers(absl::GetFlag(FLAGS_min_workers));
  c->set_max_servers(absl::GetFlag(FLAGS_max_servers));
  c->set_seed(absl::GetFlag(FLAGS_seed));
  const uint64_t chunk_kb = absl::GetFlag(FLAGS_chunk_kb);
  if (chunk_kb == 0 || chunk_kb > 16 * 1024)
    return absl::InvalidArgumentError(
        absl::StrCat("--chunk_kb must be in [1, 16384], got ", chunk_kb));
  c->set_chunk_bytes(chunk_kb * 1024);
  const uint64_t part_kb = absl::GetFlag(FLAGS_part_kb);
  if (part_kb != 0 && (part_kb < 16 || part_kb > 16 * 1024))
    return absl::InvalidArgumentError(
        absl::StrCat("--part_kb must be 0 (by the link) or in [16, 16384], got ", part_kb));
  c->set_part_bytes(part_kb * 1024);
  absl::StatusOr<v1::DType> wire = ParseWireDType(absl::GetFlag(FLAGS_wire_dtype));
  if (!wire.ok()) return FlagError("wire_dtype", wire.status());
  c->set_wire_dtype(*wire);
  absl::StatusOr<v1::LocalTransport> transport =
      ParseLocalTransport(absl::GetFlag(FLAGS_local_transport));
  if (!transport.ok()) return FlagError("local_transport", transport.status());
  c->set_local_transport(*transport);
  c->set_gradient_topk(absl::GetFlag(FLAGS_topk));
  c->set_accumulate_steps(absl::GetFlag(FLAGS_accumulate_steps));
  c->set_clip_norm(absl::GetFlag(FLAGS_clip_norm));
  c->set_clip_value(absl::GetFlag(FLAGS_clip_value));
  absl::StatusOr<v1::DType> compute = ParseWireDType(absl::GetFlag(FLAGS_compute_dtype));
  if (!compute.ok()) return FlagError("compute_dtype", compute.status());
  c->set_compute_dtype(*compute);
  c->set_loss_scale(absl::GetFlag(FLAGS_loss_scale));
  c->set_eval_every_steps(absl::GetFlag(FLAGS_eval_every));
  return absl::OkStatus();
}

// The mode's rules: staleness, backup workers, late gradients.
absl::Status SetMode(v1::JobConfig* c) {
  absl::StatusOr<v1::ConsistencyMode> mode = ParseMode(absl::GetFlag(FLAGS_mode));
  if (!mode.ok()) return FlagError("mode", mode.status());
  c->set_mode(*mode);
  c->set_staleness_bound(absl::GetFlag(FLAGS_staleness));
  c->set_max_staleness(absl::GetFlag(FLAGS_max_staleness));
  c->set_staleness_aware_lr(absl::GetFlag(FLAGS_staleness_aware_lr));
  c->set_backup_workers(absl::GetFlag(FLAGS_backup_workers));
  absl::StatusOr<v1::LateGradientPolicy> late =
      ParseLateGradients(absl::GetFlag(FLAGS_late_gradients));
  if (!late.ok()) return FlagError("late_gradients", late.status());
  c->set_late_gradients(*late);
  return absl::OkStatus();
}

// Heartbeats, timeouts and checkpoints.
absl::Status SetFaultTolerance(v1::JobConfig* c) {
  c->set_heartbeat_interval_ms(absl::GetFlag(FLAGS_heartbeat_ms));
  c->set_heartbeat_timeout_ms(absl::GetFlag(FLAGS_heartbeat_timeout_ms));
  c->set_checkpoint_dir(absl::GetFlag(FLAGS_checkpoint_dir));
  absl::StatusOr<v1::CheckpointStorage> storage =
      ParseCheckpointStorage(absl::GetFlag(FLAGS_checkpoint_storage));
  if (!storage.ok()) return FlagError("checkpoint_storage", storage.status());
  c->set_checkpoint_storage(*storage);
  c->set_checkpoint_every_steps(absl::GetFlag(FLAGS_checkpoint_every_steps));
  c->set_checkpoint_every_seconds(absl::GetFlag(FLAGS_checkpoint_every_s));
  c->set_checkpoint_full_every(absl::GetFlag(FLAGS_checkpoint_full_every));
  c->set_checkpoint_part_kib(absl::GetFlag(FLAGS_checkpoint_part_kib));
  c->set_recovery_timeout_ms(absl::GetFlag(FLAGS_recovery_timeout_ms));
  c->set_coordinator_timeout_ms(absl::GetFlag(FLAGS_coordinator_timeout_ms));
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<v1::JobConfig> JobConfigFromFlags() {
  v1::JobConfig c = DefaultJobConfig();
  c.set_job_id(absl::GetFlag(FLAGS_job_id));
  for (absl::Status (*set)(v1::JobConfig*) :
       {SetMode, SetModel, SetShapeAndGradients, SetFaultTolerance}) {
    if (absl::Status s = set(&c); !s.ok()) return s;
  }
  if (absl::Status s = SetOptimizer(c.mutable_optimizer()); !s.ok()) return s;
  if (absl::Status s = ValidateJobConfig(c); !s.ok()) return s;
  return c;
}

std::vector<std::pair<std::string, std::string>> ChangedJobFlags() {
  std::vector<std::pair<std::string, std::string>> changed;
  for (const auto& [name, flag] : absl::GetAllFlags()) {
    if (!IsJobFlag(*flag)) continue;
    std::string value = flag->CurrentValue();
    if (value != flag->DefaultValue()) changed.emplace_back(name, std::move(value));
  }
  std::sort(changed.begin(), changed.end());
  return changed;
}

}  // namespace grps
