// Teaches ThreadSanitizer what Debian's Abseil synchronization does.
//
// Debian's libabsl_synchronization is not built with -fsanitize=thread, so its
// Mutex, CondVar and Notification synchronize through atomics and futexes
// that TSan never sees: every access guarded by an absl::Mutex would be
// reported as a data race, and the real races would drown among them. This
// file defines those functions in each executable of a TSan build (see
// cmake/sanitizers.cmake), which interposes them for every caller: the
// project, gRPC (whose grpc_core::Mutex is an absl::Mutex) and Abseil itself.
// Each definition calls the library's own (found with dlsym(RTLD_NEXT)) and
// tells TSan, through its public annotation interface, what that call does:
// lock, unlock, wait, notify. These are the annotations that Abseil built with
// TSan makes inside the same functions.
//
// As there, memory accesses between a pre and a post annotation are ignored;
// that covers a waiter's Condition that an unlocking thread evaluates on the
// waiter's behalf.
//
// Compiled into TSan builds only (GRPS_SANITIZE=thread), never into a
// shipped binary.

#include <dlfcn.h>
#include <link.h>
#include <sanitizer/tsan_interface.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "absl/base/options.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"

namespace {

#define GRPS_TSAN_STR2(x) #x
#define GRPS_TSAN_STR(x) GRPS_TSAN_STR2(x)

// The library's definition of the Abseil function whose Itanium-mangled name
// is "_ZN4absl" (or "_ZNK4absl" for a const member) + <inline namespace> +
// `rest`. Aborts when there is none: a wrapper must never do nothing quietly.
template <typename Fn>
Fn Real(const char* rest, bool is_const = false) {
  const char* ns = GRPS_TSAN_STR(ABSL_OPTION_INLINE_NAMESPACE_NAME);
  std::string name = is_const ? "_ZNK4absl" : "_ZN4absl";
  name += std::to_string(std::strlen(ns)) + ns + rest;
  void* fn = dlsym(RTLD_NEXT, name.c_str());
  if (fn == nullptr) {
    std::fprintf(stderr, "tsan_absl_sync: no %s: %s\n", name.c_str(), dlerror());
    std::abort();
  }
  return reinterpret_cast<Fn>(fn);
}

constexpr unsigned kWrite = 0;
constexpr unsigned kRead = __tsan_mutex_read_lock;

void PreLock(void* mu, unsigned flags) { __tsan_mutex_pre_lock(mu, flags); }
void PostLock(void* mu, unsigned flags) { __tsan_mutex_post_lock(mu, flags, 0); }
void PreUnlock(void* mu, unsigned flags) { __tsan_mutex_pre_unlock(mu, flags); }
void PostUnlock(void* mu, unsigned flags) { __tsan_mutex_post_unlock(mu, flags); }

// A wait gives the (write-held) mutex up and takes it back before returning.
void BeginWait(void* mu) {
  PreUnlock(mu, kWrite);
  PostUnlock(mu, kWrite);
  PreLock(mu, kWrite);
}
void EndWait(void* mu) { PostLock(mu, kWrite); }

// Whether `pc` lies in the code of the executable itself (not of a shared
// library).
bool InThisExecutable(const void* pc) {
  struct Range {
    uintptr_t begin = 0, end = 0;
  };
  static const Range text = [] {
    Range r;
    dl_iterate_phdr(
        [](dl_phdr_info* info, size_t, void* out) {
          // The first object listed is the executable.
          Range* range = static_cast<Range*>(out);
          for (int i = 0; i < info->dlpi_phnum; ++i) {
            const ElfW(Phdr)& ph = info->dlpi_phdr[i];
            if (ph.p_type != PT_LOAD || !(ph.p_flags & PF_X)) continue;
            const uintptr_t begin = info->dlpi_addr + ph.p_vaddr;
            if (range->begin == 0 || begin < range->begin) range->begin = begin;
            range->end = std::max<uintptr_t>(range->end, begin + ph.p_memsz);
          }
          return 1;  // stop after the first
        },
        &r);
    return r;
  }();
  const uintptr_t p = reinterpret_cast<uintptr_t>(pc);
  return p >= text.begin && p < text.end;
}

// Abseil's functions also call one another (WaitWithTimeout calls
// WaitWithDeadline, Notify locks a Mutex), and those calls land here too:
// only a thread's outermost call is annotated.
class Outermost {
 public:
  Outermost() : outermost_(depth_++ == 0) {}
  ~Outermost() { --depth_; }
  Outermost(const Outermost&) = delete;
  Outermost& operator=(const Outermost&) = delete;
  explicit operator bool() const { return outermost_; }

 private:
  static thread_local int depth_;
  const bool outermost_;
};
thread_local int Outermost::depth_ = 0;

}  // namespace

namespace absl {
ABSL_NAMESPACE_BEGIN

// ---- Mutex ------------------------------------------------------------------

// A Mutex that gRPC destroys was handed to the destroying thread by gRPC's
// own reference counting, which TSan cannot see: only a destruction by the
// project's code (this executable) is annotated, where a destruction racing
// with a use or of a held Mutex is reported.
Mutex::~Mutex() {
  static auto real = Real<void (*)(Mutex*)>("5MutexD1Ev");
  Outermost outer;
  if (outer && InThisExecutable(__builtin_return_address(0))) __tsan_mutex_destroy(this, 0);
  real(this);
}

void Mutex::Lock() {
  static auto real = Real<void (*)(Mutex*)>("5Mutex4LockEv");
  Outermost outer;
  if (outer) PreLock(this, kWrite);
  real(this);
  if (outer) PostLock(this, kWrite);
}

void Mutex::ReaderLock() {
  static auto real = Real<void (*)(Mutex*)>("5Mutex10ReaderLockEv");
  Outermost outer;
  if (outer) PreLock(this, kRead);
  real(this);
  if (outer) PostLock(this, kRead);
}

void Mutex::Unlock() {
  static auto real = Real<void (*)(Mutex*)>("5Mutex6UnlockEv");
  Outermost outer;
  if (outer) PreUnlock(this, kWrite);
  real(this);
  if (outer) PostUnlock(this, kWrite);
}

void Mutex::ReaderUnlock() {
  static auto real = Real<void (*)(Mutex*)>("5Mutex12ReaderUnlockEv");
  Outermost outer;
  if (outer) PreUnlock(this, kRead);
  real(this);
  if (outer) PostUnlock(this, kRead);
}

namespace {
bool TryLockAnnotated(Mutex* mu, bool (*real)(Mutex*), unsigned flags) {
  Outermost outer;
  flags |= __tsan_mutex_try_lock;
  if (outer) PreLock(mu, flags);
  bool locked = real(mu);
  if (outer) PostLock(mu, locked ? flags : flags | __tsan_mutex_try_lock_failed);
  return locked;
}
}  // namespace

bool Mutex::TryLock() {
  static auto real = Real<bool (*)(Mutex*)>("5Mutex7TryLockEv");
  return TryLockAnnotated(this, real, kWrite);
}

bool Mutex::ReaderTryLock() {
  static auto real = Real<bool (*)(Mutex*)>("5Mutex13ReaderTryLockEv");
  return TryLockAnnotated(this, real, kRead);
}

// LockWhen*: return holding the mutex, whether or not the condition holds.
void Mutex::LockWhen(const Condition& cond) {
  static auto real = Real<void (*)(Mutex*, const Condition&)>("5Mutex8LockWhenERKNS0_9ConditionE");
  Outermost outer;
  if (outer) PreLock(this, kWrite);
  real(this, cond);
  if (outer) PostLock(this, kWrite);
}

void Mutex::ReaderLockWhen(const Condition& cond) {
  static auto real =
      Real<void (*)(Mutex*, const Condition&)>("5Mutex14ReaderLockWhenERKNS0_9ConditionE");
  Outermost outer;
  if (outer) PreLock(this, kRead);
  real(this, cond);
  if (outer) PostLock(this, kRead);
}

bool Mutex::LockWhenWithTimeout(const Condition& cond, absl::Duration timeout) {
  static auto real = Real<bool (*)(Mutex*, const Condition&, absl::Duration)>(
      "5Mutex19LockWhenWithTimeoutERKNS0_9ConditionENS0_8DurationE");
  Outermost outer;
  if (outer) PreLock(this, kWrite);
  bool met = real(this, cond, timeout);
  if (outer) PostLock(this, kWrite);
  return met;
}

bool Mutex::LockWhenWithDeadline(const Condition& cond, absl::Time deadline) {
  static auto real = Real<bool (*)(Mutex*, const Condition&, absl::Time)>(
      "5Mutex20LockWhenWithDeadlineERKNS0_9ConditionENS0_4TimeE");
  Outermost outer;
  if (outer) PreLock(this, kWrite);
  bool met = real(this, cond, deadline);
  if (outer) PostLock(this, kWrite);
  return met;
}

bool Mutex::ReaderLockWhenWithTimeout(const Condition& cond, absl::Duration timeout) {
  static auto real = Real<bool (*)(Mutex*, const Condition&, absl::Duration)>(
      "5Mutex25ReaderLockWhenWithTimeoutERKNS0_9ConditionENS0_8DurationE");
  Outermost outer;
  if (outer) PreLock(this, kRead);
  bool met = real(this, cond, timeout);
  if (outer) PostLock(this, kRead);
  return met;
}

bool Mutex::ReaderLockWhenWithDeadline(const Condition& cond, absl::Time deadline) {
  static auto real = Real<bool (*)(Mutex*, const Condition&, absl::Time)>(
      "5Mutex26ReaderLockWhenWithDeadlineERKNS0_9ConditionENS0_4TimeE");
  Outermost outer;
  if (outer) PreLock(this, kRead);
  bool met = real(this, cond, deadline);
  if (outer) PostLock(this, kRead);
  return met;
}

// Await*: called holding the mutex (for writing; Abseil's reader Await is the
// same call), which they give up and take back.
void Mutex::Await(const Condition& cond) {
  static auto real = Real<void (*)(Mutex*, const Condition&)>("5Mutex5AwaitERKNS0_9ConditionE");
  Outermost outer;
  if (outer) BeginWait(this);
  real(this, cond);
  if (outer) EndWait(this);
}

bool Mutex::AwaitWithTimeout(const Condition& cond, absl::Duration timeout) {
  static auto real = Real<bool (*)(Mutex*, const Condition&, absl::Duration)>(
      "5Mutex16AwaitWithTimeoutERKNS0_9ConditionENS0_8DurationE");
  Outermost outer;
  if (outer) BeginWait(this);
  bool met = real(this, cond, timeout);
  if (outer) EndWait(this);
  return met;
}

bool Mutex::AwaitWithDeadline(const Condition& cond, absl::Time deadline) {
  static auto real = Real<bool (*)(Mutex*, const Condition&, absl::Time)>(
      "5Mutex17AwaitWithDeadlineERKNS0_9ConditionENS0_4TimeE");
  Outermost outer;
  if (outer) BeginWait(this);
  bool met = real(this, cond, deadline);
  if (outer) EndWait(this);
  return met;
}

// ---- CondVar ----------------------------------------------------------------

void CondVar::Wait(Mutex* mu) {
  static auto real = Real<void (*)(CondVar*, Mutex*)>("7CondVar4WaitEPNS0_5MutexE");
  Outermost outer;
  if (outer) BeginWait(mu);
  real(this, mu);
  if (outer) EndWait(mu);
}

bool CondVar::WaitWithTimeout(Mutex* mu, absl::Duration timeout) {
  static auto real = Real<bool (*)(CondVar*, Mutex*, absl::Duration)>(
      "7CondVar15WaitWithTimeoutEPNS0_5MutexENS0_8DurationE");
  Outermost outer;
  if (outer) BeginWait(mu);
  bool timed_out = real(this, mu, timeout);
  if (outer) EndWait(mu);
  return timed_out;
}

bool CondVar::WaitWithDeadline(Mutex* mu, absl::Time deadline) {
  static auto real = Real<bool (*)(CondVar*, Mutex*, absl::Time)>(
      "7CondVar16WaitWithDeadlineEPNS0_5MutexENS0_4TimeE");
  Outermost outer;
  if (outer) BeginWait(mu);
  bool timed_out = real(this, mu, deadline);
  if (outer) EndWait(mu);
  return timed_out;
}

// ---- Notification -----------------------------------------------------------
// A waiter that finds the notification already given returns without taking
// the internal mutex, so the hand-over is annotated on the Notification
// itself: what happened before Notify() happens before a wait that returns
// notified.

void Notification::Notify() {
  static auto real = Real<void (*)(Notification*)>("12Notification6NotifyEv");
  Outermost outer;
  if (outer) __tsan_release(this);
  real(this);
}

void Notification::WaitForNotification() const {
  static auto real =
      Real<void (*)(const Notification*)>("12Notification19WaitForNotificationEv", true);
  Outermost outer;
  real(this);
  if (outer) __tsan_acquire(const_cast<Notification*>(this));
}

bool Notification::WaitForNotificationWithTimeout(absl::Duration timeout) const {
  static auto real = Real<bool (*)(const Notification*, absl::Duration)>(
      "12Notification30WaitForNotificationWithTimeoutENS0_8DurationE", true);
  Outermost outer;
  bool notified = real(this, timeout);
  if (outer && notified) __tsan_acquire(const_cast<Notification*>(this));
  return notified;
}

bool Notification::WaitForNotificationWithDeadline(absl::Time deadline) const {
  static auto real = Real<bool (*)(const Notification*, absl::Time)>(
      "12Notification31WaitForNotificationWithDeadlineENS0_4TimeE", true);
  Outermost outer;
  bool notified = real(this, deadline);
  if (outer && notified) __tsan_acquire(const_cast<Notification*>(this));
  return notified;
}

ABSL_NAMESPACE_END
}  // namespace absl
