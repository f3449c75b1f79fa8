#include "worker/evaluator.h"

#include <utility>

namespace grps {
namespace {
// Examples per forward pass of an evaluation.
constexpr int kEvalBatch = 500;
}  // namespace

Evaluator::Evaluator(std::vector<int64_t> widths, const Dataset* test,
                     ResultCallback on_result)
    : test_(test),
      on_result_(std::move(on_result)),
      backend_(CreateCpuBackend()),
      model_(std::make_unique<MlpModel>(backend_.get(), std::move(widths),
                                        kEvalBatch)) {
  thread_ = std::thread([this] { Loop(); });
}

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
  model_->SetParameters(weights.data());
  Result result;
  result.step = step;
  result.eval = model_->Evaluate(test_->features().data(),
                                 test_->labels().data(), test_->num_examples());
  result.finished = absl::Now();
  return result;
}

}  // namespace grps
