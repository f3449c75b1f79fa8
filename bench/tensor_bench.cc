// grps_tensor_bench: CPU GEMM throughput and the server's optimizer update
// rate, printed beside the yardstick measured in the same run:
//   - GEMM (OpenBLAS, all its threads) in GFLOP/s, 2 n^3 per call;
//   - SGD and Adam (one thread, as a server applies one chunk) in GB/s of
//     memory touched, beside memcpy of a chunk of the same size on one thread
//     (read + write bytes): how fast this machine streams memory. An update
//     can beat memcpy's figure a little: it writes back lines it has just
//     read, while memcpy's destination lines must first be fetched or
//     streamed around the cache.
// After Google Benchmark's table comes a summary with the ratio to memcpy.
//
//   grps_tensor_bench --benchmark_min_time=0.2
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "benchmark/benchmark.h"
#include "tensor/backend.h"

namespace grps {
namespace {

// 16M elements (64 MiB of f32): a large dense chunk, well beyond every cache.
constexpr size_t kChunk = size_t{16} << 20;

// Bytes each update touches per element (reads + writes of f32):
//   SGD:  reads p, g;        writes p        -> 3 x 4 = 12
//   Adam: reads p, g, m, v;  writes p, m, v  -> 7 x 4 = 28
constexpr double kSgdBytesPerElement = 12;
constexpr double kAdamBytesPerElement = 28;

Backend& Cpu() {
  static Backend* backend = CreateCpuBackend().release();
  return *backend;
}

// A backend buffer written once, so that page faults are not timed.
DeviceBuffer FilledBuffer(size_t n, float value) {
  DeviceBuffer buf(&Cpu(), n * sizeof(float));
  Cpu().Fill(buf.f32(), value, n);
  return buf;
}

void SetBandwidthCounter(benchmark::State& state, double bytes_per_iteration) {
  state.counters["GB/s"] = benchmark::Counter(
      bytes_per_iteration, benchmark::Counter::kIsIterationInvariantRate,
      benchmark::Counter::kIs1000);
}

void BM_Gemm(benchmark::State& state) {
  const int n = static_cast<int>(state.range(0));
  std::mt19937 rng(1);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  std::vector<float> host(static_cast<size_t>(n) * n);
  for (float& x : host) x = dist(rng);
  DeviceBuffer a = FilledBuffer(host.size(), 0.0f);
  DeviceBuffer b = FilledBuffer(host.size(), 0.0f);
  DeviceBuffer c = FilledBuffer(host.size(), 0.0f);
  Cpu().CopyToDevice(a.data(), host.data(), a.bytes());
  Cpu().CopyToDevice(b.data(), host.data(), b.bytes());
  for (auto _ : state) {
    Cpu().Gemm(false, false, n, n, n, 1.0f, a.f32(), n, b.f32(), n, 0.0f,
               c.f32(), n);
    benchmark::DoNotOptimize(c.data());
    benchmark::ClobberMemory();
  }
  state.counters["GFLOP/s"] = benchmark::Counter(
      2.0 * n * n * n / 1e9, benchmark::Counter::kIsIterationInvariantRate);
}
// Wall time throughout: OpenBLAS runs GEMM on its own threads, whose CPU time
// the calling thread's clock would not see.
BENCHMARK(BM_Gemm)->Arg(256)->Arg(512)->Arg(1024)->UseRealTime()->Unit(
    benchmark::kMillisecond);

void BM_Memcpy(benchmark::State& state) {
  DeviceBuffer src = FilledBuffer(kChunk, 1.0f);
  DeviceBuffer dst = FilledBuffer(kChunk, 0.0f);
  for (auto _ : state) {
    std::memcpy(dst.data(), src.data(), src.bytes());
    benchmark::DoNotOptimize(dst.data());
    benchmark::ClobberMemory();
  }
  SetBandwidthCounter(state, 2.0 * src.bytes());  // read + write
}
BENCHMARK(BM_Memcpy)->UseRealTime()->Unit(benchmark::kMillisecond);

void BM_SgdUpdate(benchmark::State& state) {
  DeviceBuffer param = FilledBuffer(kChunk, 0.5f);
  DeviceBuffer grad = FilledBuffer(kChunk, 1e-3f);
  SgdParams hp;
  hp.lr = 1e-6f;
  for (auto _ : state) {
    Cpu().SgdUpdate(hp, param.f32(), grad.f32(), kChunk);
    benchmark::ClobberMemory();
  }
  SetBandwidthCounter(state, kSgdBytesPerElement * kChunk);
}
BENCHMARK(BM_SgdUpdate)->UseRealTime()->Unit(benchmark::kMillisecond);

void BM_AdamUpdate(benchmark::State& state) {
  DeviceBuffer param = FilledBuffer(kChunk, 0.5f);
  DeviceBuffer grad = FilledBuffer(kChunk, 1e-3f);
  DeviceBuffer m = FilledBuffer(kChunk, 0.0f);
  DeviceBuffer v = FilledBuffer(kChunk, 0.0f);
  AdamParams hp;
  hp.lr = 1e-6f;
  for (auto _ : state) {
    Cpu().AdamUpdate(hp, param.f32(), grad.f32(), m.f32(), v.f32(), kChunk);
    ++hp.step;
    benchmark::ClobberMemory();
  }
  SetBandwidthCounter(state, kAdamBytesPerElement * kChunk);
}
BENCHMARK(BM_AdamUpdate)->UseRealTime()->Unit(benchmark::kMillisecond);

// Shows Google Benchmark's table, and keeps each benchmark's best figure
// for a summary that puts every figure beside its yardstick.
class SummaryReporter : public benchmark::ConsoleReporter {
 public:
  explicit SummaryReporter(OutputOptions options) : ConsoleReporter(options) {}

  void ReportRuns(const std::vector<Run>& runs) override {
    ConsoleReporter::ReportRuns(runs);
    for (const Run& run : runs) {
      if (run.run_type != Run::RT_Iteration || run.error_occurred) continue;
      for (const char* counter : {"GFLOP/s", "GB/s"}) {
        auto it = run.counters.find(counter);
        if (it == run.counters.end()) continue;
        // "BM_Gemm/256/real_time" -> "BM_Gemm/256"
        std::string name = run.run_name.function_name;
        if (!run.run_name.args.empty()) name += "/" + run.run_name.args;
        double& best = best_[name];
        best = std::max(best, it->second.value);
      }
    }
  }

  void PrintSummary() const {
    std::printf("\nSummary (best run of each)\n");
    std::printf("%-34s %10s\n", "GEMM, f32, n x n times n x n", "GFLOP/s");
    for (int n : {256, 512, 1024}) {
      if (const double* g = Find("BM_Gemm/" + std::to_string(n))) {
        std::printf("  n = %-28d %10.1f\n", n, *g);
      }
    }

    const double* memcpy_rate = Find("BM_Memcpy");
    if (memcpy_rate == nullptr || *memcpy_rate <= 0) return;
    std::printf("\n%-34s %10s %12s %10s\n",
                ("update of " + std::to_string(kChunk) + " f32").c_str(),
                "GB/s", "Melem/s", "of memcpy");
    struct Row {
      const char* benchmark;
      const char* label;
      double bytes_per_element;
    };
    const Row rows[] = {
        {"BM_Memcpy", "memcpy (yardstick, 8 B/elem)", 8},
        {"BM_SgdUpdate", "SGD (12 B/elem)", kSgdBytesPerElement},
        {"BM_AdamUpdate", "Adam (28 B/elem)", kAdamBytesPerElement},
    };
    for (const Row& row : rows) {
      const double* rate = Find(row.benchmark);
      if (rate == nullptr) continue;
      std::printf("  %-32s %10.2f %12.0f %9.0f%%\n", row.label, *rate / 1e9,
                  *rate / row.bytes_per_element / 1e6,
                  100.0 * *rate / *memcpy_rate);
    }
  }

 private:
  const double* Find(const std::string& name) const {
    auto it = best_.find(name);
    return it == best_.end() ? nullptr : &it->second;
  }

  std::map<std::string, double> best_;
};

}  // namespace
}  // namespace grps

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  std::printf("backend: %s\n", grps::Cpu().Name().c_str());
  grps::SummaryReporter reporter(
      isatty(STDOUT_FILENO) ? benchmark::ConsoleReporter::OO_ColorTabular
                            : benchmark::ConsoleReporter::OO_Tabular);
  benchmark::RunSpecifiedBenchmarks(&reporter);
  reporter.PrintSummary();
  benchmark::Shutdown();
  return 0;
}
