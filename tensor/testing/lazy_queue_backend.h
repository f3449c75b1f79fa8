// LazyQueueBackend: a Backend for tests that runs its queues as late as the
// rules of backend.h allow. It wraps another backend (the CPU's), which
// does the work. Each queue is lazy or eager (runs each op at once):
//   - lazy copies: an asynchronous copy runs only when something waits for
//     an event recorded after it. Code that reads an upload it never waited
//     for, or reads a download before it is done, sees the wrong data.
//   - lazy compute: a compute op runs only when something waits for it (an
//     event after it, Synchronize, a synchronous op, freeing memory). Code
//     whose copy overwrites memory that pending compute still reads, or
//     downloads a result before its op ran, sees the wrong data.
//   - both lazy: a queue's wait for the other is itself an op of the queue,
//     so a device-side wait holds nothing up on the host, as on a GPU. Code
//     that overwrites host memory whose copy the device has only been told
//     to wait for sees the wrong data.
// Where the CPU backend, running everything in call order, hides an ordering
// mistake, one of the modes shows it, as a GPU might.
//
// Thread safety: as any Backend, one thread at a time.
#ifndef GRPS_TENSOR_TESTING_LAZY_QUEUE_BACKEND_H_
#define GRPS_TENSOR_TESTING_LAZY_QUEUE_BACKEND_H_

#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <string>
#include <utility>

#include "tensor/backend.h"

namespace grps {

class LazyQueueBackend : public Backend {
 public:
  enum class Lazy { kCopies, kCompute, kBoth };
  static std::string LazyName(Lazy lazy) {
    return lazy == Lazy::kCopies ? "LazyCopies" : lazy == Lazy::kCompute ? "LazyCompute" : "LazyBoth";
  }

  LazyQueueBackend(std::unique_ptr<Backend> inner, Lazy lazy) : inner_(std::move(inner)) {
    queues_[Index(Queue::kCopy)].lazy = lazy != Lazy::kCompute;
    queues_[Index(Queue::kCompute)].lazy = lazy != Lazy::kCopies;
  }
  ~LazyQueueBackend() override { RunAll(); }

  // Ops enqueued on the lazy queues and not run yet.
  size_t pending() const { return queues_[0].ops.size() + queues_[1].ops.size(); }

  std::string Name() const override { return "lazy queues over " + inner_->Name(); }
  bool IsCuda() const override { return false; }
  void* Allocate(size_t bytes) override { return inner_->Allocate(bytes); }
  // As cudaFree, waits for everything.
  void Free(void* ptr) override {
    RunAll();
    inner_->Free(ptr);
  }
  void CopyToDevice(void* dst, const void* host_src, size_t bytes) override {
    Synchronize();
    inner_->CopyToDevice(dst, host_src, bytes);
  }
  void CopyToHost(void* host_dst, const void* src, size_t bytes) override {
    Synchronize();
    inner_->CopyToHost(host_dst, src, bytes);
  }
  void CopyOnDevice(void* dst, const void* src, size_t bytes) override {
    Compute([=] { inner_->CopyOnDevice(dst, src, bytes); });
  }
  void Fill(float* x, float value, size_t n) override {
    Compute([=] { inner_->Fill(x, value, n); });
  }
  // The compute queue (and of the copy queue what compute waits for).
  void Synchronize() override {
    const LazyQueue& q = queues_[Index(Queue::kCompute)];
    RunTo(Queue::kCompute, q.done + q.ops.size());
  }

  void* AllocateHost(size_t bytes) override { return inner_->AllocateHost(bytes); }
  void FreeHost(void* ptr) override {
    RunAll();
    inner_->FreeHost(ptr);
  }
  void CopyToDeviceAsync(void* dst, const void* host_src, size_t bytes) override {
    Enqueue(Queue::kCopy, [=] { inner_->CopyToDevice(dst, host_src, bytes); });
  }
  void CopyToHostAsync(void* host_dst, const void* src, size_t bytes) override {
    Enqueue(Queue::kCopy, [=] { inner_->CopyToHost(host_dst, src, bytes); });
  }
  std::unique_ptr<BackendEvent> CreateEvent() override { return std::make_unique<LazyEvent>(); }
  // An event is the position in its queue that it marks (an eager queue's
  // is done as soon as it is recorded).
  void Record(Queue queue, BackendEvent* event) override {
    auto* e = static_cast<LazyEvent*>(event);
    const LazyQueue& q = queues_[Index(queue)];
    e->queue = queue;
    e->position = q.done + q.ops.size();
  }
  // A lazy queue waits when it gets there; an eager one at once.
  void Wait(Queue queue, const BackendEvent& event) override {
    const auto& e = static_cast<const LazyEvent&>(event);
    Enqueue(queue, [this, e] { RunTo(e.queue, e.position); });
  }
  void WaitOnHost(const BackendEvent& event) override {
    const auto& e = static_cast<const LazyEvent&>(event);
    RunTo(e.queue, e.position);
  }

  void Gemm(bool trans_a, bool trans_b, int m, int n, int k, float alpha, const float* a,
            int lda, const float* b, int ldb, float beta, float* c, int ldc) override {
    Compute([=] { inner_->Gemm(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc); });
  }
  void GemmIn(DType operands, bool trans_a, bool trans_b, int m, int n, int k, float alpha,
              const float* a, int lda, const float* b, int ldb, float beta, float* c,
              int ldc) override {
    Compute([=] {
      inner_->GemmIn(operands, trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
    });
  }
  void BiasAdd(float* x, const float* bias, int rows, int cols) override {
    Compute([=] { inner_->BiasAdd(x, bias, rows, cols); });
  }
  void BiasGrad(const float* dy, float* dbias, int rows, int cols) override {
    Compute([=] { inner_->BiasGrad(dy, dbias, rows, cols); });
  }
  void Relu(const float* x, float* y, size_t n) override {
    Compute([=] { inner_->Relu(x, y, n); });
  }
  void ReluGrad(const float* y, const float* dy, float* dx, size_t n) override {
    Compute([=] { inner_->ReluGrad(y, dy, dx, n); });
  }
  float SoftmaxCrossEntropy(const float* logits, const int32_t* labels, int rows, int cols,
                            float* dlogits, int64_t* correct) override {
    Synchronize();
    return inner_->SoftmaxCrossEntropy(logits, labels, rows, cols, dlogits, correct);
  }
  void EnqueueSoftmaxCrossEntropy(const float* logits, const int32_t* labels, int rows,
                                  int cols, float* dlogits, LossOutput* out) override {
    Compute([=] { inner_->EnqueueSoftmaxCrossEntropy(logits, labels, rows, cols, dlogits, out); });
  }
  void Axpy(float alpha, const float* x, float* y, size_t n) override {
    Compute([=] { inner_->Axpy(alpha, x, y, n); });
  }
  void Scale(float alpha, float* x, size_t n) override {
    Compute([=] { inner_->Scale(alpha, x, n); });
  }
  void RoundTo(DType dtype, float* x, size_t n) override {
    Compute([=] { inner_->RoundTo(dtype, x, n); });
  }
  double Sum(const float* x, size_t n) override {
    Synchronize();
    return inner_->Sum(x, n);
  }
  double SquaredNorm(const float* x, size_t n) override {
    Synchronize();
    return inner_->SquaredNorm(x, n);
  }
  void SgdUpdate(const SgdParams& p, float* param, const float* grad, size_t n) override {
    Compute([=] { inner_->SgdUpdate(p, param, grad, n); });
  }
  void MomentumUpdate(const MomentumParams& p, float* param, const float* grad,
                      float* velocity, size_t n) override {
    Compute([=] { inner_->MomentumUpdate(p, param, grad, velocity, n); });
  }
  void AdamUpdate(const AdamParams& p, float* param, const float* grad, float* m, float* v,
                  size_t n) override {
    Compute([=] { inner_->AdamUpdate(p, param, grad, m, v, n); });
  }
  void AdagradUpdate(const AdagradParams& p, float* param, const float* grad, float* accum,
                     size_t n) override {
    Compute([=] { inner_->AdagradUpdate(p, param, grad, accum, n); });
  }

 private:
  struct LazyEvent : BackendEvent {
    Queue queue = Queue::kCompute;
    uint64_t position = 0;  // ops of its queue enqueued before the mark
  };
  struct LazyQueue {
    bool lazy = false;
    std::deque<std::function<void()>> ops;  // enqueued, not run
    uint64_t done = 0;                      // ops run (or enqueued, if eager)
  };
  static int Index(Queue queue) { return queue == Queue::kCompute ? 0 : 1; }

  void Enqueue(Queue queue, std::function<void()> op) {
    LazyQueue& q = queues_[Index(queue)];
    if (q.lazy) {
      q.ops.push_back(std::move(op));
    } else {
      ++q.done;
      op();
    }
  }
  void Compute(std::function<void()> op) { Enqueue(Queue::kCompute, std::move(op)); }

  // Runs `queue`'s ops before `position` (a wait among them runs the other
  // queue's ops it waits for).
  void RunTo(Queue queue, uint64_t position) {
    LazyQueue& q = queues_[Index(queue)];
    while (q.done < position && !q.ops.empty()) {
      std::function<void()> op = std::move(q.ops.front());
      q.ops.pop_front();
      ++q.done;
      op();
    }
  }
  void RunAll() {
    while (pending() > 0) {
      for (Queue queue : {Queue::kCompute, Queue::kCopy}) {
        const LazyQueue& q = queues_[Index(queue)];
        RunTo(queue, q.done + q.ops.size());
      }
    }
  }

  std::unique_ptr<Backend> inner_;
  LazyQueue queues_[2];
};

}  // namespace grps

#endif  // GRPS_TENSOR_TESTING_LAZY_QUEUE_BACKEND_H_
