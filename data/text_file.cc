#include "data/text_file.h"

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <system_error>

#include "absl/strings/str_cat.h"
#include "data/byte_source.h"

namespace grps {
namespace {

constexpr size_t kReadPiece = size_t{1} << 20;

absl::Status TooLong(const std::string& path, uint64_t max_bytes,
                     const char* how) {
  return absl::ResourceExhaustedError(absl::StrCat(
      path, " holds more than the limit of ", max_bytes, " bytes", how));
}

}  // namespace

absl::StatusOr<std::string> ReadTextFile(const std::string& path,
                                         uint64_t max_bytes) {
  absl::StatusOr<ByteSource> source = ByteSource::Open(path, "a text file");
  if (!source.ok()) return source.status();
  if (source->plain_size().has_value() && *source->plain_size() > max_bytes)
    return TooLong(path, max_bytes, "");
  const char* how = source->gzip() ? " after decompression" : "";
  std::string text;
  while (true) {
    const size_t old_size = text.size();
    text.resize(old_size + kReadPiece);
    absl::StatusOr<size_t> got = source->Read(text.data() + old_size, kReadPiece, path);
    if (!got.ok()) return got.status();
    text.resize(old_size + *got);
    if (text.size() > max_bytes) return TooLong(path, max_bytes, how);
    if (*got < kReadPiece) break;
  }
  if (source->gzip_stream_cut())
    return absl::DataLossError(absl::StrCat(path, ": gzip stream is cut short after ",
                                            text.size(), " bytes of text"));
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
