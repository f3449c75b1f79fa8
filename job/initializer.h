// Deterministic parameter initialization. A value depends only on (seed,
// tensor index, element index), never on how the tensor is chunked or which
// shard holds it, so any shard layout starts from the same weights.
#ifndef GRPS_JOB_INITIALIZER_H_
#define GRPS_JOB_INITIALIZER_H_

#include <cstdint>

#include "absl/status/status.h"
#include "proto/grps.pb.h"

namespace grps {

// Writes elements [offset, offset + count) of `tensor` into out[0, count).
// "glorot_uniform": U(-a, a), a = sqrt(6 / (fan_in + fan_out)) with fan_in =
// shape[0] and fan_out = shape[1] (or shape[0] for a vector); "zeros".
// InvalidArgument for an unknown initializer.
absl::Status InitializeRange(const ::grps::v1::TensorSpec& tensor,
                             uint64_t seed, uint32_t tensor_index,
                             uint64_t offset, uint64_t count, float* out);

}  // namespace grps

#endif  // GRPS_JOB_INITIALIZER_H_
