#include "data/sparse_features.h"

#include <algorithm>
#include <cmath>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"

namespace grps {

absl::StatusOr<SparseDataset> SparseFromDense(
    const Dataset& dense, const SparseFeatureOptions& options) {
  const int64_t buckets = options.buckets;
  const float max_value = options.max_value;
  if (buckets < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("buckets must be >= 1, got ", buckets));
  }
  if (!(max_value > 0) || !std::isfinite(max_value)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "max_value must be positive and finite, got ", max_value));
  }
  const int64_t num_features = dense.num_features();
  if (num_features > (int64_t{1} << 62) / buckets) {
    return absl::InvalidArgumentError(absl::StrCat(
        num_features, " features of ", buckets,
        " buckets each make more than 2^62 ids"));
  }

  std::vector<int64_t> offsets{0};
  std::vector<int64_t> ids;
  std::vector<float> values;
  offsets.reserve(dense.num_examples() + 1);
  for (int64_t i = 0; i < dense.num_examples(); ++i) {
    const absl::Span<const float> example = dense.example(i);
    for (int64_t f = 0; f < num_features; ++f) {
      const float x = example[f];
      if (!(x >= 0 && x <= max_value)) {
        return absl::InvalidArgumentError(absl::StrCat(
            "feature ", f, " of example ", i, " is ", x, ", outside [0, ",
            max_value, "]"));
      }
      if (x == 0) continue;
      const int64_t bucket = std::min<int64_t>(
          buckets - 1,
          static_cast<int64_t>(static_cast<double>(x) / max_value * buckets));
      ids.push_back(f * buckets + bucket);
      values.push_back(1.0f);
    }
    offsets.push_back(static_cast<int64_t>(ids.size()));
  }
  return SparseDataset::Create(
      dense.num_classes(), static_cast<uint64_t>(num_features * buckets),
      std::move(offsets), std::move(ids), std::move(values), dense.labels());
}

}  // namespace grps
