#include "data/byte_source.h"

#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace grps {

absl::StatusOr<ByteSource> ByteSource::Open(const std::string& path, const char* kind) {
  FILE* file = std::fopen(path.c_str(), "rb");
  if (file == nullptr) {
    return absl::ErrnoToStatus(errno, absl::StrCat("cannot open ", path));
  }
  struct stat st;
  if (fstat(fileno(file), &st) == 0 && S_ISDIR(st.st_mode)) {
    std::fclose(file);
    return absl::InvalidArgumentError(
        absl::StrCat(path, " is a directory, not ", kind));
  }
  unsigned char magic[2] = {0, 0};
  const size_t got = std::fread(magic, 1, 2, file);
  if (got == 2 && magic[0] == 0x1f && magic[1] == 0x8b) {
    std::fclose(file);
    gzFile gz = gzopen(path.c_str(), "rb");
    if (gz == nullptr) {
      return absl::ErrnoToStatus(errno, absl::StrCat("cannot open ", path));
    }
    gzbuffer(gz, 1 << 17);
    ByteSource source;
    source.gz_ = gz;
    return source;
  }
  std::rewind(file);
  ByteSource source;
  source.file_ = file;
  if (fstat(fileno(file), &st) == 0 && S_ISREG(st.st_mode)) {
    source.plain_size_ = static_cast<uint64_t>(st.st_size);
  }
  return source;
}

ByteSource& ByteSource::operator=(ByteSource&& other) noexcept {
  std::swap(file_, other.file_);
  std::swap(gz_, other.gz_);
  std::swap(gzip_stream_cut_, other.gzip_stream_cut_);
  std::swap(plain_size_, other.plain_size_);
  return *this;
}

ByteSource::~ByteSource() {
  if (file_ != nullptr) std::fclose(file_);
  if (gz_ != nullptr) gzclose(gz_);
}

absl::StatusOr<size_t> ByteSource::ReadPlain(void* dst, size_t n, const std::string& path) {
  const size_t got = std::fread(dst, 1, n, file_);
  if (got < n && std::ferror(file_)) {
    return absl::ErrnoToStatus(errno, absl::StrCat("cannot read ", path));
  }
  return got;
}

absl::StatusOr<size_t> ByteSource::ReadGzip(void* dst, size_t n, const std::string& path) {
  // gzread takes an unsigned count and returns an int: read in pieces.
  constexpr size_t kPiece = size_t{1} << 26;
  size_t total = 0;
  while (total < n) {
    const unsigned want =
        static_cast<unsigned>(std::min(kPiece, n - total));
    const int got = gzread(gz_, static_cast<char*>(dst) + total, want);
    if (got > 0) total += static_cast<size_t>(got);
    if (got >= 0 && static_cast<unsigned>(got) == want) continue;
    // A short read: the end of the data, or an error. zlib keeps handing
    // out what it decompressed before a cut, so a cut shows up here.
    int err = Z_OK;
    const char* message = gzerror(gz_, &err);
    if (err == Z_BUF_ERROR) {
      // zlib's "unexpected end of file": the compressed data stops
      // mid-stream. The caller reports it with the byte counts.
      gzip_stream_cut_ = true;
    } else if (err == Z_ERRNO) {
      return absl::ErrnoToStatus(errno, absl::StrCat("cannot read ", path));
    } else if (err != Z_OK || got < 0) {
      return absl::DataLossError(
          absl::StrCat(path, ": corrupt gzip data: ", message));
    }
    break;
  }
  return total;
}

}  // namespace grps
