#include "wire/wire_format.h"

#include <algorithm>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"

namespace grps {
namespace {

uint32_t KeyOf(uint32_t field, WireType type) {
  return (field << 3) | static_cast<uint32_t>(type);
}

// What an owned payload's slice holds on to until gRPC releases it.
struct OwnedPayload {
  std::string data;
  BufferPool* recycle;
};

void ReleasePayload(void* user_data) {
  auto* owned = static_cast<OwnedPayload*>(user_data);
  if (owned->recycle != nullptr) owned->recycle->Give(std::move(owned->data));
  delete owned;
}

absl::Status Truncated(absl::string_view what) {
  return absl::DataLossError(absl::StrCat("malformed message: ", what));
}

}  // namespace

size_t VarintSize(uint64_t value) {
  size_t n = 1;
  while (value >= 0x80) {
    value >>= 7;
    ++n;
  }
  return n;
}

size_t VarintFieldSize(uint32_t field, uint64_t value) {
  if (value == 0) return 0;
  return VarintSize(KeyOf(field, WireType::kVarint)) + VarintSize(value);
}

size_t LenFieldSize(uint32_t field, uint64_t body_bytes) {
  return VarintSize(KeyOf(field, WireType::kLen)) + VarintSize(body_bytes) + body_bytes;
}

void CopyBufferBytes(const grpc::ByteBuffer& buffer, char* dst) {
  std::vector<grpc::Slice> slices;
  if (!buffer.Valid() || !buffer.Dump(&slices).ok()) return;
  for (const grpc::Slice& s : slices) {
    std::memcpy(dst, s.begin(), s.size());
    dst += s.size();
  }
}

std::string BufferBytes(const grpc::ByteBuffer& buffer) {
  std::string out(buffer.Valid() ? buffer.Length() : 0, '\0');
  CopyBufferBytes(buffer, out.data());
  return out;
}

// ---- MessageWriter ----

void MessageWriter::RawVarint(uint64_t value) {
  while (value >= 0x80) {
    header_.push_back(static_cast<char>((value & 0x7f) | 0x80));
    value >>= 7;
  }
  header_.push_back(static_cast<char>(value));
}

void MessageWriter::Key(uint32_t field, WireType type) { RawVarint(KeyOf(field, type)); }

void MessageWriter::Varint(uint32_t field, uint64_t value) {
  if (value == 0) return;
  Key(field, WireType::kVarint);
  RawVarint(value);
}

void MessageWriter::String(uint32_t field, absl::string_view value) {
  if (value.empty()) return;
  BeginLen(field, value.size());
  header_.append(value.data(), value.size());
}

void MessageWriter::BeginLen(uint32_t field, uint64_t body_bytes) {
  Key(field, WireType::kLen);
  RawVarint(body_bytes);
}

void MessageWriter::FlushHeader() {
  if (header_.empty()) return;
  slices_.emplace_back(header_);  // copies the framing: a few bytes
  header_.clear();
}

void MessageWriter::ExternalBytes(uint32_t field, const void* data, size_t size) {
  BeginLen(field, size);
  if (size == 0) return;
  FlushHeader();
  slices_.emplace_back(data, size, grpc::Slice::STATIC_SLICE);
}

void MessageWriter::OwnedBytes(uint32_t field, std::string data, BufferPool* recycle) {
  BeginLen(field, data.size());
  if (data.empty()) return;
  FlushHeader();
  auto* owned = new OwnedPayload{std::move(data), recycle};
  slices_.emplace_back(owned->data.data(), owned->data.size(), ReleasePayload, owned);
}

grpc::ByteBuffer MessageWriter::Finish() {
  FlushHeader();
  grpc::ByteBuffer buffer(slices_.data(), slices_.size());
  slices_.clear();
  return buffer;
}

// ---- SliceReader ----

absl::StatusOr<SliceReader> SliceReader::Over(const grpc::ByteBuffer& buffer) {
  auto shared = std::make_shared<Shared>();
  if (buffer.Valid()) {
    grpc::Status st = buffer.Dump(&shared->slices);
    if (!st.ok())
      return absl::DataLossError(absl::StrCat("cannot read message: ", st.error_message()));
  }
  SliceReader r;
  for (const grpc::Slice& s : shared->slices) r.left_ += s.size();
  r.shared_ = std::move(shared);
  // Start at the first non-empty slice.
  while (r.slice_ < r.shared_->slices.size() && r.shared_->slices[r.slice_].size() == 0)
    ++r.slice_;
  return r;
}

absl::Status SliceReader::Advance(uint64_t size, char* out) {
  if (size > left_) return Truncated("a field runs past the end");
  left_ -= size;
  while (size > 0) {
    const grpc::Slice& s = shared_->slices[slice_];
    const uint64_t n = std::min<uint64_t>(size, s.size() - offset_);
    if (out != nullptr) {
      std::memcpy(out, s.begin() + offset_, n);
      out += n;
    }
    size -= n;
    offset_ += n;
    if (offset_ == s.size()) {
      offset_ = 0;
      ++slice_;
    }
  }
  return absl::OkStatus();
}

absl::Status SliceReader::ReadBytes(void* dst, size_t size) {
  return Advance(size, static_cast<char*>(dst));
}

absl::Status SliceReader::Skip(uint64_t size) { return Advance(size, nullptr); }

absl::Status SliceReader::ReadVarint(uint64_t* value) {
  uint64_t v = 0;
  for (int shift = 0; shift < 64; shift += 7) {
    uint8_t byte;
    if (absl::Status s = ReadBytes(&byte, 1); !s.ok()) return s;
    v |= static_cast<uint64_t>(byte & 0x7f) << shift;
    if ((byte & 0x80) == 0) {
      *value = v;
      return absl::OkStatus();
    }
  }
  return Truncated("a varint longer than 10 bytes");
}

absl::Status SliceReader::ReadKey(uint32_t* field, WireType* type) {
  uint64_t key;
  if (absl::Status s = ReadVarint(&key); !s.ok()) return s;
  const uint64_t wire = key & 7;
  if (key >> 3 == 0 || key >> 3 > 0x1fffffff || wire == 3 || wire == 4 || wire > 5)
    return Truncated(absl::StrCat("bad field key ", key));
  *field = static_cast<uint32_t>(key >> 3);
  *type = static_cast<WireType>(wire);
  return absl::OkStatus();
}

absl::Status SliceReader::ReadLength(uint64_t* length) {
  if (absl::Status s = ReadVarint(length); !s.ok()) return s;
  if (*length > left_) return Truncated("a length runs past the end");
  return absl::OkStatus();
}

absl::Status SliceReader::SkipValue(WireType type) {
  switch (type) {
    case WireType::kVarint: {
      uint64_t ignored;
      return ReadVarint(&ignored);
    }
    case WireType::kFixed64:
      return Skip(8);
    case WireType::kFixed32:
      return Skip(4);
    case WireType::kLen: {
      uint64_t length;
      if (absl::Status s = ReadLength(&length); !s.ok()) return s;
      return Skip(length);
    }
  }
  return Truncated("unknown wire type");
}

absl::StatusOr<SliceReader> SliceReader::Sub(uint64_t size) {
  if (size > left_) return Truncated("a field runs past the end");
  SliceReader sub = *this;
  sub.left_ = size;
  if (absl::Status s = Skip(size); !s.ok()) return s;
  return sub;
}

}  // namespace grps
