#include "job/initializer.h"

#include <cmath>

#include "absl/strings/str_cat.h"
#include "data/split_mix.h"

namespace grps {

absl::Status InitializeRange(const ::grps::v1::TensorSpec& tensor,
                             uint64_t seed, uint32_t tensor_index,
                             uint64_t offset, uint64_t count, float* out) {
  // "given": zeros until worker rank 0's values come (a shard serves none
  // of them before, ShardStore).
  if (tensor.initializer() == "zeros" || tensor.initializer().empty() ||
      tensor.initializer() == "given") {
    for (uint64_t i = 0; i < count; ++i) out[i] = 0.0f;
    return absl::OkStatus();
  }
  if (tensor.initializer() != "glorot_uniform")
    return absl::InvalidArgumentError(
        absl::StrCat("unknown initializer '", tensor.initializer(), "'"));
  const double fan_in = tensor.shape_size() > 0 ? tensor.shape(0) : 1;
  const double fan_out = tensor.shape_size() > 1 ? tensor.shape(1) : fan_in;
  const double limit = std::sqrt(6.0 / (fan_in + fan_out));
  const uint64_t stream = SplitMix64(seed ^ SplitMix64(tensor_index + 1));
  for (uint64_t i = 0; i < count; ++i) {
    uint64_t bits = SplitMix64(stream + offset + i);
    double u = (bits >> 11) * (1.0 / 9007199254740992.0);  // [0, 1)
    out[i] = static_cast<float>((2.0 * u - 1.0) * limit);
  }
  return absl::OkStatus();
}

}  // namespace grps
