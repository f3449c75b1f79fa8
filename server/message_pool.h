// MessagePool: a gRPC MessageAllocator for a callback unary method that
// keeps the request and response of a finished call and hands them, cleared,
// to a later one. A cleared message keeps the room of its strings and
// repeated fields, so a shard's steady stream of big calls (a sparse push's
// ids and gradients, a sparse pull's reply) parses into buffers it already
// has instead of allocating, and faulting in, megabytes of fresh pages each
// call. At most kKept pairs are kept, and none holding more than
// kMaxKeptBytes: what a pool pins is bounded, whatever the calls' sizes.
//
// Thread safety: gRPC allocates and releases from many threads at once.
#ifndef GRPS_SERVER_MESSAGE_POOL_H_
#define GRPS_SERVER_MESSAGE_POOL_H_

#include <grpcpp/support/message_allocator.h>

#include <cstddef>
#include <memory>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

namespace grps {

template <typename Request, typename Response>
class MessagePool final : public grpc::MessageAllocator<Request, Response> {
 public:
  static constexpr size_t kKept = 8;
  static constexpr size_t kMaxKeptBytes = size_t{32} << 20;

  MessagePool() = default;
  MessagePool(const MessagePool&) = delete;
  MessagePool& operator=(const MessagePool&) = delete;

  grpc::MessageHolder<Request, Response>* AllocateMessages() override {
    {
      absl::MutexLock lock(&mu_);
      if (!kept_.empty()) {
        Holder* h = kept_.back().release();
        kept_.pop_back();
        return h;
      }
    }
    return new Holder(this);
  }

  // Pairs kept now (tests).
  size_t kept() const {
    absl::MutexLock lock(&mu_);
    return kept_.size();
  }

 private:
  class Holder final : public grpc::MessageHolder<Request, Response> {
   public:
    explicit Holder(MessagePool* pool) : pool_(pool) {
      this->set_request(&request_);
      this->set_response(&response_);
    }
    void Release() override { pool_->Keep(std::unique_ptr<Holder>(this)); }
    size_t BytesHeld() const { return request_.SpaceUsedLong() + response_.SpaceUsedLong(); }
    void Clear() {
      request_.Clear();
      response_.Clear();
    }

   private:
    MessagePool* const pool_;
    Request request_;
    Response response_;
  };

  void Keep(std::unique_ptr<Holder> h) {
    h->Clear();
    if (h->BytesHeld() > kMaxKeptBytes) return;
    absl::MutexLock lock(&mu_);
    if (kept_.size() < kKept) kept_.push_back(std::move(h));
  }

  mutable absl::Mutex mu_;
  std::vector<std::unique_ptr<Holder>> kept_ ABSL_GUARDED_BY(mu_);
};

}  // namespace grps

#endif  // GRPS_SERVER_MESSAGE_POOL_H_
