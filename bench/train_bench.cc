// grps_train_bench: how fast the default job trains under each mode, beside
// the compute-only rate of the same model on the same cores, measured in the
// same run.
//
// The yardstick: the default model (MLP 784-256-128-10, batch 64) trained
// with no network at all, forward/backward plus a local SGD step in a loop,
// in two shapes, best of which counts:
//   - one thread per worker, each with OpenBLAS on one thread;
//   - one thread with OpenBLAS on every core.
// Then each grps configuration runs twice through the local launcher (the
// real daemons as processes, on loopback):
//   - a rate run with no evaluation until the end: samples/s while training
//     (each worker's steps between its first and last progress rows of the
//     curve, summed over workers) and over the whole launch (wall time,
//     start-up and shut-down included);
//   - an accuracy run with an evaluation every --eval_every steps: seconds
//     from the launch to the first evaluation at or above --target, and the
//     final test accuracy.
// The table ends each row with the training rate's ratio to the yardstick.
//
//   grps_train_bench                        # sync 2x2, sync 1x2, async, ssp
//   grps_train_bench --configs=sync:2 --steps=300 --no_accuracy   (quick)
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <limits>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "data/dataset.h"
#include "job/job_config.h"
#include "launcher/local_launcher.h"
#include "tensor/backend.h"
#include "tensor/cpu_backend.h"
#include "worker/mlp_model.h"

ABSL_FLAG(std::string, configs, "sync:2,sync:2:grpc,sync:1,async:2,ssp:2",
          "grps runs, each MODE:SERVERS[:TRANSPORT] (ssp uses --staleness; TRANSPORT is "
          "the job's --local_transport, shm by default, or grpc: every byte through gRPC)");
ABSL_FLAG(uint32_t, workers, 2, "workers of every grps run, and threads of the yardstick");
ABSL_FLAG(uint32_t, staleness, 2, "the ssp runs' staleness bound");
ABSL_FLAG(std::optional<uint64_t>, steps, std::nullopt,
          "steps per worker (default: the job's 3 epochs)");
ABSL_FLAG(uint32_t, eval_every, 50, "the accuracy runs evaluate every this many steps");
ABSL_FLAG(double, target, 0.85, "test accuracy whose time is reported");
ABSL_FLAG(bool, no_accuracy, false, "skip the accuracy runs");
ABSL_FLAG(double, compute_seconds, 3, "how long each yardstick shape trains");
ABSL_FLAG(std::string, bin_dir, "", "where grps-coordinator, -server, -worker are "
          "(default: beside this program)");
ABSL_FLAG(std::string, run_root, "", "run folders go here (default: a fresh /tmp folder)");
ABSL_FLAG(double, timeout_s, 300, "each grps run fails after this long");

namespace grps {
namespace {

namespace fs = std::filesystem;

std::string OwnDirectory() {
  std::error_code ec;
  fs::path self = fs::read_symlink("/proc/self/exe", ec);
  return ec ? "." : self.parent_path().string();
}

// ---- The yardstick: the same model with no network ----

struct ComputeRate {
  double samples_per_sec = 0;
  uint64_t steps = 0;
};

// `threads` threads, each training its own copy of the default model on its
// own batches for `seconds`: gather, forward/backward, the gradient to host
// memory, an SGD step on the host parameters and back into the model (the
// host-side work a grps worker does around its pass, minus the network).
ComputeRate MeasureCompute(const v1::JobConfig& config, const Dataset& train,
                           int threads, int blas_threads, double seconds) {
  SetCpuBlasThreads(blas_threads);
  std::atomic<uint64_t> total_steps{0};
  std::atomic<bool> go{false};
  std::vector<double> busy(threads, 0);
  std::vector<std::thread> pool;
  const int batch = static_cast<int>(config.batch_size());
  for (int t = 0; t < threads; ++t)
    pool.emplace_back([&, t] {
      std::unique_ptr<Backend> backend = CreateCpuBackend();
      MlpModel model(backend.get(), LayerWidths(config), batch);
      std::vector<float> params(model.num_parameters()), grads(params.size());
      std::mt19937 rng(17 + t);
      std::uniform_real_distribution<float> init(-0.05f, 0.05f);
      for (float& p : params) p = init(rng);
      model.SetParameters(params.data());
      std::vector<float> x(static_cast<size_t>(batch) * train.num_features());
      std::vector<int32_t> y(batch);
      std::vector<int64_t> idx(batch);
      std::uniform_int_distribution<int64_t> pick(0, train.num_examples() - 1);
      while (!go.load()) std::this_thread::yield();
      const absl::Time start = absl::Now();
      const absl::Time end = start + absl::Seconds(seconds);
      uint64_t steps = 0;
      while (absl::Now() < end) {
        for (int64_t& i : idx) i = pick(rng);
        if (!train.Gather(idx, absl::MakeSpan(x), absl::MakeSpan(y)).ok()) break;
        model.ForwardBackward(x.data(), y.data(), batch, nullptr);
        model.GetGradients(grads.data());
        backend->Axpy(-config.optimizer().learning_rate(), grads.data(), params.data(),
                      params.size());
        model.SetParameters(params.data());
        ++steps;
      }
      busy[t] = absl::ToDoubleSeconds(absl::Now() - start);
      total_steps += steps;
    });
  go = true;
  for (std::thread& t : pool) t.join();
  ComputeRate r;
  r.steps = total_steps.load();
  const double secs = *std::max_element(busy.begin(), busy.end());
  r.samples_per_sec = secs > 0 ? r.steps * batch / secs : 0;
  return r;
}

// ---- grps runs ----

struct CurveRow {
  uint64_t step = 0;
  double unix_time = 0;
  double test_accuracy = -1;
  bool evaluated = false;
};

// The rows of a worker's curve CSV (see worker/trainer.cc), empty if absent.
std::vector<CurveRow> ReadCurve(const std::string& path) {
  std::vector<CurveRow> rows;
  std::ifstream in(path);
  std::string line;
  if (!std::getline(in, line)) return rows;  // header
  while (std::getline(in, line)) {
    std::vector<std::string> f = absl::StrSplit(line, ',');
    if (f.size() < 9) continue;
    CurveRow r;
    double evaluated = 0;
    if (!absl::SimpleAtoi(f[0], &r.step) || !absl::SimpleAtod(f[3], &r.unix_time) ||
        !absl::SimpleAtod(f[6], &r.test_accuracy) || !absl::SimpleAtod(f[8], &evaluated))
      continue;
    r.evaluated = evaluated != 0;
    rows.push_back(r);
  }
  return rows;
}

struct RunFigures {
  bool ok = false;
  std::string error;
  double wall_s = 0;
  double job_samples_per_sec = 0;    // all samples / wall
  double train_samples_per_sec = 0;  // while training, summed over workers
  std::optional<double> time_to_target_s;
  std::optional<double> final_accuracy;
};

struct GrpsConfig {
  std::string mode;
  uint32_t servers = 2;
  std::string transport = "shm";
  std::string Name() const {
    return absl::StrCat(mode, " ", servers, "s", transport == "shm" ? "" : " " + transport);
  }
};

RunFigures RunGrps(const GrpsConfig& c, bool accuracy_run, const std::string& run_dir) {
  LaunchOptions o;
  o.bin_dir = absl::GetFlag(FLAGS_bin_dir).empty() ? OwnDirectory()
                                                   : absl::GetFlag(FLAGS_bin_dir);
  o.run_dir = run_dir;
  o.job_id = fs::path(run_dir).filename().string();
  o.mode = c.mode;
  o.servers = c.servers;
  o.workers = absl::GetFlag(FLAGS_workers);
  o.backend = "cpu";
  o.timeout = absl::Seconds(absl::GetFlag(FLAGS_timeout_s));
  o.strict = true;
  o.restart_servers = 0;
  o.restart_coordinator = 0;
  o.job_flags.push_back(
      {"eval_every", accuracy_run ? absl::StrCat(absl::GetFlag(FLAGS_eval_every)) : "0"});
  if (c.mode == "ssp")
    o.job_flags.push_back({"staleness", absl::StrCat(absl::GetFlag(FLAGS_staleness))});
  o.job_flags.push_back({"local_transport", c.transport});
  if (absl::GetFlag(FLAGS_steps))
    o.job_flags.push_back({"steps", absl::StrCat(*absl::GetFlag(FLAGS_steps))});
  RunFigures f;
  fs::create_directories(run_dir);
  std::FILE* out = std::fopen((fs::path(run_dir) / "launcher.out").c_str(), "w");
  if (out == nullptr) {
    f.error = "cannot write launcher.out";
    return f;
  }
  const absl::Time start = absl::Now();
  const int rc = LocalLauncher(o, out, [] { return false; }).Run();
  f.wall_s = absl::ToDoubleSeconds(absl::Now() - start);
  std::fclose(out);
  if (rc != kLaunchOk) {
    f.error = absl::StrCat("grps-local failed (exit ", rc, "); see ", run_dir);
    return f;
  }
  f.ok = true;
  const double start_unix = absl::ToDoubleSeconds(start - absl::UnixEpoch());
  const uint64_t batch = DefaultJobConfig().batch_size();
  uint64_t all_steps = 0;
  std::optional<double> final_time;
  for (uint32_t rank = 0; rank < o.workers; ++rank) {
    std::vector<CurveRow> rows =
        ReadCurve(absl::StrCat(run_dir, "/curve-worker-", rank, ".csv"));
    std::vector<CurveRow> progress;
    for (const CurveRow& r : rows) {
      if (!r.evaluated) progress.push_back(r);
      if (r.evaluated && r.test_accuracy >= absl::GetFlag(FLAGS_target) &&
          (!f.time_to_target_s || r.unix_time - start_unix < *f.time_to_target_s))
        f.time_to_target_s = r.unix_time - start_unix;
      if (r.evaluated && (!final_time || r.unix_time >= *final_time)) {
        final_time = r.unix_time;
        f.final_accuracy = r.test_accuracy;
      }
    }
    if (!rows.empty()) all_steps += rows.back().step;
    if (progress.size() >= 2) {
      const double dt = progress.back().unix_time - progress.front().unix_time;
      if (dt > 0)
        f.train_samples_per_sec +=
            (progress.back().step - progress.front().step) * batch / dt;
    }
  }
  f.job_samples_per_sec = f.wall_s > 0 ? all_steps * batch / f.wall_s : 0;
  return f;
}

std::string Fmt(std::optional<double> v, const char* spec) {
  if (!v) return "-";
  char buf[64];
  std::snprintf(buf, sizeof(buf), spec, *v);
  return buf;
}

int Main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  std::vector<GrpsConfig> configs;
  for (absl::string_view item :
       absl::StrSplit(absl::GetFlag(FLAGS_configs), ',', absl::SkipEmpty())) {
    std::vector<std::string> parts = absl::StrSplit(item, ':');
    GrpsConfig c;
    c.mode = parts[0];
    if (parts.size() > 2) c.transport = parts[2];
    if (!ParseMode(c.mode).ok() || parts.size() > 3 ||
        (parts.size() > 1 && !absl::SimpleAtoi(parts[1], &c.servers)) || c.servers == 0 ||
        !ParseLocalTransport(c.transport).ok()) {
      std::fprintf(stderr, "--configs: bad entry '%s' (MODE:SERVERS[:TRANSPORT])\n",
                   std::string(item).c_str());
      return 2;
    }
    configs.push_back(c);
  }
  std::string root = absl::GetFlag(FLAGS_run_root);
  if (root.empty()) root = absl::StrCat("/tmp/grps-train-bench-", getpid());

  v1::JobConfig config = DefaultJobConfig();
  absl::StatusOr<Dataset> train =
      LoadIdxDirectory(config.dataset().path(), DatasetSplit::kTrain);
  if (!train.ok()) {
    std::fprintf(stderr, "cannot load %s: %s\n", config.dataset().path().c_str(),
                 std::string(train.status().message()).c_str());
    return 1;
  }
  const int workers = static_cast<int>(absl::GetFlag(FLAGS_workers));
  const int cores = static_cast<int>(std::thread::hardware_concurrency());
  const double secs = absl::GetFlag(FLAGS_compute_seconds);
  std::printf("grps_train_bench: %d cores; default job (%s, batch %u per worker), "
              "%d workers; runs in %s\n\n", cores, ModelName(config.model()).c_str(),
              config.batch_size(), workers, root.c_str());
  const ComputeRate per_thread = MeasureCompute(config, *train, workers, 1, secs);
  const ComputeRate one_thread = MeasureCompute(config, *train, 1, cores, secs);
  const double yardstick = std::max(per_thread.samples_per_sec, one_thread.samples_per_sec);
  std::printf("compute only (no network), samples/s:\n");
  std::printf("  %d threads x 1 BLAS thread    %9.0f\n", workers, per_thread.samples_per_sec);
  std::printf("  1 thread x %d BLAS threads    %9.0f\n", cores, one_thread.samples_per_sec);
  std::printf("  yardstick (the better)       %9.0f\n\n", yardstick);
  std::fflush(stdout);

  std::printf("%-15s %10s %11s %9s %12s %10s %8s\n", "grps", "train/s", "launch/s",
              "wall s", "to target s", "final acc", "ratio");
  bool all_ok = true;
  for (const GrpsConfig& c : configs) {
    const std::string stem = absl::StrCat(root, "/", c.mode, "-", c.servers, "s-", c.transport);
    RunFigures rate = RunGrps(c, false, stem + "-rate");
    RunFigures acc;
    if (rate.ok && !absl::GetFlag(FLAGS_no_accuracy)) acc = RunGrps(c, true, stem + "-acc");
    if (!rate.ok || (!absl::GetFlag(FLAGS_no_accuracy) && !acc.ok)) {
      all_ok = false;
      std::printf("%-15s failed: %s\n", c.Name().c_str(),
                  (rate.ok ? acc.error : rate.error).c_str());
      continue;
    }
    std::printf("%-15s %10.0f %11.0f %9.2f %12s %10s %8.2f\n", c.Name().c_str(),
                rate.train_samples_per_sec, rate.job_samples_per_sec, rate.wall_s,
                Fmt(acc.time_to_target_s, "%.2f").c_str(),
                Fmt(acc.ok ? acc.final_accuracy : rate.final_accuracy, "%.4f").c_str(),
                yardstick > 0 ? rate.train_samples_per_sec / yardstick : 0.0);
    std::fflush(stdout);
  }
  std::printf("\nratio: grps training samples/s over the compute-only yardstick. "
              "\"to target\": seconds from the launch to the first evaluation at or "
              "above %.2f (accuracy run, evaluation every %u steps).\n",
              absl::GetFlag(FLAGS_target), absl::GetFlag(FLAGS_eval_every));
  return all_ok ? 0 : 1;
}

}  // namespace
}  // namespace grps

int main(int argc, char** argv) { return grps::Main(argc, argv); }
