// Reads IDX files, the format of MNIST and Fashion-MNIST: a 4-byte magic
// number (two zero bytes, a dtype byte, a dimension count), one big-endian
// uint32 per dimension, then the elements in row-major order.
//
// Only unsigned-byte elements (dtype 0x08) are supported, which is what the
// MNIST family uses. A file may be stored plain or gzip-compressed; gzip is
// recognised by its magic bytes 1f 8b, not by the file name.
//
// A bad file is an error Status, never a crash:
//   NotFound          the file does not exist
//   InvalidArgument   wrong magic number, unsupported dtype, wrong dimension
//                     count, an empty image shape
//   DataLoss          the file holds fewer or more bytes than its header
//                     declares, or its gzip stream is corrupt
//   ResourceExhausted the header declares more than max_bytes of elements
//                     (this also catches dimension products that overflow)
// Every message names the file.
#ifndef GRPS_DATA_IDX_READER_H_
#define GRPS_DATA_IDX_READER_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace grps {

// Largest element payload accepted by default: 1 GiB, twenty times
// Fashion-MNIST's training images. Bounds the memory a corrupt header or a
// gzip bomb can make the reader allocate.
inline constexpr uint64_t kDefaultMaxIdxBytes = uint64_t{1} << 30;

inline constexpr uint32_t kIdxImagesMagic = 0x00000803;  // u8, 3 dimensions
inline constexpr uint32_t kIdxLabelsMagic = 0x00000801;  // u8, 1 dimension

// Any unsigned-byte IDX array: dims as in the header, data holds exactly
// the product of dims bytes.
struct IdxArray {
  std::vector<uint32_t> dims;
  std::vector<uint8_t> data;
};

// Images: data[(i * rows + r) * cols + c] is pixel (r, c) of image i.
struct IdxImages {
  int64_t count = 0;
  int64_t rows = 0;
  int64_t cols = 0;
  std::vector<uint8_t> pixels;  // count * rows * cols bytes
};

struct IdxLabels {
  std::vector<uint8_t> labels;  // one per example
};

// Reads an unsigned-byte IDX file with any number (1..255) of dimensions.
// Reads no more than the header and max_bytes of elements (plus one byte to
// detect trailing data), whatever the file's size.
absl::StatusOr<IdxArray> ReadIdxFile(const std::string& path,
                                     uint64_t max_bytes = kDefaultMaxIdxBytes);

// Reads an image file: magic must be kIdxImagesMagic, rows and cols >= 1.
absl::StatusOr<IdxImages> ReadIdxImages(
    const std::string& path, uint64_t max_bytes = kDefaultMaxIdxBytes);

// Reads a label file: magic must be kIdxLabelsMagic.
absl::StatusOr<IdxLabels> ReadIdxLabels(
    const std::string& path, uint64_t max_bytes = kDefaultMaxIdxBytes);

}  // namespace grps

#endif  // GRPS_DATA_IDX_READER_H_
