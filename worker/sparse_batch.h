// SparseBatch: a batch of sparse examples turned into what the wire and the
// embedding model need: the distinct embedding-table ids to pull and push,
// and, per nonzero, which of those rows it reads.
#ifndef GRPS_WORKER_SPARSE_BATCH_H_
#define GRPS_WORKER_SPARSE_BATCH_H_

#include <cstdint>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"

namespace grps {

// The embedding-table row of a raw feature id.
//
// table_rows == 0 (identity mode): the id is the feature itself; requires
// feature >= 0 (SparseBatch::Build checks it).
// table_rows > 0: the splitmix64 finalizer of the feature's bits, modulo
// table_rows, so nearby features land far apart. The function has no seed
// and depends on nothing but its arguments: every worker of every run on
// every platform maps a feature to the same row, which is what lets one
// worker's pushes meet another's pulls and a checkpointed table be reloaded.
// Changing it remaps every stored table.
uint64_t HashFeatureId(int64_t feature, uint64_t table_rows);

// A batch of examples in CSR form, as a data loader hands it over. Example i
// has the nonzeros [offsets[i], offsets[i + 1]) of features / values and the
// label labels[i]. Views: the caller keeps the storage alive for the call.
struct SparseExamples {
  absl::Span<const int64_t> offsets;   // labels.size() + 1 entries
  absl::Span<const int64_t> features;  // raw feature ids, any int64
  absl::Span<const float> values;      // one per feature
  absl::Span<const int32_t> labels;
};

// A batch reads num_fields tables, one per field (data/sparse_dataset.h):
// with one field a feature is the table's raw id; with several, a feature is
// FieldFeature(field, value) and its raw id in the field's table is the
// value.
//
// Invariants, checked by Build and holding for every SparseBatch that exists:
//   * table_offsets() has num_fields() + 1 entries, from 0 to
//     unique_ids().size(), never decreasing; table t's ids are
//     unique_ids()[table_offsets()[t], table_offsets()[t + 1]), sorted
//     ascending and distinct, every id in [0, table_rows) (or the raw id
//     itself in identity mode);
//   * rows() and fields() have one entry per nonzero; nonzero j reads table
//     fields()[j], and unique_ids()[rows()[j]] is HashFeatureId of its raw
//     id, within that table's range of unique_ids();
//   * offsets() has size() + 1 entries, starts at 0, never decreases and
//     ends at nnz(); values() are finite.
// Labels are copied as they are: the dataset reader checks them against the
// job's num_classes, and the model requires them in [0, classes).
//
// Thread safety: Build mutates; const methods may run concurrently.
class SparseBatch {
 public:
  SparseBatch() = default;  // empty: no examples, no ids.

  // A new batch built from `examples` (see Build).
  static absl::StatusOr<SparseBatch> Create(const SparseExamples& examples, uint64_t table_rows,
                                            int32_t num_fields = 1);

  // Replaces the contents with `examples` of `num_fields` fields, hashed
  // into tables of `table_rows` rows each (0: identity), reusing this
  // batch's buffers, which is why a training loop keeps one SparseBatch
  // across steps. InvalidArgument (and an empty batch) if the offsets do not
  // describe the features, the feature and value counts differ, a value is
  // not finite, a feature is negative in identity mode or with several
  // fields, a feature's field is not below num_fields, num_fields is not in
  // [1, kMaxFields], table_rows exceeds INT64_MAX (the wire's ids are int64)
  // or there are 2^31 nonzeros or more.
  absl::Status Build(const SparseExamples& examples, uint64_t table_rows, int32_t num_fields = 1);

  // Examples in the batch (may be 0).
  int size() const { return static_cast<int>(labels_.size()); }
  int64_t nnz() const { return static_cast<int64_t>(rows_.size()); }

  int32_t num_fields() const { return static_cast<int32_t>(table_offsets_.size()) - 1; }
  // The distinct rows the batch touches, table by table: what is pulled
  // before the step and what its row gradients are pushed for, in this
  // order.
  const std::vector<int64_t>& unique_ids() const { return unique_ids_; }
  const std::vector<int64_t>& table_offsets() const { return table_offsets_; }
  // Table t's part of unique_ids(); requires 0 <= t < num_fields().
  absl::Span<const int64_t> table_ids(int32_t t) const {
    return absl::MakeConstSpan(unique_ids_.data() + table_offsets_[t],
                               unique_ids_.data() + table_offsets_[t + 1]);
  }
  // Per nonzero, its index into unique_ids().
  const std::vector<int32_t>& rows() const { return rows_; }
  // Per nonzero, its field (the table it reads).
  const std::vector<int32_t>& fields() const { return fields_; }
  const std::vector<float>& values() const { return values_; }
  const std::vector<int64_t>& offsets() const { return offsets_; }
  const std::vector<int32_t>& labels() const { return labels_; }

 private:
  void Clear();

  std::vector<int64_t> unique_ids_;
  std::vector<int64_t> table_offsets_ = {0, 0};
  std::vector<int32_t> rows_;
  std::vector<int32_t> fields_;
  std::vector<float> values_;
  std::vector<int64_t> offsets_ = {0};
  std::vector<int32_t> labels_;
  // Scratch: per nonzero, its (field, table id); then their sorted set.
  std::vector<std::pair<int32_t, int64_t>> keys_;
  std::vector<std::pair<int32_t, int64_t>> unique_keys_;
};

}  // namespace grps

#endif  // GRPS_WORKER_SPARSE_BATCH_H_
