#include "tensor/cpu_backend.h"

#include <cblas.h>
#if defined(__x86_64__)
#include <cpuid.h>
#include <immintrin.h>
#endif

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "tensor/host_memory.h"

namespace grps {

namespace {

// See the class comment: a broken precondition is a caller bug.
void CheckOrDie(bool condition, const char* what) {
  grps::CheckOrDie(condition, "grps::CpuBackend", what);
}

// x = f16(x), eight at a time with the F16C conversions where the CPU has
// them (IEEE round to nearest even, as FloatToHalf): the scalar conversion
// would make f16 compute cost more than the GEMMs it rounds.
#if defined(__x86_64__)
__attribute__((target("avx,f16c"))) size_t RoundToHalfF16c(float* x, size_t n) {
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m128i h = _mm256_cvtps_ph(_mm256_loadu_ps(x + i), _MM_FROUND_TO_NEAREST_INT);
    _mm256_storeu_ps(x + i, _mm256_cvtph_ps(h));
  }
  return i;
}
// (clang 14 does not know "f16c" as a __builtin_cpu_supports feature; the
// CPUID bit is the same test.)
bool HasF16c() {
  static const bool has = [] {
    unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
    return __get_cpuid(1, &eax, &ebx, &ecx, &edx) != 0 && (ecx & bit_F16C) != 0 &&
           __builtin_cpu_supports("avx");
  }();
  return has;
}
#endif

void RoundToHalf(float* x, size_t n) {
  size_t i = 0;
#if defined(__x86_64__)
  if (HasF16c()) i = RoundToHalfF16c(x, n);
#endif
  for (; i < n; ++i) x[i] = HalfToFloat(FloatToHalf(x[i]));
}

// Sums in double over eight independent lanes: the lanes let the compiler
// vectorize without -ffast-math, and double keeps the rounding error of a
// 16M-element sum far below float's resolution.
template <typename Term>
double SumInDouble(const float* x, size_t n, Term term) {
  constexpr size_t kLanes = 8;
  double lane[kLanes] = {};
  size_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    for (size_t j = 0; j < kLanes; ++j) lane[j] += term(x[i + j]);
  }
  for (; i < n; ++i) lane[0] += term(x[i]);
  return ((lane[0] + lane[1]) + (lane[2] + lane[3])) +
         ((lane[4] + lane[5]) + (lane[6] + lane[7]));
}

}  // namespace

void SetCpuBlasThreads(int threads) {
  openblas_set_num_threads(std::max(1, threads));
}

int CpuBlasThreads() { return openblas_get_num_threads(); }

std::string CpuBackend::Name() const {
  return absl::StrCat("cpu (OpenBLAS, ", openblas_get_num_threads(),
                      " threads)");
}

void* CpuBackend::Allocate(size_t bytes) {
  return AllocateAligned(bytes);
}

void CpuBackend::Free(void* ptr) { std::free(ptr); }

void CpuBackend::CopyToDevice(void* dst, const void* host_src, size_t bytes) {
  if (bytes > 0) std::memcpy(dst, host_src, bytes);
}

void CpuBackend::CopyToHost(void* host_dst, const void* src, size_t bytes) {
  if (bytes > 0) std::memcpy(host_dst, src, bytes);
}

void* CpuBackend::AllocateHost(size_t bytes) { return AllocateAligned(bytes); }

void CpuBackend::FreeHost(void* ptr) { std::free(ptr); }

void CpuBackend::CopyToDeviceAsync(void* dst, const void* host_src,
                                   size_t bytes) {
  CopyToDevice(dst, host_src, bytes);
}

void CpuBackend::CopyToHostAsync(void* host_dst, const void* src,
                                 size_t bytes) {
  CopyToHost(host_dst, src, bytes);
}

std::unique_ptr<BackendEvent> CpuBackend::CreateEvent() {
  return std::make_unique<BackendEvent>();
}

void CpuBackend::CopyOnDevice(void* dst, const void* src, size_t bytes) {
  if (bytes > 0) std::memmove(dst, src, bytes);
}

void CpuBackend::Fill(float* x, float value, size_t n) {
  for (size_t i = 0; i < n; ++i) x[i] = value;
}

void CpuBackend::Gemm(bool trans_a, bool trans_b, int m, int n, int k,
                      float alpha, const float* a, int lda, const float* b,
                      int ldb, float beta, float* c, int ldc) {
  CheckOrDie(m >= 0 && n >= 0 && k >= 0, "Gemm: negative dimension");
  if (m == 0 || n == 0) return;
  // Row strides of the stored matrices: A is m x k (k x m when transposed),
  // B is k x n (n x k when transposed). BLAS wants at least 1 even when k = 0.
  CheckOrDie(lda >= std::max(1, trans_a ? m : k), "Gemm: lda too small");
  CheckOrDie(ldb >= std::max(1, trans_b ? k : n), "Gemm: ldb too small");
  CheckOrDie(ldc >= n, "Gemm: ldc too small");
  cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans,
              trans_b ? CblasTrans : CblasNoTrans, m, n, k, alpha, a, lda, b,
              ldb, beta, c, ldc);
}

void CpuBackend::BiasAdd(float* x, const float* bias, int rows, int cols) {
  for (int r = 0; r < rows; ++r) {
    float* row = x + static_cast<size_t>(r) * cols;
    for (int c = 0; c < cols; ++c) row[c] += bias[c];
  }
}

void CpuBackend::BiasGrad(const float* dy, float* dbias, int rows, int cols) {
  // Row by row, so the inner loop runs along contiguous memory.
  for (int c = 0; c < cols; ++c) dbias[c] = 0.0f;
  for (int r = 0; r < rows; ++r) {
    const float* row = dy + static_cast<size_t>(r) * cols;
    for (int c = 0; c < cols; ++c) dbias[c] += row[c];
  }
}

void CpuBackend::Relu(const float* x, float* y, size_t n) {
  // `x < 0 ? 0 : x`, not `x > 0 ? x : 0`: the latter would turn NaN into 0.
  for (size_t i = 0; i < n; ++i) y[i] = x[i] < 0.0f ? 0.0f : x[i];
}

void CpuBackend::ReluGrad(const float* y, const float* dy, float* dx,
                          size_t n) {
  for (size_t i = 0; i < n; ++i) {
    const float g = dy[i];  // loaded unconditionally, so the loop vectorizes
    dx[i] = y[i] > 0.0f ? g : 0.0f;
  }
}

float CpuBackend::SoftmaxCrossEntropy(const float* logits,
                                      const int32_t* labels, int rows, int cols,
                                      float* dlogits, int64_t* correct) {
  LossOutput out;
  EnqueueSoftmaxCrossEntropy(logits, labels, rows, cols, dlogits, &out);
  if (correct != nullptr) *correct = static_cast<int64_t>(out.correct);
  return out.mean_loss();
}

void CpuBackend::EnqueueSoftmaxCrossEntropy(const float* logits,
                                            const int32_t* labels, int rows,
                                            int cols, float* dlogits,
                                            LossOutput* out) {
  CheckOrDie(rows >= 0 && cols > 0, "SoftmaxCrossEntropy: bad dimensions");
  double total_loss = 0.0;
  int64_t hits = 0;
  const float inv_rows = rows > 0 ? 1.0f / static_cast<float>(rows) : 0.0f;
  for (int r = 0; r < rows; ++r) {
    const float* row = logits + static_cast<size_t>(r) * cols;
    const int32_t label = labels[r];
    CheckOrDie(label >= 0 && label < cols,
               "SoftmaxCrossEntropy: label out of range");
    // The first maximum is the prediction; subtracting it keeps every
    // exponent <= 0, so exp never overflows whatever the logits' scale.
    float max = row[0];
    int argmax = 0;
    for (int c = 1; c < cols; ++c) {
      if (row[c] > max) {
        max = row[c];
        argmax = c;
      }
    }
    if (argmax == label) ++hits;
    // Read before dlogits is written, so dlogits may alias logits.
    const float label_shifted = row[label] - max;

    // loss = log(sum_c exp(x_c - max)) - (x_label - max)
    double sum = 0.0;
    if (dlogits == nullptr) {
      for (int c = 0; c < cols; ++c) sum += std::exp(row[c] - max);
    } else {
      float* drow = dlogits + static_cast<size_t>(r) * cols;
      for (int c = 0; c < cols; ++c) {
        const float e = std::exp(row[c] - max);
        drow[c] = e;
        sum += e;
      }
      // d(mean loss)/dx_c = (softmax_c - [c == label]) / rows
      const float scale = static_cast<float>(1.0 / sum) * inv_rows;
      for (int c = 0; c < cols; ++c) drow[c] *= scale;
      drow[label] -= inv_rows;
    }
    total_loss += std::log(sum) - static_cast<double>(label_shifted);
  }
  out->loss_sum = total_loss;
  out->correct = static_cast<uint64_t>(hits);
  out->bad_label = 0;
  out->rows = rows;
}

void CpuBackend::Axpy(float alpha, const float* x, float* y, size_t n) {
  for (size_t i = 0; i < n; ++i) y[i] += alpha * x[i];
}

void CpuBackend::Scale(float alpha, float* x, size_t n) {
  for (size_t i = 0; i < n; ++i) x[i] *= alpha;
}

void CpuBackend::RoundTo(DType dtype, float* x, size_t n) {
  if (dtype == DType::kF16)
    RoundToHalf(x, n);
  else if (dtype == DType::kBF16)
    for (size_t i = 0; i < n; ++i) x[i] = BFloat16ToFloat(FloatToBFloat16(x[i]));
}

double CpuBackend::Sum(const float* x, size_t n) {
  return SumInDouble(x, n, [](float v) { return static_cast<double>(v); });
}

double CpuBackend::SquaredNorm(const float* x, size_t n) {
  return SumInDouble(x, n, [](float v) {
    const double d = v;
    return d * d;
  });
}

// The updates below follow the formulas in backend.h literally, one pass over
// the chunk each, so that they run at memory speed.

void CpuBackend::SgdUpdate(const SgdParams& p, float* param, const float* grad,
                           size_t n) {
  const float lr = p.lr;
  const float wd = p.weight_decay;
  for (size_t i = 0; i < n; ++i) {
    const float g = grad[i] + wd * param[i];
    param[i] -= lr * g;
  }
}

void CpuBackend::MomentumUpdate(const MomentumParams& p, float* param,
                                const float* grad, float* velocity, size_t n) {
  const float lr = p.lr;
  const float mu = p.momentum;
  const float wd = p.weight_decay;
  if (p.nesterov) {
    for (size_t i = 0; i < n; ++i) {
      const float g = grad[i] + wd * param[i];
      const float v = mu * velocity[i] + g;
      velocity[i] = v;
      param[i] -= lr * (g + mu * v);
    }
  } else {
    for (size_t i = 0; i < n; ++i) {
      const float g = grad[i] + wd * param[i];
      const float v = mu * velocity[i] + g;
      velocity[i] = v;
      param[i] -= lr * v;
    }
  }
}

void CpuBackend::AdamUpdate(const AdamParams& p, float* param,
                            const float* grad, float* m, float* v, size_t n) {
  CheckOrDie(p.step >= 1, "AdamUpdate: step must be >= 1");
  // Bias corrections in double: 1 - beta^t loses digits in float when beta
  // is close to 1 and t is small.
  const double t = static_cast<double>(p.step);
  const float inv_bc1 = static_cast<float>(
      1.0 / (1.0 - std::pow(static_cast<double>(p.beta1), t)));
  const float inv_bc2 = static_cast<float>(
      1.0 / (1.0 - std::pow(static_cast<double>(p.beta2), t)));
  const float lr = p.lr;
  const float b1 = p.beta1;
  const float b2 = p.beta2;
  const float one_minus_b1 = 1.0f - p.beta1;
  const float one_minus_b2 = 1.0f - p.beta2;
  const float eps = p.epsilon;
  // Coupled: g' = g + wd * p. Decoupled (AdamW): g' = g, p *= 1 - lr * wd.
  const float wd = p.decoupled_weight_decay ? 0.0f : p.weight_decay;
  const float keep = p.decoupled_weight_decay ? 1.0f - p.lr * p.weight_decay : 1.0f;
  for (size_t i = 0; i < n; ++i) {
    param[i] *= keep;
    const float g = grad[i] + wd * param[i];
    const float mi = b1 * m[i] + one_minus_b1 * g;
    const float vi = b2 * v[i] + one_minus_b2 * g * g;
    m[i] = mi;
    v[i] = vi;
    param[i] -= lr * (mi * inv_bc1) / (std::sqrt(vi * inv_bc2) + eps);
  }
}

void CpuBackend::AdagradUpdate(const AdagradParams& p, float* param,
                               const float* grad, float* accum, size_t n) {
  const float lr = p.lr;
  const float eps = p.epsilon;
  const float wd = p.weight_decay;
  for (size_t i = 0; i < n; ++i) {
    const float g = grad[i] + wd * param[i];
    const float a = accum[i] + g * g;
    accum[i] = a;
    param[i] -= lr * g / (std::sqrt(a) + eps);
  }
}

std::unique_ptr<Backend> CreateCpuBackend() {
  return std::make_unique<CpuBackend>();
}

absl::StatusOr<BackendKind> ParseBackendKind(std::string_view name) {
  if (name == "auto") return BackendKind::kAuto;
  if (name == "cpu") return BackendKind::kCpu;
  if (name == "cuda") return BackendKind::kCuda;
  // Debian's Abseil is built with its own string_view, not std's.
  return absl::InvalidArgumentError(absl::StrCat(
      "unknown backend \"", absl::string_view(name.data(), name.size()),
      "\" (expected auto, cpu or cuda)"));
}

}  // namespace grps
