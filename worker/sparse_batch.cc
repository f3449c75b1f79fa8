#include "worker/sparse_batch.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "absl/strings/str_cat.h"
#include "data/sparse_dataset.h"
#include "data/split_mix.h"

namespace grps {

uint64_t HashFeatureId(int64_t feature, uint64_t table_rows) {
  if (table_rows == 0) return static_cast<uint64_t>(feature);
  return SplitMix64(static_cast<uint64_t>(feature)) % table_rows;
}

absl::StatusOr<SparseBatch> SparseBatch::Create(const SparseExamples& examples, uint64_t table_rows,
                                                int32_t num_fields) {
  SparseBatch batch;
  absl::Status status = batch.Build(examples, table_rows, num_fields);
  if (!status.ok()) return status;
  return batch;
}

void SparseBatch::Clear() {
  unique_ids_.clear();
  table_offsets_.assign(2, 0);
  rows_.clear();
  fields_.clear();
  values_.clear();
  offsets_.assign(1, 0);
  labels_.clear();
}

absl::Status SparseBatch::Build(const SparseExamples& examples, uint64_t table_rows,
                                int32_t num_fields) {
  Clear();
  if (num_fields < 1 || num_fields > kMaxFields) {
    return absl::InvalidArgumentError(
        absl::StrCat("SparseBatch: ", num_fields, " fields (want 1 to ", kMaxFields, ")"));
  }
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
    if (num_fields > 1 &&
        (examples.features[j] < 0 || FeatureField(examples.features[j]) >= num_fields)) {
      return absl::InvalidArgumentError(absl::StrCat("SparseBatch: feature ", examples.features[j],
                                                     " is not a feature of fields 0 to ",
                                                     num_fields - 1, " (FieldFeature)"));
    }
  }

  // Hash every nonzero within its field, then sort and deduplicate the
  // (field, id) pairs: table by table, ids ascending. Each nonzero finds its
  // row by binary search in them.
  keys_.resize(nnz);
  for (size_t j = 0; j < nnz; ++j) {
    const int64_t feature = examples.features[j];
    const int32_t field = num_fields > 1 ? FeatureField(feature) : 0;
    const int64_t raw = num_fields > 1 ? FeatureValue(feature) : feature;
    keys_[j] = {field, static_cast<int64_t>(HashFeatureId(raw, table_rows))};
  }
  unique_keys_.assign(keys_.begin(), keys_.end());
  std::sort(unique_keys_.begin(), unique_keys_.end());
  unique_keys_.erase(std::unique(unique_keys_.begin(), unique_keys_.end()), unique_keys_.end());
  unique_ids_.resize(unique_keys_.size());
  table_offsets_.assign(static_cast<size_t>(num_fields) + 1, 0);
  for (size_t u = 0; u < unique_keys_.size(); ++u) {
    unique_ids_[u] = unique_keys_[u].second;
    ++table_offsets_[unique_keys_[u].first + 1];
  }
  for (int32_t t = 0; t < num_fields; ++t) table_offsets_[t + 1] += table_offsets_[t];
  rows_.resize(nnz);
  fields_.resize(nnz);
  for (size_t j = 0; j < nnz; ++j) {
    rows_[j] =
        static_cast<int32_t>(std::lower_bound(unique_keys_.begin(), unique_keys_.end(), keys_[j]) -
                             unique_keys_.begin());
    fields_[j] = keys_[j].first;
  }
  values_.assign(examples.values.begin(), examples.values.end());
  offsets_.assign(examples.offsets.begin(), examples.offsets.end());
  labels_.assign(examples.labels.begin(), examples.labels.end());
  return absl::OkStatus();
}

}  // namespace grps
