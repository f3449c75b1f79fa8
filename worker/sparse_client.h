// SparseClient: a worker's view of the job's sparse tables
// (JobConfig.sparse_tables). A batch's rows are spread over every shard
// (SparseShardOf); Pull and Push split them by shard, send one request to
// each shard at once (gRPC's callback API: no thread per call) and put the
// replies back in the caller's order.
//
// Every shard is asked every time, also with no ids: in sync mode a
// worker's step of a table must reach every shard's part of it (a push
// with no rows still counts toward the step), and a pull with no ids still
// returns the version the next push is computed on.
//
// Pushes carry (rank, incarnation, step) and the table version each shard
// returned at the last Pull of that table; a push that fails UNAVAILABLE or
// RESOURCE_EXHAUSTED is sent again (with backoff) and the shard applies it
// once (deduplication). Pulls make one attempt per shard.
//
// Thread safety: Pull and Push of one table must not run at the same time
// (a push reads the versions its pull recorded); different tables may.
// UpdateShardMap may be called at any time.
#ifndef GRPS_WORKER_SPARSE_CLIENT_H_
#define GRPS_WORKER_SPARSE_CLIENT_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "grpcpp/generic/generic_stub.h"
#include "proto/grps.grpc.pb.h"
#include "worker/parameter_client.h"
#include "worker/sparse_shards.h"

namespace grps {

class SparseClient final : public SparseShards {
 public:
  // `map` must be valid with every endpoint set (as for ParameterClient).
  // Its shard count is the one rows are spread over (SparseShardOf): a
  // re-sharded job's new map, not config.num_servers, says how many.
  SparseClient(const v1::JobConfig& config, const v1::ShardMap& map, uint32_t rank,
               uint64_t incarnation);

  // As ParameterClient::UpdateShardMap: new stubs for moved endpoints
  // (endpoints of shards this client does not know are ignored).
  void UpdateShardMap(const v1::ShardMap& map) override ABSL_LOCKS_EXCLUDED(mu_);
  void set_generation(uint64_t generation) override { generation_.store(generation); }

  // Rows of `ids` (any ids, repeats allowed) of `table` into `out`
  // (ids.size() x dim floats, in the order of ids). `clock`: the step the
  // worker is about to compute (the shards hold the pull as the mode says),
  // at most `timeout`. Records each shard's table version for Push.
  // A shard's rows go in parts of at most 16 MiB of reply each, sent at
  // once, so a pull of any size fits gRPC's messages. NOT_FOUND for an
  // unknown table; a shard's error as it is (the parts that came are in
  // `out` and `progress`). `progress`: see SparseShards::Pull.
  using SparseShards::Pull;
  absl::Status Pull(const std::string& table, absl::Span<const int64_t> ids, uint64_t clock,
                    absl::Duration timeout, float* out, PullProgress* progress) override;

  // PushOutcome: see SparseShards.
  // Gradients of `ids` (distinct: deduplicated by the caller, e.g.
  // SparseBatch) of `table`: grads holds ids.size() x dim floats. `step`: the
  // worker's clock. Retries per `retry` as ParameterClient::Push does.
  absl::StatusOr<PushOutcome> Push(const std::string& table, uint64_t step,
                                   absl::Span<const int64_t> ids, const float* grads,
                                   const ParameterClient::RetryPolicy& retry) override;

  // The serialized size of the pushes that succeeded (ids, values and
  // framing) and of the pulls' replies, as ParameterClient counts its own.
  uint64_t bytes_pushed() const override { return bytes_pushed_.load(); }
  uint64_t bytes_pulled() const override { return bytes_pulled_.load(); }

 private:
  struct TableState {
    v1::SparseTableSpec spec;
    std::vector<std::atomic<uint64_t>> versions;  // by shard, from the last Pull
    // Kept from call to call (a table's Pull and Push never overlap), so
    // that their buffers are not allocated, and faulted in, every step:
    // the ids of each shard, a pull's requests, a push's packed ids and
    // gradients (sent from here: wire/chunk_codec.h).
    std::vector<std::vector<size_t>> by_shard;
    std::vector<int64_t> split_ids;                    // the ids by_shard holds the split of
    std::vector<v1::SparsePullRequest> pull_requests;  // by part
    std::vector<std::string> push_ids;                 // by shard
    std::vector<std::string> push_gradients;           // by shard
  };
  absl::StatusOr<TableState*> Find(const std::string& table);
  std::shared_ptr<grpc::GenericStub> StubOf(size_t shard) const ABSL_LOCKS_EXCLUDED(mu_);
  // Which shard each id goes to: the positions in `ids` of each shard's ids,
  // in order, into t->by_shard. A push of the ids its pull just split (a
  // step's rows) finds them split already.
  void Split(absl::Span<const int64_t> ids, TableState* t) const;

  const v1::JobConfig config_;
  const uint32_t rank_;
  const uint64_t incarnation_;
  const uint32_t shards_;
  std::atomic<uint64_t> generation_{0};
  std::vector<std::unique_ptr<TableState>> tables_;

  mutable absl::Mutex mu_;
  std::vector<std::string> addresses_ ABSL_GUARDED_BY(mu_);  // by shard
  std::vector<std::shared_ptr<grpc::GenericStub>> stubs_ ABSL_GUARDED_BY(mu_);

  std::atomic<uint64_t> bytes_pushed_{0};
  std::atomic<uint64_t> bytes_pulled_{0};
};

}  // namespace grps

#endif  // GRPS_WORKER_SPARSE_CLIENT_H_
