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

void BufferPool::Give(std::string buffer) {
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
