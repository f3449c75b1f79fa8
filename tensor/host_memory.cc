#include "tensor/host_memory.h"

#include <cstdio>
#include <cstdlib>

namespace grps {

void CheckOrDie(bool condition, const char* who, const char* what) {
  if (!condition) {
    std::fprintf(stderr, "%s: %s\n", who, what);
    std::abort();
  }
}

void* AllocateAligned(size_t bytes) {
  // aligned_alloc wants a multiple of the alignment.
  size_t rounded = (bytes + kHostAlignment - 1) / kHostAlignment * kHostAlignment;
  if (rounded == 0) rounded = kHostAlignment;
  void* ptr = std::aligned_alloc(kHostAlignment, rounded);
  CheckOrDie(ptr != nullptr, "grps", "out of memory");
  return ptr;
}

}  // namespace grps
