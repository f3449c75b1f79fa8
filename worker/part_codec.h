// Part codec: the values of one part's chunks (ChunkLayout::Part) between a
// worker's flat arrays and the wire (wire/chunk_codec.h): a push's
// gradients put into its chunks, as slices over the array, converted
// copies, or one copy into the push's lane; and a reply's chunks (a pull's,
// or a fused push's) read into the flat parameter array, each checked
// against the part it answers.
//
//   std::vector<WireChunk> chunks = ...;  // the part's, ids set, in order
//   uint64_t lane_bytes = PutPushValues(layout, grads, DType::kBF16, lane, i, &chunks);
//   ...
//   ReplyRead read;
//   absl::Status s = ReadPartReply(layout, i, lane, reply, &push_header, params,
//                                  &versions, &read);
#ifndef GRPS_WORKER_PART_CODEC_H_
#define GRPS_WORKER_PART_CODEC_H_

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "grpcpp/support/byte_buffer.h"
#include "proto/grps.pb.h"
#include "tensor/dtype.h"
#include "wire/chunk_codec.h"
#include "worker/chunk_layout.h"
#include "worker/push_lanes.h"

namespace grps {

// Sets the values of `chunks` (part `index` of `layout`'s, in order, ids
// set) from `host_values` (the flat array) in dtype `d`. With `lane` (the
// push holds part `index`'s place): converted into the place, back to back,
// the chunks naming their offsets. Without: f32 as slices over
// `host_values` (not copied: they must stay alive and unchanged while the
// request is), other dtypes converted into each chunk's own bytes. Returns
// the bytes written into the lane.
uint64_t PutPushValues(const ChunkLayout& layout, const float* host_values, DType d,
                       PushLane* lane, size_t index, std::vector<WireChunk>* chunks);

// What ReadPartReply read of a reply that decoded: its value bytes, and of
// those the ones read from the lane; whether every chunk of the part came.
struct ReplyRead {
  uint64_t bytes = 0;
  uint64_t lane_bytes = 0;
  bool complete = false;
};

// Reads the chunks of `reply`, the answer to part `index` of `layout`, into
// `host_params` (the flat array), and each chunk's version into
// (*versions)[chunk id]. A pull's reply (`push_header` null) must bring
// every chunk of the part; a fused push's (its other fields into
// *push_header) every one or none. Values the reply names in the lane are
// read only from within part `index`'s place in `lane` (the push's; null:
// none may be). DATA_LOSS for a chunk not of the part, or twice, or
// without `host_params`, or a bad dtype, size or lane offset, or a chunk
// missing; `read` is set once the reply decoded.
absl::Status ReadPartReply(const ChunkLayout& layout, size_t index, const PushLane* lane,
                           const grpc::ByteBuffer& reply, v1::PushResponse* push_header,
                           float* host_params, std::vector<std::atomic<uint64_t>>* versions,
                           ReplyRead* read);

}  // namespace grps

#endif  // GRPS_WORKER_PART_CODEC_H_
