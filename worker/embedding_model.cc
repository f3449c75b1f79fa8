#include "worker/embedding_model.h"

#include <algorithm>
#include <cassert>
#include <cmath>
#include <utility>

#include "worker/binary_auc.h"

namespace grps {
namespace {

std::vector<int64_t> HeadWidths(int64_t embedding_dim,
                                std::vector<int64_t> hidden,
                                int64_t num_classes) {
  hidden.insert(hidden.begin(), embedding_dim);
  hidden.push_back(num_classes);
  return hidden;
}

}  // namespace

EmbeddingModel::EmbeddingModel(Backend* backend, int64_t embedding_dim, std::vector<int64_t> hidden,
                               int64_t num_classes, EmbeddingCombiner combiner, int max_batch,
                               int32_t num_fields)
    : embedding_dim_(embedding_dim),
      num_fields_(num_fields),
      combiner_(combiner),
      max_batch_(max_batch),
      head_(backend, HeadWidths(num_fields * embedding_dim, std::move(hidden), num_classes),
            max_batch),
      bags_(static_cast<size_t>(max_batch) * num_fields * embedding_dim),
      bag_grads_(bags_.size()),
      field_nnz_(num_fields),
      head_grads_(backend, head_.num_parameters()) {
  assert(embedding_dim_ >= 1 && num_classes >= 1 && max_batch_ >= 1 && num_fields_ >= 1);
}

void EmbeddingModel::SetHeadParameters(const float* host_params) {
  head_.SetParameters(host_params);
}

void EmbeddingModel::GetHeadParameters(float* host_params) {
  head_.GetParameters(host_params);
}

void EmbeddingModel::GetHeadGradients(float* host_grads) {
  std::copy(head_grads_.begin(), head_grads_.end(), host_grads);
}

template <typename Visit>
void EmbeddingModel::VisitNonzeros(const SparseBatch& batch, int first, int count, Visit visit) {
  assert(batch.num_fields() == num_fields_);
  const std::vector<int64_t>& offsets = batch.offsets();
  const std::vector<int32_t>& fields = batch.fields();
  const std::vector<float>& values = batch.values();
  const bool mean = combiner_ == EmbeddingCombiner::kMean;
  for (int i = 0; i < count; ++i) {
    const int64_t begin = offsets[first + i];
    const int64_t end = offsets[first + i + 1];
    if (mean) {
      std::fill(field_nnz_.begin(), field_nnz_.end(), 0);
      for (int64_t j = begin; j < end; ++j) ++field_nnz_[fields[j]];
    }
    for (int64_t j = begin; j < end; ++j) {
      const int32_t f = fields[j];
      const float weight = mean ? values[j] / static_cast<float>(field_nnz_[f]) : values[j];
      visit(i, j, f * embedding_dim_, weight);
    }
  }
}

void EmbeddingModel::ComputeBags(const SparseBatch& batch, int first, int count,
                                 const float* rows) {
  const int64_t dim = embedding_dim_;
  const int64_t width = num_fields_ * dim;
  const std::vector<int32_t>& row_of = batch.rows();
  std::fill(bags_.begin(), bags_.begin() + count * width, 0.0f);
  VisitNonzeros(batch, first, count, [&](int i, int64_t j, int64_t slot, float w) {
    float* bag = bags_.data() + i * width + slot;
    const float* row = rows + static_cast<int64_t>(row_of[j]) * dim;
    for (int64_t d = 0; d < dim; ++d) bag[d] += w * row[d];
  });
}

float EmbeddingModel::ForwardBackward(const SparseBatch& batch,
                                      const float* rows, int64_t* correct,
                                      int passes) {
  const int n = batch.size();
  assert(passes >= 1 && n >= passes && n % passes == 0);
  const int per_pass = n / passes;
  assert(per_pass <= max_batch_);
  const int64_t dim = embedding_dim_;
  const int64_t width = num_fields_ * dim;
  const std::vector<int32_t>& row_of = batch.rows();
  row_grads_.assign(batch.unique_ids().size() * dim, 0.0f);
  for (int pass = 0; pass < passes; ++pass) {
    const int first = pass * per_pass;
    ComputeBags(batch, first, per_pass, rows);
    // The head's passes are the dense model's: averaged on the backend,
    // the mean downloaded by the last.
    head_.StageBatch(pass, bags_.data(), batch.labels().data() + first, per_pass);
    head_.ComputeStaged(pass, pass, passes, 1.0f, head_grads_.data());
    head_.GetInputGradient(bag_grads_.data());
    // d loss / d r_u = sum over nonzeros j with row u of w_j * d loss / d
    // (j's field's bag).
    VisitNonzeros(batch, first, per_pass, [&](int i, int64_t j, int64_t slot, float w) {
      const float* bag_grad = bag_grads_.data() + i * width + slot;
      float* grad = row_grads_.data() + static_cast<int64_t>(row_of[j]) * dim;
      for (int64_t d = 0; d < dim; ++d) grad[d] += w * bag_grad[d];
    });
  }
  const float loss = head_.FinishStep(correct);
  if (passes > 1) {
    const float inv = 1.0f / static_cast<float>(passes);
    for (float& g : row_grads_) g *= inv;
  }
  return loss;
}

EvalResult EmbeddingModel::Evaluate(const SparseBatch& examples,
                                    const float* rows) {
  EvalResult result;
  const int count = examples.size();
  double loss_sum = 0;
  int64_t hits = 0;
  std::vector<float> scores;  // two classes: class 1's, every part's
  for (int first = 0; first < count; first += max_batch_) {
    const int n = std::min(max_batch_, count - first);
    ComputeBags(examples, first, n, rows);
    const EvalResult part =
        head_.Evaluate(bags_.data(), examples.labels().data() + first, n, &scores);
    loss_sum += part.loss * n;
    hits += std::llround(part.accuracy * n);
  }
  result.examples = count;
  if (count > 0) {
    result.loss = loss_sum / count;
    result.accuracy = static_cast<double>(hits) / count;
  }
  if (scores.size() == static_cast<size_t>(count))
    result.auc = BinaryAuc(scores, absl::MakeConstSpan(examples.labels().data(),
                                                       static_cast<size_t>(count)));
  return result;
}

}  // namespace grps
