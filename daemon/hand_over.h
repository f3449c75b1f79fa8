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
// Nothing outside TSan builds.
#ifndef GRPS_DAEMON_HAND_OVER_H_
#define GRPS_DAEMON_HAND_OVER_H_

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

}  // namespace grps

#endif  // GRPS_DAEMON_HAND_OVER_H_
