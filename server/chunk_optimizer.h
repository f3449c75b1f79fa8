// ChunkOptimizer: the server-side optimizer of one chunk and its state
// (momentum velocity, Adam moments, AdaGrad accumulator). The optimizer kind
// is decided once, at construction; Apply then runs it.
//
// Thread safety: none; the owner (a ShardStore chunk) calls it under the
// chunk's lock.
#ifndef GRPS_SERVER_CHUNK_OPTIMIZER_H_
#define GRPS_SERVER_CHUNK_OPTIMIZER_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "job/job_config.h"  // OptimizerStateSlots
#include "proto/grps.pb.h"
#include "server/consistency_policy.h"
#include "tensor/backend.h"

namespace grps {


// One update of n elements of `param` from `grad` with `config`'s optimizer
// at learning rate `lr`: the one kernel dense chunks and sparse rows share.
// `a` and `b` are the state slots OptimizerStateSlots names (null where the
// optimizer has none); `step` counts the updates of these elements, this one
// included (Adam's bias correction).
void ApplyOptimizerStep(const v1::OptimizerConfig& config, Backend& backend, float lr,
                        int64_t step, float* param, const float* grad, float* a, float* b,
                        uint64_t n);

class ChunkOptimizer {
 public:
  // `backend` allocates the state and must outlive the optimizer. `config`
  // must be valid (ValidateJobConfig); `mode` is the job's (what
  // OPTIMIZER_WORKERS does).
  ChunkOptimizer(const v1::OptimizerConfig& config, v1::ConsistencyMode mode, Backend* backend,
                 uint64_t num_elements);
  ChunkOptimizer(const ChunkOptimizer&) = delete;
  ChunkOptimizer& operator=(const ChunkOptimizer&) = delete;

  // One update of `param` from `grad` (num_elements floats each) as `step`
  // says (the program's optimizer, which ShardStore checked keeps this
  // one's state, or the job's); `update_index` is the 0-based count of
  // updates before this one (Adam's bias correction). With OPTIMIZER_WORKERS
  // (the program's optimizer runs on the workers) there is no optimizer
  // here: in sync `grad` (the step's average) becomes the value, in async
  // and ssp it is a worker's change of the weights and is added.
  void Apply(float* param, const float* grad, const UpdateStep& step, uint64_t update_index);

  // The state slots, as f32 bytes, in order: momentum velocity / Adam's
  // first moment / AdaGrad's accumulator, then Adam's second moment (none
  // for SGD). What a checkpoint keeps.
  std::vector<std::string> SaveState() const;
  // INVALID_ARGUMENT unless `slots` has this optimizer's number of slots,
  // each of num_elements floats; then (and only then) replaces the state.
  absl::Status CheckState(const std::vector<const std::string*>& slots) const;
  void LoadState(const std::vector<const std::string*>& slots);
  // Zero state, as at construction.
  void Reset();

 private:
  const v1::OptimizerConfig config_;
  const v1::ConsistencyMode mode_;
  Backend* const backend_;
  const uint64_t n_;
  // Momentum velocity, Adam first moment or AdaGrad accumulator (a); Adam
  // second moment (b). Empty where the optimizer has no such state.
  DeviceBuffer a_;
  DeviceBuffer b_;
};

}  // namespace grps

#endif  // GRPS_SERVER_CHUNK_OPTIMIZER_H_
