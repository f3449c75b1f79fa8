// LossScaler: dynamic loss scaling for f16 compute (JobConfig.compute_dtype),
// as PyTorch's GradScaler does it. The backward pass runs on the loss times
// scale() so that small gradients do not flush to zero in f16; a gradient
// that overflowed (an inf or NaN after unscaling) is skipped, never pushed,
// and the scale halves; after kGrowthInterval finite steps in a row it
// doubles. bf16 and f32 have f32's range and need no scaling: scale 1.
//
// Thread safety: the training thread's.
#ifndef GRPS_WORKER_LOSS_SCALER_H_
#define GRPS_WORKER_LOSS_SCALER_H_

#include <algorithm>
#include <cstdint>

namespace grps {

class LossScaler {
 public:
  static constexpr uint32_t kGrowthInterval = 2000;
  static constexpr float kMaxScale = 16777216.0f;  // 2^24

  // initial <= 0: 2^16 (GradScaler's default) when `dynamic`; scale 1 and
  // no changes when not.
  LossScaler(bool dynamic, float initial)
      : dynamic_(dynamic),
        scale_(!dynamic ? 1.0f : initial > 0 ? std::min(initial, kMaxScale) : 65536.0f) {}

  float scale() const { return scale_; }
  bool dynamic() const { return dynamic_; }
  uint64_t overflows() const { return overflows_; }

  // After a step's gradient was computed at scale(): `finite` says whether
  // every element is. Returns true when the gradient may be pushed; false
  // when it overflowed and is skipped (counted; the scale halves, but never
  // below 1: a gradient that overflows at scale 1 is the model's, not the
  // scale's, and the caller refuses it).
  bool Update(bool finite) {
    if (!dynamic_) return finite;
    if (!finite) {
      ++overflows_;
      scale_ = std::max(1.0f, scale_ / 2);
      good_steps_ = 0;
      return false;
    }
    if (++good_steps_ >= kGrowthInterval) {
      scale_ = std::min(kMaxScale, scale_ * 2);
      good_steps_ = 0;
    }
    return true;
  }

 private:
  const bool dynamic_;
  float scale_;
  uint32_t good_steps_ = 0;
  uint64_t overflows_ = 0;
};

}  // namespace grps

#endif  // GRPS_WORKER_LOSS_SCALER_H_
