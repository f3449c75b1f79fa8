#include "worker/straggler.h"

#include <cmath>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace grps {
namespace {
// Weight of the newest step in the average: smooth over about 20 steps.
constexpr double kNewest = 0.05;
}  // namespace

absl::StatusOr<Straggler> Straggler::Create(double factor,
                                            absl::Duration delay) {
  if (!std::isfinite(factor) || factor < 1)
    return absl::InvalidArgumentError(
        absl::StrCat("straggle factor must be >= 1, got ", factor));
  if (delay < absl::ZeroDuration())
    return absl::InvalidArgumentError("straggle delay must be >= 0");
  return Straggler(factor, delay);
}

std::string Straggler::Describe() const {
  std::string out;
  if (factor_ > 1) out = absl::StrFormat("%gx its own step time", factor_);
  if (delay_ > absl::ZeroDuration())
    absl::StrAppend(&out, out.empty() ? "" : " + ",
                    absl::FormatDuration(delay_), " per step");
  return out.empty() ? "no slowdown" : out;
}

absl::Duration Straggler::AfterStep(absl::Duration step_time) {
  if (!active()) return absl::ZeroDuration();
  const double s = absl::ToDoubleSeconds(step_time);
  average_s_ = average_s_ < 0 ? s : (1 - kNewest) * average_s_ + kNewest * s;
  return delay_ + absl::Seconds((factor_ - 1) * average_s_);
}

}  // namespace grps
