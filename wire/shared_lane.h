// Shared-memory lanes: how a worker's dense pushes and fused pulls reach a
// shard on the same machine without crossing a socket (docs/performance.md,
// "Shared-memory lanes"). The gRPC call still carries the request, its
// checks and its reply; only the values move through memory both processes
// map.
//
// The worker owns a LaneSegment: a memfd sealed so that it can never shrink
// (a mapping of it can then never fault past its end), that starts with a
// header holding a random nonce. A push names it by (pid, fd, size, nonce)
// (v1::SharedLane). The shard opens it through /proc/<pid>/fd/<fd>, checks
// that the process shares its network namespace and that the descriptor is
// such a memfd of exactly that size, maps it and checks the nonce: on
// another machine, in another PID or network namespace, the name leads
// nowhere or to something else, and the lane is refused.
//
// Neither side trusts the other's bytes in the lane: the shard copies a
// gradient out once and validates its copy (the worker may still be
// writing), and the worker checks every offset a reply names.
#ifndef GRPS_WIRE_SHARED_LANE_H_
#define GRPS_WIRE_SHARED_LANE_H_

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "proto/grps.pb.h"

namespace grps {

// Bytes at the start of every lane that hold its header; offsets into a
// lane's values are at least this.
inline constexpr uint64_t kLaneHeaderBytes = 64;
// The largest lane a shard maps.
inline constexpr uint64_t kMaxLaneBytes = uint64_t{4} << 30;

// Whether `bytes` bytes at `offset` lie within [begin, end), where
// begin <= end; no sum can wrap around.
inline bool LaneSpanWithin(uint64_t offset, uint64_t bytes, uint64_t begin, uint64_t end) {
  return offset >= begin && offset <= end && bytes <= end - offset;
}

// The worker's side: a sealed, mapped memfd. Thread-safe to share; what is
// written where is the owner's business.
class LaneSegment {
 public:
  // A lane with room for `value_bytes` after its header, zeroed (so its
  // pages exist before the first push). UNIMPLEMENTED where the kernel has
  // no sealable memfd; INTERNAL for other failures.
  static absl::StatusOr<std::shared_ptr<LaneSegment>> Create(uint64_t value_bytes);
  ~LaneSegment();
  LaneSegment(const LaneSegment&) = delete;
  LaneSegment& operator=(const LaneSegment&) = delete;

  // The lane's bytes, `size()` of them; values start at kLaneHeaderBytes.
  char* base() const { return base_; }
  uint64_t size() const { return size_; }
  // What a push carries to name the lane (reply_offset left 0).
  v1::SharedLane Ref() const;

 private:
  LaneSegment(int fd, char* base, uint64_t size, uint64_t nonce)
      : fd_(fd), base_(base), size_(size), nonce_(nonce) {}

  const int fd_;
  char* const base_;
  const uint64_t size_;
  const uint64_t nonce_;
};

// The shard's side: a worker's lane, mapped. Thread-safe to share.
class MappedLane {
 public:
  // Maps the lane `ref` names, or says why not (FAILED_PRECONDITION): no
  // such process or descriptor here, a process in another network
  // namespace, not a sealed grps memfd, another size, another nonce.
  static absl::StatusOr<std::shared_ptr<MappedLane>> Open(const v1::SharedLane& ref);
  ~MappedLane();
  MappedLane(const MappedLane&) = delete;
  MappedLane& operator=(const MappedLane&) = delete;

  // Whether this is the lane `ref` names.
  bool Names(const v1::SharedLane& ref) const;
  // `bytes` bytes at `offset`, or INVALID_ARGUMENT when they are not all
  // inside the lane's values. What the shard reads there comes after every
  // Wrote() before (acquire).
  absl::StatusOr<char*> At(uint64_t offset, uint64_t bytes) const;
  // The shard wrote reply values into the lane (release), before the reply
  // that tells the worker so. The worker reads a reply before it writes its
  // next request into the same bytes, so that order holds across the two
  // processes already; this makes it visible within the shard's process,
  // whose threads (one writes a rank's pulled weights, the rank's doorbell
  // reads its next gradient) see no hand-off of their own, nor does
  // ThreadSanitizer.
  void Wrote() { writes_.fetch_add(1, std::memory_order_release); }

 private:
  MappedLane(const v1::SharedLane& ref, char* base)
      : pid_(ref.pid()), fd_(ref.fd()), size_(ref.size()), nonce_(ref.nonce()), base_(base) {}

  const uint32_t pid_;
  const int32_t fd_;
  const uint64_t size_;
  const uint64_t nonce_;
  char* const base_;
  mutable std::atomic<uint64_t> writes_{0};
};

// The lanes a shard has mapped, at most one per worker rank: a worker that
// names a new lane (restarted, or replaced its lane after a failed call)
// replaces its old one, which is unmapped once no call uses it.
class LaneTable {
 public:
  // The lane of worker `rank` that `ref` names, mapped on first use.
  absl::StatusOr<std::shared_ptr<MappedLane>> Get(uint32_t rank, const v1::SharedLane& ref)
      ABSL_LOCKS_EXCLUDED(mu_);
  // Whether `lane` is still worker `rank`'s lane (not replaced by a newer).
  bool IsCurrent(uint32_t rank, const MappedLane* lane) const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  mutable absl::Mutex mu_;
  absl::flat_hash_map<uint32_t, std::shared_ptr<MappedLane>> by_rank_ ABSL_GUARDED_BY(mu_);
};

}  // namespace grps

#endif  // GRPS_WIRE_SHARED_LANE_H_
