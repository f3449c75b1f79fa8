// SparseDataset: labelled sparse examples for classification (an embedding
// model's input), held in memory in CSR form. Built by the libsvm reader
// (libsvm_reader.h), the synthetic generator (synthetic_sparse.h) and from a
// dense Dataset (sparse_features.h).
#ifndef GRPS_DATA_SPARSE_DATASET_H_
#define GRPS_DATA_SPARSE_DATASET_H_

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"

namespace grps {

// Fields: a data set whose examples carry features of several kinds, each
// kind read through a table of its own (Criteo's 26 categorical columns),
// tags every id with its field: FieldFeature(f, v) = f * 2^kFieldShift + v
// for a value v in [0, 2^kFieldShift). An example's ascending ids are then
// grouped by field, fields ascending. A data set of one field uses the
// values themselves (field 0), so untagged data reads as one field.
inline constexpr int kFieldShift = 40;
inline constexpr int64_t kFieldValueLimit = int64_t{1} << kFieldShift;
// Fields are below it, so that a tagged id stays a non-negative int64.
inline constexpr int32_t kMaxFields = int32_t{1} << (62 - kFieldShift);
// Requires 0 <= field < kMaxFields and 0 <= value < kFieldValueLimit.
inline constexpr int64_t FieldFeature(int32_t field, int64_t value) {
  return (static_cast<int64_t>(field) << kFieldShift) | value;
}
// Of a tagged id (>= 0).
inline constexpr int32_t FeatureField(int64_t feature) {
  return static_cast<int32_t>(feature >> kFieldShift);
}
inline constexpr int64_t FeatureValue(int64_t feature) { return feature & (kFieldValueLimit - 1); }

// Example i holds the feature ids ids[offsets[i] .. offsets[i + 1]) with
// their values at the same positions, and one label. The invariants, checked
// once by Create and true of every SparseDataset that exists:
//   offsets has num_examples + 1 entries, offsets[0] == 0, it never
//     decreases, and offsets[num_examples] == ids.size() == values.size()
//     (the number of non-zeros, nnz);
//   within one example the ids are strictly ascending (so no duplicates);
//   every id is >= 0, and < feature_space unless feature_space is 0 (no
//     bound);
//   every value is finite;
//   num_classes >= 1 and every label is in [0, num_classes).
// An example may hold no ids. Immutable after construction, so concurrent
// reads from many threads are safe.
class SparseDataset {
 public:
  SparseDataset() = default;  // empty: no examples, no classes.

  // InvalidArgument, naming the example (and position) at fault, unless
  // every invariant above holds.
  static absl::StatusOr<SparseDataset> Create(int32_t num_classes,
                                              uint64_t feature_space,
                                              std::vector<int64_t> offsets,
                                              std::vector<int64_t> ids,
                                              std::vector<float> values,
                                              std::vector<int32_t> labels);

  int64_t num_examples() const { return static_cast<int64_t>(labels_.size()); }
  int64_t nnz() const { return static_cast<int64_t>(ids_.size()); }
  int32_t num_classes() const { return num_classes_; }
  // Every id is below it; 0 means ids have no upper bound.
  uint64_t feature_space() const { return feature_space_; }

  // The ids and values of example i, ids ascending; requires 0 <= i <
  // num_examples().
  absl::Span<const int64_t> ids(int64_t i) const {
    return absl::MakeConstSpan(ids_.data() + offsets_[i],
                               offsets_[i + 1] - offsets_[i]);
  }
  absl::Span<const float> values(int64_t i) const {
    return absl::MakeConstSpan(values_.data() + offsets_[i],
                               offsets_[i + 1] - offsets_[i]);
  }
  int32_t label(int64_t i) const { return labels_[i]; }
  const std::vector<int32_t>& labels() const { return labels_; }
  // The CSR arrays themselves, num_examples() + 1 and nnz() entries.
  const std::vector<int64_t>& offsets() const { return offsets_; }
  const std::vector<int64_t>& all_ids() const { return ids_; }
  const std::vector<float>& all_values() const { return values_; }

  // A copy of examples [first, first + count) with the same num_classes and
  // feature_space (so a slice still fits the model of the whole set).
  // OutOfRange unless 0 <= first, 0 <= count, first + count <= num_examples.
  absl::StatusOr<SparseDataset> Subset(int64_t first, int64_t count) const;

  // One mini-batch in CSR form, as Gather fills it: example j of the batch
  // has ids[offsets[j] .. offsets[j + 1]).
  struct Batch {
    std::vector<int64_t> offsets;
    std::vector<int64_t> ids;
    std::vector<float> values;
    std::vector<int32_t> labels;
  };

  // Replaces *batch with the examples named by `indices`, in that order.
  // The vectors are cleared and refilled, so a Batch reused across steps
  // keeps its capacity and allocates only when a batch holds more
  // non-zeros than any before. OutOfRange if an index is outside [0,
  // num_examples); *batch is left unchanged on error.
  absl::Status Gather(absl::Span<const int64_t> indices, Batch* batch) const;

 private:
  int32_t num_classes_ = 0;
  uint64_t feature_space_ = 0;
  std::vector<int64_t> offsets_{0};
  std::vector<int64_t> ids_;
  std::vector<float> values_;
  std::vector<int32_t> labels_;
};

}  // namespace grps

#endif  // GRPS_DATA_SPARSE_DATASET_H_
