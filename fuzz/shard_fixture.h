// The shard the server fuzz targets (push_request, pull_request,
// optimizer_state, sparse_push) send their requests to, shared with the corpus generator
// that writes their seeds: a fixed, tiny layout, a fresh ShardStore per
// call, and a way to call ParameterServerService's raw Push, Pull and
// PushSparse handlers without a gRPC server.
//
// The layout: job "fuzz-job", 2 workers, 2 shards; tensor "w" [4, 6] in
// three chunks of 8 elements (ids 0, 1, 2) and "b" [6] in one (id 3). This
// process is shard 0, which holds chunks 0 and 2; chunks 1 and 3 are shard
// 1's, so a request for them is a request for a chunk held elsewhere. A
// sparse table "emb" of rows of 4 with ids in [0, 1000), hashed over both
// shards (SparseShardOf), at most 64 rows a shard. The store starts at
// generation 1.
#ifndef GRPS_FUZZ_SHARD_FIXTURE_H_
#define GRPS_FUZZ_SHARD_FIXTURE_H_

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "fuzz/fuzz_check.h"
#include "grpcpp/grpcpp.h"
#include "proto/grps.pb.h"
#include "server/parameter_server_service.h"
#include "server/shard_store.h"

namespace grps {

inline constexpr char kShardFuzzJobId[] = "fuzz-job";
inline constexpr uint32_t kShardFuzzWorkers = 2;
inline constexpr uint32_t kShardFuzzChunkElements = 8;  // chunks 0, 1, 2
inline constexpr uint64_t kShardFuzzGeneration = 1;
inline constexpr char kShardFuzzTable[] = "emb";
inline constexpr uint32_t kShardFuzzTableDim = 4;
inline constexpr uint64_t kShardFuzzTableRows = 1000;

// Every request is tried under each mode: validation is the same, what the
// store does with a valid request is not. Sync has one backup worker, so a
// single push completes a step.
inline constexpr v1::ConsistencyMode kShardFuzzModes[] = {v1::MODE_SYNC, v1::MODE_ASYNC,
                                                          v1::MODE_SSP};

v1::JobConfig ShardFuzzConfig(v1::ConsistencyMode mode);
v1::ShardMap ShardFuzzMap();

// A fresh store of shard 0 under `mode`, at kShardFuzzGeneration.
std::unique_ptr<ShardStore> NewFuzzShard(v1::ConsistencyMode mode);

// What a handler answered.
struct ShardCallResult {
  grpc::Status status;
  grpc::ByteBuffer response;
};

using RawHandler = grpc::ServerUnaryReactor* (ParameterServerService::*)(
    grpc::CallbackServerContext*, const grpc::ByteBuffer*, grpc::ByteBuffer*);

// Creates a fresh store of shard 0 under `mode`, runs `prepare` on it (if
// set), calls `handler` with `request` through a service over it, gives a
// pull that waits up to `grace` to be answered (a pull whose deadline is
// that close: the store's timer answers it), then shuts the store down
// (which ends a pull still waiting with UNAVAILABLE) and waits for the
// handler to finish. A handler that does not finish within 5 s aborts the
// process: that is a hang.
ShardCallResult CallShard(v1::ConsistencyMode mode,
                          const std::function<void(ShardStore&)>& prepare,
                          RawHandler handler, const grpc::ByteBuffer& request,
                          absl::Duration grace);

// The grace for a request that waits at most `timeout_ms` (0: no limit of
// its own): long enough for its deadline to pass when that is at most
// kShortWaitMs away, none otherwise (the fuzzer would spend its time
// sleeping).
inline constexpr uint32_t kShortWaitMs = 2;
absl::Duration GraceFor(uint32_t timeout_ms);

// `data` as the one slice of a ByteBuffer.
grpc::ByteBuffer OneSlice(const uint8_t* data, size_t size);
// `data` cut into slices of 1 to 16 bytes (lengths taken from the bytes
// themselves, so the cut is the same every time): a handler gets whatever
// slices the transport delivered, and must read the same message from them.
grpc::ByteBuffer ManySlices(const uint8_t* data, size_t size);
// A ByteBuffer's bytes, joined.
std::string Flatten(const grpc::ByteBuffer& buffer);

// The contract of wire/wire_format.h ("any protobuf serializer's output is
// read here"), for inputs protobuf parses as a `Message`: protobuf's
// serialization of the parsed message (its known fields: protobuf keeps
// unknown ones, groups included, which no proto3 schema produces and wire/
// refuses) must decode, with `decode` over one slice, to what `expected`
// makes of the parsed message (`same` compares). `what` names the message
// in a finding. `Decoded` has the decoding's `code`.
template <typename Message, typename Decoded>
void CheckProtobufReadsAlike(const uint8_t* data, size_t size, const char* what,
                             Decoded (*decode)(const grpc::ByteBuffer&),
                             Decoded (*expected)(Message parsed),
                             bool (*same)(const Decoded&, const Decoded&)) {
  Message parsed;
  if (!parsed.ParseFromArray(data, static_cast<int>(size))) return;
  parsed.DiscardUnknownFields();
  const std::string canonical = parsed.SerializeAsString();
  const Decoded ours =
      decode(OneSlice(reinterpret_cast<const uint8_t*>(canonical.data()), canonical.size()));
  FUZZ_CHECK(ours.code == absl::StatusCode::kOk,
             absl::StrCat("protobuf's own serialization of a ", what, " does not decode"));
  FUZZ_CHECK(same(ours, expected(std::move(parsed))),
             absl::StrCat("wire/ and protobuf read a ", what, " differently"));
}

// The reply of a handler that accepted a request (`result.status` OK) as a
// `Reply`, which the contract says it is; nullopt when the handler refused
// it. A request that did not decode (`decoded` false) must not have been
// accepted. `what` names the request in a finding.
template <typename Reply>
std::optional<Reply> AcceptedReply(const ShardCallResult& result, bool decoded,
                                   const char* what) {
  if (!result.status.ok()) return std::nullopt;
  FUZZ_CHECK(decoded, absl::StrCat("a ", what, " that does not decode was accepted"));
  Reply reply;
  FUZZ_CHECK(reply.ParseFromString(Flatten(result.response)),
             absl::StrCat("the reply to a ", what, " is not a ",
                          Reply::descriptor()->name()));
  return reply;
}

}  // namespace grps

#endif  // GRPS_FUZZ_SHARD_FIXTURE_H_
