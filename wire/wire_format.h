// The Protocol Buffers wire format, read from and written to gRPC byte
// buffers without going through a generated message: what lets a tensor's
// bytes travel from where they are stored to the socket, and from the socket
// to where they are used, with no copy into a protobuf `bytes` field.
//
// MessageWriter appends fields; a large `bytes` payload becomes a slice of
// its own that points at memory the caller keeps alive (or hands over), so
// building a message copies only its small framing. SliceReader walks a
// received ByteBuffer's slices in place and copies a payload out exactly
// once, to wherever the caller wants it, across slice boundaries.
//
// What is written is plain Protocol Buffers: any protobuf parser reads it,
// and any protobuf serializer's output is read here (fields in any order,
// unknown fields skipped).
#ifndef GRPS_WIRE_WIRE_FORMAT_H_
#define GRPS_WIRE_WIRE_FORMAT_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "grpcpp/support/byte_buffer.h"
#include "grpcpp/support/slice.h"
#include "wire/buffer_pool.h"

namespace grps {

// Protocol Buffers wire types (the low 3 bits of a field's key).
enum class WireType : uint32_t { kVarint = 0, kFixed64 = 1, kLen = 2, kFixed32 = 5 };

// Bytes of `value` as a varint (1 to 10).
size_t VarintSize(uint64_t value);
// Bytes MessageWriter::Varint writes for the field (0 for value 0).
size_t VarintFieldSize(uint32_t field, uint64_t value);
// Bytes of a length-delimited field with a body of `body_bytes` (BeginLen,
// ExternalBytes, OwnedBytes; String unless empty).
size_t LenFieldSize(uint32_t field, uint64_t body_bytes);

// Copies the bytes of `buffer`, slice after slice, to `dst` (room for
// buffer.Length() bytes); nothing for a buffer that holds no message.
void CopyBufferBytes(const grpc::ByteBuffer& buffer, char* dst);
// The bytes of `buffer`, joined (empty for a buffer that holds no message).
std::string BufferBytes(const grpc::ByteBuffer& buffer);

// Builds one message. Not thread-safe; one writer per message.
class MessageWriter {
 public:
  void Varint(uint32_t field, uint64_t value);  // omitted when 0, as proto3 does
  void String(uint32_t field, absl::string_view value);  // copied; omitted when empty
  // Starts a length-delimited field whose body (`body_bytes` long) the
  // caller then writes with the calls above and below. The caller must write
  // exactly that many bytes before the next field of this level.
  void BeginLen(uint32_t field, uint64_t body_bytes);
  // A `bytes` payload the writer does not copy: `data` must stay alive and
  // unchanged until the ByteBuffer from Finish() and every copy gRPC made of
  // it are gone (for an RPC: until it has completed).
  void ExternalBytes(uint32_t field, const void* data, size_t size);
  // The same for a payload the buffer takes over: freed with the last slice,
  // or given back to `recycle` (not owned; must outlive the buffer) if set.
  void OwnedBytes(uint32_t field, std::string data, BufferPool* recycle = nullptr);

  // The message so far; the writer is left empty.
  grpc::ByteBuffer Finish();

 private:
  void Key(uint32_t field, WireType type);
  void RawVarint(uint64_t value);
  void FlushHeader();

  std::string header_;  // framing not yet turned into a slice
  std::vector<grpc::Slice> slices_;
};

// Reads one message (or a length-delimited part of one) from the slices of a
// ByteBuffer, which must outlive the reader. Every read checks bounds: a
// truncated or malformed input is DATA_LOSS, never a read past the end.
class SliceReader {
 public:
  // An empty reader: at its end.
  SliceReader() = default;
  // Takes references to `buffer`'s slices (no copy of the data).
  static absl::StatusOr<SliceReader> Over(const grpc::ByteBuffer& buffer);

  bool AtEnd() const { return left_ == 0; }
  uint64_t left() const { return left_; }

  // The next field's number and wire type.
  absl::Status ReadKey(uint32_t* field, WireType* type);
  absl::Status ReadVarint(uint64_t* value);
  // A length prefix, checked against what is left.
  absl::Status ReadLength(uint64_t* length);
  // Copies the next `size` bytes to `dst`.
  absl::Status ReadBytes(void* dst, size_t size);
  // Skips a field's value of wire type `type`.
  absl::Status SkipValue(WireType type);
  // A reader over the next `size` bytes, which this reader skips.
  absl::StatusOr<SliceReader> Sub(uint64_t size);

 private:
  struct Shared {
    std::vector<grpc::Slice> slices;
  };
  absl::Status Skip(uint64_t size);
  // Moves `size` bytes on, copying them to `out` unless it is null.
  absl::Status Advance(uint64_t size, char* out);

  std::shared_ptr<const Shared> shared_;
  size_t slice_ = 0;   // current slice
  size_t offset_ = 0;  // within it
  uint64_t left_ = 0;  // bytes this reader may still read
};

}  // namespace grps

#endif  // GRPS_WIRE_WIRE_FORMAT_H_
