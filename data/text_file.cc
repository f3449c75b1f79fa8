#include "data/text_file.h"

#include <sys/stat.h>
#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <system_error>

#include "absl/strings/str_cat.h"

namespace grps {
namespace {

constexpr size_t kReadPiece = size_t{1} << 20;

absl::Status TooLong(const std::string& path, uint64_t max_bytes,
                     const char* how) {
  return absl::ResourceExhaustedError(absl::StrCat(
      path, " holds more than the limit of ", max_bytes, " bytes", how));
}

absl::StatusOr<std::string> ReadPlain(FILE* file, const std::string& path,
                                      uint64_t max_bytes) {
  struct stat st;
  if (fstat(fileno(file), &st) == 0 && S_ISREG(st.st_mode) &&
      static_cast<uint64_t>(st.st_size) > max_bytes) {
    return TooLong(path, max_bytes, "");
  }
  std::string text;
  while (true) {
    const size_t old_size = text.size();
    text.resize(old_size + kReadPiece);
    const size_t got = std::fread(text.data() + old_size, 1, kReadPiece, file);
    text.resize(old_size + got);
    if (text.size() > max_bytes) return TooLong(path, max_bytes, "");
    if (got < kReadPiece) break;
  }
  if (std::ferror(file)) {
    return absl::ErrnoToStatus(errno, absl::StrCat("cannot read ", path));
  }
  return text;
}

absl::StatusOr<std::string> ReadGzip(gzFile gz, const std::string& path,
                                     uint64_t max_bytes) {
  std::string text;
  while (true) {
    const size_t old_size = text.size();
    text.resize(old_size + kReadPiece);
    const int got = gzread(gz, text.data() + old_size, kReadPiece);
    text.resize(old_size + std::max(got, 0));
    if (text.size() > max_bytes) {
      return TooLong(path, max_bytes, " after decompression");
    }
    if (got == static_cast<int>(kReadPiece)) continue;
    // A short read: the end of the data, or an error.
    int err = Z_OK;
    const char* message = gzerror(gz, &err);
    if (err == Z_BUF_ERROR) {
      // zlib's "unexpected end of file": the stream stops mid-way.
      return absl::DataLossError(absl::StrCat(
          path, ": gzip stream is cut short after ", text.size(),
          " bytes of text"));
    }
    if (err == Z_ERRNO) {
      return absl::ErrnoToStatus(errno, absl::StrCat("cannot read ", path));
    }
    if (err != Z_OK || got < 0) {
      return absl::DataLossError(
          absl::StrCat(path, ": corrupt gzip data: ", message));
    }
    return text;
  }
}

}  // namespace

absl::StatusOr<std::string> ReadTextFile(const std::string& path,
                                         uint64_t max_bytes) {
  FILE* file = std::fopen(path.c_str(), "rb");
  if (file == nullptr) {
    return absl::ErrnoToStatus(errno, absl::StrCat("cannot open ", path));
  }
  struct stat st;
  if (fstat(fileno(file), &st) == 0 && S_ISDIR(st.st_mode)) {
    std::fclose(file);
    return absl::InvalidArgumentError(
        absl::StrCat(path, " is a directory, not a text file"));
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
    absl::StatusOr<std::string> text = ReadGzip(gz, path, max_bytes);
    gzclose(gz);
    return text;
  }
  std::rewind(file);
  absl::StatusOr<std::string> text = ReadPlain(file, path, max_bytes);
  std::fclose(file);
  return text;
}

bool TextLines::Next(absl::string_view* line) {
  if (done_ || rest_.empty()) return false;
  const size_t end = rest_.find('\n');
  absl::string_view found = rest_.substr(0, end);
  if (end == absl::string_view::npos) {
    done_ = true;
    rest_ = absl::string_view();
  } else {
    rest_.remove_prefix(end + 1);
  }
  if (!found.empty() && found.back() == '\r') found.remove_suffix(1);
  *line = found;
  ++number_;
  return true;
}

absl::Status LineError(absl::string_view name, int64_t line,
                       absl::string_view message) {
  return absl::InvalidArgumentError(
      absl::StrCat(name, ":", line, ": ", message));
}

absl::StatusOr<float> ParseFiniteFloat(absl::string_view token) {
  auto refuse = [token](absl::string_view why) {
    return absl::InvalidArgumentError(
        absl::StrCat("\"", token, "\" ", why));
  };
  absl::string_view digits = token;
  // from_chars takes no '+'; one is allowed, but not "+-1" or "++1".
  if (!digits.empty() && digits.front() == '+') {
    digits.remove_prefix(1);
    if (!digits.empty() && (digits.front() == '-' || digits.front() == '+')) {
      return refuse("is not a number");
    }
  }
  if (digits.empty()) return refuse("is not a number");
  double value = 0;
  const char* const end = digits.data() + digits.size();
  const std::from_chars_result result =
      std::from_chars(digits.data(), end, value);
  if (result.ec == std::errc::result_out_of_range && result.ptr == end) {
    // Beyond double's range: strtod tells a huge magnitude (HUGE_VAL) from
    // a tiny one (0 or a subnormal).
    const std::string copy(digits);
    value = std::strtod(copy.c_str(), nullptr);
    if (std::isinf(value)) return refuse("is too large for a float");
  } else if (result.ec != std::errc() || result.ptr != end) {
    return refuse("is not a number");
  }
  if (!std::isfinite(value)) return refuse("is not a finite number");
  if (std::fabs(value) > std::numeric_limits<float>::max()) {
    return refuse("is too large for a float");
  }
  return static_cast<float>(value);
}

absl::StatusOr<int64_t> ParseInt64(absl::string_view token) {
  int64_t value = 0;
  const char* const end = token.data() + token.size();
  const std::from_chars_result result =
      std::from_chars(token.data(), end, value);
  if (result.ec == std::errc::result_out_of_range) {
    return absl::InvalidArgumentError(
        absl::StrCat("\"", token, "\" is outside the range of int64"));
  }
  if (token.empty() || result.ec != std::errc() || result.ptr != end) {
    return absl::InvalidArgumentError(
        absl::StrCat("\"", token, "\" is not an integer"));
  }
  return value;
}

}  // namespace grps
