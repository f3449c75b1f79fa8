// SparseShards: what a trainer needs of the job's sparse tables on the
// shards: pull the rows a batch reads, push their gradients, follow a new
// shard map and a new generation. SparseClient implements it over gRPC; a
// trainer's tests may give it an in-memory one.
//
// Tables, ids, clocks and versions mean what they mean in SparseClient
// (worker/sparse_client.h).
//
// Thread safety: as SparseClient's: Pull and Push of one table one at a
// time; UpdateShardMap, set_generation and the byte counts from any thread.
#ifndef GRPS_WORKER_SPARSE_SHARDS_H_
#define GRPS_WORKER_SPARSE_SHARDS_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "proto/grps.pb.h"
#include "worker/parameter_shards.h"

namespace grps {

class SparseShards {
 public:
  struct PushOutcome {
    uint32_t duplicates = 0;  // shards that recognised a retry
    uint32_t late = 0;
    uint32_t too_stale = 0;
  };

  virtual ~SparseShards() = default;

  // Follows a newer shard map: later calls go to the moved endpoints.
  virtual void UpdateShardMap(const v1::ShardMap& map) = 0;
  // The job generation every later push and pull carries.
  virtual void set_generation(uint64_t generation) = 0;

  // What the attempts of one pull have read so far: the pull's parts (the
  // client's requests of it, by index) and the table version each came
  // with. Empty: nothing yet.
  struct PullProgress {
    std::vector<bool> read;
    std::vector<uint64_t> versions;
  };

  // Rows of `ids` (any ids, repeats allowed) of `table` into `out`
  // (ids.size() x dim floats, in the order of ids), as of `clock`, waiting
  // at the shards at most `timeout`. One attempt. With `progress` (from
  // the attempts before of the same pull; may be null) it reads only the
  // parts not read yet and adds those it reads, as ParameterShards::Pull
  // does.
  virtual absl::Status Pull(const std::string& table, absl::Span<const int64_t> ids, uint64_t clock,
                            absl::Duration timeout, float* out, PullProgress* progress) = 0;
  absl::Status Pull(const std::string& table, absl::Span<const int64_t> ids, uint64_t clock,
                    absl::Duration timeout, float* out) {
    return Pull(table, ids, clock, timeout, out, nullptr);
  }
  // Gradients of `ids` (distinct) of `table` for `step`: grads holds
  // ids.size() x dim floats. Retries per `retry`; a retry is applied once.
  virtual absl::StatusOr<PushOutcome> Push(const std::string& table, uint64_t step,
                                           absl::Span<const int64_t> ids, const float* grads,
                                           const ParameterShards::RetryPolicy& retry) = 0;

  // What went over the wire so far.
  virtual uint64_t bytes_pushed() const = 0;
  virtual uint64_t bytes_pulled() const = 0;
};

}  // namespace grps

#endif  // GRPS_WORKER_SPARSE_SHARDS_H_
