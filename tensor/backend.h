// Backend: the numeric operations a worker and a server need, on the CPU
// (OpenBLAS) or on a GPU (cuBLAS plus kernels, loaded at run time).
//
// Memory: every pointer passed to an op is backend memory obtained from
// Allocate() (for the CPU backend that is ordinary host memory). Move data in
// and out with CopyToDevice / CopyToHost. All matrices are row-major f32.
// Ops are enqueued in order; results are visible to the host after
// CopyToHost (which synchronizes) or Synchronize(). Scalar-returning ops
// (Sum, SquaredNorm, SoftmaxCrossEntropy) synchronize.
//
// Thread safety: a Backend instance is used by one thread at a time.
#ifndef GRPS_TENSOR_BACKEND_H_
#define GRPS_TENSOR_BACKEND_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "tensor/dtype.h"

namespace grps {

// Hyper-parameters of the in-place optimizer updates. Each update first adds
// weight decay to the gradient: g' = g + weight_decay * p.
struct SgdParams {
  float lr = 0.01f;
  float weight_decay = 0.0f;
};
// v = momentum * v + g';  p -= lr * v            (classic)
// v = momentum * v + g';  p -= lr * (g' + momentum * v)   (nesterov)
struct MomentumParams {
  float lr = 0.01f;
  float momentum = 0.9f;
  bool nesterov = false;
  float weight_decay = 0.0f;
};
// m = b1 m + (1-b1) g';  v = b2 v + (1-b2) g'^2;
// p -= lr * (m / (1-b1^t)) / (sqrt(v / (1-b2^t)) + epsilon),  t >= 1.
struct AdamParams {
  float lr = 0.001f;
  float beta1 = 0.9f;
  float beta2 = 0.999f;
  float epsilon = 1e-8f;
  float weight_decay = 0.0f;
  int64_t step = 1;  // t, the 1-based count of updates applied so far.
};
// a += g'^2;  p -= lr * g' / (sqrt(a) + epsilon)
struct AdagradParams {
  float lr = 0.01f;
  float epsilon = 1e-10f;
  float weight_decay = 0.0f;
};

class Backend {
 public:
  virtual ~Backend() = default;

  // "cpu (OpenBLAS, 2 threads)" / "cuda (NVIDIA H100, sm_90)".
  virtual std::string Name() const = 0;
  virtual bool IsCuda() const = 0;

  // ---- memory ----
  // Returns backend memory of at least `bytes` bytes (never null; aborts only
  // on out-of-memory). Free with Free().
  virtual void* Allocate(size_t bytes) = 0;
  virtual void Free(void* ptr) = 0;
  virtual void CopyToDevice(void* dst, const void* host_src, size_t bytes) = 0;
  virtual void CopyToHost(void* host_dst, const void* src, size_t bytes) = 0;
  virtual void CopyOnDevice(void* dst, const void* src, size_t bytes) = 0;
  virtual void Fill(float* x, float value, size_t n) = 0;
  virtual void Synchronize() = 0;

  // ---- dense linear algebra ----
  // C[m,n] = alpha * op(A) * op(B) + beta * C, op(X) = X or X^T.
  // op(A) is m x k, op(B) is k x n; lda/ldb/ldc are the row strides of the
  // stored (untransposed) matrices.
  virtual void Gemm(bool trans_a, bool trans_b, int m, int n, int k,
                    float alpha, const float* a, int lda, const float* b,
                    int ldb, float beta, float* c, int ldc) = 0;
  // x[r, c] += bias[c] for an x of rows x cols.
  virtual void BiasAdd(float* x, const float* bias, int rows, int cols) = 0;
  // dbias[c] = sum_r dy[r, c].
  virtual void BiasGrad(const float* dy, float* dbias, int rows,
                        int cols) = 0;
  // y = max(x, 0); y may alias x.
  virtual void Relu(const float* x, float* y, size_t n) = 0;
  // dx = dy where y > 0 else 0 (y is Relu's output); dx may alias dy.
  virtual void ReluGrad(const float* y, const float* dy, float* dx,
                        size_t n) = 0;
  // Mean softmax cross-entropy of logits[rows, cols] against labels[rows]
  // (int32 class ids in [0, cols), in backend memory). If dlogits is not null
  // it receives d(mean loss)/d(logits) = (softmax - onehot) / rows.
  // *correct (if not null) receives how many rows have argmax == label.
  virtual float SoftmaxCrossEntropy(const float* logits, const int32_t* labels,
                                    int rows, int cols, float* dlogits,
                                    int64_t* correct) = 0;

  // ---- vector ops ----
  // y += alpha * x
  virtual void Axpy(float alpha, const float* x, float* y, size_t n) = 0;
  // x *= alpha
  virtual void Scale(float alpha, float* x, size_t n) = 0;
  // x = the nearest value of `dtype` (round to nearest even; f16 overflows
  // to +-inf past 65504), still stored as f32: the rounding of a 16-bit
  // computation on f32 buffers (mixed precision). kF32 leaves x as it is.
  virtual void RoundTo(DType dtype, float* x, size_t n) = 0;
  // sum of x (accumulated in double).
  virtual double Sum(const float* x, size_t n) = 0;
  // sum of x^2 (accumulated in double).
  virtual double SquaredNorm(const float* x, size_t n) = 0;

  // ---- optimizer updates, in place on one chunk of n elements ----
  virtual void SgdUpdate(const SgdParams& p, float* param, const float* grad,
                         size_t n) = 0;
  virtual void MomentumUpdate(const MomentumParams& p, float* param,
                              const float* grad, float* velocity,
                              size_t n) = 0;
  virtual void AdamUpdate(const AdamParams& p, float* param, const float* grad,
                          float* m, float* v, size_t n) = 0;
  virtual void AdagradUpdate(const AdagradParams& p, float* param,
                             const float* grad, float* accum, size_t n) = 0;
};

enum class BackendKind { kAuto, kCpu, kCuda };

// Parses "auto" / "cpu" / "cuda".
absl::StatusOr<BackendKind> ParseBackendKind(std::string_view name);

// kCpu: the OpenBLAS backend. kCuda: the CUDA plugin (libgrps_cuda.so, found
// beside the executable, or at $GRPS_CUDA_PLUGIN), which requires that
// libcuda.so.1 opens and a device exists; otherwise FailedPrecondition with
// the reason. kAuto: CUDA when usable, else CPU.
absl::StatusOr<std::unique_ptr<Backend>> CreateBackend(BackendKind kind);

// The CPU backend directly (servers use it for optimizer updates).
std::unique_ptr<Backend> CreateCpuBackend();

// RAII owner of backend memory. Movable, not copyable.
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  DeviceBuffer(Backend* backend, size_t bytes)
      : backend_(backend), bytes_(bytes),
        ptr_(bytes ? backend->Allocate(bytes) : nullptr) {}
  ~DeviceBuffer() { Reset(); }
  DeviceBuffer(DeviceBuffer&& o) noexcept { *this = std::move(o); }
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept {
    if (this != &o) {
      Reset();
      backend_ = o.backend_;
      bytes_ = o.bytes_;
      ptr_ = o.ptr_;
      o.ptr_ = nullptr;
      o.bytes_ = 0;
    }
    return *this;
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  float* f32() { return static_cast<float*>(ptr_); }
  const float* f32() const { return static_cast<const float*>(ptr_); }
  int32_t* i32() { return static_cast<int32_t*>(ptr_); }
  void* data() { return ptr_; }
  size_t bytes() const { return bytes_; }

 private:
  void Reset() {
    if (ptr_ != nullptr) backend_->Free(ptr_);
    ptr_ = nullptr;
  }
  Backend* backend_ = nullptr;
  size_t bytes_ = 0;
  void* ptr_ = nullptr;
};

}  // namespace grps

#endif  // GRPS_TENSOR_BACKEND_H_
