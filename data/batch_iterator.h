// BatchIterator: cuts one epoch's example order into mini-batches.
#ifndef GRPS_DATA_BATCH_ITERATOR_H_
#define GRPS_DATA_BATCH_ITERATOR_H_

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"

namespace grps {

// What happens to the last batch when the order's length is not a multiple
// of the batch size.
enum class LastBatch {
  kDrop,  // every batch has exactly batch_size examples
  kKeep,  // the last batch is shorter
};

// Batch b holds order[b * batch_size, min((b + 1) * batch_size, n)), in
// the order's order. Owns its copy of the order; the spans it hands out stay
// valid while the iterator lives. Not thread-safe (Next advances a cursor);
// Batch(b) and num_batches() are const and may be called concurrently.
class BatchIterator {
 public:
  // InvalidArgument unless batch_size >= 1.
  static absl::StatusOr<BatchIterator> Create(std::vector<int64_t> order,
                                              int64_t batch_size,
                                              LastBatch last_batch);

  // n / batch_size batches, plus one when kKeep and n % batch_size != 0.
  int64_t num_batches() const { return num_batches_; }
  int64_t batch_size() const { return batch_size_; }

  // Batch b; empty unless 0 <= b < num_batches(). Random access lets a
  // resumed worker start mid-epoch.
  absl::Span<const int64_t> Batch(int64_t b) const;

  // Sets *batch to the next batch and returns true, or returns false when
  // the epoch's batches are used up.
  bool Next(absl::Span<const int64_t>* batch);
  // Makes Next start again from batch 0.
  void Reset() { next_ = 0; }

 private:
  BatchIterator(std::vector<int64_t> order, int64_t batch_size,
                int64_t num_batches)
      : order_(std::move(order)),
        batch_size_(batch_size),
        num_batches_(num_batches) {}

  std::vector<int64_t> order_;
  int64_t batch_size_;
  int64_t num_batches_;
  int64_t next_ = 0;
};

}  // namespace grps

#endif  // GRPS_DATA_BATCH_ITERATOR_H_
