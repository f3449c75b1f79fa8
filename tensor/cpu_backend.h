// CpuBackend: the Backend on host memory. Gemm goes to OpenBLAS (which runs
// its own thread pool); every other op is a single-threaded loop written so
// that the compiler vectorizes it.
#ifndef GRPS_TENSOR_CPU_BACKEND_H_
#define GRPS_TENSOR_CPU_BACKEND_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "tensor/backend.h"

namespace grps {

// Preconditions that the Backend contract leaves to the caller (dimensions,
// leading dimensions, labels in [0, cols), Adam step >= 1) are checked, and a
// violation aborts with a message rather than touching memory out of bounds.
//
// NaN propagates: Relu(NaN) is NaN, so a diverged model shows up in the loss
// and in the gradient checks at the server instead of being masked.
class CpuBackend : public Backend {
 public:
  CpuBackend() = default;
  CpuBackend(const CpuBackend&) = delete;
  CpuBackend& operator=(const CpuBackend&) = delete;

  std::string Name() const override;
  bool IsCuda() const override { return false; }

  // 64-byte aligned host memory.
  void* Allocate(size_t bytes) override;
  void Free(void* ptr) override;
  void CopyToDevice(void* dst, const void* host_src, size_t bytes) override;
  void CopyToHost(void* host_dst, const void* src, size_t bytes) override;
  // dst and src may overlap.
  void CopyOnDevice(void* dst, const void* src, size_t bytes) override;
  void Fill(float* x, float value, size_t n) override;
  // Every op completes before it returns.
  void Synchronize() override {}

  // One queue in effect: the copies run at once, and events are done as
  // soon as they are recorded.
  void* AllocateHost(size_t bytes) override;
  void FreeHost(void* ptr) override;
  void CopyToDeviceAsync(void* dst, const void* host_src,
                         size_t bytes) override;
  void CopyToHostAsync(void* host_dst, const void* src, size_t bytes) override;
  std::unique_ptr<BackendEvent> CreateEvent() override;
  void Record(Queue, BackendEvent*) override {}
  void Wait(Queue, const BackendEvent&) override {}
  void WaitOnHost(const BackendEvent&) override {}

  void Gemm(bool trans_a, bool trans_b, int m, int n, int k, float alpha,
            const float* a, int lda, const float* b, int ldb, float beta,
            float* c, int ldc) override;
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
};

// OpenBLAS's thread pool is one per process, shared by every CpuBackend.
// SetCpuBlasThreads sizes it (at least 1); call it before the first Gemm
// when several processes or threads share the cores, so that they do not
// oversubscribe them.
void SetCpuBlasThreads(int threads);
int CpuBlasThreads();

}  // namespace grps

#endif  // GRPS_TENSOR_CPU_BACKEND_H_
