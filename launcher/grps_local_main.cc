// grps-local: runs a whole training job on this machine (a coordinator, N
// servers and M workers on loopback), shows its progress and prints the
// result. See launcher/local_launcher.h for what it does and leaves behind.
//
// Job settings (model, optimizer, steps, ...) are grps-coordinator's own
// flags (coordinator/job_flags.h), validated here and passed on to it when
// set away from their defaults (on the command line or as GRPS_<FLAG>).
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

#include "absl/flags/commandlineflag.h"
#include "absl/flags/flag.h"
#include "absl/flags/reflection.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "coordinator/job_flags.h"
#include "daemon/daemon.h"
#include "daemon/metrics.h"
#include "job/job_config.h"
#include "launcher/local_launcher.h"

// Launcher settings.
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
          "worker that dies is reported and the job goes on without it), and so does "
          "a job that completed with a warning (an elastic job's examples not each "
          "trained once)");
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
ABSL_FLAG(std::string, entry, "",
          "run this command as each worker instead of grps-worker, through "
          "/bin/sh -c \"exec CMD\", with GRPS_COORDINATOR, GRPS_RANK, GRPS_WORKERS, "
          "GRPS_LOCAL_RANK, GRPS_LOCAL_SIZE, GRPS_JOB_ID, GRPS_RUN_DIR, "
          "GRPS_WORKER_TOKEN, GRPS_TLS_* and torchrun's RANK, WORLD_SIZE, LOCAL_RANK "
          "and LOCAL_WORLD_SIZE in its environment (and PYTHONPATH finding the build "
          "tree's grps package): a PyTorch script using grps.torch "
          "(docs/pytorch.md). The job's model is the workers' own (--model=user)");
ABSL_FLAG(std::optional<uint32_t>, straggler_rank, std::nullopt,
          "inject a straggler: the worker of this rank gets --straggle_factor and "
          "--straggle_ms");
ABSL_FLAG(std::optional<double>, straggle_factor, std::nullopt,
          "the straggler sleeps (F - 1) x its own step time every step (F >= 1)");
ABSL_FLAG(std::optional<uint32_t>, straggle_ms, std::nullopt,
          "the straggler sleeps this many milliseconds every step");
ABSL_FLAG(bool, examples_logs, false,
          "each grps-worker writes the examples it trained, a line per step, to "
          "<run_dir>/examples-worker-<rank>.log (grps-worker --examples_log)");

namespace grps {
namespace {

constexpr char kUsage[] =
    "runs a whole grps training job on this machine: a coordinator, the\n"
    "servers and the workers as separate processes on loopback; shows its\n"
    "progress and prints the final test accuracy.\n"
    "\n"
    "usage: grps-local [--mode=sync|async|ssp] [--servers=2] [--workers=2]\n"
    "                  [--steps=N] [--run_dir=DIR] [--result_json=FILE] ...\n"
    "       grps-local --entry=\"python3 train.py ARGS\" [--workers=2] ...\n"
    "\n"
    "--entry=CMD: the workers are copies of your own program instead of\n"
    "grps-worker, each run as /bin/sh -c \"exec CMD\" with the job in its\n"
    "environment (GRPS_COORDINATOR, GRPS_RANK, GRPS_WORKERS, GRPS_JOB_ID,\n"
    "GRPS_RUN_DIR, the worker token, GRPS_TLS_*; GRPS_LOCAL_RANK and\n"
    "GRPS_LOCAL_SIZE, the rank and the workers, as all run on this host;\n"
    "torchrun's RANK, WORLD_SIZE, LOCAL_RANK and LOCAL_WORLD_SIZE, the same;\n"
    "PYTHONPATH finds the build tree's grps package): a PyTorch script that\n"
    "calls grps.torch.init() (docs/pytorch.md). The job's model is theirs\n"
    "(--model=user; a built-in --model is refused, and so is --model=user\n"
    "without --entry); they write no curves and serve no metrics.\n"
    "\n"
    "A worker that dies does not fail the job (the others go on); --strict\n"
    "makes it, --restart_workers=N restarts dead workers. A crashed server or\n"
    "coordinator is restarted (--restart_servers, --restart_coordinator); with\n"
    "--checkpoint_dir the job checkpoints and survives it. If gnuplot is on\n"
    "PATH, the workers' curves are plotted into <run_dir>/curves.svg.\n"
    "\n"
    "The job's settings are grps-coordinator's flags (those from\n"
    "coordinator/job_flags.cc below), checked here before anything starts.\n"
    "--metrics_listen=HOST:PORT: every daemon serves Prometheus metrics, the\n"
    "coordinator at PORT, the servers and workers at the ports after it (the\n"
    "list is printed and written to <run_dir>/prometheus-targets.json).\n"
    "Every flag can also be set as GRPS_<FLAG>. Exit status: 0 completed,\n"
    "1 failed, 2 usage error, 130 interrupted.";

absl::Status SetStraggler(LaunchOptions* options);

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

// The launch's metrics ports from --metrics_listen=HOST:PORT (nothing when
// empty): the coordinator gets PORT, the servers and workers the ports after
// it.
absl::StatusOr<std::optional<LaunchOptions::MetricsPorts>> MetricsPortsFromFlag(
    uint32_t daemons) {
  const std::string listen = absl::GetFlag(FLAGS_metrics_listen);
  if (listen.empty()) return std::nullopt;
  const size_t colon = listen.rfind(':');
  int port = 0;
  if (colon == std::string::npos || colon == 0 ||
      !absl::SimpleAtoi(listen.substr(colon + 1), &port) || port < 1 ||
      port + static_cast<int64_t>(daemons) - 1 > 65535)
    return absl::InvalidArgumentError(absl::StrCat(
        "--metrics_listen must be HOST:PORT with a port the ", daemons,
        " daemons' ports start at (the coordinator's; then the servers' and the "
        "workers'), got '", listen, "'"));
  return LaunchOptions::MetricsPorts{listen.substr(0, colon), port};
}

// The job's model is one its workers train. With --entry the workers are
// the user's program, which defines the model: the job's --model is "user"
// (set here unless given, so the coordinator is started with it); a
// built-in model given is refused. Without --entry they are grps-worker,
// which trains only built-in models: --model=user is refused (the servers
// would wait for good for a worker to define the model).
// `model_given`: --model was on the command line or in GRPS_MODEL.
absl::Status SetModelForWorkers(bool model_given) {
  absl::CommandLineFlag* model = absl::FindCommandLineFlag("model");
  if (model == nullptr) return absl::InternalError("no --model flag is linked in");
  const std::string value = model->CurrentValue();
  const absl::StatusOr<v1::ModelKind> kind = ParseModel(value);
  const bool user_model = kind.ok() && *kind == v1::MODEL_USER;
  if (absl::GetFlag(FLAGS_entry).empty()) {
    if (!user_model) return absl::OkStatus();
    return absl::InvalidArgumentError(
        "--model=user is the model of your own program, run as the workers with "
        "--entry=CMD (docs/pytorch.md), and there is no --entry: grps-worker trains "
        "only a built-in model. Give --entry, or drop --model=user");
  }
  if (model_given) {
    if (user_model) return absl::OkStatus();
    return absl::InvalidArgumentError(
        absl::StrCat("--entry runs your own program as the workers, and the model is the one it "
                     "defines (--model=user); --model=",
                     value, " is a model grps-worker trains: drop --model, or drop --entry"));
  }
  std::string error;
  if (!model->ParseFrom("user", &error))
    return absl::InternalError(absl::StrCat("--model=user: ", error));
  return absl::OkStatus();
}

// The job (validated here, so a bad flag fails before any daemon starts) and
// the launcher's own settings.
absl::StatusOr<LaunchOptions> OptionsFromFlags(bool model_given) {
  if (absl::Status s = SetModelForWorkers(model_given); !s.ok()) return s;
  absl::StatusOr<v1::JobConfig> job = JobConfigFromFlags();
  if (!job.ok()) return job.status();
  LaunchOptions options;
  options.mode = ModeName(job->mode());
  options.servers = job->num_servers();
  options.workers = job->num_workers();
  options.standby_servers =
      job->max_servers() > job->num_servers() ? job->max_servers() - job->num_servers() : 0;
  // The coordinator gets these four from the launch itself.
  for (auto& [name, value] : ChangedJobFlags())
    if (name != "job_id" && name != "mode" && name != "servers" && name != "workers")
      options.job_flags.emplace_back(name, std::move(value));
  options.entry = absl::GetFlag(FLAGS_entry);
  // Entry workers serve no metrics: only the coordinator and the servers.
  absl::StatusOr<std::optional<LaunchOptions::MetricsPorts>> metrics = MetricsPortsFromFlag(
      1 + options.servers + (options.entry.empty() ? options.workers : 0));
  if (!metrics.ok()) return metrics.status();
  options.metrics = *metrics;
  options.backend = absl::GetFlag(FLAGS_backend);
  const double timeout_s = absl::GetFlag(FLAGS_timeout_s);
  if (!(timeout_s >= 0)) return absl::InvalidArgumentError("--timeout_s must be >= 0");
  options.timeout = absl::Seconds(timeout_s);

  std::string run_dir = absl::GetFlag(FLAGS_run_dir);
  if (run_dir.empty())
    run_dir = Unused(DefaultRunDir(options.mode, absl::Now(), absl::LocalTimeZone()));
  options.run_dir = std::filesystem::absolute(run_dir).lexically_normal().string();
  // The run dir names the job unless --job_id does.
  options.job_id = job->job_id() != DefaultJobConfig().job_id()
                       ? job->job_id()
                       : std::filesystem::path(options.run_dir).filename().string();
  options.bin_dir = absl::GetFlag(FLAGS_bin_dir);
  if (options.bin_dir.empty()) options.bin_dir = OwnDirectory();
  options.result_json = absl::GetFlag(FLAGS_result_json);
  options.strict = absl::GetFlag(FLAGS_strict);
  options.restart_workers = absl::GetFlag(FLAGS_restart_workers);
  options.restart_servers = absl::GetFlag(FLAGS_restart_servers);
  options.restart_coordinator = absl::GetFlag(FLAGS_restart_coordinator);
  options.examples_logs = absl::GetFlag(FLAGS_examples_logs);
  if (absl::Status s = SetStraggler(&options); !s.ok()) return s;
  if (const char* path = std::getenv("PATH")) options.plot_search_path = path;
  return options;
}

absl::Status SetStraggler(LaunchOptions* options) {
  options->straggler_rank = absl::GetFlag(FLAGS_straggler_rank);
  options->straggle_factor = absl::GetFlag(FLAGS_straggle_factor);
  options->straggle_ms = absl::GetFlag(FLAGS_straggle_ms);
  const bool straggles = options->straggle_factor || options->straggle_ms;
  if (options->straggler_rank && !straggles)
    return absl::InvalidArgumentError("--straggler_rank needs --straggle_factor or --straggle_ms");
  if (straggles && !options->straggler_rank)
    return absl::InvalidArgumentError("--straggle_factor and --straggle_ms need --straggler_rank");
  if (options->straggler_rank && *options->straggler_rank >= options->workers)
    return absl::InvalidArgumentError("--straggler_rank must be less than --workers");
  if (options->straggle_factor && !(*options->straggle_factor >= 1))
    return absl::InvalidArgumentError("--straggle_factor must be at least 1");
  return absl::OkStatus();
}

// The launcher calls the coordinator (status) with the admin token; the TLS
// files are read now so that a bad one fails here, not in a daemon.
absl::Status SetSecurity(LaunchOptions* options) {
  absl::StatusOr<SecurityConfig> security = SecurityConfigFromFlags(Role::kAdmin);
  if (!security.ok()) return security.status();
  if (absl::GetFlag(FLAGS_auth)) {
    options->token_generated = security->admin_token.empty();
    if (security->admin_token.empty()) security->admin_token = RandomHexToken();
    if (security->worker_token.empty()) security->worker_token = RandomHexToken();
    options->token = security->admin_token;
    options->worker_token = security->worker_token;
  } else {
    security->admin_token.clear();
    security->worker_token.clear();
  }
  security->call_token = security->admin_token;
  options->tls_flags = TlsFlagsToPassOn();
  SetProcessSecurity(*std::move(security));
  return absl::OkStatus();
}

int Main(int argc, char** argv) {
  // Before parsing: whether --model was given at all, its default included.
  const bool model_given =
      !FirstFlagGiven(argc, argv, {"model"}).empty() || std::getenv("GRPS_MODEL") != nullptr;
  std::vector<char*> args = ParseFlagsWithEnvironment(argc, argv, kUsage);
  if (args.size() > 1)
    return UsageError(absl::StrCat("unexpected argument '", args[1], "'"));
  absl::StatusOr<LaunchOptions> options = OptionsFromFlags(model_given);
  if (!options.ok()) return UsageError(std::string(options.status().message()));
  if (absl::Status s = SetSecurity(&*options); !s.ok())
    return UsageError(std::string(s.message()));
  InstallShutdownHandlers();
  LocalLauncher launcher(*std::move(options), stdout, ShutdownRequested);
  return launcher.Run();
}

}  // namespace
}  // namespace grps

int main(int argc, char** argv) { return grps::Main(argc, argv); }
