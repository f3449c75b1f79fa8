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
// Two queues: every op above runs on the compute queue. The copy queue runs
// beside it and carries the asynchronous copies (CopyToDeviceAsync,
// CopyToHostAsync), so that a step's uploads and downloads overlap its
// compute. Nothing orders the two queues but events: Record marks a point in
// one queue, and Wait makes the other queue (or WaitOnHost, the host) wait
// until the ops before that point are done. A queue may start an op as soon
// as the ops before it in that queue and the events it waits for are done.
// The CPU backend runs everything at once, in call order, which is one of
// the orders these rules allow.
//
// Thread safety: a Backend instance is used by one thread at a time.
#ifndef GRPS_TENSOR_BACKEND_H_
#define GRPS_TENSOR_BACKEND_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <new>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>

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
// With decoupled_weight_decay (AdamW), g' = g and first p -= lr * wd * p.
struct AdamParams {
  float lr = 0.001f;
  float beta1 = 0.9f;
  float beta2 = 0.999f;
  float epsilon = 1e-8f;
  float weight_decay = 0.0f;
  bool decoupled_weight_decay = false;
  int64_t step = 1;  // t, the 1-based count of updates applied so far.
};
// a += g'^2;  p -= lr * g' / (sqrt(a) + epsilon)
struct AdagradParams {
  float lr = 0.01f;
  float epsilon = 1e-10f;
  float weight_decay = 0.0f;
};

// The result of EnqueueSoftmaxCrossEntropy, written into host memory once
// the compute queue has run the op.
struct LossOutput {
  double loss_sum = 0;    // sum of the rows' losses
  uint64_t correct = 0;   // rows whose argmax is the label
  int32_t bad_label = 0;  // 1 if a label was outside [0, cols) (a bug of the
                          // caller's; the CPU backend aborts instead)
  int32_t rows = 0;       // set when the op is enqueued
  float mean_loss() const {
    return rows > 0 ? static_cast<float>(loss_sum / rows) : 0.0f;
  }
};

enum class Queue { kCompute, kCopy };

// A point in one of a backend's queues (Backend::Record); made by
// Backend::CreateEvent and used with that backend only.
class BackendEvent {
 public:
  virtual ~BackendEvent() = default;
};

class Backend {
 public:
  virtual ~Backend() = default;

  // "cpu (OpenBLAS, 2 threads)" / "cuda (NVIDIA H100, sm_90)".
  virtual std::string Name() const = 0;
  virtual bool IsCuda() const = 0;
  // The device's peak f32 rate without tensor cores, in GFLOP/s (units x
  // 2 flops per fused multiply-add x clock), for benchmarks to print beside
  // what they measure; 0 when unknown (the CPU backend).
  virtual double PeakGflops() const { return 0; }

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

  // ---- host memory, the copy queue and events ----
  // Host memory that the device copies to and from without staging
  // (page-locked on CUDA; aligned ordinary memory on the CPU), of at least
  // `bytes` bytes, never null. The asynchronous copies below overlap compute
  // only from and to such memory. Free with FreeHost.
  virtual void* AllocateHost(size_t bytes) = 0;
  virtual void FreeHost(void* ptr) = 0;
  // Enqueue a copy on the copy queue and return at once. The host memory
  // must stay unchanged (to the device) or unread (to the host) until an
  // event recorded on the copy queue after the copy is done; the backend
  // memory must not be used by compute ops that may run meanwhile (order
  // them with events).
  virtual void CopyToDeviceAsync(void* dst, const void* host_src,
                                 size_t bytes) = 0;
  virtual void CopyToHostAsync(void* host_dst, const void* src,
                               size_t bytes) = 0;
  virtual std::unique_ptr<BackendEvent> CreateEvent() = 0;
  // Marks the point after every op enqueued so far on `queue`; a later
  // Record moves the mark (waits enqueued before it keep the old point).
  virtual void Record(Queue queue, BackendEvent* event) = 0;
  // The ops enqueued on `queue` from now on wait until the event's point is
  // done. The host does not wait. An event never recorded is done.
  virtual void Wait(Queue queue, const BackendEvent& event) = 0;
  // The host waits until the event's point is done.
  virtual void WaitOnHost(const BackendEvent& event) = 0;

  // ---- dense linear algebra ----
  // C[m,n] = alpha * op(A) * op(B) + beta * C, op(X) = X or X^T.
  // op(A) is m x k, op(B) is k x n; lda/ldb/ldc are the row strides of the
  // stored (untransposed) matrices.
  virtual void Gemm(bool trans_a, bool trans_b, int m, int n, int k,
                    float alpha, const float* a, int lda, const float* b,
                    int ldb, float beta, float* c, int ldc) = 0;
  // Gemm on operands that hold values of `operands` (rounded to it, as
  // MlpModel's 16-bit compute leaves them): where the device has 16-bit
  // matrix units (tensor cores) they multiply, accumulating in f32, and the
  // result is Gemm's up to summation order. The CPU backend, and kF32,
  // run Gemm.
  virtual void GemmIn(DType operands, bool trans_a, bool trans_b, int m, int n,
                      int k, float alpha, const float* a, int lda,
                      const float* b, int ldb, float beta, float* c, int ldc) {
    (void)operands;
    Gemm(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
  }
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
  // SoftmaxCrossEntropy without waiting: enqueued on the compute queue,
  // which writes the results into *out (host memory from AllocateHost) when
  // it runs the op; read them after an event recorded after it is done.
  virtual void EnqueueSoftmaxCrossEntropy(const float* logits,
                                          const int32_t* labels, int rows,
                                          int cols, float* dlogits,
                                          LossOutput* out) = 0;

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

// RAII owner of `count` values of T in host memory from AllocateHost, for
// the asynchronous copies. Movable, not copyable.
template <typename T>
class HostArray {
  static_assert(std::is_trivially_destructible_v<T>,
                "HostArray never runs destructors");

 public:
  HostArray() = default;
  HostArray(Backend* backend, size_t count)
      : backend_(backend), count_(count),
        ptr_(static_cast<T*>(backend->AllocateHost(count * sizeof(T)))) {
    for (size_t i = 0; i < count_; ++i) new (ptr_ + i) T();
  }
  ~HostArray() { Reset(); }
  HostArray(HostArray&& o) noexcept { *this = std::move(o); }
  HostArray& operator=(HostArray&& o) noexcept {
    if (this != &o) {
      Reset();
      backend_ = o.backend_;
      count_ = o.count_;
      ptr_ = o.ptr_;
      o.ptr_ = nullptr;
      o.count_ = 0;
    }
    return *this;
  }
  HostArray(const HostArray&) = delete;
  HostArray& operator=(const HostArray&) = delete;

  T* data() { return ptr_; }
  const T* data() const { return ptr_; }
  size_t size() const { return count_; }
  T* begin() { return ptr_; }
  T* end() { return ptr_ + count_; }
  const T* begin() const { return ptr_; }
  const T* end() const { return ptr_ + count_; }
  T& operator[](size_t i) { return ptr_[i]; }
  const T& operator[](size_t i) const { return ptr_[i]; }

 private:
  void Reset() {
    if (ptr_ != nullptr) backend_->FreeHost(ptr_);
    ptr_ = nullptr;
  }
  Backend* backend_ = nullptr;
  size_t count_ = 0;
  T* ptr_ = nullptr;
};

}  // namespace grps

#endif  // GRPS_TENSOR_BACKEND_H_
