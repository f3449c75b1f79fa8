// TopKFeedback: top-k gradient sparsification with error feedback for a
// worker's pushes (JobConfig.gradient_topk in (0, 1)). Each push sends, of
// each chunk, the ceil(fraction x n) values of gradient plus residual
// largest in magnitude (at least one); what it did not send stays in the
// residual and is added to the next push's gradient.
//
//   TopKFeedback topk(config.gradient_topk(), layout);
//   std::vector<std::vector<WireChunk>> chunks = ...;  // by part, ids set
//   topk.Select(step, generation, host_grads, DType::kF32, &chunks);
//
// A retry of a step (the same step again, in the same generation) selects
// from the residual as it was before that step's first attempt, so it
// sends the same values. A push of another generation (the job rolled
// back) starts from an empty residual.
//
// Thread safety: Select may be called from any thread; calls take turns.
#ifndef GRPS_WORKER_TOPK_FEEDBACK_H_
#define GRPS_WORKER_TOPK_FEEDBACK_H_

#include <cstdint>
#include <optional>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "tensor/dtype.h"
#include "wire/chunk_codec.h"
#include "worker/chunk_layout.h"

namespace grps {

class TopKFeedback {
 public:
  // `fraction` in (0, 1); `layout` must outlive this.
  TopKFeedback(float fraction, const ChunkLayout& layout)
      : fraction_(fraction), layout_(layout) {}
  TopKFeedback(const TopKFeedback&) = delete;
  TopKFeedback& operator=(const TopKFeedback&) = delete;

  // Sets the selected values (in dtype `wire`) and their indices of every
  // chunk in `chunks` (by part of the layout, each part's chunks in order
  // with chunk_id set) for the push of `step` in `generation` of `grads`
  // (num_parameters() floats), and keeps the rest in the residual.
  void Select(uint64_t step, uint64_t generation, const float* grads, DType wire,
              std::vector<std::vector<WireChunk>>* chunks) ABSL_LOCKS_EXCLUDED(mu_);

 private:
  const float fraction_;
  const ChunkLayout& layout_;

  // What the pushes have not sent yet, by flat offset; as it was before the
  // push of `step_` (a retry of that step starts again from there); and the
  // generation it belongs to.
  absl::Mutex mu_;
  std::vector<float> residual_ ABSL_GUARDED_BY(mu_);
  std::vector<float> before_ ABSL_GUARDED_BY(mu_);
  std::optional<uint64_t> step_ ABSL_GUARDED_BY(mu_);
  uint64_t generation_ ABSL_GUARDED_BY(mu_) = 0;
  std::vector<uint32_t> order_ ABSL_GUARDED_BY(mu_);  // SparsifyTopK's scratch
};

}  // namespace grps

#endif  // GRPS_WORKER_TOPK_FEEDBACK_H_
