// ParameterClient: a worker's view of the sharded parameters. Pushes
// gradients to and pulls weights from every shard concurrently, cutting the
// flat parameter array into the chunks of the shard map.
#ifndef GRPS_WORKER_PARAMETER_CLIENT_H_
#define GRPS_WORKER_PARAMETER_CLIENT_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "proto/grps.grpc.pb.h"

namespace grps {


// The flat array holds the map's tensors back to back in map order; a chunk
// covers elements [tensor_offset + chunk.offset, + chunk.num_elements).
//
// Every push and pull is tagged with the client's generation (see
// RestoreOrder in proto/grps.proto): a shard refuses one from an older
// generation with ABORTED, which the client returns as it is.
//
// Thread safety: Push and Pull may not run concurrently with each other on
// one client (each fans out to the shards on its own threads).
// UpdateShardMap, set_generation and the accessors may be called from any
// thread at any time, also while a Push or Pull runs: an RPC attempt that
// starts after UpdateShardMap returned goes to the new endpoint.
class ParameterClient {
 public:
  // `map` must be valid (ValidateShardMap) with every endpoint set.
  ParameterClient(const v1::JobConfig& config, const v1::ShardMap& map,
                  uint32_t rank, uint64_t incarnation);

  int64_t num_parameters() const { return num_params_; }

  // The job generation every later push and pull carries (0 = unchecked).
  void set_generation(uint64_t generation) { generation_.store(generation); }
  uint64_t generation() const { return generation_.load(); }

  // Follows a newer shard map (a shard restarted, maybe on a new address):
  // rebuilds the stub of every endpoint whose address or incarnation changed.
  // Refuses (INVALID_ARGUMENT, nothing changed) a map that fails
  // ValidateShardMap, cuts the model into other chunks or places them on
  // other shards, or lacks an endpoint address. The caller decides which
  // map is the newest (the coordinator's, by ShardMap.epoch).
  absl::Status UpdateShardMap(const v1::ShardMap& map) ABSL_LOCKS_EXCLUDED(mu_);
  // The epoch of the map in use.
  uint64_t map_epoch() const ABSL_LOCKS_EXCLUDED(mu_);

  // Fills host_params (num_parameters() floats) with every chunk. `clock` is
  // the step the worker is about to compute: each shard holds the pull as
  // long as the job's consistency mode requires (sync: until the step this
  // worker last pushed has completed) or until `timeout` passes
  // (DEADLINE_EXCEEDED). Records each chunk's version for Push. One attempt
  // per shard: the caller decides whether to try again.
  absl::Status Pull(uint64_t clock, absl::Duration timeout, float* host_params);

  // What the shards made of a push besides applying it: chunk gradients that
  // arrived after their sync step (late: folded or dropped by the shard) and
  // chunk gradients refused as too stale. Both are counted by the shards.
  struct PushOutcome {
    uint32_t late = 0;
    uint32_t too_stale = 0;
  };

  // How long a push keeps retrying a shard that is UNAVAILABLE (down, or
  // not restored to this generation yet), with backoff.
  struct RetryPolicy {
    absl::Duration retry_for = absl::Seconds(60);
    absl::Duration initial_backoff = absl::Milliseconds(50);
    absl::Duration max_backoff = absl::Seconds(2);
    // Polled (from the per-shard threads, so it must be thread-safe) after
    // every failed attempt and while backing off; once it returns true the
    // push gives up with CANCELLED. Null: never.
    std::function<bool()> stop;
  };

  // Sends the gradient of every chunk to its shard, tagged with `step` (the
  // worker's clock), the generation and the chunk version seen by the last
  // Pull. Retries UNAVAILABLE per `retry` (each retry goes to the shard's
  // endpoint in the newest map); a retried push is deduplicated by the shard.
  // SIGINT/SIGTERM ends the retry with CANCELLED. Other errors (ABORTED: the
  // job rolled back) are returned as they are.
  absl::StatusOr<PushOutcome> Push(uint64_t step, const float* host_grads,
                                   uint32_t num_samples,
                                   const RetryPolicy& retry);
  // As above with RetryPolicy{retry_for} and no stop predicate.
  absl::StatusOr<PushOutcome> Push(uint64_t step, const float* host_grads,
                                   uint32_t num_samples,
                                   absl::Duration retry_for);

  // Smallest chunk version seen by the last Pull.
  uint64_t min_pulled_version() const;

  uint64_t bytes_pushed() const { return bytes_pushed_.load(); }
  uint64_t bytes_pulled() const { return bytes_pulled_.load(); }

 private:
  absl::Status CheckCompatible(const v1::ShardMap& map) const;
  std::shared_ptr<v1::ParameterServer::Stub> StubOf(size_t shard) const
      ABSL_LOCKS_EXCLUDED(mu_);
  absl::Status PullShard(size_t shard, uint64_t clock, absl::Duration timeout,
                         float* host_params);
  absl::Status PushShard(size_t shard, uint64_t step, const float* host_grads,
                         uint32_t num_samples, const RetryPolicy& retry,
                         PushOutcome* outcome);

  // Fixed at construction: the layout never changes (UpdateShardMap only
  // accepts maps with the same chunks on the same shards).
  const v1::JobConfig config_;
  const v1::ShardMap layout_;  // chunks and tensors of the map; endpoints stale
  const uint32_t rank_;
  const uint64_t incarnation_;
  int64_t num_params_ = 0;
  std::vector<int64_t> chunk_offset_;           // flat offset of each chunk
  std::vector<std::vector<uint32_t>> shard_chunks_;  // chunk ids per shard
  // Written by the per-shard threads of a Pull, each its own chunks.
  std::vector<uint64_t> chunk_version_;
  std::atomic<uint64_t> generation_{0};

  mutable absl::Mutex mu_;
  std::vector<v1::ShardEndpoint> endpoints_ ABSL_GUARDED_BY(mu_);
  std::vector<std::shared_ptr<v1::ParameterServer::Stub>> stubs_
      ABSL_GUARDED_BY(mu_);
  uint64_t epoch_ ABSL_GUARDED_BY(mu_) = 0;

  // Added to by the per-shard threads.
  std::atomic<uint64_t> bytes_pushed_{0};
  std::atomic<uint64_t> bytes_pulled_{0};
};

}  // namespace grps

#endif  // GRPS_WORKER_PARAMETER_CLIENT_H_
