#include "data/idx_reader.h"

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <memory>
#include <optional>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "data/byte_source.h"

namespace grps {
namespace {

constexpr uint8_t kIdxUnsignedByte = 0x08;

std::string DimsString(const std::vector<uint32_t>& dims) {
  return absl::StrCat("[", absl::StrJoin(dims, ", "), "]");
}

uint32_t BigEndian32(const unsigned char* p) {
  return (uint32_t{p[0]} << 24) | (uint32_t{p[1]} << 16) |
         (uint32_t{p[2]} << 8) | uint32_t{p[3]};
}

// What a short read found, for messages: "the file holds only N bytes"
// (after decompression for gzip; noting a cut gzip stream).
std::string Holds(const ByteSource& source, uint64_t bytes) {
  std::string text = absl::StrCat("the file holds only ", bytes, " bytes");
  if (source.gzip()) {
    absl::StrAppend(&text, " after decompression");
    if (source.gzip_stream_cut()) {
      absl::StrAppend(&text, " (its gzip stream is cut short)");
    }
  }
  return text;
}

// A validated IDX header: the element payload is payload_bytes (the product
// of dims, at most the caller's max_bytes) and follows header_bytes.
struct IdxHeader {
  std::vector<uint32_t> dims;
  uint64_t header_bytes = 0;
  uint64_t payload_bytes = 0;

  uint64_t file_bytes() const { return header_bytes + payload_bytes; }
};

// Reads and validates the magic number and dimensions. When expected_magic
// is set, the magic number must equal it; `what` names the expected content
// in that message.
absl::StatusOr<IdxHeader> ReadHeader(ByteSource& source,
                                     const std::string& path,
                                     uint64_t max_bytes,
                                     std::optional<uint32_t> expected_magic,
                                     const char* what) {
  unsigned char magic[4];
  absl::StatusOr<size_t> got = source.Read(magic, sizeof(magic), path);
  if (!got.ok()) return got.status();
  if (*got < sizeof(magic)) {
    return absl::DataLossError(
        absl::StrCat(path, ": shorter than the 4-byte IDX magic number; ",
                     Holds(source, *got)));
  }
  const uint32_t magic_number = BigEndian32(magic);
  if (expected_magic.has_value() && magic_number != *expected_magic) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "%s: wrong magic number 0x%08x, expected 0x%08x (IDX %s)", path,
        magic_number, *expected_magic, what));
  }
  if (magic[0] != 0 || magic[1] != 0) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "%s: not an IDX file: magic number 0x%08x does not start with two "
        "zero bytes",
        path, magic_number));
  }
  if (magic[2] != kIdxUnsignedByte) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "%s: unsupported IDX element type 0x%02x (only unsigned byte, 0x08, "
        "is supported)",
        path, magic[2]));
  }
  const int num_dims = magic[3];
  if (num_dims == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": IDX header declares 0 dimensions"));
  }

  IdxHeader header;
  header.header_bytes = sizeof(magic) + 4 * uint64_t(num_dims);
  std::vector<unsigned char> raw_dims(4 * size_t(num_dims));
  got = source.Read(raw_dims.data(), raw_dims.size(), path);
  if (!got.ok()) return got.status();
  if (*got < raw_dims.size()) {
    return absl::DataLossError(absl::StrCat(
        path, ": shorter than its ", header.header_bytes, "-byte IDX header; ",
        Holds(source, sizeof(magic) + *got)));
  }
  header.dims.resize(num_dims);
  bool any_zero = false;
  for (int i = 0; i < num_dims; ++i) {
    header.dims[i] = BigEndian32(&raw_dims[4 * size_t(i)]);
    any_zero |= header.dims[i] == 0;
  }
  // Checked product: a product over max_bytes (including one that would
  // overflow 64 bits) is rejected before anything is allocated.
  if (!any_zero) {
    header.payload_bytes = 1;
    for (uint32_t d : header.dims) {
      if (header.payload_bytes > max_bytes / d) {
        return absl::ResourceExhaustedError(absl::StrCat(
            path, ": IDX header declares dimensions ", DimsString(header.dims),
            ", more than the limit of ", max_bytes, " bytes"));
      }
      header.payload_bytes *= d;
    }
  }
  return header;
}

// Reads the header's payload_bytes of elements, then checks that the data
// (and, for gzip, the stream) ends exactly there. A plain file's size is
// checked before allocating; a gzip stream's buffer grows only as data
// arrives, so a header that lies about its size costs no memory.
absl::StatusOr<std::vector<uint8_t>> ReadPayload(ByteSource& source,
                                                 const std::string& path,
                                                 const IdxHeader& header) {
  auto truncated = [&](uint64_t actual_file_bytes) {
    return absl::DataLossError(absl::StrCat(
        path, " is truncated: its header declares dimensions ",
        DimsString(header.dims), ", so ", header.file_bytes(),
        " bytes in all, but ", Holds(source, actual_file_bytes)));
  };
  auto trailing = [&](const std::string& actual) {
    return absl::DataLossError(absl::StrCat(
        path, " holds ", actual, " the ", header.file_bytes(),
        " bytes its header declares (dimensions ", DimsString(header.dims),
        ")"));
  };
  const std::optional<uint64_t> plain_size = source.plain_size();
  if (plain_size.has_value() && *plain_size < header.file_bytes()) {
    return truncated(*plain_size);
  }
  if (plain_size.has_value() && *plain_size > header.file_bytes()) {
    return trailing(absl::StrCat(*plain_size, " bytes, more than"));
  }

  constexpr uint64_t kFirstPiece = uint64_t{1} << 20;
  const uint64_t total = header.payload_bytes;
  std::vector<uint8_t> data;
  uint64_t filled = 0;
  while (filled < total) {
    const uint64_t piece =
        plain_size.has_value()
            ? total - filled
            : std::min(total - filled, std::max(kFirstPiece, filled));
    data.resize(filled + piece);
    absl::StatusOr<size_t> got =
        source.Read(data.data() + filled, piece, path);
    if (!got.ok()) return got.status();
    filled += *got;
    if (*got < piece) return truncated(header.header_bytes + filled);
  }
  // One more byte tells trailing data apart from the exact end; for gzip it
  // also makes zlib read and check the stream's CRC trailer.
  unsigned char extra;
  absl::StatusOr<size_t> got = source.Read(&extra, 1, path);
  if (!got.ok()) return got.status();
  if (*got != 0) return trailing("more than");
  if (source.gzip_stream_cut()) {
    return absl::DataLossError(absl::StrCat(
        path, ": gzip stream is cut short after its ", header.file_bytes(),
        " bytes of data"));
  }
  return data;
}

absl::StatusOr<IdxArray> ReadIdx(const std::string& path, uint64_t max_bytes,
                                 std::optional<uint32_t> expected_magic,
                                 const char* what) {
  // Keeps header + payload sizes far from 64-bit overflow.
  max_bytes = std::min(max_bytes, uint64_t{1} << 62);
  absl::StatusOr<ByteSource> source = ByteSource::Open(path, "an IDX file");
  if (!source.ok()) return source.status();
  absl::StatusOr<IdxHeader> header =
      ReadHeader(*source, path, max_bytes, expected_magic, what);
  if (!header.ok()) return header.status();
  absl::StatusOr<std::vector<uint8_t>> data =
      ReadPayload(*source, path, *header);
  if (!data.ok()) return data.status();
  IdxArray array;
  array.dims = std::move(header->dims);
  array.data = *std::move(data);
  return array;
}

}  // namespace

absl::StatusOr<IdxArray> ReadIdxFile(const std::string& path,
                                     uint64_t max_bytes) {
  return ReadIdx(path, max_bytes, std::nullopt, "");
}

absl::StatusOr<IdxImages> ReadIdxImages(const std::string& path,
                                        uint64_t max_bytes) {
  absl::StatusOr<IdxArray> array =
      ReadIdx(path, max_bytes, kIdxImagesMagic, "unsigned-byte images");
  if (!array.ok()) return array.status();
  IdxImages images;
  images.count = array->dims[0];
  images.rows = array->dims[1];
  images.cols = array->dims[2];
  if (images.rows == 0 || images.cols == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": images of ", images.rows, "x", images.cols,
                     " pixels hold no features"));
  }
  images.pixels = std::move(array->data);
  return images;
}

absl::StatusOr<IdxLabels> ReadIdxLabels(const std::string& path,
                                        uint64_t max_bytes) {
  absl::StatusOr<IdxArray> array =
      ReadIdx(path, max_bytes, kIdxLabelsMagic, "unsigned-byte labels");
  if (!array.ok()) return array.status();
  IdxLabels labels;
  labels.labels = std::move(array->data);
  return labels;
}

}  // namespace grps
