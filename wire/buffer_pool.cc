#include "wire/buffer_pool.h"

#include <utility>

namespace grps {

BufferPool& BufferPool::Default() {
  static BufferPool* pool = new BufferPool(size_t{256} << 20);
  return *pool;
}

std::string BufferPool::Take(size_t size) {
  {
    absl::MutexLock lock(&mu_);
    auto it = idle_.find(size);
    if (it != idle_.end() && !it->second.empty()) {
      std::string buffer = std::move(it->second.back());
      it->second.pop_back();
      idle_bytes_ -= size;
      return buffer;
    }
  }
  return std::string(size, '\0');
}

size_t BufferPool::RoomFor(size_t size) {
  if (size <= (size_t{64} << 10)) return size;
  size_t power = size_t{1} << 16;
  while (power * 2 <= size) power *= 2;
  const size_t eighth = power / 8;
  return (size + eighth - 1) / eighth * eighth;
}

std::string BufferPool::TakeRoom(size_t size) {
  std::string buffer = Take(RoomFor(size));
  buffer.resize(size);  // smaller: the room stays, nothing is written
  return buffer;
}

void BufferPool::Give(std::string buffer) {
  // Back to its full room, so that a Take of that size finds it (writes
  // zeros past a TakeRoom buffer's bytes: at most an eighth).
  if (buffer.size() < buffer.capacity()) buffer.resize(buffer.capacity());
  const size_t size = buffer.size();
  if (size == 0) return;
  absl::MutexLock lock(&mu_);
  if (idle_bytes_ + size > max_bytes_) return;  // freed on return
  idle_bytes_ += size;
  idle_[size].push_back(std::move(buffer));
}

size_t BufferPool::idle_bytes() const {
  absl::MutexLock lock(&mu_);
  return idle_bytes_;
}

}  // namespace grps
