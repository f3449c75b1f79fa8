#include "worker/gradient_clipping.h"

#include <algorithm>
#include <cmath>

namespace grps {

ClipResult ClipGradient(const ClipLimits& limits, absl::Span<const absl::Span<float>> parts) {
  ClipResult result;
  double squares = 0;
  for (absl::Span<float> part : parts) {
    for (float& g : part) {
      if (limits.value > 0 && std::isfinite(g) && std::fabs(g) > limits.value) {
        g = std::copysign(limits.value, g);
        ++result.values_clamped;
      }
      squares += static_cast<double>(g) * g;
    }
  }
  result.norm = std::sqrt(squares);
  if (limits.norm > 0 && std::isfinite(result.norm) && result.norm > limits.norm) {
    const float scale = static_cast<float>(limits.norm / result.norm);
    for (absl::Span<float> part : parts)
      for (float& g : part) g *= scale;
    result.norm_clipped = true;
  }
  return result;
}

}  // namespace grps
