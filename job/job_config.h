// What a job is: its configuration (defaults and validation) and the dense
// parameter tensors its model has. Shared by every daemon; knows no network.
#ifndef GRPS_JOB_JOB_CONFIG_H_
#define GRPS_JOB_JOB_CONFIG_H_

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "proto/grps.pb.h"

namespace grps {


// The defaults a newcomer gets: Fashion-MNIST, an MLP 784-256-128-10, sync
// mode, 2 servers and 2 workers, SGD with momentum 0.9 at lr 0.05, halved
// every 468 steps (about one epoch of the default job), batch 64, 3 epochs.
v1::JobConfig DefaultJobConfig();

// The file a coordinator keeps its job's state in, under its --state_dir
// (CoordinatorState: what a coordinator that takes the job over reads, and
// the status the job ended with, which grps-local reads).
inline constexpr char kCoordinatorStateFile[] = "coordinator.state";

// The sparse table the embedding model's rows live in, for data of one
// field (idx-sparse, libsvm, synthetic).
inline constexpr char kEmbeddingTable[] = "embedding";

// The sparse tables the embedding model reads, one per field of its data
// (data/sparse_dataset.h), in field order: {kEmbeddingTable} for data of one
// field; for criteo data (data/criteo.h, 27 fields) "embedding.C1" ..
// "embedding.C26" and "embedding.I" (the 13 integer features).
std::vector<std::string> EmbeddingTables(const v1::JobConfig& config);

// The fewest heartbeat intervals a member may miss before it is dead, and
// the shortest heartbeat timeout, in ms (ValidateJobConfig).
inline constexpr uint32_t kLeastHeartbeatsMissed = 3;
inline constexpr uint32_t kLeastHeartbeatTimeoutMs = 100;

// Checks every field a daemon relies on; InvalidArgument names the field.
absl::Status ValidateJobConfig(const v1::JobConfig& config);

// A program's optimizer for one update (PushRequest.optimizers) against the
// job's `job`: finite hyperparameters in their ranges (a learning rate of 0
// is allowed: a scheduler may reach it), no schedule of its own, and a kind
// that keeps the job's optimizer state (the job's kind; momentum and
// nesterov stand for each other). INVALID_ARGUMENT says what is wrong.
absl::Status CheckProgramOptimizer(const v1::OptimizerConfig& job,
                                   const v1::OptimizerConfig& program);

// JobConfig.recovery_timeout_ms and coordinator_timeout_ms with their
// defaults applied (0 means 30000 and 60000 ms).
uint32_t RecoveryTimeoutMs(const v1::JobConfig& config);
uint32_t CoordinatorTimeoutMs(const v1::JobConfig& config);

// The model's dense tensors in a fixed order: for each layer l,
// "dense_<l>/weight" [in, out] (glorot_uniform) then "dense_<l>/bias" [out]
// (zeros). Requires a valid config.
std::vector<v1::TensorSpec> ModelTensors(const v1::JobConfig& config);

// Layer widths input, hidden..., classes. The embedding model's input is
// its bags side by side (one of embedding_dim a table: EmbeddingTables);
// these are its dense head's widths.
std::vector<int64_t> LayerWidths(const v1::JobConfig& config);

// Parsers for flag values; InvalidArgument on anything unknown.
absl::StatusOr<v1::ConsistencyMode> ParseMode(absl::string_view name);
absl::StatusOr<v1::ModelKind> ParseModel(absl::string_view name);
absl::StatusOr<v1::LateGradientPolicy> ParseLateGradients(absl::string_view name);
std::string LateGradientsName(v1::LateGradientPolicy policy);  // "fold", "drop"
absl::StatusOr<v1::CheckpointStorage> ParseCheckpointStorage(absl::string_view name);
std::string CheckpointStorageName(v1::CheckpointStorage storage);  // "shared", "per_shard"
absl::StatusOr<v1::LocalTransport> ParseLocalTransport(absl::string_view name);
std::string LocalTransportName(v1::LocalTransport transport);  // "shm", "grpc"
absl::StatusOr<v1::OptimizerKind> ParseOptimizer(absl::string_view name);
// "256,128" -> {256, 128}; "" or "none" -> no hidden layers.
absl::StatusOr<std::vector<uint32_t>> ParseHiddenUnits(absl::string_view csv);
std::string ModeName(v1::ConsistencyMode mode);       // "sync", "async", ...
std::string ModelName(v1::ModelKind model);           // "mlp", "softmax", "embedding"
std::string OptimizerName(v1::OptimizerKind kind);    // "sgd", "adam", ...
// The optimizer's state slots per element for `kind` (velocity, moments,
// accumulator): 0 for SGD, 2 for Adam.
uint32_t OptimizerStateSlots(v1::OptimizerKind kind);
// The most updates a loaded optimizer state may have counted
// (ChunkOptimizerState.steps, ChunkState.optimizer_step_offset): 2^53, the
// counts a torch optimizer's float step holds exactly.
inline constexpr int64_t kMaxOptimizerSteps = int64_t{1} << 53;
std::string JobStateName(v1::JobState state);         // "running", ...
std::string MemberStateName(v1::MemberState state);   // "alive", ...

// What a coordinator answers a member (a registration, a heartbeat, a
// WorkerDone) of a job that has ended in `state` (COMPLETED, STOPPED or
// FAILED): FAILED_PRECONDITION "job J has ended (state)". IsJobEnded
// recognises it, so that a member that arrives late exits as the others do.
absl::Status JobEndedError(absl::string_view job_id, v1::JobState state);
bool IsJobEnded(const absl::Status& status);

// Learning rate of update number `step` (0-based) under the schedule.
float ScheduledLearningRate(const v1::OptimizerConfig& opt, uint64_t step);

// The learning rate is that of one sync step, whose gradient averages every
// worker's batch. An async update carries one worker's batch, so it gets
// lr / num_workers (the linear scaling rule), and its schedule advances once
// per num_workers updates: one pass over the data then moves the weights as
// far in either mode. With staleness_aware_lr it is further divided by
// (1 + staleness). `version` is the chunk's count of updates so far.
// `program`: the program's optimizer for this update (PushRequest.optimizers),
// whose learning_rate takes the place of the schedule's; null: the job's.
float AsyncLearningRate(const v1::JobConfig& config, uint64_t version,
                        uint64_t staleness, const v1::OptimizerConfig* program = nullptr);

// Local batches a push carries (accumulate_steps, at least 1), and the
// examples of one worker's step: batch_size x AccumulateSteps.
uint32_t AccumulateSteps(const v1::JobConfig& config);
uint64_t StepExamples(const v1::JobConfig& config);

// Worker ranks that may exist: max_workers of an elastic job, else
// num_workers. Ranks from num_workers up may join a running elastic job.
uint32_t JobRanks(const v1::JobConfig& config);
// max_workers is set: the data is leased from the coordinator's example
// ledger (coordinator/example_ledger.h) rather than split by rank.
bool IsElastic(const v1::JobConfig& config);

// The example ledger's blocks: one worker step's examples (StepExamples)
// each, floor(train_examples / StepExamples) per epoch (at least 1); the
// job trains steps x num_workers blocks when steps is set (the examples a
// fixed job of num_workers would train), else epochs x blocks_per_epoch.
struct LedgerShape {
  uint64_t blocks_per_epoch = 0;
  uint64_t total_blocks = 0;
};
LedgerShape ExampleLedgerShape(const v1::JobConfig& config, uint64_t train_examples);

// Steps per worker: config.steps if set, else
// epochs * floor(floor(train_examples / num_workers) / StepExamples), at
// least 1.
uint64_t TotalSteps(const v1::JobConfig& config, uint64_t train_examples);

}  // namespace grps

#endif  // GRPS_JOB_JOB_CONFIG_H_
