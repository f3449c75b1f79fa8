// BufferPool: byte buffers for payloads that leave through gRPC, used again
// instead of freed. A pull reply's values are copied into a buffer that gRPC
// sends from and releases on its own thread; without a pool each reply is a
// fresh allocation of a chunk's size, which glibc may take from and return
// to the OS each time (page faults on every pull; SPEC §8). The chunks of a
// tensor have equal sizes, so a buffer of the same size is nearly always
// waiting.
//
// Thread safety: every method may be called from any thread.
#ifndef GRPS_WIRE_BUFFER_POOL_H_
#define GRPS_WIRE_BUFFER_POOL_H_

#include <cstddef>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/synchronization/mutex.h"

namespace grps {

class BufferPool {
 public:
  // Keeps at most `max_bytes` of idle buffers; beyond that, given-back
  // buffers are freed.
  explicit BufferPool(size_t max_bytes) : max_bytes_(max_bytes) {}
  BufferPool(const BufferPool&) = delete;
  BufferPool& operator=(const BufferPool&) = delete;

  // The process's pool for reply payloads (256 MiB of idle buffers).
  static BufferPool& Default();

  // A buffer of exactly `size` bytes whose contents are unspecified (an
  // idle buffer of that size if there is one, else a new one).
  std::string Take(size_t size) ABSL_LOCKS_EXCLUDED(mu_);
  // The same for buffers whose sizes vary from call to call (a sparse pull's
  // reply: its rows per shard): `size` bytes in room of RoomFor(size), so
  // that any buffer of nearby size given back is used again.
  std::string TakeRoom(size_t size) ABSL_LOCKS_EXCLUDED(mu_);
  // The room TakeRoom gives `size` bytes: `size` rounded up to an eighth of
  // its power of two (at most 1/8 more), above 64 KiB; `size` below.
  static size_t RoomFor(size_t size);
  // Hands a buffer back for a later Take of its size (its capacity: a
  // TakeRoom buffer goes back to its room's size).
  void Give(std::string buffer) ABSL_LOCKS_EXCLUDED(mu_);

  size_t idle_bytes() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  const size_t max_bytes_;
  mutable absl::Mutex mu_;
  absl::flat_hash_map<size_t, std::vector<std::string>> idle_ ABSL_GUARDED_BY(mu_);
  size_t idle_bytes_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace grps

#endif  // GRPS_WIRE_BUFFER_POOL_H_
