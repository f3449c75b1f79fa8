// InProcessShards: every shard of a job in this process, each a real
// ShardStore behind its own gRPC server on loopback (the tests that train
// real workers against real shards without starting daemons).
//
// The constructor fills in `map`'s shard addresses. On failure it records a
// gtest failure; the tests stop there. Not thread-safe to construct; the
// stores are thread-safe.
#ifndef GRPS_TEST_IN_PROCESS_SHARDS_H_
#define GRPS_TEST_IN_PROCESS_SHARDS_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "grpcpp/grpcpp.h"
#include "proto/grps.pb.h"
#include "server/parameter_server_service.h"
#include "server/shard_store.h"

namespace grps {

class InProcessShards {
 public:
  InProcessShards(const v1::JobConfig& config, v1::ShardMap* map);
  ~InProcessShards();
  InProcessShards(const InProcessShards&) = delete;
  InProcessShards& operator=(const InProcessShards&) = delete;

  ShardStore& store(size_t s) { return *stores_[s]; }
  size_t size() const { return stores_.size(); }

 private:
  std::vector<std::unique_ptr<ShardStore>> stores_;
  std::vector<std::unique_ptr<ParameterServerService>> services_;
  std::vector<std::unique_ptr<grpc::Server>> servers_;
};

// `n` random examples of `features` standard-normal inputs and a label in
// [0, classes), drawn from a generator seeded with `seed` (row-major x).
struct Examples {
  std::vector<float> x;
  std::vector<int32_t> y;
};
Examples RandomExamples(int n, int features, int classes, uint32_t seed);

}  // namespace grps

#endif  // GRPS_TEST_IN_PROCESS_SHARDS_H_
