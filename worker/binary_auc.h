// BinaryAuc: the area under the ROC curve of a two-class model's scores,
// the measure click-through and recommendation models are judged by (with
// the log loss, which for two classes is the test loss).
//
//   std::vector<float> scores = ...;   // per example: higher, more class 1
//   double auc = BinaryAuc(scores, labels);  // -1 without both classes
#ifndef GRPS_WORKER_BINARY_AUC_H_
#define GRPS_WORKER_BINARY_AUC_H_

#include <cstdint>

#include "absl/types/span.h"

namespace grps {

// The probability that a random example of class 1 scores above a random
// example of class 0, a tie counting one half (the Mann-Whitney U over the
// product of the classes' sizes). `scores` and `labels` (0 or 1; any other
// label counts as neither) are per example. -1 when either class has no
// example, a score is NaN, or the sizes differ. O(n log n).
double BinaryAuc(absl::Span<const float> scores, absl::Span<const int32_t> labels);

}  // namespace grps

#endif  // GRPS_WORKER_BINARY_AUC_H_
