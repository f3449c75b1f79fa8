// The command-line flags (and GRPS_* environment variables, see
// daemon/daemon.h) that define a job: declared here once, read by
// grps-coordinator and passed on to it by grps-local. Every flag defaults to
// DefaultJobConfig()'s value.
//
//   --job_id --mode=sync|async|ssp --staleness (ssp bound)
//   --model=mlp|softmax|embedding --hidden="256,128" ("" for none)
//   --dataset=DIR|FILE --data_format=idx|csv|idx-sparse|libsvm|synthetic|criteo
//   --test_data --csv_header --csv_label_column --libsvm_zero_based
//   --sparse_buckets --synthetic_{train,test,vocabulary,features,zipf,
//   margin,noise} --classes --features --train_limit --test_limit
//   --embedding_dim --embedding_rows --embedding_combiner=sum|mean
//   --embedding_max_rows_per_shard --embedding_eviction=none|lru|lfu
//   --embedding_admit_after --embedding_evict_after (the table "embedding";
//   for criteo data each of the 27 tables of EmbeddingTables)
//   --optimizer=sgd|momentum|nesterov|adam|adagrad --lr --momentum
//   --weight_decay --warmup_steps --decay_steps --decay_rate
//   --batch --epochs --steps --servers --workers --seed --chunk_kb --part_kb
//   --wire_dtype=f32|f16|bf16 --eval_every --heartbeat_ms
//   --heartbeat_timeout_ms --max_staleness --staleness_aware_lr
//   --backup_workers --late_gradients
//   --checkpoint_dir --checkpoint_every_steps --checkpoint_every_s
//   --recovery_timeout_ms --coordinator_timeout_ms
#ifndef GRPS_COORDINATOR_JOB_FLAGS_H_
#define GRPS_COORDINATOR_JOB_FLAGS_H_

#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "proto/grps.pb.h"

namespace grps {

// The job the flags describe, validated (ValidateJobConfig). --model=softmax
// drops the hidden layers; --model=embedding adds the sparse tables of
// EmbeddingTables (embedding_rows x embedding_dim each). InvalidArgument names the offending flag
// (or, from ValidateJobConfig, the JobConfig field).
absl::StatusOr<v1::JobConfig> JobConfigFromFlags();

// The job flags whose value is not their default, as {name, value} sorted by
// name (from the command line or GRPS_<FLAG> alike): what a launcher passes
// on to grps-coordinator, whose defaults are the same declarations.
std::vector<std::pair<std::string, std::string>> ChangedJobFlags();

}  // namespace grps

#endif  // GRPS_COORDINATOR_JOB_FLAGS_H_
