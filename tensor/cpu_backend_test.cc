// Every CPU op against a plain reference written out here, on random inputs;
// backward ops against finite differences of the forward ones.
#include "tensor/cpu_backend.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace grps {
namespace {

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

std::vector<float> RandomVector(size_t n, std::mt19937* rng, float lo = -1.0f,
                                float hi = 1.0f) {
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> v(n);
  for (float& x : v) x = dist(*rng);
  return v;
}

// Goes through the Backend interface only (Allocate, CopyToDevice,
// CopyToHost), as a worker does.
class CpuBackendTest : public ::testing::Test {
 protected:
  CpuBackendTest() : backend_(CreateCpuBackend()), rng_(20240611) {}

  DeviceBuffer Upload(const std::vector<float>& host) {
    DeviceBuffer buf(backend_.get(), host.size() * sizeof(float));
    backend_->CopyToDevice(buf.data(), host.data(), buf.bytes());
    return buf;
  }
  DeviceBuffer UploadLabels(const std::vector<int32_t>& host) {
    DeviceBuffer buf(backend_.get(), host.size() * sizeof(int32_t));
    backend_->CopyToDevice(buf.data(), host.data(), buf.bytes());
    return buf;
  }
  std::vector<float> Download(DeviceBuffer& buf) {
    std::vector<float> host(buf.bytes() / sizeof(float));
    backend_->CopyToHost(host.data(), buf.data(), buf.bytes());
    return host;
  }

  std::unique_ptr<Backend> backend_;
  std::mt19937 rng_;
};

// ---- identity and memory ----------------------------------------------------

TEST(ParseBackendKindTest, AcceptsTheThreeKindsAndRejectsOthers) {
  EXPECT_EQ(*ParseBackendKind("auto"), BackendKind::kAuto);
  EXPECT_EQ(*ParseBackendKind("cpu"), BackendKind::kCpu);
  EXPECT_EQ(*ParseBackendKind("cuda"), BackendKind::kCuda);
  for (const char* bad : {"", "gpu", "CPU", "cuda0", " cpu"}) {
    EXPECT_EQ(ParseBackendKind(bad).status().code(),
              absl::StatusCode::kInvalidArgument)
        << bad;
  }
}

TEST_F(CpuBackendTest, IsNotCudaAndNamesItselfCpu) {
  EXPECT_FALSE(backend_->IsCuda());
  EXPECT_EQ(backend_->Name().rfind("cpu (OpenBLAS, ", 0), 0u)
      << backend_->Name();
}

TEST_F(CpuBackendTest, AllocateReturnsAlignedNonNullMemoryEvenForZeroBytes) {
  for (size_t bytes : {0, 1, 63, 64, 1000, 1 << 20}) {
    void* p = backend_->Allocate(bytes);
    ASSERT_NE(p, nullptr);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(p) % 64, 0u) << bytes;
    std::memset(p, 0xab, bytes);  // the whole size is usable
    backend_->Free(p);
  }
}

TEST_F(CpuBackendTest, CopiesMoveBytesExactlyIncludingOverlap) {
  std::vector<float> host = RandomVector(100, &rng_);
  DeviceBuffer a = Upload(host);
  DeviceBuffer b(backend_.get(), a.bytes());
  backend_->CopyOnDevice(b.data(), a.data(), a.bytes());
  EXPECT_EQ(Download(b), host);

  // Overlapping copy on device behaves like memmove.
  backend_->CopyOnDevice(a.f32() + 10, a.f32(), 50 * sizeof(float));
  std::vector<float> expected = host;
  std::copy(host.begin(), host.begin() + 50, expected.begin() + 10);
  EXPECT_EQ(Download(a), expected);
}

TEST_F(CpuBackendTest, FillSetsEveryElementAndNothingElse) {
  DeviceBuffer buf = Upload(std::vector<float>(37, -1.0f));
  backend_->Fill(buf.f32() + 1, 2.5f, 35);
  std::vector<float> out = Download(buf);
  EXPECT_EQ(out[0], -1.0f);
  for (int i = 1; i <= 35; ++i) EXPECT_EQ(out[i], 2.5f) << i;
  EXPECT_EQ(out[36], -1.0f);
}

TEST_F(CpuBackendTest, RoundToKeepsTheNearest16BitValueAndF16OverflowsToInfinity) {
  const std::vector<float> x = {1.0f + 1.0f / 4096, 65504.0f, 70000.0f, -1e-9f, 3.14159265f};
  DeviceBuffer half = Upload(x), bf = Upload(x), f32 = Upload(x);
  backend_->RoundTo(DType::kF16, half.f32(), x.size());
  backend_->RoundTo(DType::kBF16, bf.f32(), x.size());
  backend_->RoundTo(DType::kF32, f32.f32(), x.size());
  const std::vector<float> h = Download(half), b = Download(bf);
  EXPECT_EQ(h[0], 1.0f);  // 2^-12 is below f16's half ulp at 1 (2^-11)
  EXPECT_EQ(h[1], 65504.0f);
  EXPECT_EQ(h[2], INFINITY);
  EXPECT_EQ(h[3], 0.0f);  // below half the smallest subnormal
  EXPECT_EQ(h[4], HalfToFloat(FloatToHalf(3.14159265f)));
  EXPECT_EQ(b[0], 1.0f);
  EXPECT_EQ(b[2], 70144.0f);  // bf16 has f32's range, 8 bits of precision
  EXPECT_EQ(b[3], BFloat16ToFloat(FloatToBFloat16(-1e-9f)));
  EXPECT_NE(b[3], 0.0f);
  EXPECT_EQ(Download(f32), x);
}

TEST_F(CpuBackendTest, RoundToF16IsTheScalarConversionOnEveryKindOfValue) {
  // Normal, subnormal, past the range, ties, NaN and signed zeros: the
  // vector conversion (F16C, where the CPU has it) agrees bit for bit.
  std::uniform_real_distribution<float> mantissa(-2, 2);
  std::uniform_int_distribution<int> exponent(-30, 20);
  std::vector<float> x;
  for (int i = 0; i < 100000; ++i) x.push_back(std::ldexp(mantissa(rng_), exponent(rng_)));
  for (float v : {0.0f, -0.0f, NAN, INFINITY, -INFINITY, 65504.0f, 65520.0f, 65519.99f,
                  1.0f + 1.0f / 2048, 1.0f + 3.0f / 2048})
    x.push_back(v);
  DeviceBuffer buf = Upload(x);
  backend_->RoundTo(DType::kF16, buf.f32(), x.size());
  const std::vector<float> out = Download(buf);
  for (size_t i = 0; i < x.size(); ++i) {
    const float want = HalfToFloat(FloatToHalf(x[i]));
    if (std::isnan(want)) {
      EXPECT_TRUE(std::isnan(out[i])) << i;
    } else {
      ASSERT_EQ(std::memcmp(&want, &out[i], sizeof(float)), 0)
          << "x[" << i << "] = " << x[i] << ": " << out[i] << ", not " << want;
    }
  }
}

// ---- Gemm -------------------------------------------------------------------

// C = alpha * op(A) op(B) + beta * C on row-major storage with row strides;
// beta == 0 means C is not read (BLAS semantics).
void ReferenceGemm(bool trans_a, bool trans_b, int m, int n, int k, float alpha,
                   const std::vector<float>& a, int lda,
                   const std::vector<float>& b, int ldb, float beta,
                   std::vector<float>* c, int ldc) {
  for (int i = 0; i < m; ++i) {
    for (int j = 0; j < n; ++j) {
      double acc = 0.0;
      for (int p = 0; p < k; ++p) {
        const double aip = trans_a ? a[p * lda + i] : a[i * lda + p];
        const double bpj = trans_b ? b[j * ldb + p] : b[p * ldb + j];
        acc += aip * bpj;
      }
      float& out = (*c)[i * ldc + j];
      out = static_cast<float>(alpha * acc + (beta == 0.0f ? 0.0 : beta * out));
    }
  }
}

struct GemmCase {
  int m, n, k;
};

TEST_F(CpuBackendTest, GemmMatchesReferenceForAllTransposesAndStrides) {
  constexpr float kSentinel = 12345.0f;
  const GemmCase cases[] = {
      {1, 1, 1}, {7, 5, 3}, {3, 9, 16}, {33, 17, 65}, {64, 48, 100}};
  for (const GemmCase& gc : cases) {
    for (int ta = 0; ta < 2; ++ta) {
      for (int tb = 0; tb < 2; ++tb) {
        const int a_rows = ta ? gc.k : gc.m, a_cols = ta ? gc.m : gc.k;
        const int b_rows = tb ? gc.n : gc.k, b_cols = tb ? gc.k : gc.n;
        // Padding beyond the logical columns: strides must be honoured.
        const int lda = a_cols + 3, ldb = b_cols + 1, ldc = gc.n + 2;
        std::vector<float> a = RandomVector(a_rows * lda, &rng_);
        std::vector<float> b = RandomVector(b_rows * ldb, &rng_);
        std::vector<float> c = RandomVector(gc.m * ldc, &rng_);
        for (int i = 0; i < gc.m; ++i) {
          for (int j = gc.n; j < ldc; ++j) c[i * ldc + j] = kSentinel;
        }
        const float alpha = 0.75f, beta = -0.5f;

        DeviceBuffer da = Upload(a), db = Upload(b), dc = Upload(c);
        backend_->Gemm(ta, tb, gc.m, gc.n, gc.k, alpha, da.f32(), lda, db.f32(),
                       ldb, beta, dc.f32(), ldc);
        std::vector<float> got = Download(dc);
        ReferenceGemm(ta, tb, gc.m, gc.n, gc.k, alpha, a, lda, b, ldb, beta, &c,
                      ldc);
        for (int i = 0; i < gc.m; ++i) {
          for (int j = 0; j < ldc; ++j) {
            ASSERT_NEAR(got[i * ldc + j], c[i * ldc + j], 1e-4f)
                << "m=" << gc.m << " n=" << gc.n << " k=" << gc.k
                << " ta=" << ta << " tb=" << tb << " at " << i << "," << j;
          }
        }
      }
    }
  }
}

TEST_F(CpuBackendTest, GemmWithBetaZeroIgnoresNanInC) {
  const int m = 4, n = 6, k = 5;
  std::vector<float> a = RandomVector(m * k, &rng_);
  std::vector<float> b = RandomVector(k * n, &rng_);
  std::vector<float> c(m * n, kNaN);
  DeviceBuffer da = Upload(a), db = Upload(b), dc = Upload(c);
  backend_->Gemm(false, false, m, n, k, 2.0f, da.f32(), k, db.f32(), n, 0.0f,
                 dc.f32(), n);
  std::vector<float> got = Download(dc);
  ReferenceGemm(false, false, m, n, k, 2.0f, a, k, b, n, 0.0f, &c, n);
  for (int i = 0; i < m * n; ++i) {
    ASSERT_FALSE(std::isnan(got[i])) << i;
    EXPECT_NEAR(got[i], c[i], 1e-5f) << i;
  }
}

TEST_F(CpuBackendTest, GemmWithEmptyInnerDimensionScalesC) {
  std::vector<float> c = {1, 2, 3, 4, 5, 6};
  DeviceBuffer dc = Upload(c);
  float dummy = 0.0f;
  backend_->Gemm(false, false, 2, 3, 0, 1.0f, &dummy, 1, &dummy, 3, 0.5f,
                 dc.f32(), 3);
  EXPECT_EQ(Download(dc), (std::vector<float>{0.5f, 1, 1.5f, 2, 2.5f, 3}));
}

TEST_F(CpuBackendTest, GemmAccumulatesIntoCWithBetaOne) {
  // Gradient accumulation relies on beta = 1 adding to what C holds.
  std::vector<float> a = {1, 2, 3, 4};  // 2x2
  std::vector<float> b = {5, 6, 7, 8};  // 2x2
  std::vector<float> c = {1, 1, 1, 1};
  DeviceBuffer da = Upload(a), db = Upload(b), dc = Upload(c);
  backend_->Gemm(false, false, 2, 2, 2, 1.0f, da.f32(), 2, db.f32(), 2, 1.0f,
                 dc.f32(), 2);
  EXPECT_EQ(Download(dc), (std::vector<float>{20, 23, 44, 51}));
}

// ---- elementwise and reductions ---------------------------------------------

TEST_F(CpuBackendTest, BiasAddAddsTheBiasToEveryRow) {
  const int rows = 13, cols = 21;
  std::vector<float> x = RandomVector(rows * cols, &rng_);
  std::vector<float> bias = RandomVector(cols, &rng_);
  DeviceBuffer dx = Upload(x), dbias = Upload(bias);
  backend_->BiasAdd(dx.f32(), dbias.f32(), rows, cols);
  std::vector<float> got = Download(dx);
  for (int r = 0; r < rows; ++r) {
    for (int c = 0; c < cols; ++c) {
      ASSERT_EQ(got[r * cols + c], x[r * cols + c] + bias[c]) << r << "," << c;
    }
  }
}

TEST_F(CpuBackendTest, BiasGradSumsEachColumnOverRows) {
  const int rows = 37, cols = 19;
  std::vector<float> dy = RandomVector(rows * cols, &rng_);
  DeviceBuffer ddy = Upload(dy);
  DeviceBuffer dbias = Upload(std::vector<float>(cols, kNaN));  // overwritten
  backend_->BiasGrad(ddy.f32(), dbias.f32(), rows, cols);
  std::vector<float> got = Download(dbias);
  for (int c = 0; c < cols; ++c) {
    double expected = 0.0;
    for (int r = 0; r < rows; ++r) expected += dy[r * cols + c];
    EXPECT_NEAR(got[c], expected, 1e-5) << c;
  }
}

TEST_F(CpuBackendTest, ReluClampsNegativesAndPropagatesNan) {
  std::vector<float> x = RandomVector(1001, &rng_);
  x[0] = 0.0f;
  x[1] = -0.0f;
  x[2] = kNaN;
  x[3] = -std::numeric_limits<float>::infinity();
  DeviceBuffer dx = Upload(x);
  DeviceBuffer dy(backend_.get(), dx.bytes());
  backend_->Relu(dx.f32(), dy.f32(), x.size());
  std::vector<float> got = Download(dy);
  EXPECT_TRUE(std::isnan(got[2]));
  EXPECT_EQ(got[3], 0.0f);
  for (size_t i = 0; i < x.size(); ++i) {
    if (i == 2) continue;
    ASSERT_EQ(got[i], x[i] > 0.0f ? x[i] : 0.0f) << i;
  }
  // In place.
  backend_->Relu(dx.f32(), dx.f32(), x.size());
  std::vector<float> in_place = Download(dx);
  for (size_t i = 3; i < x.size(); ++i) ASSERT_EQ(in_place[i], got[i]) << i;
}

TEST_F(CpuBackendTest, ReluGradPassesGradientOnlyWhereOutputIsPositive) {
  std::vector<float> x = RandomVector(999, &rng_);
  std::vector<float> y(x.size());
  for (size_t i = 0; i < x.size(); ++i) y[i] = x[i] > 0 ? x[i] : 0.0f;
  y[5] = 0.0f;  // exactly at the kink: no gradient
  std::vector<float> dy = RandomVector(x.size(), &rng_);
  DeviceBuffer dyb = Upload(y), ddy = Upload(dy);
  DeviceBuffer ddx(backend_.get(), ddy.bytes());
  backend_->ReluGrad(dyb.f32(), ddy.f32(), ddx.f32(), y.size());
  std::vector<float> got = Download(ddx);
  for (size_t i = 0; i < y.size(); ++i) {
    ASSERT_EQ(got[i], y[i] > 0.0f ? dy[i] : 0.0f) << i;
  }
  // dx may alias dy.
  backend_->ReluGrad(dyb.f32(), ddy.f32(), ddy.f32(), y.size());
  EXPECT_EQ(Download(ddy), got);
}

TEST_F(CpuBackendTest, AxpyAndScaleMatchReference) {
  const size_t n = 1027;
  std::vector<float> x = RandomVector(n, &rng_), y = RandomVector(n, &rng_);
  DeviceBuffer dx = Upload(x), dy = Upload(y);
  backend_->Axpy(-0.3f, dx.f32(), dy.f32(), n);
  std::vector<float> got = Download(dy);
  for (size_t i = 0; i < n; ++i) {
    ASSERT_NEAR(got[i], y[i] + -0.3f * x[i], 1e-6f) << i;
  }
  backend_->Scale(4.0f, dx.f32(), n);
  got = Download(dx);
  for (size_t i = 0; i < n; ++i) ASSERT_EQ(got[i], 4.0f * x[i]) << i;
}

TEST_F(CpuBackendTest, SumAndSquaredNormMatchDoubleReference) {
  for (size_t n : {0, 1, 7, 8, 9, 1000, 1 << 20}) {
    std::vector<float> x = RandomVector(n, &rng_, -1.0f, 3.0f);
    double sum = 0.0, sq = 0.0;
    for (float v : x) {
      sum += v;
      sq += static_cast<double>(v) * v;
    }
    DeviceBuffer dx = Upload(x);
    EXPECT_NEAR(backend_->Sum(dx.f32(), n), sum, 1e-12 * (1.0 + n)) << n;
    EXPECT_NEAR(backend_->SquaredNorm(dx.f32(), n), sq, 1e-12 * (1.0 + sq))
        << n;
  }
}

TEST_F(CpuBackendTest, SumAccumulatesInDoubleSoSmallTermsSurviveLargeOnes) {
  // In float, 1e8 + 1 == 1e8: a float accumulator would lose every 1.
  std::vector<float> x(10002, 1.0f);
  x.front() = 1e8f;
  x.back() = -1e8f;
  DeviceBuffer dx = Upload(x);
  EXPECT_EQ(backend_->Sum(dx.f32(), x.size()), 10000.0);

  // 0.1f summed 2^22 times: a float accumulator is off by far more than this.
  std::vector<float> tenths(1 << 22, 0.1f);
  DeviceBuffer dt = Upload(tenths);
  const double expected = static_cast<double>(0.1f) * (1 << 22);
  EXPECT_NEAR(backend_->Sum(dt.f32(), tenths.size()), expected, 1e-6);
  EXPECT_NEAR(backend_->SquaredNorm(dt.f32(), tenths.size()),
              static_cast<double>(0.1f) * 0.1f * (1 << 22), 1e-6);
}

// ---- softmax cross-entropy --------------------------------------------------

struct SceResult {
  double loss;
  std::vector<double> dlogits;
  int64_t correct;
};

// Written straight from the definition, in double.
SceResult ReferenceSoftmaxCrossEntropy(const std::vector<float>& logits,
                                       const std::vector<int32_t>& labels,
                                       int rows, int cols) {
  SceResult res{0.0, std::vector<double>(rows * cols), 0};
  for (int r = 0; r < rows; ++r) {
    const float* row = &logits[r * cols];
    const int argmax =
        static_cast<int>(std::max_element(row, row + cols) - row);
    if (argmax == labels[r]) ++res.correct;
    const double max = row[argmax];
    double z = 0.0;
    for (int c = 0; c < cols; ++c) z += std::exp(row[c] - max);
    res.loss += -std::log(std::exp(row[labels[r]] - max) / z) / rows;
    for (int c = 0; c < cols; ++c) {
      const double softmax = std::exp(row[c] - max) / z;
      res.dlogits[r * cols + c] = (softmax - (c == labels[r])) / rows;
    }
  }
  return res;
}

TEST_F(CpuBackendTest, SoftmaxCrossEntropyMatchesReference) {
  const int rows = 29, cols = 10;
  std::vector<float> logits = RandomVector(rows * cols, &rng_, -4.0f, 4.0f);
  std::vector<int32_t> labels(rows);
  std::uniform_int_distribution<int32_t> pick(0, cols - 1);
  for (int32_t& l : labels) l = pick(rng_);
  SceResult ref = ReferenceSoftmaxCrossEntropy(logits, labels, rows, cols);
  ASSERT_GT(ref.correct, 0);  // the data exercises both outcomes
  ASSERT_LT(ref.correct, rows);

  DeviceBuffer dl = Upload(logits), dlab = UploadLabels(labels);
  DeviceBuffer dgrad(backend_.get(), dl.bytes());
  int64_t correct = -1;
  const float loss = backend_->SoftmaxCrossEntropy(dl.f32(), dlab.i32(), rows,
                                                   cols, dgrad.f32(), &correct);
  EXPECT_NEAR(loss, ref.loss, 1e-5 * ref.loss);
  EXPECT_EQ(correct, ref.correct);
  std::vector<float> grad = Download(dgrad);
  for (int i = 0; i < rows * cols; ++i) {
    ASSERT_NEAR(grad[i], ref.dlogits[i], 1e-6) << i;
  }

  // Optional outputs may be null; the loss is the same.
  EXPECT_EQ(backend_->SoftmaxCrossEntropy(dl.f32(), dlab.i32(), rows, cols,
                                          nullptr, nullptr),
            loss);
}

TEST_F(CpuBackendTest, SoftmaxCrossEntropyIsStableForHugeLogits) {
  // exp(1000) overflows float; subtracting the row max avoids it.
  std::vector<float> logits = {1000, 1001, 1002, -1000, -1001, -1002};
  std::vector<int32_t> labels = {2, 2};
  DeviceBuffer dl = Upload(logits), dlab = UploadLabels(labels);
  DeviceBuffer dgrad(backend_.get(), dl.bytes());
  int64_t correct = -1;
  const float loss = backend_->SoftmaxCrossEntropy(dl.f32(), dlab.i32(), 2, 3,
                                                   dgrad.f32(), &correct);
  // Row 0: -log(softmax_2) = log(1 + e^-1 + e^-2); row 1: log(1 + e + e^2).
  const double row0 = std::log(1 + std::exp(-1.0) + std::exp(-2.0));
  const double row1 = std::log(1 + std::exp(1.0) + std::exp(2.0));
  EXPECT_NEAR(loss, (row0 + row1) / 2, 1e-5);
  EXPECT_EQ(correct, 1);
  for (float g : Download(dgrad)) EXPECT_TRUE(std::isfinite(g));
}

TEST_F(CpuBackendTest, SoftmaxCrossEntropyCountsArgmaxMatches) {
  // Rows: argmax 1, argmax 0, argmax 2, tie between 0 and 2 (first wins).
  std::vector<float> logits = {0, 5, 1, 9, 1, 2, -3, -2, -1, 4, 0, 4};
  std::vector<int32_t> labels = {1, 2, 2, 0};
  DeviceBuffer dl = Upload(logits), dlab = UploadLabels(labels);
  int64_t correct = -1;
  backend_->SoftmaxCrossEntropy(dl.f32(), dlab.i32(), 4, 3, nullptr, &correct);
  EXPECT_EQ(correct, 3);
}

TEST_F(CpuBackendTest, SoftmaxCrossEntropyGradientRowsSumToZero) {
  const int rows = 8, cols = 5;
  std::vector<float> logits = RandomVector(rows * cols, &rng_, -10, 10);
  std::vector<int32_t> labels = {0, 1, 2, 3, 4, 0, 1, 2};
  DeviceBuffer dl = Upload(logits), dlab = UploadLabels(labels);
  DeviceBuffer dgrad(backend_.get(), dl.bytes());
  backend_->SoftmaxCrossEntropy(dl.f32(), dlab.i32(), rows, cols, dgrad.f32(),
                                nullptr);
  std::vector<float> grad = Download(dgrad);
  for (int r = 0; r < rows; ++r) {
    double sum = 0.0;
    for (int c = 0; c < cols; ++c) sum += grad[r * cols + c];
    EXPECT_NEAR(sum, 0.0, 1e-7) << r;
    EXPECT_LT(grad[r * cols + labels[r]], 0.0f) << r;
  }
}

TEST_F(CpuBackendTest, SoftmaxCrossEntropyGradientMatchesFiniteDifferences) {
  const int rows = 4, cols = 6;
  std::vector<float> logits = RandomVector(rows * cols, &rng_, -2.0f, 2.0f);
  std::vector<int32_t> labels = {3, 0, 5, 1};
  DeviceBuffer dl = Upload(logits), dlab = UploadLabels(labels);
  DeviceBuffer dgrad(backend_.get(), dl.bytes());
  backend_->SoftmaxCrossEntropy(dl.f32(), dlab.i32(), rows, cols, dgrad.f32(),
                                nullptr);
  std::vector<float> grad = Download(dgrad);

  const float eps = 2e-3f;
  for (int i = 0; i < rows * cols; ++i) {
    std::vector<float> plus = logits, minus = logits;
    plus[i] += eps;
    minus[i] -= eps;
    DeviceBuffer dp = Upload(plus), dm = Upload(minus);
    const double lp = backend_->SoftmaxCrossEntropy(dp.f32(), dlab.i32(), rows,
                                                    cols, nullptr, nullptr);
    const double lm = backend_->SoftmaxCrossEntropy(dm.f32(), dlab.i32(), rows,
                                                    cols, nullptr, nullptr);
    EXPECT_NEAR(grad[i], (lp - lm) / (2 * eps), 2e-4) << i;
  }
}

// ---- a 2-layer MLP, forward and backward composed from the ops --------------

// x[B,D] -> h = relu(x W1 + b1) [B,H] -> z = h W2 + b2 [B,C] -> mean CE.
class TinyMlp {
 public:
  static constexpr int kB = 6, kD = 5, kH = 7, kC = 4;

  TinyMlp(Backend* backend, std::mt19937* rng)
      : backend_(backend),
        x_(RandomVector(kB * kD, rng)),
        params_{RandomVector(kD * kH, rng), RandomVector(kH, rng, -0.5f, 0.5f),
                RandomVector(kH * kC, rng), RandomVector(kC, rng, -0.5f, 0.5f)},
        labels_{0, 1, 2, 3, 1, 2} {}

  std::vector<std::vector<float>>& params() { return params_; }

  // Returns the loss; fills *grads (same layout as params) when not null, and
  // *pre_activation with x W1 + b1.
  float Run(std::vector<std::vector<float>>* grads,
            std::vector<float>* pre_activation = nullptr) {
    Backend& be = *backend_;
    DeviceBuffer x = Up(x_), w1 = Up(params_[0]), b1 = Up(params_[1]),
                 w2 = Up(params_[2]), b2 = Up(params_[3]);
    DeviceBuffer labels(&be, kB * sizeof(int32_t));
    be.CopyToDevice(labels.data(), labels_.data(), labels.bytes());

    DeviceBuffer h(&be, kB * kH * sizeof(float));
    be.Gemm(false, false, kB, kH, kD, 1.0f, x.f32(), kD, w1.f32(), kH, 0.0f,
            h.f32(), kH);
    be.BiasAdd(h.f32(), b1.f32(), kB, kH);
    if (pre_activation != nullptr) *pre_activation = Down(h, kB * kH);
    be.Relu(h.f32(), h.f32(), kB * kH);
    DeviceBuffer z(&be, kB * kC * sizeof(float));
    be.Gemm(false, false, kB, kC, kH, 1.0f, h.f32(), kH, w2.f32(), kC, 0.0f,
            z.f32(), kC);
    be.BiasAdd(z.f32(), b2.f32(), kB, kC);
    DeviceBuffer dz(&be, kB * kC * sizeof(float));
    const float loss = be.SoftmaxCrossEntropy(
        z.f32(), labels.i32(), kB, kC, grads ? dz.f32() : nullptr, nullptr);
    if (grads == nullptr) return loss;

    DeviceBuffer dw2(&be, kH * kC * sizeof(float)),
        db2(&be, kC * sizeof(float));
    be.Gemm(true, false, kH, kC, kB, 1.0f, h.f32(), kH, dz.f32(), kC, 0.0f,
            dw2.f32(), kC);  // dW2 = h^T dz
    be.BiasGrad(dz.f32(), db2.f32(), kB, kC);
    DeviceBuffer dh(&be, kB * kH * sizeof(float));
    be.Gemm(false, true, kB, kH, kC, 1.0f, dz.f32(), kC, w2.f32(), kC, 0.0f,
            dh.f32(), kH);  // dh = dz W2^T
    be.ReluGrad(h.f32(), dh.f32(), dh.f32(), kB * kH);
    DeviceBuffer dw1(&be, kD * kH * sizeof(float)),
        db1(&be, kH * sizeof(float));
    be.Gemm(true, false, kD, kH, kB, 1.0f, x.f32(), kD, dh.f32(), kH, 0.0f,
            dw1.f32(), kH);  // dW1 = x^T dh
    be.BiasGrad(dh.f32(), db1.f32(), kB, kH);
    *grads = {Down(dw1, kD * kH), Down(db1, kH), Down(dw2, kH * kC),
              Down(db2, kC)};
    return loss;
  }

 private:
  DeviceBuffer Up(const std::vector<float>& v) {
    DeviceBuffer buf(backend_, v.size() * sizeof(float));
    backend_->CopyToDevice(buf.data(), v.data(), buf.bytes());
    return buf;
  }
  std::vector<float> Down(DeviceBuffer& buf, size_t n) {
    std::vector<float> v(n);
    backend_->CopyToHost(v.data(), buf.data(), n * sizeof(float));
    return v;
  }

  Backend* backend_;
  std::vector<float> x_;
  std::vector<std::vector<float>> params_;
  std::vector<int32_t> labels_;
};

TEST_F(CpuBackendTest, MlpBackwardMatchesFiniteDifferencesOfTheLoss) {
  TinyMlp mlp(backend_.get(), &rng_);
  std::vector<std::vector<float>> grads;
  std::vector<float> pre_activation;
  mlp.Run(&grads, &pre_activation);

  const float eps = 1e-3f;
  // Finite differences are only valid away from ReLU's kink: a perturbation
  // of eps moves a pre-activation by at most eps * max(|x|, 1) <= eps.
  for (float a : pre_activation) ASSERT_GT(std::fabs(a), 2 * eps);
  ASSERT_TRUE(std::any_of(pre_activation.begin(), pre_activation.end(),
                          [](float a) { return a < 0; }))
      << "the data should exercise the ReLU's zero branch";

  const char* names[] = {"W1", "b1", "W2", "b2"};
  for (size_t p = 0; p < mlp.params().size(); ++p) {
    for (size_t i = 0; i < mlp.params()[p].size(); ++i) {
      float& w = mlp.params()[p][i];
      const float saved = w;
      w = saved + eps;
      const double lp = mlp.Run(nullptr);
      w = saved - eps;
      const double lm = mlp.Run(nullptr);
      w = saved;
      EXPECT_NEAR(grads[p][i], (lp - lm) / (2 * eps), 5e-4)
          << names[p] << "[" << i << "]";
    }
  }
}

// ---- broken preconditions ---------------------------------------------------

using CpuBackendDeathTest = CpuBackendTest;

TEST_F(CpuBackendDeathTest, LabelOutOfRangeAbortsInsteadOfReadingOutOfBounds) {
  std::vector<float> logits(6, 0.0f);
  DeviceBuffer dl = Upload(logits);
  DeviceBuffer dlab = UploadLabels({0, 3});
  EXPECT_DEATH(backend_->SoftmaxCrossEntropy(dl.f32(), dlab.i32(), 2, 3,
                                             nullptr, nullptr),
               "label out of range");
}

TEST_F(CpuBackendDeathTest, GemmWithTooSmallLeadingDimensionAborts) {
  std::vector<float> buf(64, 0.0f);
  EXPECT_DEATH(backend_->Gemm(false, false, 4, 4, 4, 1.0f, buf.data(), 3,
                              buf.data(), 4, 0.0f, buf.data(), 4),
               "lda too small");
  EXPECT_DEATH(backend_->Gemm(false, true, 4, 4, 4, 1.0f, buf.data(), 4,
                              buf.data(), 3, 0.0f, buf.data(), 4),
               "ldb too small");
  EXPECT_DEATH(backend_->Gemm(false, false, 4, 4, 4, 1.0f, buf.data(), 4,
                              buf.data(), 4, 0.0f, buf.data(), 3),
               "ldc too small");
}

}  // namespace
}  // namespace grps
