// Trainer: one worker's part of a job. Per step: pull the weights (the
// shards decide how long the pull waits, from the worker's clock), compute
// the gradient of one batch of its data partition (in an elastic job: of a
// block of examples leased from the coordinator), push it to the shards,
// report progress in the heartbeat. The embedding model's step also pulls
// the rows its batch reads from the sparse table and pushes their
// gradients (before the dense head's, whose push brings the next weights). The worker the coordinator names as
// evaluator evaluates snapshots of its weights on an Evaluator thread; after
// the last step the worker reports WorkerDone and stays (heartbeating) until
// the job ends, evaluating the final weights if the coordinator asks it to.
//
// The worker's membership (the heartbeats, what their replies say, every
// bounded wait of a step, WorkerDone) is its WorkerSession's; the Trainer
// is about its model: data, batches, the step's computation, clipping, loss
// scaling, evaluation, metrics and the curve.
//
// Faults (docs/durability.md, handled by the WorkerSession):
// - Roll-back: a heartbeat reply with a RestoreOrder of a newer generation
//   stops the current step (also a pull that waits or a push that retries)
//   and training resumes at the order's step for this rank, in the new
//   generation; a worker that already reported WorkerDone trains again.
//   A push or pull refused as from an old generation (ABORTED) waits for
//   that order, at most coordinator_timeout_ms.
// - Moved shards: a newer shard map from the heartbeat is handed to the
//   clients at once (the evaluation client too), so the next attempt goes to
//   the new endpoint.
// - Re-sharded (JobConfig.max_servers): a map that places the same chunks
//   on other shards comes with a roll-back's order; at that roll-back
//   (a step boundary, no pull or push in flight) the trainer replaces its
//   clients with ones built for the new map (TrainerOptions::connect_shards)
//   and pulls from them. Without connect_shards such a map is refused.
// - Bounds: every wait ends when the job ends or rolls back, or on a signal.
//   Training goes on while the coordinator is away, but a wait that makes
//   no progress ends with an error once the coordinator has been silent for
//   coordinator_timeout_ms and the wait has lasted as long; WorkerDone and
//   the wait for the job's end are bounded by the coordinator's silence.
//
// The shards and the clock are the holder's (TrainerShards,
// TrainerOptions::clock): grps-worker gives the gRPC clients and the real
// clock, worker/trainer_test.cc in-memory shards and a fake clock.
#ifndef GRPS_WORKER_TRAINER_H_
#define GRPS_WORKER_TRAINER_H_

#include <atomic>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "absl/synchronization/mutex.h"
#include "data/dataset.h"
#include "data/partition.h"
#include "data/sparse_dataset.h"
#include "member/member_agent.h"
#include "proto/grps.grpc.pb.h"
#include "tensor/backend.h"
#include "worker/batch_loader.h"
#include "worker/curve_file.h"
#include "worker/embedding_model.h"
#include "worker/evaluator.h"
#include "worker/example_leases.h"
#include "worker/gradient_clipping.h"
#include "worker/loss_scaler.h"
#include "worker/mlp_model.h"
#include "worker/parameter_shards.h"
#include "worker/sparse_batch.h"
#include "worker/sparse_shards.h"
#include "worker/straggler.h"
#include "worker/worker_metrics.h"
#include "worker/worker_session.h"

namespace grps {

// The trainer's clients of the shards (grps-worker's: a ParameterClient and
// two SparseClients of the registration's shard map, rank and incarnation).
struct TrainerShards {
  std::unique_ptr<ParameterShards> dense;  // required
  // The embedding model's sparse table, one client for the training thread
  // and one for the evaluator's; unused (may be null) for the dense models.
  std::unique_ptr<SparseShards> sparse;
  std::unique_ptr<SparseShards> eval_sparse;
};

// Clients of `map`'s shards as the registration's rank and incarnation,
// as TrainerShards are of the registration's map.
using ConnectShards = std::function<absl::StatusOr<TrainerShards>(const v1::ShardMap& map)>;

struct TrainerOptions {
  std::string curve_csv;  // training curve, one row per report; "" = none
  // Each step's examples as trained (its gradient pushed): a line
  // "STEP EPOCH UNIX_MS I1 I2 ..." per step (UNIX_MS: when the push
  // returned; I: example indices); "" = none. What a test checks an elastic
  // job's data, and the pace of its steps, against.
  std::string examples_log;
  Straggler straggler;    // injected slowness (none by default)
  // Prepare the next step's batch on the data-loading thread while this one
  // trains; false: in the training thread (for comparisons).
  bool load_ahead = true;
  // Measures the coordinator's silence, the bounds of every wait and the
  // step times (tests drive it, as MemberAgent's); sleeps and gRPC
  // deadlines are real time.
  MemberAgent::Clock clock = &absl::Now;
  // Builds the clients of a map that re-places the chunks (a re-sharding),
  // on the training thread at the roll-back that follows it. Null: such a
  // map is refused, and the worker keeps its clients.
  ConnectShards connect_shards;
};

// Runs in the calling thread; a heartbeat thread runs beside it.
class Trainer {
 public:
  // `registration` is the coordinator's answer (validated by the caller);
  // `shards` reach the shards of its shard map as its rank and incarnation
  // (the trainer's WorkerSession holds dense and sparse and sets their
  // generation, eval_sparse's too). Heartbeats start at once, so a worker
  // that is still loading its data is not taken for dead.
  // *coordinator and *backend must outlive the trainer.
  Trainer(v1::Coordinator::StubInterface* coordinator,
          const v1::RegisterWorkerResponse& registration, Backend* backend,
          TrainerShards shards, TrainerOptions options);
  ~Trainer();

  // Loads the data, trains from the registration's start step to the last
  // step, reports WorkerDone, then waits for the job to end (running the
  // final evaluation when named to), training again after a roll-back.
  // Returns OK when the job completed or was stopped, or on SIGINT/SIGTERM;
  // an error when the job failed ("job failed: <reason>"), the coordinator
  // was lost, or training itself failed.
  absl::Status Run();

 private:
  using Interrupt = WorkerSession::Interrupt;

  absl::Status LoadData();
  int64_t TrainExamples() const;
  // One step's examples, as the BatchLoader prepares them: the dense
  // model's inputs and labels (accumulate_steps local batches, one after
  // the other), or the embedding model's batch hashed into row ids.
  struct StepBatch {
    std::vector<float> x;
    std::vector<int32_t> y;
    SparseDataset::Batch raw;
    SparseBatch sparse;
    uint64_t epoch = 0;
    std::vector<int64_t> examples;  // only with examples_log
  };
  // One step's gradient, computed on the weights in host_params_ and
  // clipped as the job says: the dense model's (the mean over its local
  // batches) into host_grads_; the embedding model's head gradients into
  // host_grads_, after pulling the batch's rows (clock `step`) and before
  // pushing their gradients. Returns the mean loss. `next`, if not null, is
  // step + 1's batch, ready: its first local batch is uploaded while this
  // step computes.
  absl::StatusOr<float> DenseStep(uint64_t step, const StepBatch& batch,
                                  const StepBatch* next);
  absl::StatusOr<float> EmbeddingStep(uint64_t step, const StepBatch& batch);
  // Clips host_grads_ and `rows` (the embedding rows' gradients, or empty)
  // as one gradient, when the job clips; notes how in clip_.
  void Clip(absl::Span<float> rows);
  // How Train walks the data: a step's examples, this rank's partition, and
  // the steps in an epoch (the same on every rank, so sync steps line up).
  // An elastic job's workers lease their steps' examples (leases_) instead:
  // their partition is the whole set, and per_epoch its blocks.
  struct StepPlan {
    int64_t batch = 0;
    PartitionRange part;
    uint64_t per_epoch = 0;
  };
  absl::StatusOr<StepPlan> PlanSteps() const;
  void LogPlan(const StepPlan& plan, uint64_t step, uint64_t total) const;
  // Prepares step s's batch: the epoch's shuffled order, batch s % per_epoch;
  // in an elastic job, the block leased for s (OUT_OF_RANGE: none is left).
  BatchLoader<StepBatch>::Prepare BatchSource(const StepPlan& plan);
  // What Train carries from step to step for the metrics and the progress
  // it reports.
  struct StepStats {
    absl::Time window_start;
    uint64_t window_samples = 0;
    double loss_ema = -1;
    double norm_ema = -1;
    uint64_t overflows_seen = 0;
    uint64_t late = 0;
    uint64_t too_stale = 0;
    ParameterShards::Traffic traffic_seen;
  };
  // The dense clients' traffic (of those replaced too), and that with the
  // sparse tables' bytes added.
  ParameterShards::Traffic DenseTraffic() const;
  ParameterShards::Traffic TrafficSoFar() const;
  // At a roll-back that came with `map`, which re-places the chunks:
  // replaces every client with one of `map` (the evaluator's reads keep the
  // old one until their attempt returns). Training thread.
  absl::Status FollowReplacedMap(const v1::ShardMap& map);
  // The evaluator's client of the sparse table (null for the dense models).
  std::shared_ptr<SparseShards> EvalSparse() const ABSL_LOCKS_EXCLUDED(eval_sparse_mu_);
  // Trains until the last step. Returns OK when done or interrupted by the
  // end of the job or a signal (roll-backs are taken on the way).
  absl::Status Train(uint64_t total);
  // What Train carries from one step to the next.
  struct TrainLoop {
    StepPlan plan;
    uint64_t total = 0;
    uint64_t step = 0;        // the next step to train
    uint64_t resumed_at = 0;  // where training (re)started: no evaluation there
    // The clock whose weights the last push's replies brought into
    // host_params_ (see PushGradients).
    std::optional<uint64_t> pulled_for;
    std::optional<BatchLoader<StepBatch>> loader;
    uint64_t batches_taken = 0;
    StepStats stats;
  };
  // Between steps: takes a roll-back, leaves on a signal or a drain, joins
  // the others. False: training ends here (interrupted, leaving, or no step
  // left).
  absl::StatusOr<bool> BeforeStep(TrainLoop* loop);
  // One step: its examples, weights and gradient, the push, the report.
  // False: an elastic job's examples are all trained or leased. An error
  // that an interruption caused is Train's to take (the roll-back) or end on.
  absl::StatusOr<bool> TrainStep(TrainLoop* loop);
  // Step's weights (pulled unless *pulled_for says they are here), a
  // snapshot for the evaluator, and the step's gradient; returns its loss.
  absl::StatusOr<float> ComputeStep(uint64_t step, const StepBatch& batch,
                                    const StepBatch* next, uint64_t resumed_at,
                                    std::optional<uint64_t>* pulled_for);
  // Logs what the shards said of step's push; ends the joining once a
  // gradient was in time.
  void NotePush(uint64_t step, const ParameterShards::PushOutcome& pushed, StepStats* stats);
  // The metrics and the progress (and curve) after step, trained from
  // step_start with `loss`; returns when the step ended.
  absl::Time ReportStep(uint64_t step, uint64_t total, const StepPlan& plan, uint64_t epoch,
                        float loss, const ParameterShards::PushOutcome& pushed,
                        absl::Time step_start, StepStats* stats);
  // Step's batch was trained (its gradient pushed): its block is marked
  // trained, and its examples written to the examples log.
  void NoteTrained(uint64_t step, const StepBatch& batch);
  // Reports the trained blocks (elastic jobs) and flushes the examples log:
  // before the worker finishes or leaves.
  absl::Status ReportTrainedBlocks();
  void UpdateStepMetrics(float loss, const ParameterShards::PushOutcome& pushed,
                         absl::Duration took, StepStats* stats);
  // Reports the finished steps, then heartbeats until the job ends. Returns
  // OK also when a roll-back interrupted the wait (session_->Interrupted()
  // says so).
  absl::Status FinishAndWait();
  // Leaves the job at a step boundary (WorkerDone with leaving); OK also
  // when the coordinator did not answer (it then declares the rank dead).
  absl::Status LeaveJob(uint64_t total);
  // The final evaluation the coordinator asked for, reported in `done`.
  absl::Status EvaluateFinal(v1::WorkerDoneRequest* done);
  void OnEvaluation(const Evaluator::Result& result, bool final_eval);
  void WriteCurveRow(uint64_t step, const v1::WorkerProgress& p, bool evaluated);
  bool IsEvaluator() const;
  // What the session needs of the trainer: the clock, and eval_sparse_
  // following the session's clients.
  WorkerSession::Options SessionOptions();
  absl::Time Now() const { return options_.clock(); }

  const v1::JobConfig config_;  // the registration's, as the session's
  const uint32_t rank_;
  // An elastic job's leases of the example ledger (null otherwise).
  std::unique_ptr<ExampleLeases> leases_;
  // leases_ for the heartbeat thread (SessionOptions' on_claim_examples),
  // set once it exists.
  std::atomic<ExampleLeases*> claims_to_{nullptr};
  FILE* examples_log_ = nullptr;  // training thread; options_.examples_log
  uint64_t start_step_;
  uint64_t next_step_;  // training thread: where Train starts
  // Training thread, in sync, for a rank that starts mid-job (start step >
  // 0): until this incarnation's first gradient in time for its step, each
  // step first joins the others (WorkerSession::JoinTheOthers), so that the
  // rank trains the job's remaining steps with them instead of its lost
  // steps alone after them.
  bool joining_ = false;
  // Train stopped at a step boundary to leave the job (SIGTERM, a drain).
  bool leaving_ = false;
  Backend* backend_;
  TrainerOptions options_;
  // The dense model (mlp, softmax) and its data...
  std::unique_ptr<MlpModel> model_;
  Dataset train_;
  Dataset test_;
  // ... or the embedding model's: its dense head lives in the session's
  // dense(), its rows in the sparse tables tables_, read and written
  // by the session's sparse() (the training thread's) and eval_sparse_ (the
  // evaluator's; null when sparse() is). eval_sparse_ is replaced by the
  // training thread (FollowReplacedMap) and used by the evaluator's and the
  // heartbeat's; a call on it holds its own reference, so a replaced client
  // lives until its calls returned.
  std::unique_ptr<EmbeddingModel> embedding_;
  const std::vector<std::string> tables_;  // EmbeddingTables: one per field
  mutable absl::Mutex eval_sparse_mu_;
  std::shared_ptr<SparseShards> eval_sparse_ ABSL_GUARDED_BY(eval_sparse_mu_);
  SparseDataset sparse_train_;
  SparseDataset sparse_test_;
  uint64_t hash_rows_ = 0;          // FeatureHashRows of the data
  std::vector<float> rows_;         // training thread: the step's rows
  std::vector<float> row_grads_;    // ... and their gradients, when clipped
  // Page-locked where the backend copies asynchronously (CUDA).
  HostArray<float> host_params_;
  HostArray<float> host_grads_;
  const ClipLimits clip_limits_;
  LossScaler scaler_;  // training thread: f16's loss scale
  std::optional<ClipResult> clip_;  // training thread: the last step's clipping
  std::unique_ptr<Evaluator> evaluator_;
  WorkerMetrics metrics_;  // training thread only
  const absl::Time start_;
  // Training thread: what the clients replaced at a re-sharding sent and
  // received (the sparse one's bytes only).
  ParameterShards::Traffic retired_dense_;
  ParameterShards::Traffic retired_sparse_;

  std::unique_ptr<CurveFile> curve_;  // set in the constructor; null: none

  // The registration's membership, holding the dense and sparse clients:
  // made last in the constructor (its heartbeats start then, and their
  // replies reach eval_sparse_), reset first in the destructor after the
  // evaluator. The progress the heartbeats report is its.
  std::unique_ptr<WorkerSession> session_;
};

}  // namespace grps

#endif  // GRPS_WORKER_TRAINER_H_
