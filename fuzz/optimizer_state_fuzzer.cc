// Fuzz target: a program's saved optimizer state as a shard receives it.
// The input is the raw bytes of a LoadOptimizerStateRequest (what gRPC's
// generated handler parses; bytes protobuf refuses never reach the
// service), handed to ParameterServerService::LoadOptimizerState, called
// without a gRPC server on the fixed tiny shard of fuzz/shard_fixture.h
// under each mode, whose optimizers keep 1 (momentum), 2 (Adam) and 1
// (nesterov) state slots. The contract:
//
//   - the shard's optimizer state (GetOptimizerState, which answers) is
//     then either as it was (zeros, no steps) or, when the load was
//     accepted, exactly the request's slots and steps for each chunk it
//     names and zeros for the others: all or nothing;
//   - a step of every worker's gradients after it leaves every weight a
//     finite number: no state the edge accepts makes an update overflow.
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "fuzz/fuzz_check.h"
#include "fuzz/quiet_logs.h"
#include "fuzz/shard_fixture.h"

namespace grps {
namespace {

constexpr uint32_t kChunks[] = {0, 2};  // shard 0's

void Check(v1::ConsistencyMode mode, const v1::LoadOptimizerStateRequest& request) {
  std::unique_ptr<ShardStore> store = NewFuzzShard(mode);
  ParameterServerService service(store.get());
  grpc::ServerContext load_context;
  v1::LoadOptimizerStateResponse loaded;
  const bool accepted = service.LoadOptimizerState(&load_context, &request, &loaded).ok();

  v1::GetOptimizerStateRequest get;
  get.set_job_id(kShardFuzzJobId);
  get.set_generation(kShardFuzzGeneration);
  for (uint32_t id : kChunks) get.add_chunk_ids(id);
  v1::GetOptimizerStateResponse state;
  grpc::ServerContext get_context;
  const grpc::Status read = service.GetOptimizerState(&get_context, &get, &state);
  FUZZ_CHECK(read.ok(), absl::StrCat("the state cannot be read: ", read.error_message()));
  std::map<uint32_t, const v1::ChunkOptimizerState*> sent;
  if (accepted)
    for (const v1::ChunkOptimizerState& c : request.chunks()) sent[c.chunk_id()] = &c;
  const std::string zeros(kShardFuzzChunkElements * sizeof(float), '\0');
  for (const v1::ChunkOptimizerState& c : state.chunks()) {
    auto it = sent.find(c.chunk_id());
    const bool named = it != sent.end();
    FUZZ_CHECK(c.steps() == (named ? it->second->steps() : 0),
               absl::StrCat("chunk ", c.chunk_id(), " counts ", c.steps(), " steps"));
    for (int k = 0; k < c.slots_size(); ++k)
      FUZZ_CHECK(c.slots(k) == (named ? it->second->slots(k) : zeros),
                 absl::StrCat("chunk ", c.chunk_id(), "'s slot ", k, " is not what was ",
                              named ? "loaded" : "there before a refused load"));
  }

  static const std::vector<float> gradient(kShardFuzzChunkElements, 0.25f);
  for (uint32_t rank = 0; rank < kShardFuzzWorkers; ++rank) {
    ShardStore::GradientPush push;
    push.worker_rank = rank;
    push.incarnation = 1;
    push.step = 0;
    push.generation = kShardFuzzGeneration;
    for (uint32_t id : kChunks) {
      ShardStore::ChunkGradient& g = push.chunks.emplace_back();
      g.chunk_id = id;
      g.values = gradient;
      g.wire_bytes = gradient.size() * sizeof(float);
    }
    absl::StatusOr<ShardStore::PushResult> result = store->Push(push);
    FUZZ_CHECK(result.ok(), std::string(result.status().message()));
  }
  for (uint32_t id : kChunks) {
    absl::StatusOr<ShardStore::ChunkValues> values = store->TEST_ReadChunk(id);
    FUZZ_CHECK(values.ok(), std::string(values.status().message()));
    for (float v : values->values)
      FUZZ_CHECK(std::isfinite(v), absl::StrCat("chunk ", id, " has a weight of ", v,
                                                " after a step from the loaded state"));
  }
  store->Shutdown();
}

}  // namespace
}  // namespace grps

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace grps;
  QuietLogs();
  v1::LoadOptimizerStateRequest request;
  if (!request.ParseFromArray(data, static_cast<int>(size))) return 0;
  for (v1::ConsistencyMode mode : kShardFuzzModes) Check(mode, request);
  return 0;
}
