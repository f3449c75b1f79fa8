#include "coordinator/job_model.h"

#include <string>

#include "absl/strings/str_cat.h"
#include "job/job_config.h"
#include "job/shard_map.h"
#include "spdlog/spdlog.h"

namespace grps {

absl::StatusOr<std::optional<v1::ShardMap>> JobModel::Define(const TensorSpecs& tensors,
                                                            v1::OptimizerKind optimizer,
                                                            uint32_t shards) {
  if (config_.model() != v1::MODEL_USER)
    return absl::FailedPreconditionError(absl::StrCat(
        "job ", config_.job_id(), " trains the built-in model '", ModelName(config_.model()),
        "'; start it with --model=user to train a worker's own model"));
  if (absl::Status s = ValidateUserModel(tensors); !s.ok()) return s;
  if (optimizer != v1::OPTIMIZER_UNSPECIFIED &&
      (optimizer < v1::OPTIMIZER_SGD || optimizer > v1::OPTIMIZER_WORKERS))
    return absl::InvalidArgumentError(absl::StrCat("unknown optimizer kind ", optimizer));
  if (optimizer == v1::OPTIMIZER_WORKERS && config_.sparse_tables_size() > 0)
    return absl::FailedPreconditionError(absl::StrCat(
        "job ", config_.job_id(), " has sparse tables, whose rows the servers' optimizer "
        "updates: a program whose optimizer runs on the workers cannot train it"));
  if (!tensors_.empty()) {
    const std::string difference = FirstModelDifference(tensors_, tensors);
    if (!difference.empty()) return ModelMismatchError(config_.job_id(), difference);
    return std::nullopt;
  }
  if (absl::Status s = CheckUserModelChunks(tensors, config_.chunk_bytes()); !s.ok()) return s;
  absl::StatusOr<v1::ShardMap> built =
      BuildShardMap({tensors.begin(), tensors.end()}, shards, config_.chunk_bytes());
  if (!built.ok()) return absl::InvalidArgumentError(built.status().message());
  if (absl::Status s = ValidateShardMap(*built); !s.ok())
    return absl::InvalidArgumentError(s.message());
  tensors_ = tensors;
  spdlog::info("job {}: the model is defined: {} tensors, {} chunks over {} shards",
               config_.job_id(), tensors_.size(), built->chunks_size(), shards);
  if (optimizer != v1::OPTIMIZER_UNSPECIFIED && optimizer != config_.optimizer().kind()) {
    program_optimizer_ = optimizer;
    const char* where =
        optimizer != v1::OPTIMIZER_WORKERS ? ""
        : config_.mode() == v1::MODE_SYNC
            ? ": it runs on the workers, on the gradients the servers average"
            : ": it runs on the workers, and the servers add the weights' changes they push";
    spdlog::info("job {}: the program's optimizer is {} (the job's flags said {}){}",
                 config_.job_id(), OptimizerName(optimizer),
                 OptimizerName(config_.optimizer().kind()), where);
  }
  return *std::move(built);
}

v1::JobConfig JobModel::MemberConfig(uint32_t shards) const {
  v1::JobConfig config = config_;
  *config.mutable_model_tensors() = tensors_;
  if (program_optimizer_ != v1::OPTIMIZER_UNSPECIFIED)
    config.mutable_optimizer()->set_kind(program_optimizer_);
  // A re-sharded job's members see the shard count they serve.
  config.set_num_servers(shards);
  return config;
}

}  // namespace grps
