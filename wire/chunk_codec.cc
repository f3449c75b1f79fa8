#include "wire/chunk_codec.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"

namespace grps {
namespace {

// Field numbers of proto/grps.proto.
namespace push_request {
constexpr uint32_t kJobId = 1, kWorkerRank = 2, kIncarnation = 3, kStep = 4,
                   kChunks = 5, kNumSamples = 6, kGeneration = 7, kPull = 8,
                   kPullTimeoutMs = 9, kPullDType = 10, kLane = 11,
                   kInitialValues = 12, kOptimizers = 13;
}
namespace chunk_data {
constexpr uint32_t kChunkId = 1, kDType = 2, kData = 3, kVersion = 4, kIndices = 5,
                   kLaneOffset = 6, kOptimizer = 7;
}
namespace pull_response {
constexpr uint32_t kChunks = 1;
}
namespace push_response {
constexpr uint32_t kVersions = 1, kDuplicates = 2, kLate = 3, kTooStale = 4, kChunks = 5,
                   kDoorbell = 6;
}
namespace sparse_push_request {
constexpr uint32_t kJobId = 1, kWorkerRank = 2, kIncarnation = 3, kStep = 4, kTable = 5, kIds = 6,
                   kDType = 7, kGradients = 8, kVersion = 9, kGeneration = 10;
}
namespace sparse_pull_response {
constexpr uint32_t kValues = 1, kDType = 2, kVersion = 3;
}

// Appends `v` to *out as a varint.
void AppendVarint(uint64_t v, std::string* out) {
  while (v >= 0x80) {
    out->push_back(static_cast<char>((v & 0x7f) | 0x80));
    v >>= 7;
  }
  out->push_back(static_cast<char>(v));
}

size_t PayloadBytes(const WireChunk& c) {
  return c.external != nullptr ? c.external_bytes : c.owned.size();
}

size_t ChunkDataBytes(const WireChunk& c, v1::DType dtype) {
  return VarintFieldSize(chunk_data::kChunkId, c.chunk_id) +
         VarintFieldSize(chunk_data::kDType, dtype) +
         LenFieldSize(chunk_data::kData, PayloadBytes(c)) +
         VarintFieldSize(chunk_data::kVersion, c.version) +
         (c.indices.empty() ? 0 : LenFieldSize(chunk_data::kIndices, c.indices.size())) +
         VarintFieldSize(chunk_data::kLaneOffset, c.lane_offset) +
         (c.optimizer == 0 ? 0 : VarintFieldSize(chunk_data::kOptimizer, c.optimizer));
}

// Appends `chunks` as repeated ChunkData field `field`.
void WriteChunks(uint32_t field, v1::DType dtype, std::vector<WireChunk>& chunks,
                 MessageWriter& w) {
  for (WireChunk& c : chunks) {
    w.BeginLen(field, ChunkDataBytes(c, dtype));
    w.Varint(chunk_data::kChunkId, c.chunk_id);
    w.Varint(chunk_data::kDType, dtype);
    if (c.external != nullptr)
      w.ExternalBytes(chunk_data::kData, c.external, c.external_bytes);
    else
      w.OwnedBytes(chunk_data::kData, std::move(c.owned), c.recycle);
    w.Varint(chunk_data::kVersion, c.version);
    if (!c.indices.empty()) w.OwnedBytes(chunk_data::kIndices, std::move(c.indices));
    w.Varint(chunk_data::kLaneOffset, c.lane_offset);
    if (c.optimizer != 0) w.Varint(chunk_data::kOptimizer, c.optimizer);
  }
}

// Reads one ChunkData from `r` (its whole body).
absl::StatusOr<ReceivedChunk> ReadChunkData(SliceReader r) {
  ReceivedChunk c;
  while (!r.AtEnd()) {
    uint32_t field;
    WireType type;
    if (absl::Status s = r.ReadKey(&field, &type); !s.ok()) return s;
    uint64_t v = 0;
    if ((field == chunk_data::kData || field == chunk_data::kIndices) &&
        type == WireType::kLen) {
      uint64_t length;
      if (absl::Status s = r.ReadLength(&length); !s.ok()) return s;
      absl::StatusOr<SliceReader> data = r.Sub(length);
      if (!data.ok()) return data.status();
      // The last one wins, as in protobuf.
      (field == chunk_data::kData ? c.data : c.indices) = std::move(*data);
    } else if ((field == chunk_data::kChunkId || field == chunk_data::kDType ||
                field == chunk_data::kVersion || field == chunk_data::kLaneOffset ||
                field == chunk_data::kOptimizer) &&
               type == WireType::kVarint) {
      if (absl::Status s = r.ReadVarint(&v); !s.ok()) return s;
      if (field == chunk_data::kChunkId) c.chunk_id = static_cast<uint32_t>(v);
      if (field == chunk_data::kDType) c.dtype = static_cast<int>(v);
      if (field == chunk_data::kVersion) c.version = v;
      if (field == chunk_data::kLaneOffset) c.lane_offset = v;
      if (field == chunk_data::kOptimizer) c.optimizer = static_cast<uint32_t>(v);
    } else if (absl::Status s = r.SkipValue(type); !s.ok()) {
      return s;
    }
  }
  return c;
}

}  // namespace

absl::StatusOr<DType> DTypeFromWire(int wire, bool unspecified_is_f32,
                                    absl::string_view what) {
  switch (wire) {
    case v1::DTYPE_F32:
      return DType::kF32;
    case v1::DTYPE_F16:
      return DType::kF16;
    case v1::DTYPE_BF16:
      return DType::kBF16;
    case v1::DTYPE_UNSPECIFIED:
      if (unspecified_is_f32) return DType::kF32;
      return absl::InvalidArgumentError(
          absl::StrCat(what, ": dtype is unspecified (use f32, f16 or bf16)"));
    default:
      return absl::InvalidArgumentError(
          absl::StrCat(what, ": unknown dtype ", wire, " (use f32, f16 or bf16)"));
  }
}

v1::DType DTypeToWire(DType dtype) {
  switch (dtype) {
    case DType::kF16:
      return v1::DTYPE_F16;
    case DType::kBF16:
      return v1::DTYPE_BF16;
    case DType::kF32:
      break;
  }
  return v1::DTYPE_F32;
}

grpc::ByteBuffer EncodePushRequest(const v1::PushRequest& header, v1::DType dtype,
                                   std::vector<WireChunk> chunks) {
  MessageWriter w;
  w.String(push_request::kJobId, header.job_id());
  w.Varint(push_request::kWorkerRank, header.worker_rank());
  w.Varint(push_request::kIncarnation, header.incarnation());
  w.Varint(push_request::kStep, header.step());
  WriteChunks(push_request::kChunks, dtype, chunks, w);
  w.Varint(push_request::kNumSamples, header.num_samples());
  w.Varint(push_request::kGeneration, header.generation());
  w.Varint(push_request::kPull, header.pull() ? 1 : 0);
  w.Varint(push_request::kPullTimeoutMs, header.pull_timeout_ms());
  w.Varint(push_request::kPullDType, header.pull_dtype());
  if (header.has_lane()) w.String(push_request::kLane, header.lane().SerializeAsString());
  if (header.initial_values()) w.Varint(push_request::kInitialValues, 1);
  for (const v1::OptimizerConfig& o : header.optimizers())
    w.String(push_request::kOptimizers, o.SerializeAsString());
  return w.Finish();
}

grpc::ByteBuffer EncodePullResponse(v1::DType dtype, std::vector<WireChunk> chunks) {
  MessageWriter w;
  WriteChunks(pull_response::kChunks, dtype, chunks, w);
  return w.Finish();
}

grpc::ByteBuffer EncodePushResponse(const v1::PushResponse& header, v1::DType dtype,
                                    std::vector<WireChunk> chunks) {
  MessageWriter w;
  if (header.versions_size() > 0) {
    std::string packed;
    for (uint64_t v : header.versions()) AppendVarint(v, &packed);
    w.String(push_response::kVersions, packed);
  }
  w.Varint(push_response::kDuplicates, header.duplicates());
  w.Varint(push_response::kLate, header.late());
  w.Varint(push_response::kTooStale, header.too_stale());
  w.Varint(push_response::kDoorbell, header.doorbell() ? 1 : 0);
  WriteChunks(push_response::kChunks, dtype, chunks, w);
  return w.Finish();
}

namespace {

// Walks a message: each ChunkData of field `chunks_field` goes to
// `on_chunk`, each other varint field to `on_varint`; the rest is skipped.
// Other length-delimited fields go to `on_len` when it is set.
absl::Status DecodeChunks(
    const grpc::ByteBuffer& buffer, uint32_t chunks_field,
    const std::function<void(uint32_t, uint64_t)>& on_varint,
    const std::function<absl::Status(ReceivedChunk&)>& on_chunk,
    const std::function<absl::Status(uint32_t, SliceReader&)>& on_len = nullptr) {
  absl::StatusOr<SliceReader> reader = SliceReader::Over(buffer);
  if (!reader.ok()) return reader.status();
  SliceReader& r = *reader;
  while (!r.AtEnd()) {
    uint32_t field;
    WireType type;
    if (absl::Status s = r.ReadKey(&field, &type); !s.ok()) return s;
    if (type == WireType::kVarint) {
      uint64_t v;
      if (absl::Status s = r.ReadVarint(&v); !s.ok()) return s;
      on_varint(field, v);
      continue;
    }
    if (type != WireType::kLen || (field != chunks_field && on_len == nullptr)) {
      if (absl::Status s = r.SkipValue(type); !s.ok()) return s;
      continue;
    }
    uint64_t length;
    if (absl::Status s = r.ReadLength(&length); !s.ok()) return s;
    absl::StatusOr<SliceReader> body = r.Sub(length);
    if (!body.ok()) return body.status();
    if (field != chunks_field) {
      if (absl::Status s = on_len(field, *body); !s.ok()) return s;
      continue;
    }
    absl::StatusOr<ReceivedChunk> chunk = ReadChunkData(std::move(*body));
    if (!chunk.ok()) return chunk.status();
    if (absl::Status s = on_chunk(*chunk); !s.ok()) return s;
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status DecodePullResponse(
    const grpc::ByteBuffer& buffer,
    const std::function<absl::Status(ReceivedChunk&)>& on_chunk) {
  return DecodeChunks(buffer, pull_response::kChunks, [](uint32_t, uint64_t) {}, on_chunk);
}

absl::Status DecodePushRequest(
    const grpc::ByteBuffer& buffer, v1::PushRequest* header,
    const std::function<absl::Status(ReceivedChunk&)>& on_chunk) {
  return DecodeChunks(
      buffer, push_request::kChunks,
      [header](uint32_t field, uint64_t v) {
        // Narrowed as protobuf narrows a varint into a 32-bit field.
        switch (field) {
          case push_request::kWorkerRank: header->set_worker_rank(static_cast<uint32_t>(v)); break;
          case push_request::kIncarnation: header->set_incarnation(v); break;
          case push_request::kStep: header->set_step(v); break;
          case push_request::kNumSamples: header->set_num_samples(static_cast<uint32_t>(v)); break;
          case push_request::kGeneration: header->set_generation(v); break;
          case push_request::kPull: header->set_pull(v != 0); break;
          case push_request::kPullTimeoutMs: header->set_pull_timeout_ms(static_cast<uint32_t>(v)); break;
          case push_request::kPullDType: header->set_pull_dtype(static_cast<v1::DType>(static_cast<int32_t>(v))); break;
          case push_request::kInitialValues: header->set_initial_values(v != 0); break;
        }
      },
      on_chunk,
      [header](uint32_t field, SliceReader& value) -> absl::Status {
        if (field != push_request::kJobId && field != push_request::kLane &&
            field != push_request::kOptimizers)
          return absl::OkStatus();
        std::string bytes(value.left(), '\0');
        if (!value.ReadBytes(bytes.data(), bytes.size()).ok())
          return absl::DataLossError("malformed job id, lane or optimizer");
        if (field == push_request::kJobId) {
          header->set_job_id(std::move(bytes));
        } else if (field == push_request::kOptimizers) {
          if (!header->add_optimizers()->ParseFromString(bytes))
            return absl::DataLossError("malformed optimizer");
        } else if (!header->mutable_lane()->MergeFromString(bytes)) {  // as protobuf merges a repeated message field
          return absl::DataLossError("malformed lane");
        }
        return absl::OkStatus();
      });
}

absl::Status DecodePushResponse(
    const grpc::ByteBuffer& buffer, v1::PushResponse* header,
    const std::function<absl::Status(ReceivedChunk&)>& on_chunk) {
  return DecodeChunks(
      buffer, push_response::kChunks,
      [header](uint32_t field, uint64_t v) {
        const uint32_t v32 = static_cast<uint32_t>(std::min<uint64_t>(v, UINT32_MAX));
        if (field == push_response::kDuplicates) header->set_duplicates(v32);
        if (field == push_response::kLate) header->set_late(v32);
        if (field == push_response::kTooStale) header->set_too_stale(v32);
        if (field == push_response::kDoorbell) header->set_doorbell(v != 0);
      },
      on_chunk);
}

void PackVarints(absl::Span<const int64_t> ids, std::string* out) {
  // At most 10 bytes an id, written in place: no growth check per byte.
  out->resize(ids.size() * 10);
  char* p = out->data();
  for (int64_t id : ids) {
    uint64_t v = static_cast<uint64_t>(id);
    while (v >= 0x80) {
      *p++ = static_cast<char>((v & 0x7f) | 0x80);
      v >>= 7;
    }
    *p++ = static_cast<char>(v);
  }
  out->resize(static_cast<size_t>(p - out->data()));
}

namespace {

// The varints of a packed repeated int64 field's body, appended to *ids.
absl::Status ReadPackedVarints(SliceReader& body, google::protobuf::RepeatedField<int64_t>* ids) {
  thread_local std::string bytes;  // the body in one piece: read with no bounds check per slice
  bytes.resize(body.left());
  if (absl::Status s = body.ReadBytes(bytes.data(), bytes.size()); !s.ok()) return s;
  // A varint ends at each byte below 0x80: that many ids, if the body ends with one.
  if (!bytes.empty() && (static_cast<uint8_t>(bytes.back()) & 0x80) != 0)
    return absl::DataLossError("malformed message: a packed varint runs past its field");
  const size_t count = static_cast<size_t>(std::count_if(
      bytes.begin(), bytes.end(), [](char c) { return (static_cast<uint8_t>(c) & 0x80) == 0; }));
  const int first = ids->size();
  ids->Resize(first + static_cast<int>(count), 0);
  int64_t* out = ids->mutable_data() + first;
  const uint8_t* p = reinterpret_cast<const uint8_t*>(bytes.data());
  for (size_t i = 0; i < count; ++i) {
    uint64_t v = 0;
    int shift = 0;
    for (;; shift += 7) {
      if (shift > 63)
        return absl::DataLossError("malformed message: a varint longer than 10 bytes");
      v |= static_cast<uint64_t>(*p & 0x7f) << shift;
      if ((*p++ & 0x80) == 0) break;
    }
    out[i] = static_cast<int64_t>(v);
  }
  return absl::OkStatus();
}

}  // namespace

grpc::ByteBuffer EncodeSparsePushRequest(const v1::SparsePushRequest& header,
                                         absl::string_view packed_ids,
                                         absl::string_view gradients) {
  namespace f = sparse_push_request;
  MessageWriter w;
  w.String(f::kJobId, header.job_id());
  w.Varint(f::kWorkerRank, header.worker_rank());
  w.Varint(f::kIncarnation, header.incarnation());
  w.Varint(f::kStep, header.step());
  w.String(f::kTable, header.table());
  if (!packed_ids.empty()) w.ExternalBytes(f::kIds, packed_ids.data(), packed_ids.size());
  w.Varint(f::kDType, static_cast<uint32_t>(header.dtype()));
  if (!gradients.empty()) w.ExternalBytes(f::kGradients, gradients.data(), gradients.size());
  w.Varint(f::kVersion, header.version());
  w.Varint(f::kGeneration, header.generation());
  return w.Finish();
}

absl::Status DecodeSparsePushRequest(const grpc::ByteBuffer& buffer, v1::SparsePushRequest* header,
                                     SliceReader* gradients) {
  namespace f = sparse_push_request;
  *gradients = SliceReader();
  return DecodeChunks(
      buffer, /*chunks_field=*/0,  // none: field 0 is never valid
      [header](uint32_t field, uint64_t v) {
        // Narrowed as protobuf narrows a varint into a 32-bit field.
        switch (field) {
          case f::kWorkerRank:
            header->set_worker_rank(static_cast<uint32_t>(v));
            break;
          case f::kIncarnation:
            header->set_incarnation(v);
            break;
          case f::kStep:
            header->set_step(v);
            break;
          case f::kIds:
            header->add_ids(static_cast<int64_t>(v));
            break;  // not packed
          case f::kDType:
            header->set_dtype(static_cast<v1::DType>(static_cast<int32_t>(v)));
            break;
          case f::kVersion:
            header->set_version(v);
            break;
          case f::kGeneration:
            header->set_generation(v);
            break;
        }
      },
      nullptr,
      [header, gradients](uint32_t field, SliceReader& value) -> absl::Status {
        switch (field) {
          case f::kIds:
            return ReadPackedVarints(value, header->mutable_ids());
          case f::kGradients:
            *gradients = value;  // the last one wins, as in protobuf
            return absl::OkStatus();
          case f::kJobId:
          case f::kTable: {
            std::string bytes(value.left(), '\0');
            if (absl::Status s = value.ReadBytes(bytes.data(), bytes.size()); !s.ok()) return s;
            if (field == f::kJobId)
              header->set_job_id(std::move(bytes));
            else
              header->set_table(std::move(bytes));
            return absl::OkStatus();
          }
        }
        return absl::OkStatus();
      });
}

grpc::ByteBuffer EncodeSparsePullResponse(v1::DType dtype, uint64_t version, std::string values,
                                          BufferPool* recycle) {
  namespace f = sparse_pull_response;
  MessageWriter w;
  if (!values.empty()) w.OwnedBytes(f::kValues, std::move(values), recycle);
  w.Varint(f::kDType, static_cast<uint32_t>(dtype));
  w.Varint(f::kVersion, version);
  return w.Finish();
}

absl::Status DecodeSparsePullResponse(const grpc::ByteBuffer& buffer,
                                      v1::SparsePullResponse* header, SliceReader* values) {
  namespace f = sparse_pull_response;
  *values = SliceReader();
  return DecodeChunks(
      buffer, /*chunks_field=*/0,
      [header](uint32_t field, uint64_t v) {
        if (field == f::kDType) header->set_dtype(static_cast<v1::DType>(static_cast<int32_t>(v)));
        if (field == f::kVersion) header->set_version(v);
      },
      nullptr,
      [values](uint32_t field, SliceReader& value) -> absl::Status {
        if (field == f::kValues) *values = value;
        return absl::OkStatus();
      });
}

absl::Status ReadValues(SliceReader& data, DType wire, float* dst, size_t n,
                        std::string* scratch) {
  const size_t bytes = n * DTypeSize(wire);
  if (data.left() != bytes)
    return absl::DataLossError(
        absl::StrCat(data.left(), " bytes, expected ", bytes, " (", n, " x ",
                     std::string(DTypeName(wire)), ")"));
  if (wire == DType::kF32) return data.ReadBytes(dst, bytes);
  if (scratch->size() < bytes) scratch->resize(bytes);
  if (absl::Status s = data.ReadBytes(scratch->data(), bytes); !s.ok()) return s;
  ConvertElements(scratch->data(), wire, dst, DType::kF32, n);
  return absl::OkStatus();
}

absl::Status ReadGradient(ReceivedChunk& chunk, DType wire, float* dst, size_t n,
                          std::string* scratch) {
  if (chunk.indices.AtEnd()) return ReadValues(chunk.data, wire, dst, n, scratch);
  const uint64_t index_bytes = chunk.indices.left();
  if (index_bytes % sizeof(uint32_t) != 0 || index_bytes / sizeof(uint32_t) > n)
    return absl::DataLossError(absl::StrCat(index_bytes, " bytes of indices for ", n,
                                            " elements"));
  const size_t count = index_bytes / sizeof(uint32_t);
  // Values first (as f32 at the front of dst), then indices into scratch.
  if (absl::Status s = ReadValues(chunk.data, wire, dst, count, scratch); !s.ok()) return s;
  std::vector<uint32_t> index(count);
  if (absl::Status s = chunk.indices.ReadBytes(index.data(), index_bytes); !s.ok()) return s;
  for (size_t i = 0; i < count; ++i)
    if (index[i] >= n || (i > 0 && index[i] <= index[i - 1]))
      return absl::DataLossError(absl::StrCat("index ", index[i], " at ", i,
                                              " is out of range or out of order"));
  // Scatter in place from the back: index[i] >= i, so dst[0, i) still holds
  // the values not yet moved while [index[i], n) is being written.
  for (size_t i = count; i-- > 0;) {
    const float v = dst[i];
    const size_t next = i + 1 < count ? index[i + 1] : n;
    std::fill(dst + index[i] + 1, dst + next, 0.0f);
    dst[index[i]] = v;
  }
  std::fill(dst, dst + (count > 0 ? index[0] : n), 0.0f);
  return absl::OkStatus();
}

void SparsifyTopK(const float* grad, float* residual, size_t n, size_t k, DType wire,
                  std::string* indices, std::string* values, std::vector<uint32_t>* order) {
  k = std::min(std::max<size_t>(k, 1), n);
  for (size_t i = 0; i < n; ++i) residual[i] += grad[i];
  order->resize(n);
  for (size_t i = 0; i < n; ++i) (*order)[i] = static_cast<uint32_t>(i);
  std::nth_element(order->begin(), order->begin() + (k - 1), order->end(),
                   [residual](uint32_t a, uint32_t b) {
                     return std::abs(residual[a]) > std::abs(residual[b]);
                   });
  std::sort(order->begin(), order->begin() + k);
  indices->resize(k * sizeof(uint32_t));
  std::memcpy(indices->data(), order->data(), k * sizeof(uint32_t));
  std::vector<float> picked(k);
  for (size_t j = 0; j < k; ++j) {
    picked[j] = residual[(*order)[j]];
    residual[(*order)[j]] = 0;
  }
  values->resize(k * DTypeSize(wire));
  ConvertElements(picked.data(), DType::kF32, values->data(), wire, k);
}

}  // namespace grps
