// grps_step_bench: a worker's compute step on one backend, before and after
// the pipelined step, and GEMM throughput beside the device's peak.
//
//   - GEMM: n x n by n x n through Backend::Gemm in f32, and GemmIn on f16
//     and bf16 values (tensor cores on a GPU), 2 n^3 flops a call, in
//     GFLOP/s beside Backend::PeakGflops, the f32 peak without tensor cores
//     (on CUDA: multiprocessors x f32 units x 2 x clock; unknown on the CPU).
//   - Step: what a worker computes each step for a model of --models widths
//     and --batch examples, timed two ways in the same run:
//       synchronous (the yardstick, the calls of the worker before the
//         pipelined step): weights from ordinary pageable memory,
//         MlpModel::ForwardBackward (which waits for the device), then
//         GetGradients (a synchronous copy); no batch staged ahead, no
//         gradient download overlapped;
//       pipelined (Trainer::DenseStep): weights and gradients in page-locked
//         memory (HostArray), the next batch staged while this one computes,
//         each layer's weights uploaded while the layers before it compute,
//         each layer's gradient downloaded while the layers below compute,
//         and one wait at the end.
//     On the CPU backend both run the same arithmetic and copies; the ratio
//     shows what the pipeline costs there. On a GPU it shows the overlap.
//
//   grps_step_bench                      # auto: CUDA when usable, else CPU
//   grps_step_bench --backend=cuda --gemm=1024,4096,8192 --seconds=2
#include <algorithm>
#include <cstdio>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "tensor/backend.h"
#include "tensor/dtype.h"
#include "worker/mlp_model.h"

ABSL_FLAG(std::string, backend, "auto", "auto, cpu or cuda");
ABSL_FLAG(std::string, gemm, "256,1024,2048", "GEMM sizes n (n x n x n), comma-separated");
ABSL_FLAG(std::string, models, "784,256,128,10;784,4096,3072,10",
          "models to step, each its layer widths; ';' between models");
ABSL_FLAG(int, batch, 64, "examples per step");
ABSL_FLAG(double, seconds, 1.0, "time spent on each figure");
ABSL_FLAG(std::string, compute_dtype, "f32", "the steps' compute dtype: f32, bf16 or f16");

namespace grps {
namespace {

std::vector<float> Random(size_t n, uint32_t seed, float scale) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(-scale, scale);
  std::vector<float> v(n);
  for (float& x : v) x = dist(rng);
  return v;
}

// Calls `once` until `seconds` have passed (after one untimed call);
// returns the mean seconds per call.
template <typename Fn>
double TimePerCall(Backend& backend, double seconds, Fn once) {
  once();
  backend.Synchronize();
  int64_t calls = 0;
  const absl::Time start = absl::Now();
  absl::Duration elapsed;
  do {
    once();
    backend.Synchronize();
    ++calls;
    elapsed = absl::Now() - start;
  } while (elapsed < absl::Seconds(seconds));
  return absl::ToDoubleSeconds(elapsed) / calls;
}

void BenchGemm(Backend& backend, DType dtype, int n, double seconds) {
  const size_t count = static_cast<size_t>(n) * n;
  const std::vector<float> host = Random(count, 1, 1.0f);
  DeviceBuffer a(&backend, count * sizeof(float)), b(&backend, count * sizeof(float)),
      c(&backend, count * sizeof(float));
  backend.CopyToDevice(a.data(), host.data(), a.bytes());
  backend.CopyToDevice(b.data(), host.data(), b.bytes());
  backend.RoundTo(dtype, a.f32(), count);
  backend.RoundTo(dtype, b.f32(), count);
  const double per_call = TimePerCall(backend, seconds, [&] {
    backend.GemmIn(dtype, false, false, n, n, n, 1.0f, a.f32(), n, b.f32(), n, 0.0f, c.f32(),
                   n);
  });
  const double gflops = 2.0 * n * n * static_cast<double>(n) / per_call / 1e9;
  const double peak = backend.PeakGflops();
  const std::string name(DTypeName(dtype));
  if (peak > 0)
    std::printf("gemm %-4s %5d   %10.1f GFLOP/s   f32 peak %10.1f   %6.1f %% of it\n",
                name.c_str(), n, gflops, peak, 100.0 * gflops / peak);
  else
    std::printf("gemm %-4s %5d   %10.1f GFLOP/s   f32 peak unknown\n", name.c_str(), n, gflops);
}

void BenchStep(Backend& backend, DType dtype, const std::vector<int64_t>& widths, int batch,
               double seconds) {
  MlpModel model(&backend, widths, batch);
  model.set_compute_dtype(dtype);
  const size_t params = static_cast<size_t>(model.num_parameters());
  const std::vector<float> weights = Random(params, 2, 0.05f);
  // Two batches taking turns, as the loader's do.
  std::vector<std::vector<float>> x = {Random(batch * widths[0], 3, 1.0f),
                                       Random(batch * widths[0], 4, 1.0f)};
  std::vector<int32_t> y(batch);
  for (int i = 0; i < batch; ++i) y[i] = static_cast<int32_t>(i % widths.back());

  // The yardstick: pageable memory, each copy waited for.
  std::vector<float> pageable_weights = weights, pageable_grads(params);
  int turn = 0;
  const double sync = TimePerCall(backend, seconds, [&] {
    model.SetParameters(pageable_weights.data());
    model.ForwardBackward(x[turn].data(), y.data(), batch, nullptr);
    model.GetGradients(pageable_grads.data());
    turn = 1 - turn;
  });

  HostArray<float> host_weights(&backend, params), host_grads(&backend, params);
  std::copy(weights.begin(), weights.end(), host_weights.begin());
  uint64_t step = 0;
  model.StageBatch(step, x[0].data(), y.data(), batch);
  const double pipelined = TimePerCall(backend, seconds, [&] {
    model.SetParameters(host_weights.data());
    model.ComputeStaged(step, 0, 1, 1.0f, host_grads.data());
    model.StageBatch(step + 1, x[(step + 1) % 2].data(), y.data(), batch);
    model.FinishStep();
    ++step;
  });
  std::printf("step %-22s %s, batch %d, %.1f MB of weights: synchronous %8.3f ms, "
              "pipelined %8.3f ms, ratio %.2f\n",
              absl::StrJoin(widths, "-").c_str(), std::string(DTypeName(dtype)).c_str(), batch,
              params * 4.0 / 1e6, sync * 1e3, pipelined * 1e3, sync / pipelined);
}

int Main() {
  absl::StatusOr<BackendKind> kind = ParseBackendKind(absl::GetFlag(FLAGS_backend));
  if (!kind.ok()) {
    std::fprintf(stderr, "%s\n", std::string(kind.status().message()).c_str());
    return 2;
  }
  absl::StatusOr<std::unique_ptr<Backend>> backend = CreateBackend(*kind);
  if (!backend.ok()) {
    std::fprintf(stderr, "%s\n", std::string(backend.status().message()).c_str());
    return 1;
  }
  const double seconds = absl::GetFlag(FLAGS_seconds);
  absl::StatusOr<DType> dtype = ParseDType(absl::GetFlag(FLAGS_compute_dtype));
  if (!dtype.ok()) {
    std::fprintf(stderr, "--compute_dtype: %s\n", std::string(dtype.status().message()).c_str());
    return 2;
  }
  std::printf("backend: %s\n", (*backend)->Name().c_str());
  for (absl::string_view n : absl::StrSplit(absl::GetFlag(FLAGS_gemm), ',', absl::SkipEmpty())) {
    int size = 0;
    if (!absl::SimpleAtoi(n, &size) || size <= 0) {
      std::fprintf(stderr, "--gemm: not a size: %s\n", std::string(n).c_str());
      return 2;
    }
    BenchGemm(**backend, DType::kF32, size, seconds);
    // The CPU runs GemmIn as Gemm: only a GPU has 16-bit figures of its own.
    if ((*backend)->IsCuda()) {
      BenchGemm(**backend, DType::kF16, size, seconds);
      BenchGemm(**backend, DType::kBF16, size, seconds);
    }
  }
  for (absl::string_view m : absl::StrSplit(absl::GetFlag(FLAGS_models), ';', absl::SkipEmpty())) {
    std::vector<int64_t> widths;
    for (absl::string_view w : absl::StrSplit(m, ',')) {
      int64_t width = 0;
      if (!absl::SimpleAtoi(w, &width) || width <= 0) {
        std::fprintf(stderr, "--models: not a width: %s\n", std::string(w).c_str());
        return 2;
      }
      widths.push_back(width);
    }
    if (widths.size() < 2) {
      std::fprintf(stderr, "--models: a model needs at least two widths\n");
      return 2;
    }
    BenchStep(**backend, *dtype, widths, absl::GetFlag(FLAGS_batch), seconds);
  }
  return 0;
}

}  // namespace
}  // namespace grps

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  return grps::Main();
}
