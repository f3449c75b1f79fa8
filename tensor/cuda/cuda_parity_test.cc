// The CUDA backend computes what the CPU backend computes: every op runs on
// the same random inputs through both, and the results agree within float
// rounding (summation order and fused multiply-add differ). On a machine
// without a usable GPU the parity tests skip, naming the reason; the tests of
// how a backend is chosen run everywhere.

#include <dlfcn.h>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "gtest/gtest.h"
#include "tensor/backend.h"

namespace grps {
namespace {

bool DriverLoads() {
  return dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL) != nullptr;
}

bool Contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

// |want - got| <= atol + rtol * |want| everywhere; NaN matches only NaN.
::testing::AssertionResult AllClose(const std::vector<float>& want,
                                    const std::vector<float>& got,
                                    double rtol, double atol) {
  if (want.size() != got.size()) {
    return ::testing::AssertionFailure()
           << "sizes differ: " << want.size() << " vs " << got.size();
  }
  size_t bad = 0;
  size_t first_bad = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    const double w = want[i];
    const double g = got[i];
    // Equal infinities agree too (their difference is NaN).
    const bool ok = w == g || (std::isnan(w) ? std::isnan(g)
                                             : std::abs(w - g) <= atol + rtol * std::abs(w));
    if (!ok && bad++ == 0) first_bad = i;
  }
  if (bad == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure()
         << bad << " of " << want.size() << " elements differ; first at ["
         << first_bad << "]: cpu " << want[first_bad] << ", cuda "
         << got[first_bad];
}

// The same data in both backends' memory.
struct BufferPair {
  DeviceBuffer cpu;
  DeviceBuffer gpu;
  size_t count = 0;
};

class CudaParityTest : public ::testing::Test {
 protected:
  void SetUp() override {
    absl::StatusOr<std::unique_ptr<Backend>> cuda =
        CreateBackend(BackendKind::kCuda);
    if (!cuda.ok()) {
      GTEST_SKIP() << "CUDA backend unavailable: " << cuda.status().message();
    }
    gpu_ = std::move(*cuda);
    cpu_ = CreateCpuBackend();
  }

  std::vector<float> Random(size_t n, float lo = -1.0f, float hi = 1.0f) {
    std::uniform_real_distribution<float> dist(lo, hi);
    std::vector<float> values(n);
    for (float& v : values) v = dist(rng_);
    return values;
  }

  template <typename T>
  BufferPair Upload(const std::vector<T>& host) {
    const size_t bytes = host.size() * sizeof(T);
    BufferPair pair{DeviceBuffer(cpu_.get(), bytes),
                    DeviceBuffer(gpu_.get(), bytes), host.size()};
    cpu_->CopyToDevice(pair.cpu.data(), host.data(), bytes);
    gpu_->CopyToDevice(pair.gpu.data(), host.data(), bytes);
    return pair;
  }

  // Overwrites both copies with `host`.
  void Refill(BufferPair& pair, const std::vector<float>& host) {
    ASSERT_EQ(host.size(), pair.count);
    const size_t bytes = host.size() * sizeof(float);
    cpu_->CopyToDevice(pair.cpu.data(), host.data(), bytes);
    gpu_->CopyToDevice(pair.gpu.data(), host.data(), bytes);
  }

  static std::vector<float> Download(Backend* backend, DeviceBuffer& buffer,
                                     size_t count) {
    std::vector<float> host(count);
    backend->CopyToHost(host.data(), buffer.data(), count * sizeof(float));
    return host;
  }

  ::testing::AssertionResult Agree(BufferPair& pair, double rtol,
                                   double atol) {
    return AllClose(Download(cpu_.get(), pair.cpu, pair.count),
                    Download(gpu_.get(), pair.gpu, pair.count), rtol, atol);
  }

  std::unique_ptr<Backend> cpu_;
  std::unique_ptr<Backend> gpu_;
  std::mt19937 rng_{20240611};
};

TEST_F(CudaParityTest, IdentifiesItselfAsCuda) {
  EXPECT_TRUE(gpu_->IsCuda());
  const std::string name = gpu_->Name();
  EXPECT_EQ(name.rfind("cuda (", 0), 0u) << name;
  EXPECT_TRUE(Contains(name, "sm_")) << name;
}

TEST_F(CudaParityTest, FillAndCopiesRoundTrip) {
  std::vector<float> host = Random(1000);
  BufferPair pair = Upload(host);
  EXPECT_TRUE(AllClose(host, Download(gpu_.get(), pair.gpu, 1000), 0, 0));

  cpu_->Fill(pair.cpu.f32() + 100, 2.5f, 300);
  gpu_->Fill(pair.gpu.f32() + 100, 2.5f, 300);
  EXPECT_TRUE(Agree(pair, 0, 0));

  DeviceBuffer copy(gpu_.get(), 1000 * sizeof(float));
  gpu_->CopyOnDevice(copy.data(), pair.gpu.data(), 1000 * sizeof(float));
  EXPECT_TRUE(AllClose(Download(cpu_.get(), pair.cpu, 1000),
                       Download(gpu_.get(), copy, 1000), 0, 0));
}

// The copy queue runs beside the compute queue, ordered by events only: an
// upload of 32 MiB from page-locked memory, a kernel that waits for it, a
// download that waits for the kernel, and the host that waits for the
// download. Any missing order shows up as zeros or unscaled values.
TEST_F(CudaParityTest, AsyncCopiesAndEventsOrderTheTwoQueues) {
  constexpr size_t n = size_t{8} << 20;
  HostArray<float> in(gpu_.get(), n), out(gpu_.get(), n);
  for (size_t i = 0; i < n; ++i) in[i] = static_cast<float>(i % 1000);
  DeviceBuffer device(gpu_.get(), n * sizeof(float));
  gpu_->Fill(device.f32(), 0.0f, n);
  gpu_->Synchronize();  // the copy below is not ordered after the Fill
  std::unique_ptr<BackendEvent> uploaded = gpu_->CreateEvent();
  std::unique_ptr<BackendEvent> scaled = gpu_->CreateEvent();
  std::unique_ptr<BackendEvent> downloaded = gpu_->CreateEvent();
  gpu_->Wait(Queue::kCopy, *scaled);  // never recorded: no wait
  gpu_->CopyToDeviceAsync(device.data(), in.data(), n * sizeof(float));
  gpu_->Record(Queue::kCopy, uploaded.get());
  gpu_->Wait(Queue::kCompute, *uploaded);
  gpu_->Scale(2.0f, device.f32(), n);
  gpu_->Record(Queue::kCompute, scaled.get());
  gpu_->Wait(Queue::kCopy, *scaled);
  gpu_->CopyToHostAsync(out.data(), device.data(), n * sizeof(float));
  gpu_->Record(Queue::kCopy, downloaded.get());
  gpu_->WaitOnHost(*downloaded);
  size_t bad = 0;
  for (size_t i = 0; i < n; ++i) bad += out[i] != 2.0f * static_cast<float>(i % 1000);
  EXPECT_EQ(bad, 0u);
}

TEST_F(CudaParityTest, EnqueuedLossMatchesTheSynchronousOne) {
  constexpr int rows = 100, cols = 10;
  BufferPair x = Upload(Random(rows * cols, -5, 5));
  std::vector<int32_t> labels(rows);
  for (int r = 0; r < rows; ++r) labels[r] = r % cols;
  BufferPair y = Upload(labels);
  int64_t correct = -1;
  const float want = gpu_->SoftmaxCrossEntropy(x.gpu.f32(), y.gpu.i32(), rows, cols,
                                               nullptr, &correct);
  HostArray<LossOutput> out(gpu_.get(), 1);
  gpu_->EnqueueSoftmaxCrossEntropy(x.gpu.f32(), y.gpu.i32(), rows, cols, nullptr,
                                   out.data());
  std::unique_ptr<BackendEvent> done = gpu_->CreateEvent();
  gpu_->Record(Queue::kCompute, done.get());
  gpu_->WaitOnHost(*done);
  EXPECT_EQ(out[0].rows, rows);
  EXPECT_EQ(out[0].bad_label, 0);
  EXPECT_EQ(out[0].mean_loss(), want);
  EXPECT_EQ(static_cast<int64_t>(out[0].correct), correct);
}

// 16-bit operands on the tensor cores: the products are exact, the sums f32,
// so the result is the CPU's f32 GEMM of the same rounded values up to
// summation order.
TEST_F(CudaParityTest, GemmInSixteenBitsMatchesTheCpuOnRoundedOperands) {
  constexpr int m = 96, n = 130, k = 300;
  for (DType dtype : {DType::kF16, DType::kBF16}) {
    BufferPair a = Upload(Random(static_cast<size_t>(m) * k));
    BufferPair b = Upload(Random(static_cast<size_t>(k) * n));
    BufferPair c = Upload(std::vector<float>(static_cast<size_t>(m) * n));
    for (BufferPair* x : {&a, &b}) {
      cpu_->RoundTo(dtype, x->cpu.f32(), x->count);
      gpu_->RoundTo(dtype, x->gpu.f32(), x->count);
    }
    cpu_->GemmIn(dtype, false, false, m, n, k, 1.0f, a.cpu.f32(), k, b.cpu.f32(), n, 0.0f,
                 c.cpu.f32(), n);
    gpu_->GemmIn(dtype, false, false, m, n, k, 1.0f, a.gpu.f32(), k, b.gpu.f32(), n, 0.0f,
                 c.gpu.f32(), n);
    EXPECT_TRUE(Agree(c, 1e-4, 1e-4)) << DTypeName(dtype);
  }
}

TEST_F(CudaParityTest, ReportsAPeakRate) {
  // An H100 has 132 multiprocessors at 1.98 GHz: about 67 TFLOP/s.
  EXPECT_GT(gpu_->PeakGflops(), 1000.0);
  EXPECT_EQ(cpu_->PeakGflops(), 0.0);
}

TEST_F(CudaParityTest, CopyOnDeviceHandlesOverlapLikeMemmove) {
  BufferPair pair = Upload(Random(1000));
  // Forward over an overlapping range, then backward.
  for (Backend* b : {cpu_.get(), gpu_.get()}) {
    DeviceBuffer& buf = b == cpu_.get() ? pair.cpu : pair.gpu;
    b->CopyOnDevice(buf.f32() + 7, buf.f32(), 600 * sizeof(float));
    b->CopyOnDevice(buf.f32() + 300, buf.f32() + 313, 500 * sizeof(float));
  }
  EXPECT_TRUE(Agree(pair, 0, 0));
}

TEST_F(CudaParityTest, GemmMatchesCpuForEveryTranspose) {
  constexpr int m = 37, n = 29, k = 53;
  for (bool trans_a : {false, true}) {
    for (bool trans_b : {false, true}) {
      SCOPED_TRACE(::testing::Message()
                   << "trans_a=" << trans_a << " trans_b=" << trans_b);
      // Stored shapes, with padded row strides so that lda/ldb/ldc are
      // exercised rather than implied.
      const int a_rows = trans_a ? k : m, a_cols = trans_a ? m : k;
      const int b_rows = trans_b ? n : k, b_cols = trans_b ? k : n;
      const int lda = a_cols + 3, ldb = b_cols + 5, ldc = n + 2;
      BufferPair a = Upload(Random(static_cast<size_t>(a_rows) * lda));
      BufferPair b = Upload(Random(static_cast<size_t>(b_rows) * ldb));
      BufferPair c = Upload(Random(static_cast<size_t>(m) * ldc));

      cpu_->Gemm(trans_a, trans_b, m, n, k, 0.7f, a.cpu.f32(), lda,
                 b.cpu.f32(), ldb, 0.3f, c.cpu.f32(), ldc);
      gpu_->Gemm(trans_a, trans_b, m, n, k, 0.7f, a.gpu.f32(), lda,
                 b.gpu.f32(), ldb, 0.3f, c.gpu.f32(), ldc);
      // The padding columns of C must be untouched on both.
      EXPECT_TRUE(Agree(c, 1e-5, 1e-5));
    }
  }
}

TEST_F(CudaParityTest, GemmMatchesCpuOnLayerSizedMatrices) {
  // A hidden layer's forward pass on a batch: [128, 784] x [784, 256].
  constexpr int m = 128, n = 256, k = 784;
  BufferPair a = Upload(Random(static_cast<size_t>(m) * k));
  BufferPair b = Upload(Random(static_cast<size_t>(k) * n, -0.1f, 0.1f));
  const float nan = std::numeric_limits<float>::quiet_NaN();
  BufferPair c = Upload(std::vector<float>(static_cast<size_t>(m) * n, nan));
  // beta == 0: C is written, never read, so its NaNs must not leak.
  cpu_->Gemm(false, false, m, n, k, 1.0f, a.cpu.f32(), k, b.cpu.f32(), n,
             0.0f, c.cpu.f32(), n);
  gpu_->Gemm(false, false, m, n, k, 1.0f, a.gpu.f32(), k, b.gpu.f32(), n,
             0.0f, c.gpu.f32(), n);
  std::vector<float> got = Download(gpu_.get(), c.gpu, c.count);
  for (float v : got) ASSERT_FALSE(std::isnan(v));
  EXPECT_TRUE(Agree(c, 1e-4, 1e-4));
}

TEST_F(CudaParityTest, GemmWithEmptyInnerDimensionScalesC) {
  constexpr int m = 5, n = 7;
  BufferPair c = Upload(Random(m * n));
  cpu_->Gemm(false, false, m, n, 0, 1.0f, nullptr, 1, nullptr, n, 0.5f,
             c.cpu.f32(), n);
  gpu_->Gemm(false, false, m, n, 0, 1.0f, nullptr, 1, nullptr, n, 0.5f,
             c.gpu.f32(), n);
  EXPECT_TRUE(Agree(c, 1e-6, 0));
}

TEST_F(CudaParityTest, BiasAddAndBiasGradMatchCpu) {
  // cols not a multiple of 32, rows more than one pass of the row threads.
  constexpr int rows = 301, cols = 70;
  BufferPair x = Upload(Random(rows * cols));
  BufferPair bias = Upload(Random(cols));
  cpu_->BiasAdd(x.cpu.f32(), bias.cpu.f32(), rows, cols);
  gpu_->BiasAdd(x.gpu.f32(), bias.gpu.f32(), rows, cols);
  EXPECT_TRUE(Agree(x, 1e-6, 1e-6));

  BufferPair dbias = Upload(Random(cols));  // overwritten, not accumulated
  cpu_->BiasGrad(x.cpu.f32(), dbias.cpu.f32(), rows, cols);
  gpu_->BiasGrad(x.gpu.f32(), dbias.gpu.f32(), rows, cols);
  EXPECT_TRUE(Agree(dbias, 1e-4, 1e-4));
}

TEST_F(CudaParityTest, ReluAndReluGradMatchCpuAndPropagateNaN) {
  std::vector<float> host = Random(10001);
  host[0] = 0.0f;
  host[1] = std::numeric_limits<float>::quiet_NaN();
  host[2] = -std::numeric_limits<float>::infinity();
  BufferPair x = Upload(host);
  BufferPair y = Upload(std::vector<float>(host.size()));
  cpu_->Relu(x.cpu.f32(), y.cpu.f32(), host.size());
  gpu_->Relu(x.gpu.f32(), y.gpu.f32(), host.size());
  EXPECT_TRUE(Agree(y, 0, 0));
  EXPECT_TRUE(std::isnan(Download(gpu_.get(), y.gpu, 2)[1]));

  // In place, as backend.h allows.
  cpu_->Relu(x.cpu.f32(), x.cpu.f32(), host.size());
  gpu_->Relu(x.gpu.f32(), x.gpu.f32(), host.size());
  EXPECT_TRUE(Agree(x, 0, 0));

  BufferPair dy = Upload(Random(host.size()));
  BufferPair dx = Upload(std::vector<float>(host.size()));
  cpu_->ReluGrad(y.cpu.f32(), dy.cpu.f32(), dx.cpu.f32(), host.size());
  gpu_->ReluGrad(y.gpu.f32(), dy.gpu.f32(), dx.gpu.f32(), host.size());
  EXPECT_TRUE(Agree(dx, 0, 0));
  // dx may alias dy.
  cpu_->ReluGrad(y.cpu.f32(), dy.cpu.f32(), dy.cpu.f32(), host.size());
  gpu_->ReluGrad(y.gpu.f32(), dy.gpu.f32(), dy.gpu.f32(), host.size());
  EXPECT_TRUE(Agree(dy, 0, 0));
}

class SoftmaxParityTest : public CudaParityTest,
                          public ::testing::WithParamInterface<int> {};

// Large logits (scale 30) would overflow exp without the max subtraction.
TEST_P(SoftmaxParityTest, LossGradientAndCorrectCountMatchCpu) {
  constexpr int rows = 257;  // not a multiple of the rows per block
  const int cols = GetParam();
  std::vector<float> logits = Random(static_cast<size_t>(rows) * cols, -30, 30);
  std::vector<int32_t> labels(rows);
  std::uniform_int_distribution<int32_t> label_dist(0, cols - 1);
  for (int32_t& l : labels) l = label_dist(rng_);
  // Make some rows right on purpose, and tie the maximum in two rows: the
  // first maximal column is the prediction.
  for (int r = 0; r < rows; r += 3) {
    logits[static_cast<size_t>(r) * cols + labels[r]] = 40.0f;
  }
  if (cols > 1) {
    for (int r : {1, 2}) {
      float* row = &logits[static_cast<size_t>(r) * cols];
      row[0] = 50.0f;
      row[cols - 1] = 50.0f;
      labels[r] = r == 1 ? 0 : cols - 1;  // hit, then miss
    }
  }
  BufferPair x = Upload(logits);
  BufferPair y = Upload(labels);
  BufferPair dlogits = Upload(std::vector<float>(logits.size()));

  int64_t cpu_correct = -1, gpu_correct = -1;
  const float cpu_loss = cpu_->SoftmaxCrossEntropy(
      x.cpu.f32(), y.cpu.i32(), rows, cols, dlogits.cpu.f32(), &cpu_correct);
  const float gpu_loss = gpu_->SoftmaxCrossEntropy(
      x.gpu.f32(), y.gpu.i32(), rows, cols, dlogits.gpu.f32(), &gpu_correct);
  EXPECT_NEAR(cpu_loss, gpu_loss, 1e-5 * std::abs(cpu_loss) + 1e-6);
  EXPECT_EQ(cpu_correct, gpu_correct);
  EXPECT_GE(gpu_correct, rows / 3);
  EXPECT_TRUE(Agree(dlogits, 1e-4, 1e-7));

  // Without outputs: the same loss, nothing written.
  EXPECT_EQ(gpu_loss, gpu_->SoftmaxCrossEntropy(x.gpu.f32(), y.gpu.i32(),
                                                rows, cols, nullptr, nullptr));

  // dlogits may alias logits.
  cpu_->SoftmaxCrossEntropy(x.cpu.f32(), y.cpu.i32(), rows, cols, x.cpu.f32(),
                            nullptr);
  gpu_->SoftmaxCrossEntropy(x.gpu.f32(), y.gpu.i32(), rows, cols, x.gpu.f32(),
                            nullptr);
  EXPECT_TRUE(Agree(x, 1e-4, 1e-7));
}

// One class, a 10-class head, and more classes than a warp has lanes.
INSTANTIATE_TEST_SUITE_P(Classes, SoftmaxParityTest,
                         ::testing::Values(1, 10, 1000));

TEST_F(CudaParityTest, AxpyAndScaleMatchCpu) {
  constexpr size_t n = 100003;
  BufferPair x = Upload(Random(n));
  BufferPair y = Upload(Random(n));
  cpu_->Axpy(-0.37f, x.cpu.f32(), y.cpu.f32(), n);
  gpu_->Axpy(-0.37f, x.gpu.f32(), y.gpu.f32(), n);
  EXPECT_TRUE(Agree(y, 1e-6, 1e-7));
  cpu_->Scale(1.7f, y.cpu.f32(), n);
  gpu_->Scale(1.7f, y.gpu.f32(), n);
  EXPECT_TRUE(Agree(y, 1e-6, 1e-7));
}

TEST_F(CudaParityTest, RoundToMatchesCpuBitForBit) {
  constexpr size_t n = 100003;
  std::vector<float> values = Random(n);
  for (size_t i = 0; i < n; i += 7) values[i] *= 1e5f;  // some past f16's range
  for (size_t i = 3; i < n; i += 11) values[i] *= 1e-7f;  // some subnormal in f16
  for (DType dtype : {DType::kF16, DType::kBF16}) {
    BufferPair x = Upload(values);
    cpu_->RoundTo(dtype, x.cpu.f32(), n);
    gpu_->RoundTo(dtype, x.gpu.f32(), n);
    EXPECT_TRUE(Agree(x, 0, 0)) << DTypeName(dtype);
  }
}

TEST_F(CudaParityTest, SumAndSquaredNormMatchCpuInDouble) {
  // Sizes from empty to more than one pass of the whole grid.
  for (size_t n : {size_t{0}, size_t{1}, size_t{31}, size_t{1000},
                   (size_t{1} << 22) + 17}) {
    SCOPED_TRACE(::testing::Message() << "n=" << n);
    BufferPair x = Upload(Random(std::max<size_t>(n, 1)));
    const double cpu_sum = cpu_->Sum(x.cpu.f32(), n);
    const double gpu_sum = gpu_->Sum(x.gpu.f32(), n);
    const double cpu_norm = cpu_->SquaredNorm(x.cpu.f32(), n);
    const double gpu_norm = gpu_->SquaredNorm(x.gpu.f32(), n);
    // Both add exact double products of floats; only the order differs, so
    // they agree far below float resolution (n terms of magnitude <= 1).
    const double tol = 1e-12 * std::max<double>(n, 1);
    EXPECT_NEAR(cpu_sum, gpu_sum, tol);
    EXPECT_NEAR(cpu_norm, gpu_norm, tol);
    if (n == 0) {
      EXPECT_EQ(gpu_sum, 0.0);
      EXPECT_EQ(gpu_norm, 0.0);
    }
  }
}

// Runs `steps` updates with fresh gradients on both backends and checks the
// parameters and every state buffer after each step.
class OptimizerParityTest : public CudaParityTest {
 protected:
  static constexpr size_t kN = 10007;
  static constexpr int kSteps = 5;

  template <typename Update>
  void RunSteps(int state_buffers, Update update) {
    BufferPair param = Upload(Random(kN));
    std::vector<BufferPair> state;
    for (int i = 0; i < state_buffers; ++i) {
      state.push_back(Upload(std::vector<float>(kN, 0.0f)));
    }
    BufferPair grad = Upload(std::vector<float>(kN));
    for (int step = 1; step <= kSteps; ++step) {
      SCOPED_TRACE(::testing::Message() << "step " << step);
      Refill(grad, Random(kN));
      update(cpu_.get(), step, param.cpu.f32(), grad.cpu.f32(),
             state_buffers > 0 ? state[0].cpu.f32() : nullptr,
             state_buffers > 1 ? state[1].cpu.f32() : nullptr);
      update(gpu_.get(), step, param.gpu.f32(), grad.gpu.f32(),
             state_buffers > 0 ? state[0].gpu.f32() : nullptr,
             state_buffers > 1 ? state[1].gpu.f32() : nullptr);
      EXPECT_TRUE(Agree(param, 1e-5, 1e-6)) << "param";
      for (int i = 0; i < state_buffers; ++i) {
        EXPECT_TRUE(Agree(state[i], 1e-5, 1e-6)) << "state " << i;
      }
    }
  }
};

TEST_F(OptimizerParityTest, SgdMatchesCpu) {
  SgdParams p;
  p.lr = 0.1f;
  p.weight_decay = 0.01f;
  RunSteps(0, [&](Backend* b, int, float* param, const float* grad, float*,
                  float*) { b->SgdUpdate(p, param, grad, kN); });
}

TEST_F(OptimizerParityTest, MomentumMatchesCpu) {
  MomentumParams p;
  p.lr = 0.05f;
  p.momentum = 0.9f;
  p.weight_decay = 0.001f;
  RunSteps(1, [&](Backend* b, int, float* param, const float* grad,
                  float* velocity, float*) {
    b->MomentumUpdate(p, param, grad, velocity, kN);
  });
}

TEST_F(OptimizerParityTest, NesterovMatchesCpu) {
  MomentumParams p;
  p.lr = 0.05f;
  p.momentum = 0.9f;
  p.nesterov = true;
  p.weight_decay = 0.001f;
  RunSteps(1, [&](Backend* b, int, float* param, const float* grad,
                  float* velocity, float*) {
    b->MomentumUpdate(p, param, grad, velocity, kN);
  });
}

TEST_F(OptimizerParityTest, AdamWithBiasCorrectionMatchesCpu) {
  AdamParams p;
  p.lr = 0.01f;
  p.weight_decay = 0.001f;
  RunSteps(2, [&](Backend* b, int step, float* param, const float* grad,
                  float* m, float* v) {
    p.step = step;
    b->AdamUpdate(p, param, grad, m, v, kN);
  });
}

TEST_F(OptimizerParityTest, AdamWMatchesCpu) {
  AdamParams p;
  p.lr = 0.01f;
  p.weight_decay = 0.1f;
  p.decoupled_weight_decay = true;
  RunSteps(2, [&](Backend* b, int step, float* param, const float* grad,
                  float* m, float* v) {
    p.step = step;
    b->AdamUpdate(p, param, grad, m, v, kN);
  });
}

TEST_F(OptimizerParityTest, AdagradMatchesCpu) {
  AdagradParams p;
  p.lr = 0.1f;
  p.weight_decay = 0.001f;
  RunSteps(1, [&](Backend* b, int, float* param, const float* grad,
                  float* accum, float*) {
    b->AdagradUpdate(p, param, grad, accum, kN);
  });
}

// ---- choosing a backend: these run with or without a GPU ----

TEST(CudaBackendSelection, CudaRequestWithoutUsableGpuIsAClearError) {
  absl::StatusOr<std::unique_ptr<Backend>> cuda =
      CreateBackend(BackendKind::kCuda);
  if (cuda.ok()) {
    EXPECT_TRUE((*cuda)->IsCuda());
    return;
  }
  EXPECT_EQ(cuda.status().code(), absl::StatusCode::kFailedPrecondition)
      << cuda.status();
  const std::string message(cuda.status().message());
  if (!DriverLoads()) {
    EXPECT_TRUE(Contains(message, "no NVIDIA driver (libcuda.so.1)"))
        << message;
  } else {
    // The driver is there; the plugin is missing, or found no device.
    EXPECT_TRUE(Contains(message, "no CUDA backend") ||
                Contains(message, "CUDA backend plugin") ||
                Contains(message, "no usable CUDA device"))
        << message;
  }
}

TEST(CudaBackendSelection, UnloadablePluginPathIsNamedInTheError) {
  if (!DriverLoads()) {
    GTEST_SKIP() << "no NVIDIA driver: the plugin is never looked for";
  }
  const char* saved = std::getenv("GRPS_CUDA_PLUGIN");
  const std::string saved_value = saved != nullptr ? saved : "";
  setenv("GRPS_CUDA_PLUGIN", "/nonexistent/libgrps_cuda.so", 1);
  absl::StatusOr<std::unique_ptr<Backend>> cuda =
      CreateBackend(BackendKind::kCuda);
  if (saved != nullptr) {
    setenv("GRPS_CUDA_PLUGIN", saved_value.c_str(), 1);
  } else {
    unsetenv("GRPS_CUDA_PLUGIN");
  }
  ASSERT_FALSE(cuda.ok());
  EXPECT_EQ(cuda.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(Contains(std::string(cuda.status().message()),
                       "/nonexistent/libgrps_cuda.so"))
      << cuda.status();
}

TEST(CudaBackendSelection, CpuRequestIsAlwaysTheCpuBackend) {
  absl::StatusOr<std::unique_ptr<Backend>> cpu =
      CreateBackend(BackendKind::kCpu);
  ASSERT_TRUE(cpu.ok()) << cpu.status();
  EXPECT_FALSE((*cpu)->IsCuda());
}

TEST(CudaBackendSelection, AutoAlwaysYieldsAWorkingBackend) {
  absl::StatusOr<std::unique_ptr<Backend>> backend =
      CreateBackend(BackendKind::kAuto);
  ASSERT_TRUE(backend.ok()) << backend.status();
  Backend& b = **backend;
  // CUDA exactly when CUDA is usable.
  EXPECT_EQ(b.IsCuda(), CreateBackend(BackendKind::kCuda).ok()) << b.Name();

  const std::vector<float> host = {1.0f, -2.0f, 3.5f, 0.25f};
  DeviceBuffer x(&b, host.size() * sizeof(float));
  b.CopyToDevice(x.data(), host.data(), host.size() * sizeof(float));
  b.Scale(2.0f, x.f32(), host.size());
  EXPECT_EQ(b.Sum(x.f32(), host.size()), 5.5);
  std::vector<float> back(host.size());
  b.CopyToHost(back.data(), x.data(), back.size() * sizeof(float));
  EXPECT_EQ(back, (std::vector<float>{2.0f, -4.0f, 7.0f, 0.5f}));
}

}  // namespace
}  // namespace grps
