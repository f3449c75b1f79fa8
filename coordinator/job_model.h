// JobModel: the model a job trains as its members are told it, one of
// JobStateMachine's collaborators: a built-in model's, or (MODEL_USER) the
// tensors the first worker's offer defined, and the optimizer kind the
// program runs where it differs from the job's flags. Not thread-safe (every
// call is made under the machine's mutex).
#ifndef GRPS_COORDINATOR_JOB_MODEL_H_
#define GRPS_COORDINATOR_JOB_MODEL_H_

#include <cstdint>
#include <optional>

#include "absl/status/statusor.h"
#include "job/user_model.h"
#include "proto/grps.pb.h"

namespace grps {

class JobModel {
 public:
  // `config` (valid) outlives this.
  explicit JobModel(const v1::JobConfig& config) : config_(config) {}

  // A user model's offer of `tensors` (the program's `optimizer`, or
  // UNSPECIFIED) for a job of `shards` shards. The first defines the model:
  // its layout (the map of its chunks) is returned for the membership.
  // An equal offer later: nullopt (nothing changes). FAILED_PRECONDITION
  // for a built-in model, an offer that differs (naming the first tensor
  // that does), or workers' optimizers with sparse tables;
  // INVALID_ARGUMENT for tensors ValidateUserModel refuses or that cut into
  // too many chunks, and an unknown optimizer kind.
  absl::StatusOr<std::optional<v1::ShardMap>> Define(const TensorSpecs& tensors,
                                                     v1::OptimizerKind optimizer,
                                                     uint32_t shards);
  // A user model that no worker defined yet (servers wait for it).
  bool awaiting_definition() const {
    return config_.model() == v1::MODEL_USER && tensors_.empty();
  }
  // The config members are handed for a job of `shards` shards: the user
  // model's tensors once defined, the program's optimizer.
  v1::JobConfig MemberConfig(uint32_t shards) const;

 private:
  const v1::JobConfig& config_;
  // MODEL_USER: the tensors the first worker defined; empty before.
  TensorSpecs tensors_;
  // The program's optimizer kind, from the offer that defined the model (or
  // the state or checkpoint that did); UNSPECIFIED: config_'s.
  v1::OptimizerKind program_optimizer_ = v1::OPTIMIZER_UNSPECIFIED;
};

}  // namespace grps

#endif  // GRPS_COORDINATOR_JOB_MODEL_H_
