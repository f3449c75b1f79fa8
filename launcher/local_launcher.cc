#include "launcher/local_launcher.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <signal.h>
#include <sys/ioctl.h>
#include <unistd.h>

#include <cerrno>
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "client/job_client.h"
#include "client/status_format.h"
#include "daemon/daemon.h"
#include "daemon/env.h"
#include "job/job_config.h"

namespace grps {
namespace {

namespace fs = std::filesystem;

constexpr char kCoordinatorBinary[] = "grps-coordinator";
constexpr char kServerBinary[] = "grps-server";
constexpr char kWorkerBinary[] = "grps-worker";
constexpr char kLoopbackAnyPort[] = "127.0.0.1:0";
constexpr int kLogTailLines = 20;
constexpr size_t kLogTailBytes = 64 * 1024;
constexpr absl::Duration kSupervisePeriod = absl::Milliseconds(50);
// How long after the job ended a standby server may still be registering
// before it is asked to leave (the servers of the map's shards exit within
// a heartbeat of the end by themselves).
constexpr absl::Duration kStandbyGrace = absl::Seconds(2);

std::string InDir(const std::string& dir, const std::string& name) {
  return (fs::path(dir) / name).string();
}

std::string JsonString(const std::string& s) {
  std::string out = "\"";
  for (unsigned char c : s) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      default:
        if (c < 0x20) {
          out += absl::StrFormat("\\u%04x", c);
        } else {
          out += static_cast<char>(c);
        }
    }
  }
  return out + "\"";
}

std::string JsonNumber(std::optional<double> value) {
  if (!value || !std::isfinite(*value)) return "null";
  return absl::StrFormat("%.6g", *value);
}

// Seconds since the epoch, to the millisecond (more than %.6g keeps).
std::string JsonUnixTime(double seconds) {
  if (!std::isfinite(seconds)) return "null";
  return absl::StrFormat("%.3f", seconds);
}

std::string JsonArray(const std::vector<uint64_t>& values) {
  return absl::StrCat("[", absl::StrJoin(values, ","), "]");
}


int TerminalWidth(std::FILE* out) {
  winsize ws = {};
  if (ioctl(fileno(out), TIOCGWINSZ, &ws) == 0 && ws.ws_col > 0) return ws.ws_col;
  return 80;
}

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

// Writes `contents` to a new file only its owner can read.
absl::Status WriteSecretFile(const std::string& path, const std::string& contents) {
  const int fd = open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  bool ok = fd >= 0 && fchmod(fd, 0600) == 0 &&
            write(fd, contents.data(), contents.size()) ==
                static_cast<ssize_t>(contents.size());
  if (fd >= 0) ok = close(fd) == 0 && ok;
  if (ok) return absl::OkStatus();
  return absl::UnavailableError(absl::StrCat("cannot write ", path, ": ", strerror(errno)));
}

// The daemon's --metrics_listen, when the launch serves metrics.
void AddMetrics(const LaunchOptions& options, int offset, ChildSpec* spec) {
  if (!options.metrics) return;
  spec->argv.push_back(absl::StrCat("--metrics_listen=", options.metrics->host, ":",
                                    options.metrics->first_port + offset));
}

const std::string* FindJobFlag(const LaunchOptions& options, const std::string& name) {
  for (const auto& [n, v] : options.job_flags)
    if (n == name) return &v;
  return nullptr;
}

}  // namespace

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

std::string DefaultRunDir(const std::string& mode, absl::Time now,
                          absl::TimeZone zone) {
  return absl::StrCat("runs/", mode, "-", absl::FormatTime("%Y%m%d-%H%M%S", now, zone));
}

absl::StatusOr<int> ParsePort(const std::string& contents) {
  int port = 0;
  if (!absl::SimpleAtoi(absl::StripAsciiWhitespace(contents), &port) || port < 1 ||
      port > 65535)
    return absl::InvalidArgumentError(
        absl::StrCat("not a port number: '", contents, "'"));
  return port;
}

std::string TailOfFile(const std::string& path, int max_lines) {
  std::ifstream f(path, std::ios::binary);
  if (!f) return absl::StrCat("(cannot read ", path, ": ", std::strerror(errno), ")\n");
  f.seekg(0, std::ios::end);
  const std::streamoff size = f.tellg();
  const std::streamoff start =
      size > static_cast<std::streamoff>(kLogTailBytes) ? size - kLogTailBytes : 0;
  f.seekg(start);
  std::string text((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  if (text.empty()) return "(empty)\n";
  if (text.back() != '\n') text += '\n';
  // Walk back over max_lines line ends (the last one ends the last line).
  size_t begin = text.size() - 1;
  for (int lines = 0; begin > 0; --begin)
    if (text[begin - 1] == '\n' && ++lines == max_lines) break;
  return text.substr(begin);
}

JobProgress EntryProgressOf(const v1::JobStatus& status) {
  JobProgress p = ProgressOf(status);
  const v1::JobConfig& config = status.config();
  double step = static_cast<double>(status.global_step());
  if (config.mode() != v1::MODE_SYNC && config.num_workers() > 0) step /= config.num_workers();
  p.step = step;
  p.total = config.steps() > 0 ? config.steps() : status.total_steps();
  return p;
}

std::string ShardStepsText(const v1::JobStatus& status) {
  std::vector<uint64_t> versions;
  for (const v1::ShardStatus& s : status.shards())
    if (s.num_chunks() > 0) versions.push_back(s.version());
  if (versions.empty()) return "";
  std::sort(versions.begin(), versions.end());
  versions.erase(std::unique(versions.begin(), versions.end()), versions.end());
  if (versions.size() > 1)
    return absl::StrCat("shards at versions ", absl::StrJoin(versions, ", "), ": they differ");
  if (status.config().mode() == v1::MODE_SYNC)
    return absl::StrCat(versions[0], " steps (every shard at version ", versions[0], ")");
  return absl::StrCat("every shard at version ", versions[0], " (a version a gradient)");
}

RunResult ResultOf(const LaunchOptions& options,
                   const std::optional<v1::JobStatus>& latest,
                   const std::optional<v1::JobStatus>& final_eval,
                   double wall_seconds) {
  RunResult r;
  r.mode = options.mode;
  r.servers = options.servers;
  r.workers = options.workers;
  if (const std::string* model = FindJobFlag(options, "model")) r.model = *model;
  if (const std::string* opt = FindJobFlag(options, "optimizer")) r.optimizer = *opt;
  r.wall_seconds = wall_seconds;
  r.run_dir = options.run_dir;
  if (latest) {
    const v1::JobConfig& config = latest->config();
    if (config.mode() != v1::MODE_UNSPECIFIED) r.mode = ModeName(config.mode());
    if (config.model() != v1::MODEL_UNSPECIFIED) r.model = ModelName(config.model());
    if (config.optimizer().kind() != v1::OPTIMIZER_UNSPECIFIED)
      r.optimizer = OptimizerName(config.optimizer().kind());
    if (config.num_servers() > 0) r.servers = config.num_servers();
    if (config.num_workers() > 0) r.workers = config.num_workers();
    r.steps = static_cast<uint64_t>(std::llround(
        (options.entry.empty() ? ProgressOf(*latest) : EntryProgressOf(*latest)).step));
    uint64_t samples = 0;
    int norms = 0;
    for (const v1::WorkerStatus& w : latest->workers()) {
      samples += w.progress().samples();
      r.clipped_steps += w.progress().clipped_steps();
      r.overflow_steps += w.progress().overflow_steps();
      if (w.progress().loss_scale() > 0 &&
          (r.loss_scale == 0 || w.progress().loss_scale() < r.loss_scale))
        r.loss_scale = w.progress().loss_scale();
      if (w.progress().gradient_norm() > 0) {
        r.gradient_norm += w.progress().gradient_norm();
        ++norms;
      }
    }
    if (norms > 0) r.gradient_norm /= norms;
    if (wall_seconds > 0) r.samples_per_sec = samples / wall_seconds;
    r.backup_workers = config.backup_workers();
    r.staleness_bound = config.staleness_bound();
    uint64_t shard_late = 0, shard_too_stale = 0, counted = 0;
    double staleness_sum = 0;
    for (const v1::ShardStatus& shard : latest->shards()) {
      shard_late += shard.late_gradients();
      shard_too_stale += shard.too_stale();
      r.staleness_max = std::max(r.staleness_max, shard.staleness_max());
      if (r.staleness_histogram.size() < static_cast<size_t>(shard.staleness_histogram_size()))
        r.staleness_histogram.resize(shard.staleness_histogram_size(), 0);
      uint64_t count = 0;
      for (int i = 0; i < shard.staleness_histogram_size(); ++i) {
        r.staleness_histogram[i] += shard.staleness_histogram(i);
        count += shard.staleness_histogram(i);
      }
      staleness_sum += shard.staleness_mean() * static_cast<double>(count);
      counted += count;
    }
    if (counted > 0) r.staleness_mean = staleness_sum / static_cast<double>(counted);
    // The coordinator sums the shards' counts; older ones left it to us.
    r.late_gradients = latest->late_gradients() > 0 ? latest->late_gradients() : shard_late;
    r.worker_leaves = latest->worker_leaves();
    r.worker_joins = latest->worker_joins();
    r.data = latest->data();
    r.warnings.assign(latest->warnings().begin(), latest->warnings().end());
    r.too_stale = latest->too_stale() > 0 ? latest->too_stale() : shard_too_stale;
  }
  if (final_eval) {
    r.final_test_accuracy = final_eval->final_test_accuracy();
    r.final_test_loss = final_eval->final_test_loss();
  }
  return r;
}

std::string ResultJson(const RunResult& r) {
  std::string json = absl::StrCat(
      "{\"mode\":", JsonString(r.mode), ",\"servers\":", r.servers,
      ",\"workers\":", r.workers, ",\"model\":", JsonString(r.model),
      ",\"optimizer\":", JsonString(r.optimizer), ",\"steps\":", r.steps,
      ",\"final_test_accuracy\":", JsonNumber(r.final_test_accuracy),
      ",\"final_test_loss\":", JsonNumber(r.final_test_loss),
      ",\"wall_seconds\":", JsonNumber(r.wall_seconds),
      ",\"samples_per_sec\":", JsonNumber(r.samples_per_sec),
      ",\"run_dir\":", JsonString(r.run_dir),
      ",\"started_unix\":", JsonUnixTime(r.started_unix),
      ",\"workers_died\":", r.workers_died,
      ",\"workers_restarted\":", r.workers_restarted,
      ",\"worker_leaves\":", r.worker_leaves, ",\"worker_joins\":", r.worker_joins,
      ",\"backup_workers\":", r.backup_workers,
      ",\"staleness_bound\":", r.staleness_bound,
      ",\"late_gradients\":", r.late_gradients, ",\"too_stale\":", r.too_stale,
      ",\"staleness_mean\":", JsonNumber(r.staleness_mean),
      ",\"staleness_max\":", r.staleness_max,
      ",\"staleness_histogram\":", JsonArray(r.staleness_histogram),
      ",\"clipped_steps\":", r.clipped_steps,
      ",\"gradient_norm\":", JsonNumber(r.gradient_norm),
      ",\"overflow_steps\":", r.overflow_steps,
      ",\"loss_scale\":", JsonNumber(r.loss_scale),
      ",\"exit\":", JsonString(r.exit));
  if (r.exit != "ok") absl::StrAppend(&json, ",\"error\":", JsonString(r.error));
  if (r.data.total_blocks() > 0)
    absl::StrAppend(&json, ",\"data\":{\"blocks_per_epoch\":", r.data.blocks_per_epoch(),
                    ",\"total_blocks\":", r.data.total_blocks(),
                    ",\"trained\":", r.data.consumed(), ",\"leased\":", r.data.leased(),
                    ",\"returned\":", r.data.returned(),
                    ",\"refused_reports\":", r.data.refused_reports(), "}");
  std::vector<std::string> warnings;
  for (const std::string& w : r.warnings) warnings.push_back(JsonString(w));
  absl::StrAppend(&json, ",\"warnings\":[", absl::StrJoin(warnings, ","), "]");
  return json + "}\n";
}

CurveFile ReadCurveFile(const std::string& path, const std::string& label) {
  CurveFile c;
  c.path = path;
  c.label = label;
  std::ifstream f(path);
  std::string line;
  if (!std::getline(f, line)) return c;
  std::vector<std::string> names = absl::StrSplit(line, ',');
  for (size_t i = 0; i < names.size(); ++i) {
    const std::string name(absl::StripAsciiWhitespace(names[i]));
    const int column = static_cast<int>(i) + 1;
    if (name == "step") c.step = column;
    if (name == "unix_time") c.unix_time = column;
    if (name == "loss") c.loss = column;
    if (name == "test_accuracy") c.test_accuracy = column;
    if (name == "evaluated") c.evaluated = column;
  }
  while (std::getline(f, line) && !(c.has_evaluated && c.has_training)) {
    if (absl::StripAsciiWhitespace(line).empty()) continue;
    c.has_rows = true;
    std::vector<std::string> fields = absl::StrSplit(line, ',');
    const bool evaluation = c.evaluated > 0 &&
                            static_cast<size_t>(c.evaluated) <= fields.size() &&
                            absl::StripAsciiWhitespace(fields[c.evaluated - 1]) == "1";
    (evaluation ? c.has_evaluated : c.has_training) = true;
  }
  return c;
}

namespace {

// A gnuplot single-quoted string ('' stands for ').
std::string GnuplotString(const std::string& s) {
  return absl::StrCat("'", absl::StrReplaceAll(s, {{"'", "''"}}), "'");
}

// Draws nothing, but keeps the panel with its title and a "no data" note.
constexpr char kEmptyPanel[] =
    "set label 1 'no data' at graph 0.5, 0.5 center\n"
    "set xrange [0:1]\nset yrange [0:1]\nplot 2 notitle\n"
    "unset label 1\nset autoscale\n";

}  // namespace

std::string CurvesGnuplotScript(const std::vector<CurveFile>& curves, double started_unix,
                                const std::string& svg_path) {
  std::string gp = absl::StrCat(
      "# Written by grps-local: the workers' training curves from their CSVs.\n"
      "# Re-draw with: gnuplot curves.gp\n"
      "set terminal svg size 900,800 dynamic background rgb 'white'\n"
      "set output ",
      GnuplotString(svg_path),
      "\n"
      "set datafile separator ','\n"
      // Rows that are not evaluations are NaN in the accuracy panel, and a
      // line goes on across them.
      "set datafile missing NaN\n"
      "set key outside right top noenhanced\n"
      // The same plot area in both panels, whatever their keys' widths.
      "set lmargin at screen 0.08\nset rmargin at screen 0.7\n"
      "set grid\n"
      "set multiplot layout 2,1\n"
      "set title 'training loss'\nset xlabel 'step'\nset ylabel 'loss'\n");
  std::vector<std::string> series;
  for (const CurveFile& c : curves)
    if (c.has_training && c.step > 0 && c.loss > 0)
      // Evaluation rows are written when an evaluation ends, out of step
      // order: the loss line skips them.
      series.push_back(absl::StrCat(
          GnuplotString(c.path), " skip 1 using ", c.step, ":",
          c.evaluated > 0 ? absl::StrFormat("($%d == 1 ? NaN : $%d)", c.evaluated, c.loss)
                          : absl::StrCat(c.loss),
          " with lines title ", GnuplotString(c.label)));
  if (series.empty()) {
    gp += kEmptyPanel;
  } else {
    absl::StrAppend(&gp, "plot ", absl::StrJoin(series, ", \\\n     "), "\n");
  }
  absl::StrAppend(&gp,
                  "set title 'test accuracy (evaluations)'\n"
                  "set xlabel 'seconds since the launch'\nset ylabel 'accuracy'\n");
  series.clear();
  for (const CurveFile& c : curves)
    if (c.has_evaluated && c.unix_time > 0 && c.test_accuracy > 0)
      series.push_back(absl::StrFormat(
          "%s skip 1 using ($%d - %.3f):($%d == 1 ? $%d : NaN) with linespoints pt 7 "
          "ps 0.5 title %s",
          GnuplotString(c.path), c.unix_time, started_unix, c.evaluated, c.test_accuracy,
          GnuplotString(absl::StrCat("evaluated by ", c.label))));
  if (series.empty()) {
    gp += kEmptyPanel;
  } else {
    absl::StrAppend(&gp, "plot ", absl::StrJoin(series, ", \\\n     "), "\n");
  }
  return gp + "unset multiplot\n";
}

std::string FindInSearchPath(const std::string& program, const std::string& search_path) {
  for (absl::string_view dir : absl::StrSplit(search_path, ':', absl::SkipEmpty())) {
    const std::string path = InDir(std::string(dir), program);
    if (access(path.c_str(), X_OK) == 0 && !fs::is_directory(path)) return path;
  }
  return "";
}

LocalLauncher::LocalLauncher(LaunchOptions options, std::FILE* out,
                             std::function<bool()> interrupted)
    : options_(std::move(options)),
      out_(out),
      interrupted_(std::move(interrupted)),
      tty_(isatty(fileno(out)) == 1) {}

void LocalLauncher::Say(const std::string& message) {
  if (bar_drawn_) std::fputc('\n', out_);
  bar_drawn_ = false;
  std::fprintf(out_, "%s\n", message.c_str());
  std::fflush(out_);
}

absl::Status LocalLauncher::StartChild(const ChildSpec& spec, Role role,
                                       uint32_t index) {
  auto child = std::make_unique<ChildProcess>(spec.name, spec.argv, spec.log_path,
                                              spec.environment);
  absl::Status s = child->Start();
  children_.push_back(std::move(child));
  child_role_.push_back(role);
  child_index_.push_back(index);
  death_handled_.push_back(false);
  const size_t newest = children_.size() - 1;
  switch (role) {
    case Role::kCoordinator:
      coordinator_child_ = newest;
      break;
    case Role::kServer:
      if (server_restarts_.size() <= index) server_restarts_.resize(index + 1, 0);
      break;
    case Role::kWorker:
      if (worker_child_.size() <= index) {
        worker_child_.resize(index + 1, 0);
        worker_restarts_.resize(index + 1, 0);
      }
      worker_child_[index] = newest;
      break;
  }
  return s;
}

absl::Status LocalLauncher::OnDaemonCrashed(size_t child_index) {
  death_handled_[child_index] = true;
  const ChildProcess& dead = *children_[child_index];
  const bool is_coordinator = child_role_[child_index] == Role::kCoordinator;
  const bool job_ended = latest_ && JobEnded(latest_->state());
  if (!dead.killed_by_signal() || job_ended)
    return absl::FailedPreconditionError(
        absl::StrCat(dead.name(), " ", dead.DescribeExit()));
  if (is_coordinator) {
    if (coordinator_restarts_ >= options_.restart_coordinator)
      return absl::FailedPreconditionError(absl::StrCat(
          dead.name(), " ", dead.DescribeExit(), " (no coordinator restarts left)"));
    ++coordinator_restarts_;
    ChildSpec spec = CoordinatorSpec(options_, coordinator_port_);
    spec.log_path = InDir(options_.run_dir,
                          absl::StrCat("coordinator.restart-", coordinator_restarts_, ".log"));
    Say(absl::StrCat("grps-local: ", dead.name(), " ", dead.DescribeExit(),
                     "; restarting it on port ", coordinator_port_, " (restart ",
                     coordinator_restarts_, " of ", options_.restart_coordinator,
                     "), log ", spec.log_path));
    return StartChild(spec, Role::kCoordinator);
  }
  const uint32_t shard = child_index_[child_index];
  if (servers_restarted_ >= options_.restart_servers)
    return absl::FailedPreconditionError(absl::StrCat(
        dead.name(), " ", dead.DescribeExit(), " (no server restarts left)"));
  ++servers_restarted_;
  ++server_restarts_[shard];
  ChildSpec spec = ServerSpec(options_, shard, coordinator_address_);
  spec.log_path = InDir(options_.run_dir, absl::StrCat("server-", shard, ".restart-",
                                                       server_restarts_[shard], ".log"));
  Say(absl::StrCat("grps-local: ", dead.name(), " ", dead.DescribeExit(),
                   "; restarting it with --shard=", shard, " (restart ",
                   servers_restarted_, " of ", options_.restart_servers, "), log ",
                   spec.log_path));
  return StartChild(spec, Role::kServer, shard);
}

namespace {

bool SaidRetired(const ChildProcess& server) {
  // Its last words: "shard 2 exiting (shard 2 retired: the job re-sharded
  // to 1 shards): ...". A server that exits 0 otherwise (the job ended, a
  // signal) is not started again.
  std::ifstream log(server.log_path(), std::ios::binary);
  if (!log) return false;
  log.seekg(0, std::ios::end);
  const std::streamoff size = log.tellg();
  log.seekg(std::max<std::streamoff>(0, size - 4096));
  const std::string tail((std::istreambuf_iterator<char>(log)), std::istreambuf_iterator<char>());
  return absl::StrContains(tail, " retired: the job re-sharded to ");
}

}  // namespace

void LocalLauncher::StopStandbys(absl::Time now) {
  // The servers of the shards in the job's map hear the end and exit within
  // a heartbeat; a standby still registering after that has nothing to
  // serve (and, with the coordinator gone, no one to ask).
  if (standbys_.empty() || now < stop_standbys_at_) return;
  for (size_t i : standbys_)
    if (children_[i]->running()) children_[i]->Signal(SIGTERM);
  standbys_.clear();
}

absl::Status LocalLauncher::OnServerRetired(size_t child_index) {
  death_handled_[child_index] = true;
  const uint32_t shard = child_index_[child_index];
  ++server_restarts_[shard];
  ChildSpec spec = ServerSpec(options_, shard, coordinator_address_);
  spec.log_path = InDir(options_.run_dir, absl::StrCat("server-", shard, ".standby-",
                                                       server_restarts_[shard], ".log"));
  Say(absl::StrCat("grps-local: ", children_[child_index]->name(),
                   " left the job (its shard was re-sharded away); it stands by again, log ",
                   spec.log_path));
  absl::Status started = StartChild(spec, Role::kServer, shard);
  standbys_.push_back(children_.size() - 1);
  return started;
}

absl::Status LocalLauncher::OnWorkerDied(size_t child_index) {
  death_handled_[child_index] = true;
  const ChildProcess& dead = *children_[child_index];
  const uint32_t rank = child_index_[child_index];
  ++workers_died_;
  // A worker that dies after the job ended has nothing left to rejoin.
  const bool job_ended =
      coordinator().exited() || (latest_ && JobEnded(latest_->state()));
  if (workers_restarted_ < options_.restart_workers && !job_ended) {
    ++workers_restarted_;
    ++worker_restarts_[rank];
    ChildSpec spec = WorkerSpec(options_, rank, coordinator_address_);
    spec.log_path = InDir(options_.run_dir,
                          absl::StrCat("worker-", rank, ".restart-",
                                       worker_restarts_[rank], ".log"));
    Say(absl::StrCat("grps-local: ", dead.name(), " ", dead.DescribeExit(),
                     "; restarting it with ",
                     options_.entry.empty() ? "--rank=" : "GRPS_RANK=", rank, " (restart ",
                     workers_restarted_, " of ", options_.restart_workers, "), log ",
                     spec.log_path));
    return StartChild(spec, Role::kWorker, rank);
  }
  // The coordinator waits for every worker to register before the job runs;
  // one that dies before then (most likely a bad flag or a missing file)
  // leaves the job waiting for good.
  if (!latest_ || latest_->state() == v1::JOB_STATE_WAITING ||
      latest_->state() == v1::JOB_STATE_UNSPECIFIED)
    return absl::FailedPreconditionError(absl::StrCat(
        dead.name(), " ", dead.DescribeExit(),
        " before the job started; the job cannot start without it"));
  uint32_t going_on = 0;
  for (size_t index : worker_child_) {
    const ChildProcess& newest = *children_[index];
    if (newest.running() || newest.succeeded()) ++going_on;
  }
  Say(absl::StrCat("grps-local: ", dead.name(), " ", dead.DescribeExit(),
                   "; the job goes on with ", going_on, " of ", options_.workers,
                   " workers",
                   options_.restart_workers > 0 && !job_ended ? " (no restarts left)" : ""));
  return absl::OkStatus();
}

const ChildProcess* LocalLauncher::EveryWorkerDead() const {
  const ChildProcess* last = nullptr;
  for (size_t index : worker_child_) {
    const ChildProcess& newest = *children_[index];
    if (!newest.exited() || newest.succeeded()) return nullptr;
    last = &newest;
  }
  return last;
}

void LocalLauncher::RefreshStatus() {
  if (feed_ == nullptr) return;
  if (auto latest = feed_->Latest()) latest_ = std::move(latest);
  if (auto final_eval = feed_->WithFinalEval()) final_eval_ = std::move(final_eval);
}

void LocalLauncher::ShowProgress(absl::Time now) {
  if (!latest_) return;
  const uint64_t count = feed_->count();
  const bool fresh = count != snapshots_seen_;
  snapshots_seen_ = count;
  JobProgress progress =
      options_.entry.empty() ? ProgressOf(*latest_) : EntryProgressOf(*latest_);
  // The rate counts from the first step, not from start-up (loading data).
  if (fresh && progress.state == v1::JOB_STATE_RUNNING && progress.step > 0)
    eta_.Observe(now, progress.step);
  // No ETA ("?") while the job's steps are not known.
  std::optional<double> eta =
      progress.total > 0 ? eta_.SecondsLeft(progress.total) : std::nullopt;
  if (tty_) {
    if (!fresh) return;
    std::fprintf(out_, "\r%s\033[K",
                 ProgressBar(progress, eta, TerminalWidth(out_) - 1).c_str());
    bar_drawn_ = true;
  } else {
    if (now < next_plain_line_) return;
    std::fprintf(out_, "%s\n", ProgressLine(progress, eta).c_str());
    next_plain_line_ = now + options_.plain_progress_period;
  }
  std::fflush(out_);
}

std::optional<int> LocalLauncher::PrepareRunDir() {
  std::error_code ec;
  fs::create_directories(options_.run_dir, ec);
  if (ec)
    return Finish("failed",
                  absl::StrCat("cannot create run dir ", options_.run_dir, ": ",
                               ec.message()),
                  nullptr);
  std::fprintf(out_, "run dir: %s\n", options_.run_dir.c_str());
  std::fflush(out_);
  if (!options_.token.empty()) {
    const std::string path = InDir(options_.run_dir, "token");
    // The worker token too: a worker started by hand (a rank that comes
    // back) needs it.
    for (const auto& [file, token] :
         {std::pair<std::string, std::string>{path, options_.token},
          {InDir(options_.run_dir, "worker_token"), options_.worker_token}})
      if (absl::Status s = WriteSecretFile(file, token + "\n"); !s.ok())
        return Finish("failed", std::string(s.message()), nullptr);
    std::fprintf(out_, "auth: every RPC needs the job's token, generated for it: %s%s\n",
                 path.c_str(), options_.tls_flags.empty() ? "" : " (and TLS)");
  } else {
    std::fprintf(out_, "auth: off (--noauth): anyone who can reach the ports may act "
                       "on the job\n");
  }
  std::vector<const char*> binaries = {kCoordinatorBinary, kServerBinary};
  if (options_.entry.empty()) binaries.push_back(kWorkerBinary);  // else the user's command
  for (const char* binary : binaries) {
    const std::string path = InDir(options_.bin_dir, binary);
    if (access(path.c_str(), X_OK) != 0)
      return Finish("failed",
                    absl::StrCat("cannot find ", binary, " in ", options_.bin_dir,
                                 " (build it, or point --bin_dir at it)"),
                    nullptr);
  }
  return std::nullopt;
}

std::optional<int> LocalLauncher::StartCoordinator() {
  const std::string port_file = CoordinatorPortFile(options_);
  std::error_code ec;
  fs::remove(port_file, ec);
  if (absl::Status s = StartChild(CoordinatorSpec(options_), Role::kCoordinator);
      !s.ok())
    return Finish("failed", std::string(s.message()), nullptr);
  const absl::Time port_deadline = absl::Now() + options_.port_file_timeout;
  while (true) {
    if (interrupted_()) return Finish("interrupted", "interrupted", nullptr);
    if (children_.front()->Poll())
      return Finish("failed",
                    absl::StrCat("coordinator ", coordinator().DescribeExit(),
                                 " before it was listening"),
                    &coordinator());
    std::ifstream f(port_file);
    std::stringstream contents;
    contents << f.rdbuf();
    if (absl::StatusOr<int> port = ParsePort(contents.str()); f && port.ok()) {
      coordinator_port_ = *port;
      break;
    }
    if (absl::Now() >= port_deadline)
      return Finish("failed",
                    absl::StrCat("coordinator wrote no port to ", port_file, " within ",
                                 absl::FormatDuration(options_.port_file_timeout)),
                    &coordinator());
    absl::SleepFor(kSupervisePeriod);
  }
  coordinator_address_ = absl::StrCat("127.0.0.1:", coordinator_port_);
  Say(absl::StrCat("coordinator: ", coordinator_address_, "   (",
                   options_.token.empty()
                       ? ""
                       : absl::StrCat("GRPS_TOKEN=$(cat ", InDir(options_.run_dir, "token"),
                                      ") "),
                   "grpsctl --coordinator=", coordinator_address_, " status)"));
  return std::nullopt;
}

std::optional<int> LocalLauncher::StartMembers() {
  const std::string& address = coordinator_address_;
  for (uint32_t shard = 0; shard < options_.servers + options_.standby_servers; ++shard) {
    if (absl::Status s = StartChild(ServerSpec(options_, shard, address), Role::kServer,
                                    shard);
        !s.ok())
      return Finish("failed", std::string(s.message()), nullptr);
    if (shard >= options_.servers) standbys_.push_back(children_.size() - 1);
  }
  for (uint32_t rank = 0; rank < options_.workers; ++rank)
    if (absl::Status s = StartChild(WorkerSpec(options_, rank, address), Role::kWorker,
                                    rank);
        !s.ok())
      return Finish("failed", std::string(s.message()), nullptr);
  Say(absl::StrCat("started ", options_.servers, " servers",
                   options_.standby_servers > 0
                       ? absl::StrCat(" (and ", options_.standby_servers, " standing by)")
                       : std::string(),
                   " and ", options_.workers, " workers",
                   options_.entry.empty() ? "" : absl::StrCat(" (", options_.entry, ")"),
                   "; logs in ", options_.run_dir));
  if (options_.metrics) SayWhereMetricsAre();
  return std::nullopt;
}

void LocalLauncher::SayWhereMetricsAre() {
  const std::string targets_path = InDir(options_.run_dir, "prometheus-targets.json");
  const std::vector<MetricsTarget> targets = MetricsTargets(options_);
  if (absl::Status s = WriteFileAtomically(Env::Default(), targets_path,
                                           PrometheusTargetsJson(targets, options_.job_id));
      !s.ok())
    Say(absl::StrCat("grps-local: ", s.message()));
  std::vector<std::string> lines;
  for (const MetricsTarget& t : targets)
    lines.push_back(absl::StrCat("  ", t.daemon, ": http://", t.address, "/metrics"));
  Say(absl::StrCat("metrics (Prometheus; scrape targets in ", targets_path, "):\n",
                   absl::StrJoin(lines, "\n")));
}

std::optional<int> LocalLauncher::HandleExitedChildren(bool* all_exited) {
  *all_exited = true;
  // By index: a restart appends to children_.
  for (size_t i = 0; i < children_.size(); ++i) {
    ChildProcess& child = *children_[i];
    if (!child.Poll()) {
      *all_exited = false;
    } else if (child.succeeded() && !death_handled_[i] && child_role_[i] == Role::kServer &&
               options_.standby_servers > 0 && !job_ended_ && !coordinator().exited() &&
               SaidRetired(child)) {
      if (absl::Status s = OnServerRetired(i); !s.ok())
        return Finish("failed", std::string(s.message()), &child);
      *all_exited = false;
    } else if (!child.succeeded() && !death_handled_[i]) {
      if (options_.strict)
        return Finish("failed", absl::StrCat(child.name(), " ", child.DescribeExit()),
                      &child);
      const absl::Status s = child_role_[i] == Role::kWorker ? OnWorkerDied(i)
                                                             : OnDaemonCrashed(i);
      if (!s.ok()) return Finish("failed", std::string(s.message()), &child);
    }
  }
  if (const ChildProcess* last_dead = EveryWorkerDead())
    return Finish("failed",
                  absl::StrCat("every worker died (the last: ", last_dead->name(), " ",
                               last_dead->DescribeExit(), "); no worker is left to train"),
                  last_dead);
  return std::nullopt;
}

std::optional<int> LocalLauncher::Supervise() {
  std::optional<absl::Time> ended_at;
  while (true) {
    if (interrupted_()) return Finish("interrupted", "interrupted", nullptr);
    bool all_exited = false;
    if (std::optional<int> code = HandleExitedChildren(&all_exited)) return code;
    if (all_exited) return std::nullopt;
    const absl::Time now = absl::Now();
    if (options_.timeout > absl::ZeroDuration() && now - start_ >= options_.timeout)
      return Finish("timeout",
                    absl::StrCat("timed out after ",
                                 absl::FormatDuration(options_.timeout)),
                    nullptr);
    RefreshStatus();
    ShowProgress(now);
    if (!ended_at && (coordinator().exited() || (latest_ && JobEnded(latest_->state())))) {
      ended_at = now;
      job_ended_ = true;
      stop_standbys_at_ = now + kStandbyGrace;
    }
    if (ended_at) StopStandbys(now);
    if (ended_at && now - *ended_at > options_.exit_grace) {
      std::vector<std::string> running;
      for (const auto& child : children_)
        if (child->running()) running.push_back(child->name());
      return Finish("failed",
                    absl::StrCat(absl::StrJoin(running, ", "), " still running ",
                                 absl::FormatDuration(options_.exit_grace),
                                 " after the job ended"),
                    nullptr);
    }
    absl::SleepFor(kSupervisePeriod);
  }
}

int LocalLauncher::Run() {
  start_ = absl::Now();
  if (std::optional<int> code = PrepareRunDir()) return *code;
  // The coordinator first; the others need its address.
  if (std::optional<int> code = StartCoordinator()) return *code;
  if (std::optional<int> code = StartMembers()) return *code;
  // Only now: every fork above happened before gRPC's client threads exist.
  feed_ = std::make_unique<StatusFeed>(coordinator_address_, options_.status_interval);
  // Until every child has exited 0, or something goes wrong.
  if (std::optional<int> code = Supervise()) return *code;

  // Every child exited 0. A job stopped by an operator ends that way too.
  feed_->Stop();
  RefreshStatus();
  if (latest_ && (latest_->state() == v1::JOB_STATE_FAILED ||
                  latest_->state() == v1::JOB_STATE_STOPPED))
    return Finish(latest_->state() == v1::JOB_STATE_STOPPED ? "stopped" : "failed",
                  absl::StrCat("job ", JobStateName(latest_->state()),
                               latest_->message().empty() ? "" : ": ",
                               latest_->message()),
                  nullptr);
  return Finish("ok", "", nullptr);
}

void LocalLauncher::PlotCurves() {
  std::vector<CurveFile> curves;
  for (uint32_t rank = 0; rank < options_.workers; ++rank) {
    const std::string path =
        InDir(options_.run_dir, absl::StrCat("curve-worker-", rank, ".csv"));
    if (fs::exists(path)) curves.push_back(ReadCurveFile(path, absl::StrCat("worker-", rank)));
  }
  // A program that reported nothing (gt.report, gt.done's figures) wrote no
  // curve: nothing to say.
  if (curves.empty() && !options_.entry.empty()) return;
  const std::string gnuplot = FindInSearchPath("gnuplot", options_.plot_search_path);
  if (gnuplot.empty()) {
    Say("grps-local: no plot: gnuplot is not on PATH (scripts/setup installs it)");
    return;
  }
  if (curves.empty()) {
    Say("grps-local: no plot: no worker wrote a curve");
    return;
  }
  const std::string script_path = InDir(options_.run_dir, "curves.gp");
  const std::string svg_path = InDir(options_.run_dir, "curves.svg");
  const double started_unix = absl::ToDoubleSeconds(start_ - absl::UnixEpoch());
  if (absl::Status s = WriteFileAtomically(
          Env::Default(), script_path, CurvesGnuplotScript(curves, started_unix, svg_path));
      !s.ok()) {
    Say(absl::StrCat("grps-local: no plot: ", s.message()));
    return;
  }
  ChildProcess plot("gnuplot", {gnuplot, script_path}, InDir(options_.run_dir, "curves.log"));
  if (absl::Status s = plot.Start(); !s.ok()) {
    Say(absl::StrCat("grps-local: no plot: ", s.message()));
    return;
  }
  if (!plot.WaitFor(options_.plot_timeout)) {
    plot.Signal(SIGKILL);
    plot.WaitFor(absl::Seconds(5));
    Say(absl::StrCat("grps-local: no plot: gnuplot ran longer than ",
                     absl::FormatDuration(options_.plot_timeout), " (", script_path, ")"));
    return;
  }
  if (!plot.succeeded()) {
    Say(absl::StrCat("grps-local: no plot: gnuplot ", plot.DescribeExit(), " (see ",
                     plot.log_path(), ")"));
    return;
  }
  Say(absl::StrCat("curves: ", svg_path));
}

int LocalLauncher::Finish(const std::string& exit, const std::string& error,
                          const ChildProcess* failed_child) {
  bool ok = exit == "ok";
  if (!ok) Say(absl::StrCat("grps-local: ", error));
  if (failed_child != nullptr)
    Say(absl::StrCat("--- last lines of ", failed_child->log_path(), " (pid ",
                     failed_child->pid(), ") ---\n",
                     TailOfFile(failed_child->log_path(), kLogTailLines),
                     "--- end of ", failed_child->name(), " log ---"));

  int running = 0;
  for (const auto& child : children_) running += child->running() ? 1 : 0;
  if (running > 0) {
    Say(absl::StrCat("grps-local: stopping ", running, " processes"));
    std::vector<std::string> killed = StopChildren(children_, options_.stop_grace);
    if (!killed.empty())
      Say(absl::StrCat("grps-local: killed (no exit ",
                       absl::FormatDuration(options_.stop_grace),
                       " after SIGTERM): ", absl::StrJoin(killed, ", ")));
  }
  if (feed_ != nullptr) feed_->Stop();  // the coordinator is gone by now
  RefreshStatus();
  if (!worker_child_.empty()) PlotCurves();

  const double wall = absl::ToDoubleSeconds(absl::Now() - start_);
  RunResult result = ResultOf(options_, latest_, final_eval_, wall);
  result.exit = exit;
  result.error = error;
  result.started_unix = absl::ToDoubleSeconds(start_ - absl::UnixEpoch());
  result.workers_died = workers_died_;
  result.workers_restarted = workers_restarted_;
  if (workers_died_ > 0)
    Say(absl::StrCat("workers: ", workers_died_, " died, ", workers_restarted_,
                     " restarted, of ", options_.workers));
  for (const std::string& warning : result.warnings) Say(absl::StrCat("warning: ", warning));
  if (ok && options_.strict && !result.warnings.empty()) {
    ok = false;
    result.exit = "failed";
    result.error = absl::StrCat("the job completed with ", result.warnings.size(), " warning",
                                result.warnings.size() == 1 ? "" : "s", " (--strict)");
    Say(absl::StrCat("grps-local: ", result.error));
  }
  if (ok) {
    // An --entry job's steps are the shards' versions: a worker's own count
    // may be a restarted rank's, past or short of the job's.
    const std::string shard_steps =
        options_.entry.empty() || !latest_ ? "" : ShardStepsText(*latest_);
    Say(absl::StrCat("job completed: ",
                     shard_steps.empty() ? absl::StrCat(result.steps, " steps per worker")
                                         : shard_steps,
                     ", ",
                     result.workers, " workers, ", result.servers, " servers, ",
                     HumanDuration(wall), " wall, ",
                     absl::StrFormat("%.1f", result.samples_per_sec),
                     " samples/s (all workers)"));
    if (result.final_test_accuracy) {
      Say(absl::StrFormat("final test loss: %.4f", *result.final_test_loss));
      Say(absl::StrFormat("final test accuracy: %.4f", *result.final_test_accuracy));
    } else {
      Say("final test accuracy: n/a (no worker reported a final evaluation)");
    }
  } else {
    Say(absl::StrCat("grps-local: job ", result.exit, "; logs in ", options_.run_dir));
  }
  if (!options_.result_json.empty()) {
    if (absl::Status s =
            WriteFileAtomically(Env::Default(), options_.result_json, ResultJson(result));
        !s.ok()) {
      Say(absl::StrCat("grps-local: ", s.message()));
      return kLaunchFailed;
    }
  }
  if (ok) return kLaunchOk;
  return result.exit == "interrupted" ? kLaunchInterrupted : kLaunchFailed;
}

}  // namespace grps
