// LazyCopyBackend: a Backend for tests that runs the copy queue as late as
// the rules of backend.h allow. It wraps another backend (the CPU's): every
// compute op runs at once, through it; an asynchronous copy runs only when
// something must see it done: the compute queue or the host waiting for an
// event recorded on the copy queue after it. So code that forgets an event
// (reads an upload it never waited for, reads a download before it is done,
// changes a source before its copy ran) sees stale data here, as it might
// on a GPU, where the CPU backend would hide the mistake.
//
// Thread safety: as any Backend, one thread at a time.
#ifndef GRPS_TENSOR_LAZY_COPY_BACKEND_H_
#define GRPS_TENSOR_LAZY_COPY_BACKEND_H_

#include <cstdint>
#include <cstring>
#include <deque>
#include <memory>
#include <string>
#include <utility>

#include "tensor/backend.h"

namespace grps {

class LazyCopyBackend : public Backend {
 public:
  explicit LazyCopyBackend(std::unique_ptr<Backend> inner) : inner_(std::move(inner)) {}

  // Copies enqueued and not run yet.
  size_t pending_copies() const { return pending_.size(); }

  std::string Name() const override { return "lazy copies over " + inner_->Name(); }
  bool IsCuda() const override { return false; }
  void* Allocate(size_t bytes) override { return inner_->Allocate(bytes); }
  void Free(void* ptr) override { inner_->Free(ptr); }
  void CopyToDevice(void* dst, const void* host_src, size_t bytes) override {
    inner_->CopyToDevice(dst, host_src, bytes);
  }
  void CopyToHost(void* host_dst, const void* src, size_t bytes) override {
    inner_->CopyToHost(host_dst, src, bytes);
  }
  void CopyOnDevice(void* dst, const void* src, size_t bytes) override {
    inner_->CopyOnDevice(dst, src, bytes);
  }
  void Fill(float* x, float value, size_t n) override { inner_->Fill(x, value, n); }
  // The compute queue only: pending copies stay pending.
  void Synchronize() override { inner_->Synchronize(); }

  void* AllocateHost(size_t bytes) override { return inner_->AllocateHost(bytes); }
  void FreeHost(void* ptr) override { inner_->FreeHost(ptr); }
  void CopyToDeviceAsync(void* dst, const void* host_src, size_t bytes) override {
    pending_.push_back({dst, host_src, bytes});
  }
  void CopyToHostAsync(void* host_dst, const void* src, size_t bytes) override {
    pending_.push_back({host_dst, src, bytes});
  }
  std::unique_ptr<BackendEvent> CreateEvent() override {
    return std::make_unique<LazyEvent>();
  }
  // A compute event is done when recorded (compute runs at once); a copy
  // event is the position in the copy queue that it marks.
  void Record(Queue queue, BackendEvent* event) override {
    auto* e = static_cast<LazyEvent*>(event);
    e->on_copy_queue = queue == Queue::kCopy;
    e->position = enqueued();
  }
  // The copy queue waiting for compute waits for nothing: compute is done.
  void Wait(Queue queue, const BackendEvent& event) override {
    if (queue == Queue::kCompute) RunCopiesTo(event);
  }
  void WaitOnHost(const BackendEvent& event) override { RunCopiesTo(event); }

  void Gemm(bool trans_a, bool trans_b, int m, int n, int k, float alpha, const float* a,
            int lda, const float* b, int ldb, float beta, float* c, int ldc) override {
    inner_->Gemm(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
  }
  void GemmIn(DType operands, bool trans_a, bool trans_b, int m, int n, int k, float alpha,
              const float* a, int lda, const float* b, int ldb, float beta, float* c,
              int ldc) override {
    inner_->GemmIn(operands, trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
  }
  void BiasAdd(float* x, const float* bias, int rows, int cols) override {
    inner_->BiasAdd(x, bias, rows, cols);
  }
  void BiasGrad(const float* dy, float* dbias, int rows, int cols) override {
    inner_->BiasGrad(dy, dbias, rows, cols);
  }
  void Relu(const float* x, float* y, size_t n) override { inner_->Relu(x, y, n); }
  void ReluGrad(const float* y, const float* dy, float* dx, size_t n) override {
    inner_->ReluGrad(y, dy, dx, n);
  }
  float SoftmaxCrossEntropy(const float* logits, const int32_t* labels, int rows, int cols,
                            float* dlogits, int64_t* correct) override {
    return inner_->SoftmaxCrossEntropy(logits, labels, rows, cols, dlogits, correct);
  }
  void EnqueueSoftmaxCrossEntropy(const float* logits, const int32_t* labels, int rows,
                                  int cols, float* dlogits, LossOutput* out) override {
    inner_->EnqueueSoftmaxCrossEntropy(logits, labels, rows, cols, dlogits, out);
  }
  void Axpy(float alpha, const float* x, float* y, size_t n) override {
    inner_->Axpy(alpha, x, y, n);
  }
  void Scale(float alpha, float* x, size_t n) override { inner_->Scale(alpha, x, n); }
  void RoundTo(DType dtype, float* x, size_t n) override { inner_->RoundTo(dtype, x, n); }
  double Sum(const float* x, size_t n) override { return inner_->Sum(x, n); }
  double SquaredNorm(const float* x, size_t n) override { return inner_->SquaredNorm(x, n); }
  void SgdUpdate(const SgdParams& p, float* param, const float* grad, size_t n) override {
    inner_->SgdUpdate(p, param, grad, n);
  }
  void MomentumUpdate(const MomentumParams& p, float* param, const float* grad,
                      float* velocity, size_t n) override {
    inner_->MomentumUpdate(p, param, grad, velocity, n);
  }
  void AdamUpdate(const AdamParams& p, float* param, const float* grad, float* m, float* v,
                  size_t n) override {
    inner_->AdamUpdate(p, param, grad, m, v, n);
  }
  void AdagradUpdate(const AdagradParams& p, float* param, const float* grad, float* accum,
                     size_t n) override {
    inner_->AdagradUpdate(p, param, grad, accum, n);
  }

 private:
  struct LazyEvent : BackendEvent {
    bool on_copy_queue = false;
    uint64_t position = 0;  // copies enqueued before the mark
  };
  struct Copy {
    void* dst;
    const void* src;
    size_t bytes;
  };

  uint64_t enqueued() const { return done_ + pending_.size(); }

  void RunCopiesTo(const BackendEvent& event) {
    const auto& e = static_cast<const LazyEvent&>(event);
    if (!e.on_copy_queue) return;
    while (done_ < e.position) {
      const Copy& c = pending_.front();
      if (c.bytes > 0) std::memcpy(c.dst, c.src, c.bytes);
      pending_.pop_front();
      ++done_;
    }
  }

  std::unique_ptr<Backend> inner_;
  std::deque<Copy> pending_;
  uint64_t done_ = 0;  // copies run so far
};

}  // namespace grps

#endif  // GRPS_TENSOR_LAZY_COPY_BACKEND_H_
