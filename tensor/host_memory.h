// Host memory and invariant checks shared by Tensor and CpuBackend.
#ifndef GRPS_TENSOR_HOST_MEMORY_H_
#define GRPS_TENSOR_HOST_MEMORY_H_

#include <cstddef>

namespace grps {

// Alignment of every host block grps allocates (a cache line, and enough for
// any SIMD load).
inline constexpr size_t kHostAlignment = 64;

// Aborts with "<who>: <what>" when `condition` is false. For invariants whose
// violation is a bug in the caller (inputs were validated where they entered
// the process); going on would read or write out of bounds.
void CheckOrDie(bool condition, const char* who, const char* what);

// A kHostAlignment-aligned block of at least `bytes` bytes, never null (also
// for 0 bytes); aborts when out of memory. Release with std::free.
void* AllocateAligned(size_t bytes);

}  // namespace grps

#endif  // GRPS_TENSOR_HOST_MEMORY_H_
