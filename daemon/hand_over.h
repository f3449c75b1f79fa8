// Tells ThreadSanitizer of an object's hand-over through gRPC core.
//
// Debian builds gRPC without -fsanitize=thread, so when gRPC core passes an
// object of the project's (a call's reactor, a server interceptor) from the
// thread that made or last used it to another of its threads, through
// lock-free queues of its own, TSan sees no order between the two: whatever
// the first thread wrote reads as racing with the second. The thread that
// hands `object` to gRPC calls HandOverToGrpc(object) last, the one gRPC
// hands it to calls TakeOverFromGrpc(object) first: a release and an
// acquire on the object's address, the order gRPC guarantees, for that
// object only, so a real race with any other thread is still reported.
// Nothing outside TSan builds. A server interceptor is made, run and
// deleted on whichever of gRPC's threads its call is on: HandedOver makes
// one that hands itself over at each.
#ifndef GRPS_DAEMON_HAND_OVER_H_
#define GRPS_DAEMON_HAND_OVER_H_

#include <utility>

#include "grpcpp/support/server_interceptor.h"

#if defined(__SANITIZE_THREAD__)
#define GRPS_TSAN_HAND_OVER 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define GRPS_TSAN_HAND_OVER 1
#endif
#endif

#ifdef GRPS_TSAN_HAND_OVER
// ThreadSanitizer's annotation interface (sanitizer/tsan_interface.h).
extern "C" void __tsan_acquire(void* addr);
extern "C" void __tsan_release(void* addr);
#endif

namespace grps {

inline void HandOverToGrpc(const void* object) {
#ifdef GRPS_TSAN_HAND_OVER
  __tsan_release(const_cast<void*>(object));
#else
  (void)object;
#endif
}

inline void TakeOverFromGrpc(const void* object) {
#ifdef GRPS_TSAN_HAND_OVER
  __tsan_acquire(const_cast<void*>(object));
#else
  (void)object;
#endif
}

// A server interceptor that does what `Hook` (a callable taking the
// InterceptorBatchMethods*) does at each of its hook points, then proceeds;
// handed over when made, taken over at each interception and before it is
// deleted (in this, the most derived destructor, before any member or base
// is touched).
//
//   struct Stamp { void operator()(grpc::experimental::InterceptorBatchMethods* m); };
//   return new HandedOver<Stamp>(Stamp{...});  // CreateServerInterceptor
template <typename Hook>
class HandedOver final : public grpc::experimental::Interceptor {
 public:
  explicit HandedOver(Hook hook) : hook_(std::move(hook)) { HandOverToGrpc(this); }
  ~HandedOver() override { TakeOverFromGrpc(this); }

  void Intercept(grpc::experimental::InterceptorBatchMethods* methods) override {
    TakeOverFromGrpc(this);
    hook_(methods);
    HandOverToGrpc(this);  // Proceed may go on, and delete this, elsewhere
    methods->Proceed();
  }

 private:
  Hook hook_;
};

}  // namespace grps

#endif  // GRPS_DAEMON_HAND_OVER_H_
