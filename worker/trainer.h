// Trainer: one worker's training loop. Per step: pull the weights of the
// step, compute the gradient of one batch of its data partition, push it to
// the shards; evaluate now and then; report progress to the coordinator.
#ifndef GRPS_WORKER_TRAINER_H_
#define GRPS_WORKER_TRAINER_H_

#include <atomic>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "data/dataset.h"
#include "proto/grps.grpc.pb.h"
#include "tensor/backend.h"
#include "worker/mlp_model.h"
#include "worker/parameter_client.h"

namespace grps {


struct TrainerOptions {
  std::string curve_csv;  // training curve, one row per report; "" = none
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

  // Loads the data (the test split on rank 0 only, which evaluates), trains
  // to the last step, runs the final evaluation (rank 0) and reports
  // WorkerDone. Returns early with OK if the
  // job is stopped, or on SIGTERM.
  absl::Status Run();

 private:
  void HeartbeatLoop();
  absl::Status PullWeights(uint64_t min_version);
  void Evaluate(EvalResult* out);
  void WriteCurveRow(uint64_t step, const v1::WorkerProgress& p, double elapsed);
  bool Stopping() const;

  v1::Coordinator::Stub* coordinator_;
  v1::JobConfig config_;
  uint32_t rank_;
  uint64_t incarnation_;
  Backend* backend_;
  Dataset train_;
  Dataset test_;
  TrainerOptions options_;
  MlpModel model_;
  ParameterClient params_;
  std::vector<float> host_params_;
  std::vector<float> host_grads_;
  FILE* curve_ = nullptr;

  mutable absl::Mutex mu_;
  v1::WorkerProgress progress_ ABSL_GUARDED_BY(mu_);
  v1::JobState job_state_ ABSL_GUARDED_BY(mu_) = v1::JOB_STATE_RUNNING;
  std::vector<uint32_t> live_workers_ ABSL_GUARDED_BY(mu_);
  bool heartbeat_seen_ ABSL_GUARDED_BY(mu_) = false;
  std::atomic<bool> stop_heartbeat_{false};
  std::thread heartbeat_;
};

}  // namespace grps

#endif  // GRPS_WORKER_TRAINER_H_
