// ByteSource: a file opened for sequential reading, either plain or
// gzip-compressed (chosen by the 1f 8b magic bytes, not the name). What the
// IDX reader and the text readers (text_file.h) open their files with.
#ifndef GRPS_DATA_BYTE_SOURCE_H_
#define GRPS_DATA_BYTE_SOURCE_H_

#include <zlib.h>

#include <cstdint>
#include <cstdio>
#include <optional>
#include <string>
#include <utility>

#include "absl/status/statusor.h"

namespace grps {

// Move-only; closes the file on destruction.
class ByteSource {
 public:
  // Opens `path`. NotFound (or another errno status) when it cannot be
  // opened; InvalidArgument "<path> is a directory, not <kind>" for a
  // directory (`kind`: "an IDX file", "a text file").
  static absl::StatusOr<ByteSource> Open(const std::string& path, const char* kind);

  ByteSource(ByteSource&& other) noexcept { *this = std::move(other); }
  ByteSource& operator=(ByteSource&& other) noexcept;
  ~ByteSource();

  bool gzip() const { return gz_ != nullptr; }
  // The size of a plain regular file, known before reading it.
  std::optional<uint64_t> plain_size() const { return plain_size_; }
  // True once a read hit the end of a gzip stream that lacks its end (the
  // compressed file was cut short). Reads then report end of data.
  bool gzip_stream_cut() const { return gzip_stream_cut_; }

  // Reads up to n bytes into dst; returns fewer only at the end of the data.
  // A corrupt gzip stream is DataLoss, an I/O error its errno status;
  // `path` only names the file in messages.
  absl::StatusOr<size_t> Read(void* dst, size_t n, const std::string& path) {
    return gz_ != nullptr ? ReadGzip(dst, n, path) : ReadPlain(dst, n, path);
  }

 private:
  ByteSource() = default;
  absl::StatusOr<size_t> ReadPlain(void* dst, size_t n, const std::string& path);
  absl::StatusOr<size_t> ReadGzip(void* dst, size_t n, const std::string& path);

  FILE* file_ = nullptr;
  gzFile gz_ = nullptr;
  bool gzip_stream_cut_ = false;
  std::optional<uint64_t> plain_size_;
};

}  // namespace grps

#endif  // GRPS_DATA_BYTE_SOURCE_H_
