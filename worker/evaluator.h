// Evaluator: test-set evaluation off the training path. It owns a model of
// its own on a CPU backend of its own and evaluates snapshots of the weights
// on its own thread, so that training never waits for it.
//
// Thread safety: Submit, EvaluateNow and WaitIdle may be called from any
// thread; results are delivered on the evaluator's thread (Submit) or the
// calling thread (EvaluateNow).
#ifndef GRPS_WORKER_EVALUATOR_H_
#define GRPS_WORKER_EVALUATOR_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "data/dataset.h"
#include "tensor/backend.h"
#include "worker/mlp_model.h"

namespace grps {

class Evaluator {
 public:
  struct Result {
    uint64_t step = 0;  // the step whose weights were evaluated
    EvalResult eval;
    absl::Time finished;
  };
  using ResultCallback = std::function<void(const Result&)>;

  // `test` must outlive the evaluator. `on_result` receives every
  // evaluation made by Submit.
  Evaluator(std::vector<int64_t> widths, const Dataset* test,
            ResultCallback on_result);
  ~Evaluator();  // finishes a running evaluation first
  Evaluator(const Evaluator&) = delete;
  Evaluator& operator=(const Evaluator&) = delete;

  // Evaluates `weights` (the step's full parameter array) on the evaluator's
  // thread. Returns false and does nothing while an evaluation is running:
  // a busy evaluator skips, it never queues.
  bool Submit(uint64_t step, std::vector<float> weights)
      ABSL_LOCKS_EXCLUDED(mu_);

  // Evaluates on the calling thread, after a running evaluation finished.
  Result EvaluateNow(uint64_t step, const std::vector<float>& weights)
      ABSL_LOCKS_EXCLUDED(mu_);

  // Waits until no evaluation is running.
  void WaitIdle() ABSL_LOCKS_EXCLUDED(mu_);

 private:
  void Loop();
  Result Run(uint64_t step, const std::vector<float>& weights);

  const Dataset* const test_;
  const ResultCallback on_result_;
  std::unique_ptr<Backend> backend_;
  // Used by one thread at a time: the evaluator's thread while busy_, else
  // EvaluateNow's caller (which takes busy_ itself).
  std::unique_ptr<MlpModel> model_;

  absl::Mutex mu_;
  bool busy_ ABSL_GUARDED_BY(mu_) = false;
  bool has_work_ ABSL_GUARDED_BY(mu_) = false;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  uint64_t step_ ABSL_GUARDED_BY(mu_) = 0;
  std::vector<float> weights_ ABSL_GUARDED_BY(mu_);
  std::thread thread_;
};

}  // namespace grps

#endif  // GRPS_WORKER_EVALUATOR_H_
