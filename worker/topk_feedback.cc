// TopKFeedback: a push's top-k selection and the residual it leaves.
#include "worker/topk_feedback.h"

#include <cmath>

namespace grps {

void TopKFeedback::Select(uint64_t step, uint64_t generation, const float* grads, DType wire,
                          std::vector<std::vector<WireChunk>>* chunks) {
  absl::MutexLock lock(&mu_);
  if (residual_.empty() || generation_ != generation) {
    residual_.assign(layout_.num_parameters(), 0.0f);
    step_.reset();
    generation_ = generation;
  }
  if (step_ == step) {
    residual_ = before_;  // a retry: the same selection again
  } else {
    before_ = residual_;
    step_ = step;
  }
  for (std::vector<WireChunk>& part : *chunks) {
    for (WireChunk& c : part) {
      const uint64_t n = layout_.num_elements(c.chunk_id);
      const int64_t offset = layout_.offset(c.chunk_id);
      const size_t keep = static_cast<size_t>(std::ceil(fraction_ * static_cast<double>(n)));
      SparsifyTopK(grads + offset, residual_.data() + offset, n, keep, wire, &c.indices,
                   &c.owned, &order_);
    }
  }
}

}  // namespace grps
