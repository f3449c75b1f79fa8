// What the text data readers (libsvm_reader.h, csv_reader.h) share: a whole
// file read into memory, plain or gzip, bounded in size; its lines,
// numbered; strict number parsing; and their "NAME:LINE: what is wrong"
// errors.
#ifndef GRPS_DATA_TEXT_FILE_H_
#define GRPS_DATA_TEXT_FILE_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace grps {

// Largest text accepted by default: 1 GiB after decompression. Bounds the
// memory a big file or a gzip bomb can make a reader allocate.
inline constexpr uint64_t kDefaultMaxTextBytes = uint64_t{1} << 30;

// The file's bytes; decompressed when the file starts with the gzip magic
// bytes 1f 8b (the content decides, not the name). Never holds more than
// max_bytes (+ one read buffer while finding out). Errors name the file:
//   NotFound          the file does not exist
//   InvalidArgument   the path is a directory
//   ResourceExhausted the text is longer than max_bytes
//   DataLoss          the gzip stream is corrupt or cut short
absl::StatusOr<std::string> ReadTextFile(
    const std::string& path, uint64_t max_bytes = kDefaultMaxTextBytes);

// The lines of a text, in order and numbered from 1. A line ends at '\n',
// which it does not include, nor a '\r' just before it (so CRLF files read
// like LF ones); a last line without '\n' is a line, an empty text has
// none. Views into the text, which must outlive the TextLines.
class TextLines {
 public:
  explicit TextLines(absl::string_view text) : rest_(text) {}

  // Sets *line to the next line and returns true, or returns false when
  // every line was handed out.
  bool Next(absl::string_view* line);
  // The number of the line Next last handed out (0 before the first).
  int64_t number() const { return number_; }

 private:
  absl::string_view rest_;
  bool done_ = false;
  int64_t number_ = 0;
};

// InvalidArgument "NAME:LINE: message"; NAME is the file's path, or
// whatever names an in-memory text.
absl::Status LineError(absl::string_view name, int64_t line,
                       absl::string_view message);

// Strict parsing of one whole token, no space around it. On failure,
// InvalidArgument whose message says what is wrong with the token (quoted)
// but not where: callers wrap it in a LineError.
//
// A float is decimal ([+-]digits[.digits][e[+-]digits], as std::from_chars
// reads it, with an optional leading '+'), finite, and within float's range
// (a magnitude below float's smallest rounds to 0 or a subnormal; one above
// its largest is refused, not turned into infinity). "nan", "inf", hex and
// trailing characters are refused.
absl::StatusOr<float> ParseFiniteFloat(absl::string_view token);
// A decimal int64 with an optional leading '-'; no '+', no overflow.
absl::StatusOr<int64_t> ParseInt64(absl::string_view token);

}  // namespace grps

#endif  // GRPS_DATA_TEXT_FILE_H_
