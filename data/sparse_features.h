// Turns a dense Dataset into a SparseDataset of bucketed features, so that
// one real data set (Fashion-MNIST) can train both the dense model and the
// embedding model.
#ifndef GRPS_DATA_SPARSE_FEATURES_H_
#define GRPS_DATA_SPARSE_FEATURES_H_

#include <cstdint>

#include "absl/status/statusor.h"
#include "data/dataset.h"
#include "data/sparse_dataset.h"

namespace grps {

struct SparseFeatureOptions {
  // Intensity buckets per feature, >= 1.
  int32_t buckets = 16;
  // Features must lie in [0, max_value] (1 for LoadIdxDataset's pixels);
  // > 0 and finite.
  float max_value = 1.0f;
};

// Each non-zero feature f of an example, with value x in (0, max_value],
// becomes the id f * buckets + b with value 1, where b = floor(x /
// max_value * buckets) (the top bucket also takes x == max_value); a zero
// feature gives no id. So ids ascend with f, an all-zero example holds no
// ids, and feature_space is num_features * buckets. Labels and num_classes
// are copied (so a default-constructed Dataset, with no classes, is
// InvalidArgument).
//
// InvalidArgument for options outside their ranges, for a feature space
// over 2^62 ids, and for a feature outside [0, max_value] (naming the
// example and feature).
absl::StatusOr<SparseDataset> SparseFromDense(
    const Dataset& dense, const SparseFeatureOptions& options = {});

}  // namespace grps

#endif  // GRPS_DATA_SPARSE_FEATURES_H_
