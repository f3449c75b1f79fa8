// Internal to the CUDA backend plugin: the CudaBackend class and the checks
// that abort on a broken invariant, shared by the plugin's two sources:
//   cuda_backend.cu      opening the device, the factory, memory, copies and
//                        events;
//   cuda_backend_ops.cu  the kernels and the ops that launch them (and Gemm,
//                        which goes to cuBLAS).
// Only the plugin's sources include it. Every symbol it declares is hidden
// (the plugin is compiled with -fvisibility=hidden); only
// grps_cuda_create_backend (cuda_backend.h) is exported.
#ifndef GRPS_TENSOR_CUDA_CUDA_BACKEND_INTERNAL_H_
#define GRPS_TENSOR_CUDA_CUDA_BACKEND_INTERNAL_H_

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>

#include "tensor/backend.h"

namespace grps {

// A failed check aborts with a message naming the call and where it was made
// (see "Errors" below).
[[noreturn]] inline void Die(const char* what, const char* detail,
                             const char* file, int line) {
  std::fprintf(stderr, "grps cuda backend: %s failed (%s:%d): %s\n", what,
               file, line, detail);
  std::fflush(stderr);
  std::abort();
}

#define GRPS_CUDA_CHECK(expr)                                          \
  do {                                                                 \
    cudaError_t grps_err_ = (expr);                                    \
    if (grps_err_ != cudaSuccess) {                                    \
      ::grps::Die(#expr, cudaGetErrorString(grps_err_), __FILE__,      \
                  __LINE__);                                           \
    }                                                                  \
  } while (0)

#define GRPS_CUBLAS_CHECK(expr)                                        \
  do {                                                                 \
    cublasStatus_t grps_st_ = (expr);                                  \
    if (grps_st_ != CUBLAS_STATUS_SUCCESS) {                           \
      ::grps::Die(#expr, cublasGetStatusString(grps_st_), __FILE__,    \
                  __LINE__);                                           \
    }                                                                  \
  } while (0)

#define GRPS_REQUIRE(cond, msg)                                    \
  do {                                                             \
    if (!(cond)) ::grps::Die("precondition " #cond, msg, __FILE__, \
                             __LINE__);                            \
  } while (0)

constexpr int kThreads = 256;           // per block, for 1-D kernels
constexpr int kFinalSumThreads = 1024;  // one block folds the partial sums
constexpr int kMaxReduceBlocks = kFinalSumThreads;

// cudaFuncGetAttributes of one of the plugin's kernels: fails on a device
// that this plugin carries no code for. Defined beside the kernels.
cudaError_t GetKernelAttributes(cudaFuncAttributes* attributes);

// CudaBackend: the Backend on one NVIDIA GPU. Gemm goes to cuBLAS; every
// other op is a kernel (cuda_backend_ops.cu). Built only as the plugin
// libgrps_cuda.so (see cuda_backend.h for how it is loaded).
//
// Ordering: the compute queue is one stream that the backend owns, so its
// ops run in the order they were called. CopyToDevice, CopyToHost,
// Synchronize and the scalar-returning ops (Sum, SquaredNorm,
// SoftmaxCrossEntropy) wait for that stream; after CopyToDevice returns the
// caller may reuse host_src. The copy queue is a second stream, for the
// asynchronous copies; events (cudaEvent_t, without timing) order the two.
// Nothing here synchronizes the whole device but Free and the rare growth of
// a scratch buffer (cudaFree waits for the device).
//
// Errors: whether a device is usable is decided once, by the factory (Create,
// in cuda_backend.cu), which reports rather than aborts. After that, a failing
// CUDA or cuBLAS call, a precondition that the Backend contract leaves to the
// caller (dimensions, leading dimensions, labels in [0, cols), Adam step >= 1),
// or running out of device memory is a broken invariant: the process aborts
// with a message naming the call, as CpuBackend does.
//
// Numerics follow CpuBackend's: NaN propagates through Relu; Sum, SquaredNorm
// and the mean loss accumulate in double; argmax ties go to the lowest index.
// Results differ from the CPU's by float rounding (summation order, fused
// multiply-add), which cuda_parity_test bounds.
class CudaBackend : public Backend {
 public:
  // Returns nullptr and sets *error when device 0 cannot be used; the
  // factory's only failure path, so it must not abort.
  static std::unique_ptr<CudaBackend> Create(std::string* error);

  ~CudaBackend() override;
  CudaBackend(const CudaBackend&) = delete;
  CudaBackend& operator=(const CudaBackend&) = delete;

  std::string Name() const override { return name_; }
  bool IsCuda() const override { return true; }
  double PeakGflops() const override { return peak_gflops_; }

  void* Allocate(size_t bytes) override;
  void Free(void* ptr) override;
  void CopyToDevice(void* dst, const void* host_src, size_t bytes) override;
  void CopyToHost(void* host_dst, const void* src, size_t bytes) override;
  // dst and src may overlap.
  void CopyOnDevice(void* dst, const void* src, size_t bytes) override;
  void Fill(float* x, float value, size_t n) override;
  void Synchronize() override;

  void* AllocateHost(size_t bytes) override;
  void FreeHost(void* ptr) override;
  void CopyToDeviceAsync(void* dst, const void* host_src,
                         size_t bytes) override;
  void CopyToHostAsync(void* host_dst, const void* src, size_t bytes) override;
  std::unique_ptr<BackendEvent> CreateEvent() override;
  void Record(Queue queue, BackendEvent* event) override;
  void Wait(Queue queue, const BackendEvent& event) override;
  void WaitOnHost(const BackendEvent& event) override;

  void Gemm(bool trans_a, bool trans_b, int m, int n, int k, float alpha,
            const float* a, int lda, const float* b, int ldb, float beta,
            float* c, int ldc) override;
  void GemmIn(DType operands, bool trans_a, bool trans_b, int m, int n, int k,
              float alpha, const float* a, int lda, const float* b, int ldb,
              float beta, float* c, int ldc) override;
  void BiasAdd(float* x, const float* bias, int rows, int cols) override;
  void BiasGrad(const float* dy, float* dbias, int rows, int cols) override;
  void Relu(const float* x, float* y, size_t n) override;
  void ReluGrad(const float* y, const float* dy, float* dx, size_t n) override;
  float SoftmaxCrossEntropy(const float* logits, const int32_t* labels,
                            int rows, int cols, float* dlogits,
                            int64_t* correct) override;
  void EnqueueSoftmaxCrossEntropy(const float* logits, const int32_t* labels,
                                  int rows, int cols, float* dlogits,
                                  LossOutput* out) override;

  void Axpy(float alpha, const float* x, float* y, size_t n) override;
  void Scale(float alpha, float* x, size_t n) override;
  void RoundTo(DType dtype, float* x, size_t n) override;
  double Sum(const float* x, size_t n) override;
  double SquaredNorm(const float* x, size_t n) override;

  void SgdUpdate(const SgdParams& p, float* param, const float* grad,
                 size_t n) override;
  void MomentumUpdate(const MomentumParams& p, float* param, const float* grad,
                      float* velocity, size_t n) override;
  void AdamUpdate(const AdamParams& p, float* param, const float* grad,
                  float* m, float* v, size_t n) override;
  void AdagradUpdate(const AdagradParams& p, float* param, const float* grad,
                     float* accum, size_t n) override;

 private:
  CudaBackend() = default;
  // The streams, the cuBLAS handle and the scratch memory; false (and
  // `error`) if any cannot be had.
  bool CreateQueuesAndScratch(std::string* error);

  // Grid size for a grid-stride loop over n > 0 elements: enough blocks to
  // fill the device, no more.
  unsigned Blocks(size_t n) const {
    const size_t wanted = (n + kThreads - 1) / kThreads;
    return static_cast<unsigned>(
        std::min<size_t>(wanted, static_cast<size_t>(max_blocks_)));
  }

  // Gemm and GemmIn: cuBLAS with the given compute type.
  void GemmWith(cublasComputeType_t compute, bool trans_a, bool trans_b,
                int m, int n, int k, float alpha, const float* a, int lda,
                const float* b, int ldb, float beta, float* c, int ldc);

  // Enqueues the sum of x[0, n) (squared if `square`) in double into
  // *result_ on the stream; n > 0.
  void EnqueueSum(const float* x, size_t n, bool square, double* result);
  // Returns a device buffer of at least `count` floats for per-row losses.
  float* RowLossBuffer(int count);

  cudaStream_t StreamOf(Queue queue) const {
    return queue == Queue::kCompute ? stream_ : copy_stream_;
  }

  std::string name_;
  double peak_gflops_ = 0;
  int max_blocks_ = 0;
  cudaStream_t stream_ = nullptr;       // the compute queue
  cudaStream_t copy_stream_ = nullptr;  // the copy queue
  cublasHandle_t cublas_ = nullptr;
  double* partial_ = nullptr;       // kMaxReduceBlocks partial sums
  double* sum_result_ = nullptr;    // Sum / SquaredNorm result
  LossOutput* loss_scalars_ = nullptr;  // device memory
  LossOutput* sync_loss_ = nullptr;     // page-locked, SoftmaxCrossEntropy's
  float* row_loss_ = nullptr;
  int row_loss_capacity_ = 0;
};

}  // namespace grps

#endif  // GRPS_TENSOR_CUDA_CUDA_BACKEND_INTERNAL_H_
