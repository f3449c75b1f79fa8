#include "worker/sparse_batch.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "absl/strings/str_cat.h"
#include "data/split_mix.h"

namespace grps {

uint64_t HashFeatureId(int64_t feature, uint64_t table_rows) {
  if (table_rows == 0) return static_cast<uint64_t>(feature);
  return SplitMix64(static_cast<uint64_t>(feature)) % table_rows;
}

absl::StatusOr<SparseBatch> SparseBatch::Create(const SparseExamples& examples,
                                                uint64_t table_rows) {
  SparseBatch batch;
  absl::Status status = batch.Build(examples, table_rows);
  if (!status.ok()) return status;
  return batch;
}

void SparseBatch::Clear() {
  unique_ids_.clear();
  rows_.clear();
  values_.clear();
  offsets_.assign(1, 0);
  labels_.clear();
}

absl::Status SparseBatch::Build(const SparseExamples& examples,
                                uint64_t table_rows) {
  Clear();
  const size_t batch = examples.labels.size();
  const size_t nnz = examples.features.size();
  if (examples.offsets.size() != batch + 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("SparseBatch: ", examples.offsets.size(),
                     " offsets for ", batch, " examples (want ", batch + 1, ")"));
  }
  if (examples.values.size() != nnz) {
    return absl::InvalidArgumentError(
        absl::StrCat("SparseBatch: ", nnz, " features but ",
                     examples.values.size(), " values"));
  }
  if (nnz > static_cast<size_t>(std::numeric_limits<int32_t>::max()) ||
      batch > static_cast<size_t>(std::numeric_limits<int32_t>::max())) {
    return absl::InvalidArgumentError(absl::StrCat(
        "SparseBatch: ", batch, " examples with ", nnz,
        " nonzeros is too large (both must stay below 2^31)"));
  }
  if (table_rows > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
    return absl::InvalidArgumentError(absl::StrCat(
        "SparseBatch: table_rows ", table_rows, " exceeds INT64_MAX"));
  }
  if (examples.offsets[0] != 0 ||
      examples.offsets[batch] != static_cast<int64_t>(nnz)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "SparseBatch: offsets run from ", examples.offsets[0], " to ",
        examples.offsets[batch], " (want 0 to ", nnz, ")"));
  }
  for (size_t i = 0; i < batch; ++i) {
    if (examples.offsets[i + 1] < examples.offsets[i]) {
      return absl::InvalidArgumentError(absl::StrCat(
          "SparseBatch: offsets decrease at example ", i, " (",
          examples.offsets[i], " then ", examples.offsets[i + 1], ")"));
    }
  }
  for (size_t j = 0; j < nnz; ++j) {
    if (!std::isfinite(examples.values[j])) {
      return absl::InvalidArgumentError(absl::StrCat(
          "SparseBatch: value ", j, " (feature ", examples.features[j],
          ") is not finite"));
    }
    if (table_rows == 0 && examples.features[j] < 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "SparseBatch: feature ", examples.features[j],
          " is negative, which identity mode (table_rows 0) cannot map"));
    }
  }

  // Hash every nonzero, then sort and deduplicate the ids; each nonzero finds
  // its row by binary search in the sorted ids.
  hashed_.resize(nnz);
  for (size_t j = 0; j < nnz; ++j) {
    hashed_[j] =
        static_cast<int64_t>(HashFeatureId(examples.features[j], table_rows));
  }
  unique_ids_.assign(hashed_.begin(), hashed_.end());
  std::sort(unique_ids_.begin(), unique_ids_.end());
  unique_ids_.erase(std::unique(unique_ids_.begin(), unique_ids_.end()),
                    unique_ids_.end());
  rows_.resize(nnz);
  for (size_t j = 0; j < nnz; ++j) {
    rows_[j] = static_cast<int32_t>(
        std::lower_bound(unique_ids_.begin(), unique_ids_.end(), hashed_[j]) -
        unique_ids_.begin());
  }
  values_.assign(examples.values.begin(), examples.values.end());
  offsets_.assign(examples.offsets.begin(), examples.offsets.end());
  labels_.assign(examples.labels.begin(), examples.labels.end());
  return absl::OkStatus();
}

}  // namespace grps
