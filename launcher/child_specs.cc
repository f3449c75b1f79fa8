#include "launcher/child_specs.h"

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "daemon/daemon.h"
#include "launcher/json_text.h"

namespace grps {
namespace {

namespace fs = std::filesystem;

constexpr char kLoopbackAnyPort[] = "127.0.0.1:0";

// A process's tokens: a worker gets only the worker token; with
// authentication off, none, whatever the launcher's own environment holds.
ChildProcess::Environment TokenEnvironment(const LaunchOptions& options, bool worker) {
  return {{"GRPS_TOKEN", worker ? "" : options.token},
          {"GRPS_WORKER_TOKEN", options.worker_token}};
}

// A daemon's tokens and TLS flags.
void AddSecurity(const LaunchOptions& options, bool worker, ChildSpec* spec) {
  spec->environment = TokenEnvironment(options, worker);
  spec->argv.insert(spec->argv.end(), options.tls_flags.begin(), options.tls_flags.end());
}

// The TLS flags daemons get (--tls_ca=PATH, --tls_client_auth, ...) as the
// GRPS_TLS_* variables a program without them reads (grps.torch.init()).
// Each one the launch does not set is removed: the launcher's own
// environment must not add TLS the daemons do not have.
ChildProcess::Environment TlsEnvironment(const std::vector<std::string>& tls_flags) {
  ChildProcess::Environment environment;
  for (const char* name :
       {"tls_cert", "tls_key", "tls_ca", "tls_client_auth", "tls_server_name"}) {
    const std::string bare = absl::StrCat("--", name);
    std::string value;
    for (const std::string& flag : tls_flags) {
      if (flag == bare) value = "true";
      if (absl::StartsWith(flag, bare + "=")) value = flag.substr(bare.size() + 1);
    }
    environment.emplace_back(absl::StrCat("GRPS_", absl::AsciiStrToUpper(name)), value);
  }
  return environment;
}

// The build tree's grps Python package folder: <bin_dir>/../python when it
// holds grps/__init__.py (python/CMakeLists.txt builds it there), else "".
std::string BuildTreePythonDir(const std::string& bin_dir) {
  std::error_code ec;
  const fs::path bin = fs::absolute(bin_dir, ec);
  if (ec) return "";
  const fs::path dir = (bin / ".." / "python").lexically_normal();
  return fs::exists(dir / "grps" / "__init__.py", ec) ? dir.string() : "";
}

// The user's command as the worker of `rank` (see WorkerSpec).
ChildSpec EntryWorkerSpec(const LaunchOptions& options, uint32_t rank,
                          const std::string& coordinator) {
  const std::string rank_text = absl::StrCat(rank);
  const std::string workers_text = absl::StrCat(options.workers);
  // Every worker runs on this host: its local rank is its rank.
  ChildSpec spec{absl::StrCat("worker-", rank),
                 {"/bin/sh", "-c", absl::StrCat("exec ", options.entry)},
                 InDir(options.run_dir, absl::StrCat("worker-", rank, ".log")),
                 {{"GRPS_COORDINATOR", coordinator},
                  {"GRPS_RANK", rank_text},
                  {"GRPS_WORKERS", workers_text},
                  {"GRPS_LOCAL_RANK", rank_text},
                  {"GRPS_LOCAL_SIZE", workers_text},
                  {"GRPS_JOB_ID", options.job_id},
                  {"GRPS_RUN_DIR", options.run_dir},
                  {"RANK", rank_text},
                  {"WORLD_SIZE", workers_text},
                  {"LOCAL_RANK", rank_text},
                  {"LOCAL_WORLD_SIZE", workers_text},
                  {"GRPS_CURVE_CSV",
                   InDir(options.run_dir, absl::StrCat("curve-worker-", rank, ".csv"))}}};
  if (options.straggler_rank == rank) {
    if (options.straggle_factor)
      spec.environment.emplace_back("GRPS_STRAGGLE_FACTOR",
                                    absl::StrFormat("%g", *options.straggle_factor));
    if (options.straggle_ms)
      spec.environment.emplace_back("GRPS_STRAGGLE_MS", absl::StrCat(*options.straggle_ms));
  }
  for (auto& variable : TokenEnvironment(options, /*worker=*/true))
    spec.environment.push_back(std::move(variable));
  for (auto& variable : TlsEnvironment(options.tls_flags))
    spec.environment.push_back(std::move(variable));
  if (const std::string python = BuildTreePythonDir(options.bin_dir); !python.empty()) {
    const char* inherited = std::getenv("PYTHONPATH");
    spec.environment.emplace_back(
        "PYTHONPATH", inherited != nullptr && *inherited != '\0'
                          ? absl::StrCat(python, ":", inherited)
                          : python);
  }
  return spec;
}

// The daemon's --metrics_listen, when the launch serves metrics.
void AddMetrics(const LaunchOptions& options, int offset, ChildSpec* spec) {
  if (!options.metrics) return;
  spec->argv.push_back(absl::StrCat("--metrics_listen=", options.metrics->host, ":",
                                    options.metrics->first_port + offset));
}

}  // namespace

std::string InDir(const std::string& dir, const std::string& name) {
  return (fs::path(dir) / name).string();
}

const std::string* FindJobFlag(const LaunchOptions& options, const std::string& name) {
  for (const auto& [n, v] : options.job_flags)
    if (n == name) return &v;
  return nullptr;
}

ChildSpec CoordinatorSpec(const LaunchOptions& options, int port) {
  ChildSpec spec{"coordinator",
                 {InDir(options.bin_dir, kCoordinatorBinary),
                  port > 0 ? absl::StrCat("--listen=127.0.0.1:", port)
                           : absl::StrCat("--listen=", kLoopbackAnyPort),
                  absl::StrCat("--port_file=", CoordinatorPortFile(options)),
                  // What a restarted coordinator takes the job back from.
                  absl::StrCat("--state_dir=", options.run_dir)},
                 InDir(options.run_dir, "coordinator.log")};
  if (!options.job_id.empty())
    spec.argv.push_back(absl::StrCat("--job_id=", options.job_id));
  spec.argv.push_back(absl::StrCat("--mode=", options.mode));
  spec.argv.push_back(absl::StrCat("--servers=", options.servers));
  spec.argv.push_back(absl::StrCat("--workers=", options.workers));
  for (const auto& [name, value] : options.job_flags)
    spec.argv.push_back(absl::StrCat("--", name, "=", value));
  AddSecurity(options, /*worker=*/false, &spec);
  // The coordinator dials no one: it refuses the name its peers check.
  spec.argv.erase(std::remove_if(spec.argv.begin(), spec.argv.end(),
                                 [](const std::string& arg) {
                                   return absl::StartsWith(arg, "--tls_server_name=");
                                 }),
                  spec.argv.end());
  AddMetrics(options, 0, &spec);
  return spec;
}

ChildSpec ServerSpec(const LaunchOptions& options, uint32_t shard,
                     const std::string& coordinator) {
  ChildSpec spec{absl::StrCat("server-", shard),
                 {InDir(options.bin_dir, kServerBinary),
                  absl::StrCat("--coordinator=", coordinator),
                  absl::StrCat("--listen=", kLoopbackAnyPort),
                  absl::StrCat("--shard=", shard)},
                 InDir(options.run_dir, absl::StrCat("server-", shard, ".log"))};
  AddSecurity(options, /*worker=*/false, &spec);
  // Standbys (shards past --servers) have no metrics port of their own.
  if (shard < options.servers) AddMetrics(options, 1 + static_cast<int>(shard), &spec);
  return spec;
}

ChildSpec WorkerSpec(const LaunchOptions& options, uint32_t rank,
                     const std::string& coordinator) {
  if (!options.entry.empty()) return EntryWorkerSpec(options, rank, coordinator);
  ChildSpec spec{
      absl::StrCat("worker-", rank),
      {InDir(options.bin_dir, kWorkerBinary),
       absl::StrCat("--coordinator=", coordinator), absl::StrCat("--rank=", rank),
       absl::StrCat("--backend=", options.backend),
       // The workers share this machine's cores: OpenBLAS threads beyond a
       // worker's share only fight the others' (and the servers').
       absl::StrCat("--blas_threads=",
                    std::max<int>(1, UsableCores() / static_cast<int>(options.workers))),
       absl::StrCat("--curve_csv=",
                    InDir(options.run_dir, absl::StrCat("curve-worker-", rank, ".csv")))},
      InDir(options.run_dir, absl::StrCat("worker-", rank, ".log"))};
  if (options.examples_logs)
    spec.argv.push_back(absl::StrCat(
        "--examples_log=", InDir(options.run_dir, absl::StrCat("examples-worker-", rank, ".log"))));
  if (options.straggler_rank == rank) {
    if (options.straggle_factor)
      spec.argv.push_back(absl::StrFormat("--straggle_factor=%g", *options.straggle_factor));
    if (options.straggle_ms)
      spec.argv.push_back(absl::StrCat("--straggle_ms=", *options.straggle_ms));
  }
  AddSecurity(options, /*worker=*/true, &spec);
  AddMetrics(options, 1 + static_cast<int>(options.servers + rank), &spec);
  return spec;
}

std::vector<MetricsTarget> MetricsTargets(const LaunchOptions& options) {
  std::vector<MetricsTarget> targets;
  if (!options.metrics) return targets;
  auto add = [&](std::string daemon) {
    const int port = options.metrics->first_port + static_cast<int>(targets.size());
    targets.push_back({std::move(daemon), absl::StrCat(options.metrics->host, ":", port)});
  };
  add("coordinator");
  for (uint32_t shard = 0; shard < options.servers; ++shard)
    add(absl::StrCat("server-", shard));
  if (!options.entry.empty()) return targets;  // the user's program serves none
  for (uint32_t rank = 0; rank < options.workers; ++rank) add(absl::StrCat("worker-", rank));
  return targets;
}

std::string PrometheusTargetsJson(const std::vector<MetricsTarget>& targets,
                                  const std::string& job_id) {
  std::vector<std::string> groups;
  for (const MetricsTarget& t : targets)
    groups.push_back(absl::StrCat("  {\"targets\": [", JsonString(t.address),
                                  "], \"labels\": {\"grps_job\": ", JsonString(job_id),
                                  ", \"daemon\": ", JsonString(t.daemon), "}}"));
  return absl::StrCat("[\n", absl::StrJoin(groups, ",\n"), "\n]\n");
}

std::string CoordinatorPortFile(const LaunchOptions& options) {
  return InDir(options.run_dir, "coordinator.port");
}

}  // namespace grps
