// What CudaBackend computes: the device kernels (private to this file) and
// the CudaBackend ops that launch them, with Gemm, which goes to cuBLAS. The
// class, its contract and the checks are in cuda_backend_internal.h.

#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>

#include "tensor/cuda/cuda_backend_internal.h"

namespace grps {
namespace {

// A kernel launch reports a bad configuration at once; faults inside the
// kernel surface at the next synchronizing call, which is checked too.
#define GRPS_LAUNCH_CHECK(kernel_name) \
  ::grps::CheckLaunch(kernel_name, __FILE__, __LINE__)

void CheckLaunch(const char* kernel_name, const char* file, int line) {
  cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) Die(kernel_name, cudaGetErrorString(err), file, line);
}

constexpr int kWarp = 32;

// Indexes of a grid-stride loop over [0, n); size_t because chunks may exceed
// 2^31 elements.
#define GRPS_GRID_STRIDE(i, n)                                            \
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) +         \
                  threadIdx.x;                                           \
       i < (n); i += static_cast<size_t>(gridDim.x) * blockDim.x)

// ---- reductions ------------------------------------------------------------

__device__ double WarpSum(double v) {
  for (int offset = kWarp / 2; offset > 0; offset >>= 1) {
    v += __shfl_down_sync(0xffffffffu, v, offset);
  }
  return v;
}

// Sum over the block; the result is valid in thread 0. Every thread of the
// block must call it; blockDim.x is a multiple of 32.
__device__ double BlockSum(double v) {
  __shared__ double warp_sums[kWarp];
  const int lane = threadIdx.x % kWarp;
  const int warp = threadIdx.x / kWarp;
  v = WarpSum(v);
  if (lane == 0) warp_sums[warp] = v;
  __syncthreads();
  const int warps = blockDim.x / kWarp;
  v = threadIdx.x < warps ? warp_sums[threadIdx.x] : 0.0;
  if (warp == 0) v = WarpSum(v);
  return v;
}

// partial[blockIdx.x] = sum of x[i] (or x[i]^2) over this block's share.
template <bool kSquare>
__global__ void PartialSumKernel(const float* x, size_t n, double* partial) {
  double acc = 0.0;
  GRPS_GRID_STRIDE(i, n) {
    const double v = x[i];
    acc += kSquare ? v * v : v;
  }
  acc = BlockSum(acc);
  if (threadIdx.x == 0) partial[blockIdx.x] = acc;
}

// *out = sum of partial[0, count), count <= blockDim.x; one block.
__global__ void FinalSumKernel(const double* partial, int count, double* out) {
  double v = threadIdx.x < count ? partial[threadIdx.x] : 0.0;
  v = BlockSum(v);
  if (threadIdx.x == 0) *out = v;
}

// ---- elementwise -----------------------------------------------------------

__global__ void FillKernel(float* x, float value, size_t n) {
  GRPS_GRID_STRIDE(i, n) { x[i] = value; }
}

// c[r, j] = beta * c[r, j] for r < m, j < n (beta == 0 writes 0 and reads
// nothing, as in BLAS). Gemm with k == 0.
__global__ void ScaleMatrixKernel(float* c, int ldc, int m, int n,
                                  float beta) {
  const size_t total = static_cast<size_t>(m) * n;
  GRPS_GRID_STRIDE(i, total) {
    float* cell = c + (i / n) * static_cast<size_t>(ldc) + i % n;
    *cell = beta == 0.0f ? 0.0f : beta * *cell;
  }
}

__global__ void BiasAddKernel(float* x, const float* bias, size_t total,
                              int cols) {
  GRPS_GRID_STRIDE(i, total) { x[i] += bias[i % cols]; }
}

// Block (32, ty): threadIdx.x picks a column (consecutive threads read
// consecutive addresses), threadIdx.y strides over rows; the ty partial sums
// of a column are folded in shared memory.
constexpr int kBiasGradRowThreads = 32;
__global__ void BiasGradKernel(const float* dy, float* dbias, int rows,
                               int cols) {
  __shared__ float partial[kBiasGradRowThreads][kWarp + 1];
  const int c = blockIdx.x * kWarp + threadIdx.x;
  float acc = 0.0f;
  if (c < cols) {
    for (int r = threadIdx.y; r < rows; r += blockDim.y) {
      acc += dy[static_cast<size_t>(r) * cols + c];
    }
  }
  partial[threadIdx.y][threadIdx.x] = acc;
  __syncthreads();
  if (threadIdx.y == 0 && c < cols) {
    float sum = 0.0f;
    for (unsigned y = 0; y < blockDim.y; ++y) sum += partial[y][threadIdx.x];
    dbias[c] = sum;
  }
}

// `x < 0 ? 0 : x`, as on the CPU: NaN propagates (`x > 0 ? x : 0` would
// turn it into 0).
__global__ void ReluKernel(const float* x, float* y, size_t n) {
  GRPS_GRID_STRIDE(i, n) { y[i] = x[i] < 0.0f ? 0.0f : x[i]; }
}

__global__ void ReluGradKernel(const float* y, const float* dy, float* dx,
                               size_t n) {
  GRPS_GRID_STRIDE(i, n) { dx[i] = y[i] > 0.0f ? dy[i] : 0.0f; }
}

__global__ void AxpyKernel(float alpha, const float* x, float* y, size_t n) {
  GRPS_GRID_STRIDE(i, n) { y[i] += alpha * x[i]; }
}

__global__ void ScaleKernel(float alpha, float* x, size_t n) {
  GRPS_GRID_STRIDE(i, n) { x[i] *= alpha; }
}

__global__ void RoundToHalfKernel(float* x, size_t n) {
  GRPS_GRID_STRIDE(i, n) { x[i] = __half2float(__float2half_rn(x[i])); }
}

__global__ void RoundToBFloat16Kernel(float* x, size_t n) {
  GRPS_GRID_STRIDE(i, n) { x[i] = __bfloat162float(__float2bfloat16_rn(x[i])); }
}

// ---- softmax cross-entropy -------------------------------------------------

// The loss kernel accumulates into a LossOutput (backend.h) in device
// memory, which is copied back up to its `rows`, which the host sets.
constexpr size_t kLossOutputDeviceBytes = offsetof(LossOutput, rows);
static_assert(offsetof(LossOutput, rows) + sizeof(int32_t) == sizeof(LossOutput),
              "every field but rows is copied back: rows must be the last");
static_assert(sizeof(unsigned long long) == sizeof(uint64_t),
              "LossOutput::correct is updated with atomicAdd");

// One warp per row. Lanes stride over the columns; the row's max (with the
// lowest index among equal maxima) and the sum of exp(x - max) are reduced
// with shuffles, so every lane ends up with the same values. Every read of the
// row's logits precedes a __syncwarp that precedes every write of its
// dlogits, so dlogits may alias logits (as on the CPU).
__global__ void SoftmaxCrossEntropyKernel(const float* logits,
                                          const int32_t* labels, int rows,
                                          int cols, float* dlogits,
                                          float* row_loss,
                                          LossOutput* scalars) {
  const size_t row =
      (blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x) / kWarp;
  const int lane = threadIdx.x % kWarp;
  if (row >= static_cast<size_t>(rows)) return;  // uniform across the warp
  const float* x = logits + row * cols;

  float best = -INFINITY;
  int best_index = INT32_MAX;
  if (lane < cols) {
    best = x[lane];
    best_index = lane;
  }
  for (int c = lane + kWarp; c < cols; c += kWarp) {
    if (x[c] > best) {
      best = x[c];
      best_index = c;
    }
  }
  for (int offset = kWarp / 2; offset > 0; offset >>= 1) {
    const float other = __shfl_xor_sync(0xffffffffu, best, offset);
    const int other_index = __shfl_xor_sync(0xffffffffu, best_index, offset);
    if (other > best || (other == best && other_index < best_index)) {
      best = other;
      best_index = other_index;
    }
  }
  const float max = best;

  float sum_exp = 0.0f;
  for (int c = lane; c < cols; c += kWarp) sum_exp += expf(x[c] - max);
  for (int offset = kWarp / 2; offset > 0; offset >>= 1) {
    sum_exp += __shfl_xor_sync(0xffffffffu, sum_exp, offset);
  }

  const int label = labels[row];
  if (label < 0 || label >= cols) {
    if (lane == 0) {
      scalars->bad_label = 1;
      row_loss[row] = 0.0f;
    }
    return;  // uniform: every lane read the same label
  }
  const float label_shifted = x[label] - max;
  if (lane == 0) {
    row_loss[row] = logf(sum_exp) - label_shifted;
    if (best_index == label) {
      atomicAdd(reinterpret_cast<unsigned long long*>(&scalars->correct),
                1ull);
    }
  }
  if (dlogits != nullptr) {
    __syncwarp();
    float* d = dlogits + row * cols;
    const float inv_rows = 1.0f / rows;
    for (int c = lane; c < cols; c += kWarp) {
      const float p = expf(x[c] - max) / sum_exp;
      d[c] = (p - (c == label ? 1.0f : 0.0f)) * inv_rows;
    }
  }
}

// ---- optimizers (formulas in backend.h) ------------------------------------

__global__ void SgdKernel(float lr, float weight_decay, float* param,
                          const float* grad, size_t n) {
  GRPS_GRID_STRIDE(i, n) {
    const float g = grad[i] + weight_decay * param[i];
    param[i] -= lr * g;
  }
}

__global__ void MomentumKernel(float lr, float momentum, bool nesterov,
                               float weight_decay, float* param,
                               const float* grad, float* velocity, size_t n) {
  GRPS_GRID_STRIDE(i, n) {
    const float g = grad[i] + weight_decay * param[i];
    const float v = momentum * velocity[i] + g;
    velocity[i] = v;
    param[i] -= nesterov ? lr * (g + momentum * v) : lr * v;
  }
}

// inv_bias1 = 1 / (1 - beta1^t) and inv_bias2 = 1 / (1 - beta2^t), computed
// once on the host in double, as on the CPU.
// `keep`: AdamW's decoupled decay, 1 - lr * wd (1 for Adam's, which comes
// in through weight_decay).
__global__ void AdamKernel(float lr, float beta1, float beta2, float epsilon,
                           float weight_decay, float keep, float inv_bias1,
                           float inv_bias2, float* param, const float* grad,
                           float* m, float* v, size_t n) {
  GRPS_GRID_STRIDE(i, n) {
    param[i] *= keep;
    const float g = grad[i] + weight_decay * param[i];
    const float mi = beta1 * m[i] + (1.0f - beta1) * g;
    const float vi = beta2 * v[i] + (1.0f - beta2) * g * g;
    m[i] = mi;
    v[i] = vi;
    param[i] -= lr * (mi * inv_bias1) / (sqrtf(vi * inv_bias2) + epsilon);
  }
}

__global__ void AdagradKernel(float lr, float epsilon, float weight_decay,
                              float* param, const float* grad, float* accum,
                              size_t n) {
  GRPS_GRID_STRIDE(i, n) {
    const float g = grad[i] + weight_decay * param[i];
    const float a = accum[i] + g * g;
    accum[i] = a;
    param[i] -= lr * g / (sqrtf(a) + epsilon);
  }
}

}  // namespace

cudaError_t GetKernelAttributes(cudaFuncAttributes* attributes) {
  return cudaFuncGetAttributes(attributes, FillKernel);
}

// ---- memory ----

void CudaBackend::Fill(float* x, float value, size_t n) {
  if (n == 0) return;
  FillKernel<<<Blocks(n), kThreads, 0, stream_>>>(x, value, n);
  GRPS_LAUNCH_CHECK("FillKernel");
}

// ---- dense linear algebra ----

void CudaBackend::Gemm(bool trans_a, bool trans_b, int m, int n, int k,
                       float alpha, const float* a, int lda, const float* b,
                       int ldb, float beta, float* c, int ldc) {
  GemmWith(CUBLAS_COMPUTE_32F, trans_a, trans_b, m, n, k, alpha, a, lda, b,
           ldb, beta, c, ldc);
}

// The operands are f32 buffers holding 16-bit values, so the down-conversion
// that the fast compute types allow (to the 16-bit type or TF32, cuBLAS's
// choice) is exact: the tensor cores multiply exactly what the CPU does.
void CudaBackend::GemmIn(DType operands, bool trans_a, bool trans_b, int m,
                         int n, int k, float alpha, const float* a, int lda,
                         const float* b, int ldb, float beta, float* c,
                         int ldc) {
  const cublasComputeType_t compute =
      operands == DType::kF16    ? CUBLAS_COMPUTE_32F_FAST_16F
      : operands == DType::kBF16 ? CUBLAS_COMPUTE_32F_FAST_16BF
                                 : CUBLAS_COMPUTE_32F;
  GemmWith(compute, trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c,
           ldc);
}

void CudaBackend::GemmWith(cublasComputeType_t compute, bool trans_a,
                           bool trans_b, int m, int n, int k, float alpha,
                           const float* a, int lda, const float* b, int ldb,
                           float beta, float* c, int ldc) {
  GRPS_REQUIRE(m >= 0 && n >= 0 && k >= 0, "Gemm: negative dimension");
  if (m == 0 || n == 0) return;
  GRPS_REQUIRE(lda >= (trans_a ? m : k) && lda >= 1,
               "Gemm: lda is less than the stored row length of A");
  GRPS_REQUIRE(ldb >= (trans_b ? k : n) && ldb >= 1,
               "Gemm: ldb is less than the stored row length of B");
  GRPS_REQUIRE(ldc >= n && ldc >= 1,
               "Gemm: ldc is less than the row length of C");
  if (k == 0) {
    const size_t total = static_cast<size_t>(m) * n;
    ScaleMatrixKernel<<<Blocks(total), kThreads, 0, stream_>>>(c, ldc, m, n,
                                                                beta);
    GRPS_LAUNCH_CHECK("ScaleMatrixKernel");
    return;
  }
  // cuBLAS is column-major. A row-major matrix with row stride ld is the
  // column-major matrix of its transpose with the same ld, so row-major
  // C = op(A) op(B) is column-major C^T = op(B)^T op(A)^T: swap the operands
  // and the dimensions m and n, and keep each operand's transpose flag.
  const cublasOperation_t op_b = trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cublasOperation_t op_a = trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
  if (compute == CUBLAS_COMPUTE_32F) {
    GRPS_CUBLAS_CHECK(cublasSgemm(cublas_, op_b, op_a, n, m, k, &alpha, b, ldb,
                                  a, lda, &beta, c, ldc));
    return;
  }
  GRPS_CUBLAS_CHECK(cublasGemmEx(cublas_, op_b, op_a, n, m, k, &alpha, b,
                                 CUDA_R_32F, ldb, a, CUDA_R_32F, lda, &beta, c,
                                 CUDA_R_32F, ldc, compute,
                                 CUBLAS_GEMM_DEFAULT));
}

void CudaBackend::BiasAdd(float* x, const float* bias, int rows, int cols) {
  GRPS_REQUIRE(rows >= 0 && cols >= 0, "BiasAdd: negative dimension");
  const size_t total = static_cast<size_t>(rows) * cols;
  if (total == 0) return;
  BiasAddKernel<<<Blocks(total), kThreads, 0, stream_>>>(x, bias, total, cols);
  GRPS_LAUNCH_CHECK("BiasAddKernel");
}

void CudaBackend::BiasGrad(const float* dy, float* dbias, int rows, int cols) {
  GRPS_REQUIRE(rows >= 0 && cols >= 0, "BiasGrad: negative dimension");
  if (cols == 0) return;
  // rows == 0 still runs: dbias becomes 0.
  const dim3 block(kWarp, kBiasGradRowThreads);
  const dim3 grid((cols + kWarp - 1) / kWarp);
  BiasGradKernel<<<grid, block, 0, stream_>>>(dy, dbias, rows, cols);
  GRPS_LAUNCH_CHECK("BiasGradKernel");
}

void CudaBackend::Relu(const float* x, float* y, size_t n) {
  if (n == 0) return;
  ReluKernel<<<Blocks(n), kThreads, 0, stream_>>>(x, y, n);
  GRPS_LAUNCH_CHECK("ReluKernel");
}

void CudaBackend::ReluGrad(const float* y, const float* dy, float* dx,
                           size_t n) {
  if (n == 0) return;
  ReluGradKernel<<<Blocks(n), kThreads, 0, stream_>>>(y, dy, dx, n);
  GRPS_LAUNCH_CHECK("ReluGradKernel");
}

float* CudaBackend::RowLossBuffer(int count) {
  if (count > row_loss_capacity_) {
    // The old buffer may still be read by enqueued work; cudaFree waits.
    GRPS_CUDA_CHECK(cudaFree(row_loss_));
    row_loss_ = nullptr;
    row_loss_capacity_ = 0;
    GRPS_CUDA_CHECK(cudaMalloc(&row_loss_, count * sizeof(float)));
    row_loss_capacity_ = count;
  }
  return row_loss_;
}

float CudaBackend::SoftmaxCrossEntropy(const float* logits,
                                       const int32_t* labels, int rows,
                                       int cols, float* dlogits,
                                       int64_t* correct) {
  EnqueueSoftmaxCrossEntropy(logits, labels, rows, cols, dlogits, sync_loss_);
  GRPS_CUDA_CHECK(cudaStreamSynchronize(stream_));
  GRPS_REQUIRE(sync_loss_->bad_label == 0,
               "SoftmaxCrossEntropy: a label is outside [0, cols)");
  if (correct != nullptr) *correct = static_cast<int64_t>(sync_loss_->correct);
  return sync_loss_->mean_loss();
}

void CudaBackend::EnqueueSoftmaxCrossEntropy(const float* logits,
                                             const int32_t* labels, int rows,
                                             int cols, float* dlogits,
                                             LossOutput* out) {
  GRPS_REQUIRE(rows >= 0 && cols > 0, "SoftmaxCrossEntropy: bad dimensions");
  // Set now; the copy below writes only the fields before `rows`.
  out->rows = rows;
  if (rows == 0) {
    // An earlier enqueued loss may still be copying into *out: write after it.
    GRPS_CUDA_CHECK(cudaStreamSynchronize(stream_));
    out->loss_sum = 0;
    out->correct = 0;
    out->bad_label = 0;
    return;
  }
  float* row_loss = RowLossBuffer(rows);
  GRPS_CUDA_CHECK(
      cudaMemsetAsync(loss_scalars_, 0, sizeof(LossOutput), stream_));
  constexpr int kRowsPerBlock = kThreads / kWarp;
  const unsigned blocks = (rows + kRowsPerBlock - 1) / kRowsPerBlock;
  SoftmaxCrossEntropyKernel<<<blocks, kThreads, 0, stream_>>>(
      logits, labels, rows, cols, dlogits, row_loss, loss_scalars_);
  GRPS_LAUNCH_CHECK("SoftmaxCrossEntropyKernel");
  EnqueueSum(row_loss, rows, /*square=*/false, &loss_scalars_->loss_sum);
  GRPS_CUDA_CHECK(cudaMemcpyAsync(out, loss_scalars_, kLossOutputDeviceBytes,
                                  cudaMemcpyDeviceToHost, stream_));
}

// ---- vector ops ----

void CudaBackend::Axpy(float alpha, const float* x, float* y, size_t n) {
  if (n == 0) return;
  AxpyKernel<<<Blocks(n), kThreads, 0, stream_>>>(alpha, x, y, n);
  GRPS_LAUNCH_CHECK("AxpyKernel");
}

void CudaBackend::Scale(float alpha, float* x, size_t n) {
  if (n == 0) return;
  ScaleKernel<<<Blocks(n), kThreads, 0, stream_>>>(alpha, x, n);
  GRPS_LAUNCH_CHECK("ScaleKernel");
}

void CudaBackend::RoundTo(DType dtype, float* x, size_t n) {
  if (n == 0 || dtype == DType::kF32) return;
  if (dtype == DType::kF16) {
    RoundToHalfKernel<<<Blocks(n), kThreads, 0, stream_>>>(x, n);
    GRPS_LAUNCH_CHECK("RoundToHalfKernel");
  } else {
    RoundToBFloat16Kernel<<<Blocks(n), kThreads, 0, stream_>>>(x, n);
    GRPS_LAUNCH_CHECK("RoundToBFloat16Kernel");
  }
}

void CudaBackend::EnqueueSum(const float* x, size_t n, bool square,
                             double* result) {
  const unsigned blocks =
      std::min<unsigned>(Blocks(n), static_cast<unsigned>(kMaxReduceBlocks));
  if (square) {
    PartialSumKernel<true><<<blocks, kThreads, 0, stream_>>>(x, n, partial_);
  } else {
    PartialSumKernel<false><<<blocks, kThreads, 0, stream_>>>(x, n, partial_);
  }
  GRPS_LAUNCH_CHECK("PartialSumKernel");
  FinalSumKernel<<<1, kFinalSumThreads, 0, stream_>>>(
      partial_, static_cast<int>(blocks), result);
  GRPS_LAUNCH_CHECK("FinalSumKernel");
}

double CudaBackend::Sum(const float* x, size_t n) {
  if (n == 0) return 0.0;
  EnqueueSum(x, n, /*square=*/false, sum_result_);
  double result = 0.0;
  GRPS_CUDA_CHECK(cudaMemcpyAsync(&result, sum_result_, sizeof(result),
                                  cudaMemcpyDeviceToHost, stream_));
  GRPS_CUDA_CHECK(cudaStreamSynchronize(stream_));
  return result;
}

double CudaBackend::SquaredNorm(const float* x, size_t n) {
  if (n == 0) return 0.0;
  EnqueueSum(x, n, /*square=*/true, sum_result_);
  double result = 0.0;
  GRPS_CUDA_CHECK(cudaMemcpyAsync(&result, sum_result_, sizeof(result),
                                  cudaMemcpyDeviceToHost, stream_));
  GRPS_CUDA_CHECK(cudaStreamSynchronize(stream_));
  return result;
}

// ---- optimizer updates ----

void CudaBackend::SgdUpdate(const SgdParams& p, float* param,
                            const float* grad, size_t n) {
  if (n == 0) return;
  SgdKernel<<<Blocks(n), kThreads, 0, stream_>>>(p.lr, p.weight_decay, param,
                                                 grad, n);
  GRPS_LAUNCH_CHECK("SgdKernel");
}

void CudaBackend::MomentumUpdate(const MomentumParams& p, float* param,
                                 const float* grad, float* velocity,
                                 size_t n) {
  if (n == 0) return;
  MomentumKernel<<<Blocks(n), kThreads, 0, stream_>>>(
      p.lr, p.momentum, p.nesterov, p.weight_decay, param, grad, velocity, n);
  GRPS_LAUNCH_CHECK("MomentumKernel");
}

void CudaBackend::AdamUpdate(const AdamParams& p, float* param,
                             const float* grad, float* m, float* v,
                             size_t n) {
  GRPS_REQUIRE(p.step >= 1, "AdamUpdate: step is 1-based");
  if (n == 0) return;
  const double t = static_cast<double>(p.step);
  const float inv_bias1 =
      static_cast<float>(1.0 / (1.0 - std::pow(double{p.beta1}, t)));
  const float inv_bias2 =
      static_cast<float>(1.0 / (1.0 - std::pow(double{p.beta2}, t)));
  AdamKernel<<<Blocks(n), kThreads, 0, stream_>>>(
      p.lr, p.beta1, p.beta2, p.epsilon,
      p.decoupled_weight_decay ? 0.0f : p.weight_decay,
      p.decoupled_weight_decay ? 1.0f - p.lr * p.weight_decay : 1.0f, inv_bias1, inv_bias2,
      param, grad, m, v, n);
  GRPS_LAUNCH_CHECK("AdamKernel");
}

void CudaBackend::AdagradUpdate(const AdagradParams& p, float* param,
                                const float* grad, float* accum, size_t n) {
  if (n == 0) return;
  AdagradKernel<<<Blocks(n), kThreads, 0, stream_>>>(
      p.lr, p.epsilon, p.weight_decay, param, grad, accum, n);
  GRPS_LAUNCH_CHECK("AdagradKernel");
}

}  // namespace grps
