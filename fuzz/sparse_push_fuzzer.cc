// Fuzz target: a PushSparse request as a shard receives it. The input is
// the raw bytes of a SparsePushRequest (what arrives on the wire), and goes
// through what the server does with them:
//
//   * wire/'s DecodeSparsePushRequest (the server reads sparse pushes
//     without protobuf, the gradients in place), once over one slice and
//     once over the same bytes cut into many small slices, which must
//     decode alike;
//   * ParameterServerService::PushSparse itself, called without a gRPC
//     server on the tiny shard of fuzz/shard_fixture.h (its table "emb")
//     under each mode: the validation (job, rank, table, dtype, byte count,
//     ids in range, this shard's and once, NaN), then the store, then the
//     reply, which must be a SparsePushResponse.
//
// And, for inputs protobuf itself parses, the contract of wire/wire_format.h
// ("any protobuf serializer's output is read here"): protobuf's serialization
// of the parsed message decodes to the same fields and gradient bytes.
#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>

#include "fuzz/fuzz_check.h"
#include "fuzz/quiet_logs.h"
#include "fuzz/shard_fixture.h"
#include "google/protobuf/util/message_differencer.h"
#include "wire/chunk_codec.h"

namespace grps {
namespace {

// What DecodeSparsePushRequest read, in a comparable form.
struct DecodedSparsePush {
  absl::StatusCode code = absl::StatusCode::kOk;
  v1::SparsePushRequest header;  // without gradients
  std::string gradients;
};

DecodedSparsePush Decode(const grpc::ByteBuffer& buffer) {
  DecodedSparsePush d;
  SliceReader gradients;
  absl::Status s = DecodeSparsePushRequest(buffer, &d.header, &gradients);
  if (s.ok()) {
    d.gradients.assign(gradients.left(), '\0');
    s = gradients.ReadBytes(d.gradients.data(), d.gradients.size());
  }
  d.code = s.code();
  return d;
}

bool Same(const DecodedSparsePush& a, const DecodedSparsePush& b) {
  // MessageDifferencer, not serialized bytes: a job id or table name that
  // is not UTF-8 is fine here.
  return a.code == b.code &&
         google::protobuf::util::MessageDifferencer::Equals(a.header, b.header) &&
         a.gradients == b.gradients;
}

// What protobuf read, as Decode says it.
DecodedSparsePush AsProtobufReadIt(v1::SparsePushRequest parsed) {
  DecodedSparsePush expected;
  expected.gradients = parsed.gradients();
  parsed.clear_gradients();
  expected.header = std::move(parsed);
  return expected;
}

}  // namespace
}  // namespace grps

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace grps;
  QuietLogs();
  const grpc::ByteBuffer sliced = ManySlices(data, size);
  const DecodedSparsePush whole = Decode(OneSlice(data, size));
  FUZZ_CHECK(Same(whole, Decode(sliced)),
             "DecodeSparsePushRequest reads one slice and many slices differently");
  CheckProtobufReadsAlike<v1::SparsePushRequest, DecodedSparsePush>(
      data, size, "SparsePushRequest", &Decode, &AsProtobufReadIt, &Same);
  for (v1::ConsistencyMode mode : kShardFuzzModes)
    AcceptedReply<v1::SparsePushResponse>(
        CallShard(mode, nullptr, &ParameterServerService::PushSparse, sliced, absl::ZeroDuration()),
        whole.code == absl::StatusCode::kOk, "sparse push");
  return 0;
}
