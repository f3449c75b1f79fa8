#include "data/batch_iterator.h"

#include <algorithm>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace grps {

absl::StatusOr<BatchIterator> BatchIterator::Create(std::vector<int64_t> order,
                                                    int64_t batch_size,
                                                    LastBatch last_batch) {
  if (batch_size < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("batch size must be >= 1, got ", batch_size));
  }
  const int64_t n = static_cast<int64_t>(order.size());
  int64_t num_batches = n / batch_size;
  if (last_batch == LastBatch::kKeep && n % batch_size != 0) ++num_batches;
  return BatchIterator(std::move(order), batch_size, num_batches);
}

absl::Span<const int64_t> BatchIterator::Batch(int64_t b) const {
  if (b < 0 || b >= num_batches_) return {};
  const int64_t begin = b * batch_size_;
  const int64_t end =
      std::min<int64_t>(begin + batch_size_, static_cast<int64_t>(order_.size()));
  return absl::MakeConstSpan(order_.data() + begin, end - begin);
}

bool BatchIterator::Next(absl::Span<const int64_t>* batch) {
  if (next_ >= num_batches_) return false;
  *batch = Batch(next_++);
  return true;
}

}  // namespace grps
