// grps-local: runs a whole training job on this machine (a coordinator, N
// servers and M workers on loopback), shows its progress and prints the
// result. See launcher/local_launcher.h for what it does and leaves behind.
//
// Job settings (model, optimizer, steps, ...) are passed to the coordinator
// only when set here (on the command line or as GRPS_<FLAG>); the others take
// the coordinator's defaults, so the two never disagree.
//
// Exit status: 0 the job completed; 1 it failed (see the message and the run
// dir's logs); 2 a usage error; 130 interrupted (Ctrl-C or SIGTERM).
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/reflection.h"
#include "absl/flags/usage_config.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "daemon/daemon.h"
#include "job/job_config.h"
#include "launcher/local_launcher.h"

// Launcher settings.
ABSL_FLAG(std::string, mode, "sync", "consistency mode: sync, async or ssp");
ABSL_FLAG(uint32_t, servers, 2, "parameter server shards (grps-server processes)");
ABSL_FLAG(uint32_t, workers, 2, "workers (grps-worker processes)");
ABSL_FLAG(std::string, backend, "auto", "the workers' compute backend: auto, cpu or cuda");
ABSL_FLAG(std::string, run_dir, "",
          "where logs, the port file and training curves go "
          "(default runs/<mode>-<YYYYmmdd-HHMMSS> under the current directory)");
ABSL_FLAG(std::string, result_json, "",
          "write the result (accuracy, throughput, wall time) as JSON here");
ABSL_FLAG(std::string, bin_dir, "",
          "directory of grps-coordinator, grps-server and grps-worker "
          "(default: this program's directory)");
ABSL_FLAG(double, timeout_s, 0, "fail the job after this many seconds (0 = never)");
ABSL_FLAG(bool, strict, false,
          "any child's failure fails the launch, a worker's included (by default a "
          "worker that dies is reported and the job goes on without it)");
ABSL_FLAG(uint32_t, restart_workers, 0,
          "restart a worker that died, with the same --rank, up to this many times "
          "in total");
ABSL_FLAG(uint32_t, restart_servers, 10,
          "restart a server killed by a signal (a crash), with the same --shard, up "
          "to this many times in total; it reloads the newest checkpoint");
ABSL_FLAG(uint32_t, restart_coordinator, 3,
          "restart a coordinator killed by a signal, on the same port, up to this "
          "many times; it takes the job back from its state in the run dir");
ABSL_FLAG(bool, auth, true,
          "authenticate every RPC of the job: the launcher generates an admin "
          "and a worker token (unless GRPS_TOKEN / GRPS_WORKER_TOKEN give them) "
          "and writes the admin token to RUN_DIR/token; --noauth: none. TLS on "
          "request: --tls_cert, --tls_key, --tls_ca [--tls_client_auth] go to "
          "every daemon");
ABSL_FLAG(std::optional<uint32_t>, straggler_rank, std::nullopt,
          "inject a straggler: the worker of this rank gets --straggle_factor and "
          "--straggle_ms");
ABSL_FLAG(std::optional<double>, straggle_factor, std::nullopt,
          "the straggler sleeps (F - 1) x its own step time every step (F >= 1)");
ABSL_FLAG(std::optional<uint32_t>, straggle_ms, std::nullopt,
          "the straggler sleeps this many milliseconds every step");

// Job settings, forwarded to the coordinator when set (see kJobFlags).
ABSL_FLAG(std::optional<std::string>, model, std::nullopt,
          "model: mlp, softmax or embedding (coordinator default: mlp)");
ABSL_FLAG(std::optional<std::string>, hidden, std::nullopt,
          "mlp hidden layer widths, e.g. 256,128, or none (coordinator default: 256,128)");
ABSL_FLAG(std::optional<std::string>, optimizer, std::nullopt,
          "sgd, momentum, nesterov, adam or adagrad (coordinator default: momentum)");
ABSL_FLAG(std::optional<float>, lr, std::nullopt, "learning rate");
ABSL_FLAG(std::optional<float>, momentum, std::nullopt, "momentum (momentum, nesterov)");
ABSL_FLAG(std::optional<float>, weight_decay, std::nullopt, "weight decay");
ABSL_FLAG(std::optional<uint32_t>, warmup_steps, std::nullopt,
          "learning-rate warm-up updates");
ABSL_FLAG(std::optional<uint32_t>, decay_steps, std::nullopt,
          "decay the learning rate every this many updates");
ABSL_FLAG(std::optional<float>, decay_rate, std::nullopt, "learning-rate decay factor");
ABSL_FLAG(std::optional<uint32_t>, batch, std::nullopt, "examples per worker per step");
ABSL_FLAG(std::optional<uint32_t>, epochs, std::nullopt,
          "passes over each worker's data (when --steps is not set)");
ABSL_FLAG(std::optional<uint64_t>, steps, std::nullopt, "steps per worker");
ABSL_FLAG(std::optional<std::string>, dataset, std::nullopt,
          "IDX dataset directory (coordinator default: "
          "/usr/share/datasets/fashion-mnist), or the csv or libsvm training file");
ABSL_FLAG(std::optional<std::string>, data_format, std::nullopt,
          "idx or csv (dense models); idx-sparse, libsvm or synthetic (embedding)");
ABSL_FLAG(std::optional<std::string>, test_data, std::nullopt,
          "csv and libsvm: the test set's file");
ABSL_FLAG(std::optional<bool>, csv_header, std::nullopt, "csv: the first line is a header");
ABSL_FLAG(std::optional<int32_t>, csv_label_column, std::nullopt,
          "csv: the label's column (-1: the last)");
ABSL_FLAG(std::optional<bool>, libsvm_zero_based, std::nullopt,
          "libsvm: ids are numbered from 0");
ABSL_FLAG(std::optional<uint32_t>, sparse_buckets, std::nullopt,
          "idx-sparse: intensity buckets per pixel");
ABSL_FLAG(std::optional<uint64_t>, synthetic_train, std::nullopt,
          "synthetic: training examples");
ABSL_FLAG(std::optional<uint64_t>, synthetic_test, std::nullopt, "synthetic: test examples");
ABSL_FLAG(std::optional<uint64_t>, synthetic_vocabulary, std::nullopt,
          "synthetic: distinct feature ids");
ABSL_FLAG(std::optional<uint32_t>, synthetic_features, std::nullopt,
          "synthetic: feature ids per example");
ABSL_FLAG(std::optional<double>, synthetic_zipf, std::nullopt,
          "synthetic: skew of the ids' frequencies");
ABSL_FLAG(std::optional<double>, synthetic_margin, std::nullopt,
          "synthetic: redraw examples nearer the true boundary than this");
ABSL_FLAG(std::optional<double>, synthetic_noise, std::nullopt,
          "synthetic: chance a label is redrawn at random");
ABSL_FLAG(std::optional<uint32_t>, classes, std::nullopt, "classes of the data set");
ABSL_FLAG(std::optional<uint32_t>, features, std::nullopt,
          "dense models: features per example");
ABSL_FLAG(std::optional<uint32_t>, embedding_dim, std::nullopt,
          "embedding model: floats per row");
ABSL_FLAG(std::optional<uint64_t>, embedding_rows, std::nullopt,
          "embedding model: rows features are hashed into (0: no hashing)");
ABSL_FLAG(std::optional<std::string>, embedding_combiner, std::nullopt,
          "embedding model: sum or mean");
ABSL_FLAG(std::optional<uint64_t>, embedding_max_rows_per_shard, std::nullopt,
          "embedding model: rows one shard may create (0: no limit)");
ABSL_FLAG(std::optional<uint64_t>, train_limit, std::nullopt,
          "use only the first N training examples");
ABSL_FLAG(std::optional<uint64_t>, test_limit, std::nullopt,
          "use only the first N test examples");
ABSL_FLAG(std::optional<uint64_t>, seed, std::nullopt, "seed for initialization and shuffling");
ABSL_FLAG(std::optional<uint64_t>, chunk_kb, std::nullopt, "dense chunk size in KiB");
ABSL_FLAG(std::optional<std::string>, wire_dtype, std::nullopt,
          "dtype on the wire: f32, f16 or bf16");
ABSL_FLAG(std::optional<std::string>, local_transport, std::nullopt,
          "shm (the default: pushes and fused pulls through each worker's shared-memory "
          "lane) or grpc (every byte through gRPC)");
ABSL_FLAG(std::optional<float>, topk, std::nullopt,
          "push only this fraction of each gradient (top-k with error feedback)");
ABSL_FLAG(std::optional<uint32_t>, accumulate_steps, std::nullopt,
          "each push carries the mean gradient of this many local batches of "
          "--batch (gradient accumulation)");
ABSL_FLAG(std::optional<float>, clip_norm, std::nullopt,
          "scale each worker's gradient down to this global L2 norm before the push "
          "when it is longer");
ABSL_FLAG(std::optional<float>, clip_value, std::nullopt,
          "clamp each gradient element to [-v, v] before the push");
ABSL_FLAG(std::optional<std::string>, compute_dtype, std::nullopt,
          "dense models: the workers compute in f32, bf16 or f16 (mixed precision)");
ABSL_FLAG(std::optional<float>, loss_scale, std::nullopt,
          "f16 compute: the initial loss scale (0 = 65536)");
ABSL_FLAG(std::optional<uint32_t>, eval_every, std::nullopt,
          "evaluate every this many steps (0 = only at the end)");
ABSL_FLAG(std::optional<uint32_t>, heartbeat_ms, std::nullopt, "heartbeat interval (ms)");
ABSL_FLAG(std::optional<uint32_t>, heartbeat_timeout_ms, std::nullopt,
          "a member silent this long (ms) is dead");
ABSL_FLAG(std::optional<uint32_t>, staleness, std::nullopt, "ssp staleness bound");
ABSL_FLAG(std::optional<uint32_t>, max_staleness, std::nullopt,
          "async and ssp: reject gradients staler than this");
ABSL_FLAG(std::optional<bool>, staleness_aware_lr, std::nullopt,
          "async and ssp: scale the learning rate by 1 / (1 + staleness)");
ABSL_FLAG(std::optional<uint32_t>, backup_workers, std::nullopt,
          "sync: complete a step with the first (live workers - this) gradients");
ABSL_FLAG(std::optional<std::string>, checkpoint_dir, std::nullopt,
          "folder for checkpoints; a job started with one that holds a complete "
          "checkpoint of the same job id resumes from the newest");
ABSL_FLAG(std::optional<uint64_t>, checkpoint_every_steps, std::nullopt,
          "take a checkpoint every N global steps (needs --checkpoint_dir)");
ABSL_FLAG(std::optional<uint32_t>, checkpoint_every_s, std::nullopt,
          "take a checkpoint every N seconds (needs --checkpoint_dir)");
ABSL_FLAG(std::optional<uint32_t>, recovery_timeout_ms, std::nullopt,
          "a shard dead this long, or no live worker this long, fails the job");
ABSL_FLAG(std::optional<uint32_t>, coordinator_timeout_ms, std::nullopt,
          "servers and workers give up after hearing nothing from the coordinator "
          "this long");
ABSL_FLAG(std::optional<std::string>, late_gradients, std::nullopt,
          "sync: a gradient that arrives after its step completed is counted, then "
          "folded into the next step (fold) or dropped (drop)");

namespace grps {
namespace {

// The job flags above, named as grps-coordinator names them.
constexpr const char* kJobFlags[] = {
    "model",        "hidden",      "optimizer",  "lr",           "momentum",
    "weight_decay", "warmup_steps", "decay_steps", "decay_rate",  "batch",
    "epochs",       "steps",       "dataset",    "train_limit",  "test_limit",
    "seed",         "chunk_kb",    "wire_dtype", "local_transport", "topk", "eval_every",
    "accumulate_steps", "clip_norm", "clip_value", "compute_dtype", "loss_scale",
    "heartbeat_ms",
    "heartbeat_timeout_ms",        "staleness",  "max_staleness", "staleness_aware_lr",
    "backup_workers",              "late_gradients",
    "checkpoint_dir", "checkpoint_every_steps", "checkpoint_every_s",
    "recovery_timeout_ms", "coordinator_timeout_ms",
    "data_format", "test_data", "csv_header", "csv_label_column", "libsvm_zero_based",
    "sparse_buckets", "synthetic_train", "synthetic_test", "synthetic_vocabulary",
    "synthetic_features", "synthetic_zipf", "synthetic_margin", "synthetic_noise",
    "classes", "features", "embedding_dim", "embedding_rows", "embedding_combiner",
    "embedding_max_rows_per_shard",
};

constexpr char kUsage[] =
    "runs a whole grps training job on this machine: a coordinator, the\n"
    "servers and the workers as separate processes on loopback; shows its\n"
    "progress and prints the final test accuracy.\n"
    "\n"
    "usage: grps-local [--mode=sync|async|ssp] [--servers=2] [--workers=2]\n"
    "                  [--steps=N] [--run_dir=DIR] [--result_json=FILE] ...\n"
    "\n"
    "A worker that dies does not fail the job (the others go on); --strict\n"
    "makes it, --restart_workers=N restarts dead workers. A crashed server or\n"
    "coordinator is restarted (--restart_servers, --restart_coordinator); with\n"
    "--checkpoint_dir the job checkpoints and survives it. If gnuplot is on\n"
    "PATH, the workers' curves are plotted into <run_dir>/curves.svg.\n"
    "\n"
    "Job settings left unset (shown as \"default: ;\") take grps-coordinator's\n"
    "defaults. Every flag can also be set as GRPS_<FLAG>. Exit status: 0 completed,\n"
    "1 failed, 2 usage error, 130 interrupted.";

int UsageError(const std::string& message) {
  std::fprintf(stderr, "grps-local: %s\n", message.c_str());
  return 2;
}

// The directory this program lives in.
std::string OwnDirectory() {
  std::error_code ec;
  std::filesystem::path self = std::filesystem::read_symlink("/proc/self/exe", ec);
  return ec ? "." : self.parent_path().string();
}

// `base`, or base-2, base-3, ... if it exists (two launches in one second).
std::string Unused(const std::string& base) {
  std::string dir = base;
  for (int i = 2; std::filesystem::exists(dir); ++i) dir = absl::StrCat(base, "-", i);
  return dir;
}

int Main(int argc, char** argv) {
  // --help lists this file's flags (absl looks for a file named like the
  // program, grps-local, which has a dash).
  absl::FlagsUsageConfig usage_config;
  usage_config.contains_help_flags = [](absl::string_view file) {
    return absl::StrContains(file, "grps_local_main");
  };
  usage_config.contains_helpshort_flags = usage_config.contains_help_flags;
  absl::SetFlagsUsageConfig(usage_config);
  std::vector<char*> args = ParseFlagsWithEnvironment(argc, argv, kUsage);
  if (args.size() > 1)
    return UsageError(absl::StrCat("unexpected argument '", args[1], "'"));

  LaunchOptions options;
  options.mode = absl::GetFlag(FLAGS_mode);
  if (absl::Status s = ParseMode(options.mode).status(); !s.ok())
    return UsageError(absl::StrCat("--mode: ", s.message()));
  options.servers = absl::GetFlag(FLAGS_servers);
  options.workers = absl::GetFlag(FLAGS_workers);
  if (options.servers == 0 || options.workers == 0)
    return UsageError("--servers and --workers must be at least 1");
  options.backend = absl::GetFlag(FLAGS_backend);
  const double timeout_s = absl::GetFlag(FLAGS_timeout_s);
  if (!(timeout_s >= 0)) return UsageError("--timeout_s must be >= 0");
  options.timeout = absl::Seconds(timeout_s);

  std::string run_dir = absl::GetFlag(FLAGS_run_dir);
  if (run_dir.empty())
    run_dir = Unused(DefaultRunDir(options.mode, absl::Now(), absl::LocalTimeZone()));
  options.run_dir = std::filesystem::absolute(run_dir).lexically_normal().string();
  options.job_id = std::filesystem::path(options.run_dir).filename().string();
  options.bin_dir = absl::GetFlag(FLAGS_bin_dir);
  if (options.bin_dir.empty()) options.bin_dir = OwnDirectory();
  options.result_json = absl::GetFlag(FLAGS_result_json);
  options.strict = absl::GetFlag(FLAGS_strict);
  options.restart_workers = absl::GetFlag(FLAGS_restart_workers);
  options.restart_servers = absl::GetFlag(FLAGS_restart_servers);
  options.restart_coordinator = absl::GetFlag(FLAGS_restart_coordinator);
  options.straggler_rank = absl::GetFlag(FLAGS_straggler_rank);
  options.straggle_factor = absl::GetFlag(FLAGS_straggle_factor);
  options.straggle_ms = absl::GetFlag(FLAGS_straggle_ms);
  const bool straggles = options.straggle_factor || options.straggle_ms;
  if (options.straggler_rank && !straggles)
    return UsageError("--straggler_rank needs --straggle_factor or --straggle_ms");
  if (straggles && !options.straggler_rank)
    return UsageError("--straggle_factor and --straggle_ms need --straggler_rank");
  if (options.straggler_rank && *options.straggler_rank >= options.workers)
    return UsageError("--straggler_rank must be less than --workers");
  if (options.straggle_factor && !(*options.straggle_factor >= 1))
    return UsageError("--straggle_factor must be at least 1");
  if (const char* path = std::getenv("PATH")) options.plot_search_path = path;

  // The launcher calls the coordinator (status) with the admin token; the
  // TLS files are read now so that a bad one fails here, not in a daemon.
  absl::StatusOr<SecurityConfig> security = SecurityConfigFromFlags(Role::kAdmin);
  if (!security.ok()) return UsageError(std::string(security.status().message()));
  if (absl::GetFlag(FLAGS_auth)) {
    if (security->admin_token.empty()) security->admin_token = RandomHexToken();
    if (security->worker_token.empty()) security->worker_token = RandomHexToken();
    options.token = security->admin_token;
    options.worker_token = security->worker_token;
  } else {
    security->admin_token.clear();
    security->worker_token.clear();
  }
  security->call_token = security->admin_token;
  options.tls_flags = TlsFlagsToPassOn();
  SetProcessSecurity(*std::move(security));

  for (const char* name : kJobFlags) {
    const absl::CommandLineFlag* flag = absl::FindCommandLineFlag(name);
    std::string value = flag->CurrentValue();  // "" while unset
    if (!value.empty()) options.job_flags.push_back({name, value});
  }

  InstallShutdownHandlers();
  LocalLauncher launcher(std::move(options), stdout, ShutdownRequested);
  return launcher.Run();
}

}  // namespace
}  // namespace grps

int main(int argc, char** argv) { return grps::Main(argc, argv); }
