// The command-line flags (and GRPS_* environment variables, see
// daemon/daemon.h) that define a job, read by grps-coordinator. Every flag
// defaults to DefaultJobConfig()'s value.
//
//   --job_id --mode=sync|async|ssp --staleness (ssp bound)
//   --model=mlp|softmax --hidden="256,128" ("" for none) --dataset=DIR
//   --train_limit --test_limit
//   --optimizer=sgd|momentum|nesterov|adam|adagrad --lr --momentum
//   --weight_decay --warmup_steps --decay_steps --decay_rate
//   --batch --epochs --steps --servers --workers --seed --chunk_kb
//   --wire_dtype=f32|f16|bf16 --eval_every --heartbeat_ms
//   --heartbeat_timeout_ms --max_staleness --staleness_aware_lr
//   --backup_workers --late_gradients
//   --checkpoint_dir --checkpoint_every_steps --checkpoint_every_s
//   --recovery_timeout_ms --coordinator_timeout_ms
#ifndef GRPS_COORDINATOR_JOB_FLAGS_H_
#define GRPS_COORDINATOR_JOB_FLAGS_H_

#include "absl/status/statusor.h"
#include "proto/grps.pb.h"

namespace grps {


// The job the flags describe, validated (ValidateJobConfig). --model=softmax
// drops the hidden layers. InvalidArgument names the offending flag (or,
// from ValidateJobConfig, the JobConfig field).
absl::StatusOr<v1::JobConfig> JobConfigFromFlags();

}  // namespace grps

#endif  // GRPS_COORDINATOR_JOB_FLAGS_H_
