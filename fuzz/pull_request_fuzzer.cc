// Fuzz target: a Pull request as a shard receives it. The input is the raw
// bytes of a PullRequest (what arrives on the wire, cut into many small
// slices as a transport may deliver it), handed to
// ParameterServerService::Pull, called without a gRPC server on the fixed
// tiny shard of fuzz/shard_fixture.h under each mode, after one push from
// each worker so that the chunks have moved on from version 0. The handler
// parses the request, validates it against the shard's layout (job, rank,
// chunk ownership, duplicates, dtype, reply size), and the store answers at
// once, at its deadline (when that is a millisecond or two away), or, for a
// pull that would wait longer, with UNAVAILABLE when the fixture shuts the
// store down.
//
// A reply must be what the contract says: a PullResponse (protobuf parses
// it, and so does wire/'s DecodePullResponse, as the worker does) with the
// chunks asked for (all of the shard's when none were named), in order,
// each in the asked dtype with exactly its elements.
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "fuzz/fuzz_check.h"
#include "fuzz/quiet_logs.h"
#include "fuzz/shard_fixture.h"
#include "tensor/dtype.h"
#include "wire/chunk_codec.h"

namespace grps {
namespace {

// One step's gradients from every worker, so that a pull has versions to
// wait for and to read.
void PushFromEveryWorker(ShardStore& store) {
  static const std::vector<float> gradient(kShardFuzzChunkElements, 0.25f);
  for (uint32_t rank = 0; rank < kShardFuzzWorkers; ++rank) {
    ShardStore::GradientPush push;
    push.worker_rank = rank;
    push.incarnation = 1;
    push.step = 0;
    push.generation = kShardFuzzGeneration;
    for (uint32_t id : {0u, 2u}) {
      ShardStore::ChunkGradient& g = push.chunks.emplace_back();
      g.chunk_id = id;
      g.values = gradient;
      g.wire_bytes = gradient.size() * sizeof(float);
    }
    absl::StatusOr<ShardStore::PushResult> result = store.Push(push);
    FUZZ_CHECK(result.ok(), std::string(result.status().message()));
  }
}

void CheckReply(const ShardCallResult& result, const uint8_t* data, size_t size) {
  if (!result.status.ok()) return;
  v1::PullRequest request;
  FUZZ_CHECK(request.ParseFromArray(data, static_cast<int>(size)),
             "a pull that protobuf does not parse was served");
  absl::StatusOr<DType> dtype = DTypeFromWire(request.dtype(), true, "pull");
  FUZZ_CHECK(dtype.ok(), "a pull with an unknown dtype was served");
  std::vector<uint32_t> expected(request.chunk_ids().begin(), request.chunk_ids().end());
  if (expected.empty()) expected = {0, 2};

  v1::PullResponse parsed;
  FUZZ_CHECK(parsed.ParseFromString(Flatten(result.response)),
             "the pull reply is not a PullResponse");
  std::vector<uint32_t> served;
  std::string scratch;
  absl::Status s = DecodePullResponse(result.response, [&](ReceivedChunk& c) {
    served.push_back(c.chunk_id);
    FUZZ_CHECK(c.dtype == DTypeToWire(*dtype), absl::StrCat("chunk ", c.chunk_id, " came as dtype ",
                                                            c.dtype, ", not as asked"));
    std::vector<float> values(kShardFuzzChunkElements);
    return ReadValues(c.data, *dtype, values.data(), values.size(), &scratch);
  });
  FUZZ_CHECK(s.ok(), absl::StrCat("the pull reply does not decode: ", s.message()));
  FUZZ_CHECK(served == expected, absl::StrCat(served.size(), " chunks served for ",
                                              expected.size(), " asked"));
}

}  // namespace
}  // namespace grps

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace grps;
  QuietLogs();
  const grpc::ByteBuffer sliced = ManySlices(data, size);
  v1::PullRequest request;
  const absl::Duration grace = request.ParseFromArray(data, static_cast<int>(size))
                                   ? GraceFor(request.timeout_ms())
                                   : absl::ZeroDuration();
  for (v1::ConsistencyMode mode : kShardFuzzModes)
    CheckReply(
        CallShard(mode, &PushFromEveryWorker, &ParameterServerService::Pull, sliced, grace),
        data, size);
  return 0;
}
