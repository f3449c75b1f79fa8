// Gradient clipping on the worker, before the push (JobConfig.clip_value,
// clip_norm): the defence against the rare batch whose gradient would throw
// the weights far off, applied to the whole gradient a worker pushes, as
// torch.nn.utils.clip_grad_norm_ and clip_grad_value_ do.
#ifndef GRPS_WORKER_GRADIENT_CLIPPING_H_
#define GRPS_WORKER_GRADIENT_CLIPPING_H_

#include <cstdint>

#include "absl/types/span.h"

namespace grps {

struct ClipLimits {
  float value = 0;  // clamp each element to [-value, value]; 0: no clamp
  float norm = 0;   // then scale to this global L2 norm if longer; 0: none
  bool active() const { return value > 0 || norm > 0; }
};

struct ClipResult {
  // The global L2 norm before norm clipping (after the clamp): what the
  // worker reports as its gradient norm.
  double norm = 0;
  bool norm_clipped = false;   // the gradient was scaled by limits.norm / norm
  uint64_t values_clamped = 0; // elements the clamp changed
  bool clipped() const { return norm_clipped || values_clamped > 0; }
};

// Clips, in place, the gradient made of `parts` (say a dense head and the
// embedding rows its batch read), as one vector. A non-finite element is
// left as it is, and so is the rest: the norm is then not finite, and the
// caller refuses the step.
ClipResult ClipGradient(const ClipLimits& limits, absl::Span<const absl::Span<float>> parts);

}  // namespace grps

#endif  // GRPS_WORKER_GRADIENT_CLIPPING_H_
