// Fuzz target: a Push request as a shard receives it. The input is the raw
// bytes of a PushRequest (what arrives on the wire), and goes through what
// the server does with them:
//
//   * wire/'s DecodePushRequest (the server parses pushes without protobuf),
//     once over one slice and once over the same bytes cut into many small
//     slices, which must decode alike: a handler gets whatever slices the
//     transport delivered;
//   * ParameterServerService::Push itself, called without a gRPC server on
//     the fixed tiny shard of fuzz/shard_fixture.h under each mode: the
//     validation against the shard's layout (job, rank, chunk ownership,
//     dtype, lengths, sparse indices, NaN), then the store, then the reply,
//     which must be a PushResponse with one version per pushed chunk.
//
// And, for inputs protobuf itself parses, the contract of wire/wire_format.h
// ("any protobuf serializer's output is read here"): protobuf's serialization
// of the parsed message (its known fields) decodes to the same fields.
#include <cstddef>
#include <algorithm>
#include <cstdint>
#include <optional>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "fuzz/fuzz_check.h"
#include "fuzz/quiet_logs.h"
#include "fuzz/shard_fixture.h"
#include "google/protobuf/util/field_comparator.h"
#include "google/protobuf/util/message_differencer.h"
#include "wire/chunk_codec.h"

namespace grps {
namespace {

// What DecodePushRequest read, in a comparable form.
struct DecodedPush {
  absl::StatusCode code = absl::StatusCode::kOk;
  v1::PushRequest header;  // the scalar fields
  // chunk_id, dtype, version, data, indices
  std::vector<std::tuple<uint32_t, int, uint64_t, std::string, std::string>> chunks;
};

absl::Status ReadAll(SliceReader& reader, std::string* out) {
  out->assign(reader.left(), '\0');
  return reader.ReadBytes(out->data(), out->size());
}

DecodedPush Decode(const grpc::ByteBuffer& buffer) {
  DecodedPush d;
  absl::Status s = DecodePushRequest(buffer, &d.header, [&d](ReceivedChunk& c) {
    std::string data, indices;
    if (absl::Status r = ReadAll(c.data, &data); !r.ok()) return r;
    if (absl::Status r = ReadAll(c.indices, &indices); !r.ok()) return r;
    d.chunks.emplace_back(c.chunk_id, c.dtype, c.version, std::move(data), std::move(indices));
    return absl::OkStatus();
  });
  d.code = s.code();
  return d;
}

bool Same(const DecodedPush& a, const DecodedPush& b) {
  // MessageDifferencer, not serialized bytes: a job id that is not UTF-8 is
  // fine here, and protobuf would complain about it on every input. A NaN
  // read from the same bytes (an optimizer's decay_rate) is the same value.
  google::protobuf::util::DefaultFieldComparator floats;
  floats.set_treat_nan_as_equal(true);
  google::protobuf::util::MessageDifferencer differ;
  differ.set_field_comparator(&floats);
  return a.code == b.code && differ.Compare(a.header, b.header) && a.chunks == b.chunks;
}

// What protobuf read, as Decode says it.
DecodedPush AsProtobufReadIt(v1::PushRequest parsed) {
  DecodedPush expected;
  for (const v1::ChunkData& c : parsed.chunks())
    expected.chunks.emplace_back(c.chunk_id(), c.dtype(), c.version(), c.data(), c.indices());
  parsed.clear_chunks();
  expected.header = std::move(parsed);
  return expected;
}

void CheckReply(const ShardCallResult& result, const DecodedPush& request) {
  const std::optional<v1::PushResponse> accepted = AcceptedReply<v1::PushResponse>(
      result, request.code == absl::StatusCode::kOk, "push");
  if (!accepted) return;
  const v1::PushResponse& reply = *accepted;
  // Initial values are not a step: their reply is empty.
  const size_t versions = request.header.initial_values() ? 0 : request.chunks.size();
  FUZZ_CHECK(static_cast<size_t>(reply.versions_size()) == versions,
             absl::StrCat(reply.versions_size(), " versions for ", request.chunks.size(),
                          " chunks", request.header.initial_values() ? " of initial values" : ""));
  for (const v1::ChunkData& c : reply.chunks()) {
    bool pushed = false;
    for (const auto& p : request.chunks) pushed |= std::get<0>(p) == c.chunk_id();
    FUZZ_CHECK(pushed, absl::StrCat("the reply carries chunk ", c.chunk_id(),
                                    ", which was not pushed"));
  }
}

}  // namespace
}  // namespace grps

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace grps;
  QuietLogs();
  const grpc::ByteBuffer sliced = ManySlices(data, size);
  const DecodedPush whole = Decode(OneSlice(data, size));
  FUZZ_CHECK(Same(whole, Decode(sliced)),
             "DecodePushRequest reads one slice and many slices differently");
  CheckProtobufReadsAlike<v1::PushRequest, DecodedPush>(data, size, "PushRequest", &Decode,
                                                       &AsProtobufReadIt, &Same);
  // The pull half of a push waits at most max(1, pull_timeout_ms).
  const absl::Duration grace =
      whole.header.pull() ? GraceFor(std::max<uint32_t>(1, whole.header.pull_timeout_ms()))
                          : absl::ZeroDuration();
  for (v1::ConsistencyMode mode : kShardFuzzModes)
    CheckReply(CallShard(mode, nullptr, &ParameterServerService::Push, sliced, grace), whole);
  return 0;
}
