// Part codec: one part's values into a push, and out of a reply.
#include "worker/part_codec.h"

#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"

namespace grps {

uint64_t PutPushValues(const ChunkLayout& layout, const float* host_values, DType d,
                       PushLane* lane, size_t index, std::vector<WireChunk>* chunks) {
  uint64_t at = lane != nullptr ? lane->place[index] : 0;
  uint64_t lane_bytes = 0;
  for (WireChunk& c : *chunks) {
    const uint64_t n = layout.num_elements(c.chunk_id);
    const float* values = host_values + layout.offset(c.chunk_id);
    if (lane != nullptr) {
      // The one copy of the push: into the lane, where the shard reads it.
      ConvertElements(values, DType::kF32, lane->segment->base() + at, d, n);
      c.lane_offset = at;
      at += n * DTypeSize(d);
      lane_bytes += n * DTypeSize(d);
    } else if (d == DType::kF32) {
      c.external = values;
      c.external_bytes = n * sizeof(float);
    } else {
      c.owned.resize(n * DTypeSize(d));
      ConvertElements(values, DType::kF32, c.owned.data(), d, n);
    }
  }
  return lane_bytes;
}

absl::Status ReadPartReply(const ChunkLayout& layout, size_t index, const PushLane* lane,
                           const grpc::ByteBuffer& reply, v1::PushResponse* push_header,
                           float* host_params, std::vector<std::atomic<uint64_t>>* versions,
                           ReplyRead* read) {
  const ChunkLayout::Part& part = layout.parts()[index];
  const bool push = push_header != nullptr;
  thread_local std::string scratch;  // for f16 / bf16 payloads, reused
  std::vector<bool> wanted(layout.num_chunks(), false), seen(wanted.size(), false);
  for (uint32_t id : part.chunk_ids) wanted[id] = true;
  uint64_t bytes = 0, lane_read = 0;
  size_t count = 0;
  auto on_chunk = [&](ReceivedChunk& c) -> absl::Status {
    if (c.chunk_id >= wanted.size() || !wanted[c.chunk_id] || seen[c.chunk_id] ||
        host_params == nullptr)
      return absl::DataLossError(absl::StrCat("returned unexpected chunk ", c.chunk_id));
    seen[c.chunk_id] = true;
    ++count;
    absl::StatusOr<DType> d =
        DTypeFromWire(c.dtype, false, absl::StrCat("chunk ", c.chunk_id));
    if (!d.ok()) return absl::DataLossError(d.status().message());
    const uint64_t n = layout.num_elements(c.chunk_id);
    float* dst = host_params + layout.offset(c.chunk_id);
    if (c.lane_offset != 0) {
      // Only inside this part's place in the lane the push named.
      const uint64_t size = n * DTypeSize(*d);
      const char* values = lane != nullptr ? lane->Within(index, c.lane_offset, size) : nullptr;
      if (values == nullptr || !c.data.AtEnd())
        return absl::DataLossError(absl::StrCat("chunk ", c.chunk_id, " names lane offset ",
                                                c.lane_offset, " outside its place"));
      ConvertElements(values, *d, dst, DType::kF32, n);
      bytes += size;
      lane_read += size;
    } else {
      bytes += c.data.left();
      if (absl::Status r = ReadValues(c.data, *d, dst, n, &scratch); !r.ok())
        return absl::DataLossError(absl::StrCat("chunk ", c.chunk_id, ": ", r.message()));
    }
    (*versions)[c.chunk_id].store(c.version);
    return absl::OkStatus();
  };
  absl::Status s = push ? DecodePushResponse(reply, push_header, on_chunk)
                        : DecodePullResponse(reply, on_chunk);
  if (!s.ok()) return s;
  read->bytes = bytes;
  read->lane_bytes = lane_read;
  read->complete = count == part.chunk_ids.size();
  // A pull must bring every chunk; a fused push's reply may bring none.
  if (!push && !read->complete) {
    for (uint32_t id : part.chunk_ids)
      if (!seen[id]) return absl::DataLossError(absl::StrCat("omitted chunk ", id));
  }
  if (push && count > 0 && !read->complete)
    return absl::DataLossError("a push's reply carried only some of its chunks");
  return absl::OkStatus();
}

}  // namespace grps
