// The small job the coordinator's tests run, its shard map and the shard
// files its fake servers write: `servers` shards and `workers` ranks of the
// default model, heartbeat every 100 ms, a member silent for 1 s dead. For
// tests only.
#ifndef GRPS_COORDINATOR_TESTING_TEST_JOB_H_
#define GRPS_COORDINATOR_TESTING_TEST_JOB_H_

#include <cstdint>
#include <string>
#include <vector>
#include <utility>

#include "absl/status/statusor.h"
#include "job/job_config.h"
#include "job/shard_map.h"
#include "job/user_model.h"
#include "proto/grps.pb.h"

namespace grps {

inline v1::JobConfig TestJobConfig(uint32_t servers, uint32_t workers,
                                   v1::ConsistencyMode mode, const std::string& checkpoint_dir) {
  v1::JobConfig config = DefaultJobConfig();
  config.set_job_id("test-job");
  config.set_mode(mode);
  config.set_num_servers(servers);
  config.set_num_workers(workers);
  config.set_heartbeat_interval_ms(100);
  config.set_heartbeat_timeout_ms(1000);
  config.set_checkpoint_dir(checkpoint_dir);
  return config;
}

// The job's shard map, after checking the config as a coordinator would.
inline absl::StatusOr<v1::ShardMap> TestShardMap(const v1::JobConfig& config) {
  if (absl::Status s = ValidateJobConfig(config); !s.ok()) return s;
  return BuildShardMap(ModelTensors(config), config.num_servers(), config.chunk_bytes());
}

// What a shard's server writes for checkpoint `checkpoint_id` of the test
// job: each of its chunks at `version`, values zero.
inline v1::ShardCheckpointFile FakeShardFile(const v1::ShardMap& map, uint64_t checkpoint_id,
                                             uint32_t shard, uint64_t version) {
  v1::ShardCheckpointFile file;
  file.set_job_id("test-job");
  file.set_checkpoint_id(checkpoint_id);
  file.set_shard(shard);
  for (const v1::ChunkSpec& chunk : map.chunks()) {
    if (chunk.shard() != shard) continue;
    v1::ChunkState* c = file.add_chunks();
    c->set_chunk_id(chunk.chunk_id());
    c->set_version(version);
    c->set_num_elements(chunk.num_elements());
    c->set_values(std::string(4 * chunk.num_elements(), '\0'));
  }
  return file;
}

// A user model of three tensors ("fc.weight" [hidden, 8], "fc.bias"
// [hidden], the scalar "scale"), each with given initial values.
inline TensorSpecs TestUserModel(int64_t hidden) {
  TensorSpecs model;
  for (auto [name, shape] : std::vector<std::pair<std::string, std::vector<int64_t>>>{
           {"fc.weight", {hidden, 8}}, {"fc.bias", {hidden}}, {"scale", {}}}) {
    v1::TensorSpec* t = model.Add();
    t->set_name(name);
    for (int64_t d : shape) t->add_shape(d);
    t->set_initializer("given");
  }
  return model;
}

}  // namespace grps

#endif  // GRPS_COORDINATOR_TESTING_TEST_JOB_H_
