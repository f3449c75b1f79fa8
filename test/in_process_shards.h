// InProcessShards: every shard of a job in this process, each a real
// ShardStore behind its own gRPC server on loopback (the tests that train
// real workers against real shards without starting daemons).
//
// Serve (or the tests' constructor) fills in `map`'s shard addresses. Not
// thread-safe to set up; the stores are thread-safe. Also used by
// bench/wire_bench, which links no test framework: only the constructor
// that records a gtest failure needs one, and it is inline here.
#ifndef GRPS_TEST_IN_PROCESS_SHARDS_H_
#define GRPS_TEST_IN_PROCESS_SHARDS_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "grpcpp/grpcpp.h"
#include "daemon/security.h"
#include "gtest/gtest.h"
#include "proto/grps.pb.h"
#include "server/parameter_server_service.h"
#include "server/shard_store.h"

namespace grps {

class InProcessShards {
 public:
  InProcessShards() = default;
  // For tests: Serve, recording a gtest failure if it fails.
  InProcessShards(const v1::JobConfig& config, v1::ShardMap* map) {
    const absl::Status s = Serve(config, map);
    EXPECT_TRUE(s.ok()) << s;
  }
  // Starts config.num_servers() shards of `map` on free ports of `host` (an
  // IP address; loopback by default) and writes their addresses into *map.
  // Call once. The servers are secured as `security` says (by default: not
  // at all).
  absl::Status Serve(const v1::JobConfig& config, v1::ShardMap* map,
                     const SecurityConfig& security = SecurityConfig(),
                     const std::string& host = "127.0.0.1");
  // Makes ranks [0, workers) the live workers of every shard, each at
  // incarnation 1 (as a ParameterClient created with incarnation 1 pushes).
  void SetLiveWorkers(uint32_t workers);
  ~InProcessShards();
  InProcessShards(const InProcessShards&) = delete;
  InProcessShards& operator=(const InProcessShards&) = delete;

  ShardStore& store(size_t s) { return *stores_[s]; }
  ParameterServerService& service(size_t s) { return *services_[s]; }
  size_t size() const { return stores_.size(); }

 private:
  std::vector<std::unique_ptr<ShardStore>> stores_;
  std::vector<std::unique_ptr<ParameterServerService>> services_;
  std::vector<std::unique_ptr<grpc::Server>> servers_;
};

// The shard map of a model of one tensor "w" of `elements` zeros, cut and
// placed as the job's config says.
absl::StatusOr<v1::ShardMap> OneTensorMap(const v1::JobConfig& config, int64_t elements);

// `n` random examples of `features` standard-normal inputs and a label in
// [0, classes), drawn from a generator seeded with `seed` (row-major x).
struct Examples {
  std::vector<float> x;
  std::vector<int32_t> y;
};
Examples RandomExamples(int n, int features, int classes, uint32_t seed);

}  // namespace grps

#endif  // GRPS_TEST_IN_PROCESS_SHARDS_H_
