#include "worker/evaluator.h"

#include <utility>

namespace grps {
namespace {
// Examples per forward pass of an evaluation.
constexpr int kEvalBatch = 500;

class DenseEvalTarget : public EvalTarget {
 public:
  DenseEvalTarget(std::vector<int64_t> widths, const Dataset* test)
      : test_(test),
        backend_(CreateCpuBackend()),
        model_(backend_.get(), std::move(widths), kEvalBatch) {}

  absl::StatusOr<EvalResult> Evaluate(uint64_t,
                                      const std::vector<float>& weights) override {
    model_.SetParameters(weights.data());
    return model_.Evaluate(test_->features().data(), test_->labels().data(),
                           test_->num_examples());
  }

 private:
  const Dataset* const test_;
  std::unique_ptr<Backend> backend_;
  MlpModel model_;
};

class EmbeddingEvalTarget : public EvalTarget {
 public:
  EmbeddingEvalTarget(std::vector<int64_t> widths, EmbeddingCombiner combiner, SparseBatch test,
                      RowReader read_rows)
      : test_(std::move(test)),
        read_rows_(std::move(read_rows)),
        backend_(CreateCpuBackend()),
        model_(backend_.get(), widths.front() / test_.num_fields(),
               std::vector<int64_t>(widths.begin() + 1, widths.end() - 1), widths.back(), combiner,
               kEvalBatch, test_.num_fields()) {}

  absl::StatusOr<EvalResult> Evaluate(uint64_t step,
                                      const std::vector<float>& weights) override {
    const int64_t dim = model_.embedding_dim();
    rows_.resize(test_.unique_ids().size() * dim);
    for (int32_t t = 0; t < test_.num_fields(); ++t) {
      absl::Status s =
          read_rows_(t, test_.table_ids(t), step, rows_.data() + test_.table_offsets()[t] * dim);
      if (!s.ok()) return s;
    }
    model_.SetHeadParameters(weights.data());
    return model_.Evaluate(test_, rows_.data());
  }

 private:
  const SparseBatch test_;
  const RowReader read_rows_;
  std::unique_ptr<Backend> backend_;
  EmbeddingModel model_;
  std::vector<float> rows_;
};

}  // namespace

std::unique_ptr<EvalTarget> MakeDenseEvalTarget(std::vector<int64_t> widths,
                                                const Dataset* test) {
  return std::make_unique<DenseEvalTarget>(std::move(widths), test);
}

std::unique_ptr<EvalTarget> MakeEmbeddingEvalTarget(std::vector<int64_t> widths,
                                                    EmbeddingCombiner combiner,
                                                    SparseBatch test, RowReader read_rows) {
  return std::make_unique<EmbeddingEvalTarget>(std::move(widths), combiner, std::move(test),
                                               std::move(read_rows));
}

Evaluator::Evaluator(std::unique_ptr<EvalTarget> target, ResultCallback on_result)
    : on_result_(std::move(on_result)), target_(std::move(target)) {
  thread_ = std::thread([this] { Loop(); });
}

Evaluator::Evaluator(std::vector<int64_t> widths, const Dataset* test,
                     ResultCallback on_result)
    : Evaluator(MakeDenseEvalTarget(std::move(widths), test), std::move(on_result)) {}

Evaluator::~Evaluator() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
  }
  thread_.join();
}

bool Evaluator::Submit(uint64_t step, std::vector<float> weights) {
  absl::MutexLock lock(&mu_);
  if (busy_ || stop_) return false;
  busy_ = true;
  has_work_ = true;
  step_ = step;
  weights_ = std::move(weights);
  return true;
}

void Evaluator::Loop() {
  while (true) {
    uint64_t step;
    std::vector<float> weights;
    {
      absl::MutexLock lock(&mu_);
      mu_.Await(absl::Condition(
          +[](Evaluator* e) ABSL_EXCLUSIVE_LOCKS_REQUIRED(e->mu_) {
            return e->has_work_ || e->stop_;
          },
          this));
      if (!has_work_) return;  // stopping and idle
      has_work_ = false;
      step = step_;
      weights = std::move(weights_);
    }
    const Result result = Run(step, weights);
    on_result_(result);
    absl::MutexLock lock(&mu_);
    busy_ = false;
  }
}

Evaluator::Result Evaluator::EvaluateNow(uint64_t step,
                                         const std::vector<float>& weights) {
  {
    absl::MutexLock lock(&mu_);
    mu_.Await(absl::Condition(
        +[](bool* busy) { return !*busy; }, &busy_));
    busy_ = true;
  }
  Result result = Run(step, weights);
  absl::MutexLock lock(&mu_);
  busy_ = false;
  return result;
}

void Evaluator::WaitIdle() {
  absl::MutexLock lock(&mu_);
  mu_.Await(absl::Condition(+[](bool* busy) { return !*busy; }, &busy_));
}

Evaluator::Result Evaluator::Run(uint64_t step,
                                 const std::vector<float>& weights) {
  Result result;
  result.step = step;
  absl::StatusOr<EvalResult> eval = target_->Evaluate(step, weights);
  if (eval.ok()) {
    result.eval = *eval;
  } else {
    result.error = eval.status();
  }
  result.finished = absl::Now();
  return result;
}

}  // namespace grps
