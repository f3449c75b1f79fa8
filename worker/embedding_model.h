// EmbeddingModel: a classifier over sparse features of one or more fields.
// Each example's features pick rows of their field's embedding table (by
// HashFeatureId, see sparse_batch.h); per field, the rows, each weighted by
// its feature's value, are combined into one bag of embedding_dim floats,
// and the fields' bags, side by side, feed a dense head (an MlpModel of
// widths {num_fields x embedding_dim, hidden..., classes}) trained with
// softmax cross-entropy.
//
// The tables live on the parameter servers, in sparse tables keyed by int64
// id; the model never holds them. Per step the caller pulls the rows of
// SparseBatch::unique_ids() (table t's part from table t), passes them to
// ForwardBackward, and pushes row_gradients() for the same ids: one row per
// distinct id of a table, already summed over every occurrence. The head's
// parameters are a flat array in MlpModel's layout, so they live in the
// dense chunks like a dense model's.
#ifndef GRPS_WORKER_EMBEDDING_MODEL_H_
#define GRPS_WORKER_EMBEDDING_MODEL_H_

#include <cstdint>
#include <vector>

#include "absl/types/span.h"
#include "tensor/backend.h"
#include "worker/mlp_model.h"
#include "worker/sparse_batch.h"

namespace grps {

// How an example's rows become its bag of a field, for the example's
// nonzeros j of that field, with values v_j and rows r_j:
enum class EmbeddingCombiner {
  kSum,   // bag = sum_j v_j r_j
  kMean,  // bag = (1 / n) sum_j v_j r_j, n = the example's nonzero count
          // in the field (not divided by sum_j v_j: values may sum to zero).
};
// Under both, a field without nonzeros in an example gets a zero bag (an
// example with none at all is predicted by the head's response to zero);
// it contributes no row gradient.

// The bag runs on the host (a loop over nonzeros, cheap beside the head);
// the head runs on the Backend, as MlpModel does.
//
// Thread safety: one thread at a time (like the Backend it runs on).
class EmbeddingModel {
 public:
  // embedding_dim >= 1, num_classes >= 1, max_batch >= 1, hidden widths
  // >= 1 each (none: a softmax regression on the bags), num_fields >= 1
  // (the batches' SparseBatch::num_fields()). *backend must outlive the
  // model.
  EmbeddingModel(Backend* backend, int64_t embedding_dim, std::vector<int64_t> hidden,
                 int64_t num_classes, EmbeddingCombiner combiner, int max_batch,
                 int32_t num_fields = 1);

  int64_t embedding_dim() const { return embedding_dim_; }
  int32_t num_fields() const { return num_fields_; }
  EmbeddingCombiner combiner() const { return combiner_; }
  int max_batch() const { return max_batch_; }
  // {num_fields x embedding_dim, hidden..., num_classes}.
  const std::vector<int64_t>& head_widths() const { return head_.widths(); }

  // The dense head, exactly as MlpModel with head_widths(): the same count,
  // layout, and meaning of its parameters and gradients.
  int64_t num_head_parameters() const { return head_.num_parameters(); }
  void SetHeadParameters(const float* host_params);
  void GetHeadParameters(float* host_params);

  // Forward and backward over `batch` (labels in [0, num_classes)), in
  // `passes` passes of batch.size() / passes consecutive examples each
  // (gradient accumulation: passes divides batch.size(), and a pass is at
  // most max_batch). `rows` holds the pulled rows:
  // batch.unique_ids().size() x embedding_dim floats, row i for
  // unique_ids()[i]; every pass reads them as they are. Returns the mean of
  // the passes' mean losses and leaves the mean of their gradients:
  //   * d(mean loss)/d(head parameters) for GetHeadGradients;
  //   * d(mean loss)/d(rows) in row_gradients();
  // *correct (if not null) counts argmax == label.
  float ForwardBackward(const SparseBatch& batch, const float* rows,
                        int64_t* correct, int passes = 1);

  // Copies the head gradient of the last ForwardBackward to host memory
  // (num_head_parameters() floats).
  void GetHeadGradients(float* host_grads);

  // The row gradient of the last ForwardBackward: that batch's
  // unique_ids().size() x embedding_dim floats, row i for unique_ids()[i],
  // summed over every nonzero that reads it (so pushing it as it is pushes
  // each id once). Empty before the first ForwardBackward; the span is valid
  // until the next ForwardBackward or the model's destruction.
  absl::Span<const float> row_gradients() const { return row_grads_; }

  // Forward only, over every example of `examples` (any size, 0 included),
  // in batches of at most max_batch; `rows` as for ForwardBackward, for
  // examples.unique_ids(). Leaves the gradients of the last ForwardBackward
  // as they were.
  EvalResult Evaluate(const SparseBatch& examples, const float* rows);

 private:
  // Calls visit(i, j, bag, weight) for every nonzero j of examples
  // [first, first + count) of `batch`: i counts from 0 at `first`, bag is
  // the offset of j's field's bag within example i's num_fields bags, weight
  // j's weight in that bag.
  template <typename Visit>
  void VisitNonzeros(const SparseBatch& batch, int first, int count, Visit visit);
  // bags_[0, count) = the bags of examples [first, first + count).
  void ComputeBags(const SparseBatch& batch, int first, int count, const float* rows);

  const int64_t embedding_dim_;
  const int32_t num_fields_;
  const EmbeddingCombiner combiner_;
  const int max_batch_;
  MlpModel head_;
  std::vector<float> bags_;         // host, max_batch x num_fields x embedding_dim
  std::vector<float> bag_grads_;    // host, as bags_
  std::vector<int64_t> field_nnz_;  // scratch: one example's nonzeros per field
  std::vector<float> row_grads_;  // host, unique ids x embedding_dim
  HostArray<float> head_grads_;   // the last ForwardBackward's, page-locked
};

}  // namespace grps

#endif  // GRPS_WORKER_EMBEDDING_MODEL_H_
