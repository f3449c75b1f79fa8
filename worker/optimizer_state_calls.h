// OptimizerStateCalls: reads and loads a program's optimizer state (the
// slots and step counts a torch optimizer's state_dict() holds) from and
// into every chunk on the shards, laid over the worker's flat parameter
// array. The state of a job is read from its shards to save it, and loaded
// into them to resume a saved program before its first update.
//
//   OptimizerStateCalls calls(config, layout, rank, incarnation, &generation,
//                             [&](size_t shard) { return StubOf(shard); });
//   absl::StatusOr<ProgramOptimizerState> state = calls.Read(timeout);
//   ... later, in a new job of the same model:
//   absl::Status s = calls.Load(*state, timeout);
//
// Calls of at most kCallBytes, one shard at a time, each attempted once
// within the timeout given.
#ifndef GRPS_WORKER_OPTIMIZER_STATE_CALLS_H_
#define GRPS_WORKER_OPTIMIZER_STATE_CALLS_H_

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "proto/grps.grpc.pb.h"
#include "worker/chunk_layout.h"

namespace grps {

// A program's optimizer state over the flat array (grps.torch's
// optimizer.state_dict()): `slots` in ChunkOptimizerState's order, each
// num_parameters() floats, and `steps` (the updates the optimizer
// counted) by tensor.
struct ProgramOptimizerState {
  v1::OptimizerKind kind = v1::OPTIMIZER_UNSPECIFIED;
  std::vector<std::vector<float>> slots;
  std::vector<uint64_t> steps;
};

// Thread safety: const; Read and Load may run on any threads at once.
class OptimizerStateCalls {
 public:
  static constexpr size_t kCallBytes = size_t{16} << 20;
  // A stub to shard `shard`'s endpoint in the newest map.
  using StubFor = std::function<std::unique_ptr<v1::ParameterServer::Stub>(size_t shard)>;

  // The calls of worker `rank` (of `incarnation`) in `config`'s job, over
  // `layout`, tagged with `*generation` as each call starts. `layout` and
  // `generation` must outlive this.
  OptimizerStateCalls(const v1::JobConfig& config, const ChunkLayout& layout, uint32_t rank,
                      uint64_t incarnation, const std::atomic<uint64_t>* generation,
                      StubFor stub);

  // Every chunk's optimizer state as the shards hold it now; a tensor's
  // steps are its first chunk's. A shard's error as it is (with the shard
  // named); INTERNAL for an answer that does not match the request.
  absl::StatusOr<ProgramOptimizerState> Read(absl::Duration timeout) const;
  // Loads `state` (its kind the job's, its slots and steps of the model's
  // sizes: INVALID_ARGUMENT otherwise, nothing sent) into every chunk, as
  // ShardStore::LoadOptimizerState: FAILED_PRECONDITION once a chunk had
  // an update. Each shard's calls are all-or-nothing; the shards are not
  // (a failure may leave earlier shards loaded).
  absl::Status Load(const ProgramOptimizerState& state, absl::Duration timeout) const;

 private:
  const std::string job_id_;
  const v1::OptimizerKind kind_;  // the job's optimizer
  const ChunkLayout& layout_;
  const uint32_t rank_;
  const uint64_t incarnation_;
  const std::atomic<uint64_t>* const generation_;
  const StubFor stub_;
};

}  // namespace grps

#endif  // GRPS_WORKER_OPTIMIZER_STATE_CALLS_H_
