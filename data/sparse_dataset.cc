#include "data/sparse_dataset.h"

#include <cmath>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "data/dataset.h"

namespace grps {

absl::StatusOr<SparseDataset> SparseDataset::Create(
    int32_t num_classes, uint64_t feature_space, std::vector<int64_t> offsets,
    std::vector<int64_t> ids, std::vector<float> values,
    std::vector<int32_t> labels) {
  if (num_classes < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "a dataset needs at least one class, got ", num_classes));
  }
  const uint64_t rows = labels.size();
  if (offsets.size() != rows + 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("sparse dataset holds ", offsets.size(), " offsets for ",
                     rows, " labels; expected ", rows + 1));
  }
  if (ids.size() != values.size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "sparse dataset holds ", ids.size(), " ids but ", values.size(),
        " values"));
  }
  if (offsets[0] != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("the first offset must be 0, got ", offsets[0]));
  }
  if (static_cast<uint64_t>(offsets[rows]) != ids.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("the last offset is ", offsets[rows], " but the dataset "
                     "holds ", ids.size(), " ids"));
  }
  for (uint64_t i = 0; i < rows; ++i) {
    if (offsets[i + 1] < offsets[i]) {
      return absl::InvalidArgumentError(
          absl::StrCat("offsets decrease at example ", i, ": ", offsets[i],
                       " then ", offsets[i + 1]));
    }
  }
  // Offsets are now in [0, ids.size()], so every slice below is in bounds.
  for (uint64_t i = 0; i < rows; ++i) {
    if (labels[i] < 0 || labels[i] >= num_classes) {
      return absl::InvalidArgumentError(
          absl::StrCat("label ", labels[i], " of example ", i,
                       " is outside [0, ", num_classes, ")"));
    }
    for (int64_t k = offsets[i]; k < offsets[i + 1]; ++k) {
      const int64_t id = ids[k];
      if (id < 0 ||
          (feature_space != 0 && static_cast<uint64_t>(id) >= feature_space)) {
        return absl::InvalidArgumentError(absl::StrCat(
            "id ", id, " of example ", i, " is outside [0, ",
            feature_space == 0 ? std::string("unbounded")
                               : absl::StrCat(feature_space),
            ")"));
      }
      if (k > offsets[i] && id <= ids[k - 1]) {
        return absl::InvalidArgumentError(absl::StrCat(
            "ids of example ", i, " are not strictly ascending: ", ids[k - 1],
            " then ", id));
      }
      if (!std::isfinite(values[k])) {
        return absl::InvalidArgumentError(absl::StrCat(
            "value ", values[k], " of id ", id, " in example ", i,
            " is not finite"));
      }
    }
  }
  SparseDataset dataset;
  dataset.num_classes_ = num_classes;
  dataset.feature_space_ = feature_space;
  dataset.offsets_ = std::move(offsets);
  dataset.ids_ = std::move(ids);
  dataset.values_ = std::move(values);
  dataset.labels_ = std::move(labels);
  return dataset;
}

absl::StatusOr<SparseDataset> SparseDataset::Subset(int64_t first,
                                                    int64_t count) const {
  if (absl::Status s = CheckSubsetRange(first, count, num_examples()); !s.ok()) return s;
  SparseDataset subset;
  subset.num_classes_ = num_classes_;
  subset.feature_space_ = feature_space_;
  const int64_t begin = offsets_[first];
  const int64_t end = offsets_[first + count];
  subset.offsets_.resize(count + 1);
  for (int64_t i = 0; i <= count; ++i) {
    subset.offsets_[i] = offsets_[first + i] - begin;
  }
  subset.ids_.assign(ids_.begin() + begin, ids_.begin() + end);
  subset.values_.assign(values_.begin() + begin, values_.begin() + end);
  subset.labels_.assign(labels_.begin() + first,
                        labels_.begin() + first + count);
  return subset;
}

absl::Status SparseDataset::Gather(absl::Span<const int64_t> indices,
                                   Batch* batch) const {
  if (absl::Status s = CheckExampleIndices(indices, num_examples()); !s.ok()) return s;
  batch->offsets.assign(1, 0);
  batch->ids.clear();
  batch->values.clear();
  batch->labels.clear();
  for (int64_t index : indices) {
    const int64_t begin = offsets_[index];
    const int64_t end = offsets_[index + 1];
    batch->ids.insert(batch->ids.end(), ids_.begin() + begin,
                      ids_.begin() + end);
    batch->values.insert(batch->values.end(), values_.begin() + begin,
                         values_.begin() + end);
    batch->offsets.push_back(static_cast<int64_t>(batch->ids.size()));
    batch->labels.push_back(labels_[index]);
  }
  return absl::OkStatus();
}

}  // namespace grps
