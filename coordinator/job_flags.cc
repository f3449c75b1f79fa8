#include "coordinator/job_flags.h"

#include <cstdint>
#include <string>

#include "absl/flags/flag.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "job/job_config.h"
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
          "model: mlp or softmax (softmax regression, no hidden layers)");
ABSL_FLAG(std::string, hidden, absl::StrJoin(Defaults().hidden_units(), ","),
          "mlp hidden layer widths, comma-separated (\"\" for none)");
ABSL_FLAG(std::string, dataset, Defaults().dataset().path(),
          "directory of IDX files ({train,t10k}-{images-idx3,labels-idx1}-ubyte[.gz])");
ABSL_FLAG(uint64_t, train_limit, Defaults().dataset().train_limit(),
          "use only the first N training examples (0 = all)");
ABSL_FLAG(uint64_t, test_limit, Defaults().dataset().test_limit(),
          "use only the first N test examples (0 = all)");
ABSL_FLAG(std::string, optimizer, grps::OptimizerName(Defaults().optimizer().kind()),
          "server-side optimizer: sgd, momentum, nesterov, adam or adagrad");
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
ABSL_FLAG(uint32_t, workers, Defaults().num_workers(), "workers");
ABSL_FLAG(uint64_t, seed, Defaults().seed(), "seed for initialization and shuffling");
ABSL_FLAG(uint64_t, chunk_kb, Defaults().chunk_bytes() / 1024,
          "target dense chunk size in KiB (f32)");
ABSL_FLAG(std::string, wire_dtype, DTypeFlagName(Defaults().wire_dtype()),
          "dtype of pushed gradients and pulled weights: f32, f16 or bf16");
ABSL_FLAG(float, topk, Defaults().gradient_topk(),
          "push only this fraction of each chunk's gradient elements, the largest, "
          "keeping the rest on the worker for its next push (top-k with error "
          "feedback); 0 = whole gradients");
ABSL_FLAG(uint32_t, eval_every, Defaults().eval_every_steps(),
          "evaluate test accuracy every this many steps (0 = only at the end)");
ABSL_FLAG(uint32_t, heartbeat_ms, Defaults().heartbeat_interval_ms(),
          "heartbeat interval of every daemon, in ms");
ABSL_FLAG(uint32_t, heartbeat_timeout_ms, Defaults().heartbeat_timeout_ms(),
          "a member silent this long (ms) is declared dead");
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
ABSL_FLAG(uint64_t, checkpoint_every_steps, Defaults().checkpoint_every_steps(),
          "take a checkpoint every this many global steps (0 = not by steps)");
ABSL_FLAG(uint32_t, checkpoint_every_s, Defaults().checkpoint_every_seconds(),
          "take a checkpoint every this many seconds (0 = not by time)");
ABSL_FLAG(uint32_t, recovery_timeout_ms, Defaults().recovery_timeout_ms(),
          "a shard dead this long, or no live and no finished worker for this "
          "long, fails the job (0 = 30000)");
ABSL_FLAG(uint32_t, coordinator_timeout_ms, Defaults().coordinator_timeout_ms(),
          "servers and workers that hear nothing from the coordinator this "
          "long exit non-zero (0 = 60000)");

namespace grps {

namespace {

absl::Status FlagError(absl::string_view flag, const absl::Status& status) {
  return absl::InvalidArgumentError(absl::StrCat("--", flag, ": ", status.message()));
}

absl::StatusOr<v1::DType> ParseWireDType(absl::string_view name) {
  const std::string lower = absl::AsciiStrToLower(name);
  absl::StatusOr<DType> dtype = ParseDType(lower);
  if (!dtype.ok()) return dtype.status();
  return DTypeToWire(*dtype);
}

}  // namespace

absl::StatusOr<v1::JobConfig> JobConfigFromFlags() {
  v1::JobConfig c = DefaultJobConfig();
  c.set_job_id(absl::GetFlag(FLAGS_job_id));

  absl::StatusOr<v1::ConsistencyMode> mode = ParseMode(absl::GetFlag(FLAGS_mode));
  if (!mode.ok()) return FlagError("mode", mode.status());
  c.set_mode(*mode);
  c.set_staleness_bound(absl::GetFlag(FLAGS_staleness));

  absl::StatusOr<v1::ModelKind> model = ParseModel(absl::GetFlag(FLAGS_model));
  if (!model.ok()) return FlagError("model", model.status());
  c.set_model(*model);
  c.clear_hidden_units();
  if (*model == v1::MODEL_MLP) {
    absl::StatusOr<std::vector<uint32_t>> hidden =
        ParseHiddenUnits(absl::GetFlag(FLAGS_hidden));
    if (!hidden.ok()) return FlagError("hidden", hidden.status());
    for (uint32_t units : *hidden) c.add_hidden_units(units);
  }

  c.mutable_dataset()->set_path(absl::GetFlag(FLAGS_dataset));
  c.mutable_dataset()->set_train_limit(absl::GetFlag(FLAGS_train_limit));
  c.mutable_dataset()->set_test_limit(absl::GetFlag(FLAGS_test_limit));

  v1::OptimizerConfig* opt = c.mutable_optimizer();
  absl::StatusOr<v1::OptimizerKind> kind =
      ParseOptimizer(absl::GetFlag(FLAGS_optimizer));
  if (!kind.ok()) return FlagError("optimizer", kind.status());
  opt->set_kind(*kind);
  opt->set_learning_rate(absl::GetFlag(FLAGS_lr));
  opt->set_momentum(absl::GetFlag(FLAGS_momentum));
  opt->set_weight_decay(absl::GetFlag(FLAGS_weight_decay));
  opt->set_warmup_steps(absl::GetFlag(FLAGS_warmup_steps));
  opt->set_decay_steps(absl::GetFlag(FLAGS_decay_steps));
  opt->set_decay_rate(absl::GetFlag(FLAGS_decay_rate));

  c.set_batch_size(absl::GetFlag(FLAGS_batch));
  c.set_epochs(absl::GetFlag(FLAGS_epochs));
  c.set_steps(absl::GetFlag(FLAGS_steps));
  c.set_num_servers(absl::GetFlag(FLAGS_servers));
  c.set_num_workers(absl::GetFlag(FLAGS_workers));
  c.set_seed(absl::GetFlag(FLAGS_seed));

  const uint64_t chunk_kb = absl::GetFlag(FLAGS_chunk_kb);
  if (chunk_kb == 0 || chunk_kb > 64 * 1024)
    return absl::InvalidArgumentError(
        absl::StrCat("--chunk_kb must be in [1, 65536], got ", chunk_kb));
  c.set_chunk_bytes(chunk_kb * 1024);

  absl::StatusOr<v1::DType> wire = ParseWireDType(absl::GetFlag(FLAGS_wire_dtype));
  if (!wire.ok()) return FlagError("wire_dtype", wire.status());
  c.set_wire_dtype(*wire);

  c.set_gradient_topk(absl::GetFlag(FLAGS_topk));
  c.set_eval_every_steps(absl::GetFlag(FLAGS_eval_every));
  c.set_heartbeat_interval_ms(absl::GetFlag(FLAGS_heartbeat_ms));
  c.set_heartbeat_timeout_ms(absl::GetFlag(FLAGS_heartbeat_timeout_ms));
  c.set_max_staleness(absl::GetFlag(FLAGS_max_staleness));
  c.set_staleness_aware_lr(absl::GetFlag(FLAGS_staleness_aware_lr));
  c.set_backup_workers(absl::GetFlag(FLAGS_backup_workers));
  absl::StatusOr<v1::LateGradientPolicy> late =
      ParseLateGradients(absl::GetFlag(FLAGS_late_gradients));
  if (!late.ok()) return FlagError("late_gradients", late.status());
  c.set_late_gradients(*late);

  c.set_checkpoint_dir(absl::GetFlag(FLAGS_checkpoint_dir));
  c.set_checkpoint_every_steps(absl::GetFlag(FLAGS_checkpoint_every_steps));
  c.set_checkpoint_every_seconds(absl::GetFlag(FLAGS_checkpoint_every_s));
  c.set_recovery_timeout_ms(absl::GetFlag(FLAGS_recovery_timeout_ms));
  c.set_coordinator_timeout_ms(absl::GetFlag(FLAGS_coordinator_timeout_ms));

  if (absl::Status s = ValidateJobConfig(c); !s.ok()) return s;
  return c;
}

}  // namespace grps
