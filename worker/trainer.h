// Trainer: one worker's part of a job. Per step: pull the weights (the
// shards decide how long the pull waits, from the worker's clock), compute
// the gradient of one batch of its data partition, push it to the shards,
// report progress in the heartbeat. The worker the coordinator names as
// evaluator evaluates snapshots of its weights on an Evaluator thread; after
// the last step the worker reports WorkerDone and stays (heartbeating) until
// the job ends, evaluating the final weights if the coordinator asks it to.
#ifndef GRPS_WORKER_TRAINER_H_
#define GRPS_WORKER_TRAINER_H_

#include <atomic>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "data/dataset.h"
#include "proto/grps.grpc.pb.h"
#include "tensor/backend.h"
#include "worker/evaluator.h"
#include "worker/mlp_model.h"
#include "worker/parameter_client.h"
#include "worker/straggler.h"

namespace grps {

struct TrainerOptions {
  std::string curve_csv;  // training curve, one row per report; "" = none
  Straggler straggler;    // injected slowness (none by default)
};

// Runs in the calling thread; a heartbeat thread runs beside it.
class Trainer {
 public:
  // `registration` is the coordinator's answer (validated by the caller).
  // Heartbeats start at once, so a worker that is still loading its data is
  // not taken for dead. *coordinator and *backend must outlive the trainer.
  Trainer(v1::Coordinator::Stub* coordinator,
          const v1::RegisterWorkerResponse& registration, Backend* backend,
          TrainerOptions options);
  ~Trainer();

  // Loads the data, trains from the registration's start step to the last
  // step, reports WorkerDone, then waits for the job to end (running the
  // final evaluation when named to). Returns OK when the job ended, was
  // stopped, or on SIGTERM.
  absl::Status Run();

 private:
  absl::Status LoadData();
  absl::Status Train(uint64_t total);
  absl::Status PullWeights(uint64_t clock);
  // Reports the finished steps, then heartbeats until the job ends.
  absl::Status FinishAndWait(uint64_t total);
  absl::Status ReportDone(const v1::WorkerDoneRequest& done);
  void HeartbeatLoop();
  void OnEvaluation(const Evaluator::Result& result, bool final_eval);
  void WriteCurveRow(uint64_t step, const v1::WorkerProgress& p, bool evaluated)
      ABSL_LOCKS_EXCLUDED(curve_mu_);
  bool Stopping() const;
  bool IsEvaluator() const;

  v1::Coordinator::Stub* coordinator_;
  v1::JobConfig config_;
  uint32_t rank_;
  uint64_t incarnation_;
  uint64_t start_step_;
  Backend* backend_;
  Dataset train_;
  Dataset test_;
  TrainerOptions options_;
  MlpModel model_;
  ParameterClient params_;
  std::vector<float> host_params_;
  std::vector<float> host_grads_;
  std::unique_ptr<Evaluator> evaluator_;
  const absl::Time start_ = absl::Now();

  absl::Mutex curve_mu_;
  FILE* curve_ ABSL_GUARDED_BY(curve_mu_) = nullptr;

  mutable absl::Mutex mu_;
  v1::WorkerProgress progress_ ABSL_GUARDED_BY(mu_);
  v1::JobState job_state_ ABSL_GUARDED_BY(mu_) = v1::JOB_STATE_RUNNING;
  std::optional<uint32_t> evaluator_rank_ ABSL_GUARDED_BY(mu_);
  bool evaluate_final_ ABSL_GUARDED_BY(mu_) = false;
  absl::Time last_heartbeat_ok_ ABSL_GUARDED_BY(mu_) = absl::Now();
  std::atomic<bool> stop_heartbeat_{false};
  std::thread heartbeat_;
};

}  // namespace grps

#endif  // GRPS_WORKER_TRAINER_H_
