// Evaluator: test-set evaluation off the training path. It owns a model of
// its own on a CPU backend of its own (an EvalTarget: the dense MLP, or the
// embedding model with its reader of rows) and evaluates snapshots of the
// weights on its own thread, so that training never waits for it.
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
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "data/dataset.h"
#include "tensor/backend.h"
#include "worker/embedding_model.h"
#include "worker/mlp_model.h"
#include "worker/sparse_batch.h"

namespace grps {

// What an evaluation runs: a model of its own, over the test set. Called by
// one thread at a time.
class EvalTarget {
 public:
  virtual ~EvalTarget() = default;
  // The test-set loss and accuracy of `weights` (a step's dense parameter
  // array), which were read at `step`.
  virtual absl::StatusOr<EvalResult> Evaluate(uint64_t step,
                                              const std::vector<float>& weights) = 0;
};

// An MlpModel of `widths` over `test` (which must outlive the target), on a
// CPU backend of its own.
std::unique_ptr<EvalTarget> MakeDenseEvalTarget(std::vector<int64_t> widths,
                                                const Dataset* test);

// Reads `ids` (any ids) of the embedding table of field `table` as they are
// at `clock` or later into `out` (ids.size() x dim floats).
using RowReader = std::function<absl::Status(int32_t table, absl::Span<const int64_t> ids,
                                             uint64_t clock, float* out)>;

// An EmbeddingModel (head `widths`, whose first entry is the width of the
// bags side by side, test.num_fields() of them) over `test`, whose rows it
// reads with `read_rows` at the step of the weights, table by table: so a
// snapshot evaluated while training goes on pairs the head of its step with
// rows at least as new. `test` is already hashed into the tables' ids.
std::unique_ptr<EvalTarget> MakeEmbeddingEvalTarget(std::vector<int64_t> widths,
                                                    EmbeddingCombiner combiner,
                                                    SparseBatch test, RowReader read_rows);

class Evaluator {
 public:
  struct Result {
    uint64_t step = 0;  // the step whose weights were evaluated
    EvalResult eval;
    absl::Status error;  // not OK: no evaluation (eval is empty)
    absl::Time finished;
  };
  using ResultCallback = std::function<void(const Result&)>;

  // `on_result` receives every evaluation made by Submit.
  Evaluator(std::unique_ptr<EvalTarget> target, ResultCallback on_result);
  // A dense model's: MakeDenseEvalTarget(widths, test).
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

  const ResultCallback on_result_;
  // Used by one thread at a time: the evaluator's thread while busy_, else
  // EvaluateNow's caller (which takes busy_ itself).
  const std::unique_ptr<EvalTarget> target_;

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
