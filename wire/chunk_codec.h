// ChunkCodec: how chunks of dense values travel, shared by the worker's
// client and the server: the one mapping between the contract's dtype tag
// and tensor/'s DType, push requests built straight over the gradients
// (wire/wire_format.h), pull replies built over the values a shard read,
// and pull replies decoded with one copy into the caller's array; and the
// same for a sparse table's rows (SparsePushRequest, SparsePullResponse):
// the gradients sent from where the worker gathered them and read in place
// by the shard, the rows a shard read sent as they are and scattered by the
// worker straight from gRPC's slices.
//
// Everything here speaks the messages of proto/grps.proto byte for byte: a
// client or server that uses the generated protobuf classes instead talks to
// these unchanged.
#ifndef GRPS_WIRE_CHUNK_CODEC_H_
#define GRPS_WIRE_CHUNK_CODEC_H_

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "grpcpp/support/byte_buffer.h"
#include "proto/grps.pb.h"
#include "tensor/dtype.h"
#include "wire/wire_format.h"

namespace grps {

// A wire dtype tag as a DType. UNSPECIFIED is f32 where
// `unspecified_is_f32`, else INVALID_ARGUMENT; an unknown tag is
// INVALID_ARGUMENT. `what` names the value in the message.
absl::StatusOr<DType> DTypeFromWire(int wire, bool unspecified_is_f32,
                                    absl::string_view what);
v1::DType DTypeToWire(DType dtype);

// One chunk's values on the wire, already in the message's dtype: either
// `external` (not copied; must outlive the RPC) or `owned` (moved into the
// message, and given back to `recycle` when gRPC is done with it, if set).
struct WireChunk {
  uint32_t chunk_id = 0;
  uint64_t version = 0;
  const void* external = nullptr;
  size_t external_bytes = 0;
  std::string owned;
  BufferPool* recycle = nullptr;
  // A sparse gradient: the uint32 indices of the values (ChunkData.indices).
  std::string indices;
  // Not 0: the values are in the sender's shared-memory lane at this offset
  // (ChunkData.lane_offset); no payload is written.
  uint64_t lane_offset = 0;
  // A push: 1-based index of the header's optimizer its update runs
  // (ChunkData.optimizer); 0, the job's, is not written.
  uint32_t optimizer = 0;
};

// A PushRequest: the scalar fields, the lane and the optimizers of `header`
// (its chunks are ignored) and `chunks`, each tagged `dtype`. Every field of the contract is
// written.
grpc::ByteBuffer EncodePushRequest(const v1::PushRequest& header, v1::DType dtype,
                                   std::vector<WireChunk> chunks);

// A PullResponse of `chunks`, each tagged `dtype`.
grpc::ByteBuffer EncodePullResponse(v1::DType dtype, std::vector<WireChunk> chunks);

// A PushResponse: the fields of `header` (its chunks are ignored) and
// `chunks` (the values of a push with PushRequest.pull), each tagged `dtype`.
grpc::ByteBuffer EncodePushResponse(const v1::PushResponse& header, v1::DType dtype,
                                    std::vector<WireChunk> chunks);

// One ChunkData of a received PullResponse. `data` reads its payload.
struct ReceivedChunk {
  uint32_t chunk_id = 0;
  int dtype = 0;  // the raw tag: check it with DTypeFromWire
  uint64_t version = 0;
  SliceReader data;
  SliceReader indices;  // empty unless the gradient is sparse
  uint64_t lane_offset = 0;  // not 0: the values are in the sender's lane
  uint32_t optimizer = 0;    // a push's: ChunkData.optimizer
};

// Calls `on_chunk` for every ChunkData of the PullResponse in `buffer`, in
// order; stops at the first error it or the parse returns (DATA_LOSS for a
// malformed message). Unknown fields are skipped.
absl::Status DecodePullResponse(
    const grpc::ByteBuffer& buffer,
    const std::function<absl::Status(ReceivedChunk&)>& on_chunk);

// A PushRequest: its scalar fields, lane and optimizers into *header (its
// chunks stay empty) and `on_chunk` for every ChunkData, as DecodePullResponse.
absl::Status DecodePushRequest(
    const grpc::ByteBuffer& buffer, v1::PushRequest* header,
    const std::function<absl::Status(ReceivedChunk&)>& on_chunk);

// A PushResponse: its scalar fields into *header (versions are skipped),
// and `on_chunk` for every ChunkData, as DecodePullResponse.
absl::Status DecodePushResponse(
    const grpc::ByteBuffer& buffer, v1::PushResponse* header,
    const std::function<absl::Status(ReceivedChunk&)>& on_chunk);

// Copies `n` values of dtype `wire` from `data` (exactly n x size bytes) to
// `dst` as f32: straight into `dst` for f32, through `scratch` otherwise.
absl::Status ReadValues(SliceReader& data, DType wire, float* dst, size_t n,
                        std::string* scratch);

// A chunk's gradient, dense or sparse, as `n` f32 values in `dst`: a sparse
// one is scattered over zeros. DATA_LOSS when the lengths disagree, or an
// index is out of range or not above the one before.
absl::Status ReadGradient(ReceivedChunk& chunk, DType wire, float* dst, size_t n,
                          std::string* scratch);

// ---- Sparse rows ----

// `ids` as the body of a packed repeated int64 field (varints), into *out
// (replacing what it held; its room is kept).
void PackVarints(absl::Span<const int64_t> ids, std::string* out);

// A SparsePushRequest: the scalar fields of `header` (its ids and gradients
// are ignored), `packed_ids` (PackVarints) and `gradients`. Neither is
// copied: both must outlive the call (MessageWriter::ExternalBytes).
grpc::ByteBuffer EncodeSparsePushRequest(const v1::SparsePushRequest& header,
                                         absl::string_view packed_ids, absl::string_view gradients);

// A SparsePushRequest: everything but its gradients into *header (ids
// packed or not, appended to what it holds), and the gradients' bytes in
// *gradients, read in place. DATA_LOSS for a malformed message.
absl::Status DecodeSparsePushRequest(const grpc::ByteBuffer& buffer, v1::SparsePushRequest* header,
                                     SliceReader* gradients);

// A SparsePullResponse of `values` (taken over; given back to `recycle`
// when gRPC is done with them, if set).
grpc::ByteBuffer EncodeSparsePullResponse(v1::DType dtype, uint64_t version, std::string values,
                                          BufferPool* recycle = nullptr);

// A SparsePullResponse: its dtype and version into *header, its values'
// bytes in *values, read in place. DATA_LOSS for a malformed message.
absl::Status DecodeSparsePullResponse(const grpc::ByteBuffer& buffer,
                                      v1::SparsePullResponse* header, SliceReader* values);

// Top-k sparsification with error feedback, for one chunk of `n` elements:
// adds `grad` into `residual`, moves the k largest |residual| elements into
// `indices` (uint32, ascending) and `values` (in dtype `wire`), and leaves
// the rest in `residual` for the next push. `order` is scratch.
void SparsifyTopK(const float* grad, float* residual, size_t n, size_t k, DType wire,
                  std::string* indices, std::string* values, std::vector<uint32_t>* order);

}  // namespace grps

#endif  // GRPS_WIRE_CHUNK_CODEC_H_
