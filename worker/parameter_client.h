// ParameterClient: a worker's view of the sharded parameters. Pushes
// gradients to and pulls weights from every shard concurrently, cutting the
// flat parameter array into the chunks of the shard map.
#ifndef GRPS_WORKER_PARAMETER_CLIENT_H_
#define GRPS_WORKER_PARAMETER_CLIENT_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "proto/grps.grpc.pb.h"

namespace grps {


// The flat array holds the map's tensors back to back in map order; a chunk
// covers elements [tensor_offset + chunk.offset, + chunk.num_elements).
//
// Thread safety: Push and Pull may not run concurrently with each other on
// one client (each fans out to the shards on its own threads).
class ParameterClient {
 public:
  // `map` must be valid (ValidateShardMap) with every endpoint set.
  ParameterClient(const v1::JobConfig& config, const v1::ShardMap& map,
                  uint32_t rank, uint64_t incarnation);

  int64_t num_parameters() const { return num_params_; }

  // Fills host_params (num_parameters() floats) with every chunk. `clock` is
  // the step the worker is about to compute: each shard holds the pull as
  // long as the job's consistency mode requires (sync: until the step this
  // worker last pushed has completed) or until `timeout` passes
  // (DEADLINE_EXCEEDED). Records each chunk's version for Push.
  absl::Status Pull(uint64_t clock, absl::Duration timeout, float* host_params);

  // What the shards made of a push besides applying it: chunk gradients that
  // arrived after their sync step (late: folded or dropped by the shard) and
  // chunk gradients refused as too stale. Both are counted by the shards.
  struct PushOutcome {
    uint32_t late = 0;
    uint32_t too_stale = 0;
  };

  // Sends the gradient of every chunk to its shard, tagged with `step` (the
  // worker's clock) and the chunk version seen by the last Pull. Retries
  // UNAVAILABLE with backoff for up to `retry_for`; a retried push is
  // deduplicated by the shard. Other errors are returned as they are.
  absl::StatusOr<PushOutcome> Push(uint64_t step, const float* host_grads,
                                   uint32_t num_samples,
                                   absl::Duration retry_for);

  // Smallest chunk version seen by the last Pull.
  uint64_t min_pulled_version() const;

  uint64_t bytes_pushed() const { return bytes_pushed_.load(); }
  uint64_t bytes_pulled() const { return bytes_pulled_.load(); }

 private:
  struct Shard {
    std::unique_ptr<v1::ParameterServer::Stub> stub;
    std::vector<uint32_t> chunks;  // chunk ids owned by the shard
  };
  absl::Status PullShard(size_t shard, uint64_t clock, absl::Duration timeout,
                         float* host_params);
  absl::Status PushShard(size_t shard, uint64_t step, const float* host_grads,
                         uint32_t num_samples, absl::Duration retry_for,
                         PushOutcome* outcome);

  v1::JobConfig config_;
  v1::ShardMap map_;
  uint32_t rank_;
  uint64_t incarnation_;
  int64_t num_params_ = 0;
  std::vector<int64_t> chunk_offset_;  // flat offset of each chunk
  std::vector<uint64_t> chunk_version_;
  std::vector<Shard> shards_;
  // Added to by the per-shard threads.
  std::atomic<uint64_t> bytes_pushed_{0};
  std::atomic<uint64_t> bytes_pulled_{0};
};

}  // namespace grps

#endif  // GRPS_WORKER_PARAMETER_CLIENT_H_
