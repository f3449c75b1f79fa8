// Reads dense classification data from CSV text into a Dataset
// (dataset.h): one example per line, comma-separated, one column the label
// and every other column a feature, in order.
//
// The format this reader accepts, and nothing looser:
//   * fields are numbers; spaces and tabs around a field are ignored, and
//     there is no quoting (a '"' is not part of any number);
//   * the label is a non-negative decimal integer ("3", not "3.0");
//   * a feature is a finite float (text_file.h's ParseFiniteFloat: no
//     "nan", "inf" or trailing characters);
//   * every row has the same number of columns, at least 2;
//   * blank lines are skipped; a UTF-8 byte order mark before the first
//     line is ignored; CRLF line ends read like LF ones.
// The file may be stored plain or gzip-compressed (recognised by its magic
// bytes, see text_file.h).
//
// Every malformed row makes the whole read fail (nothing half-loaded is
// returned) with InvalidArgument "PATH:LINE: what is wrong". A file with no
// rows, or a label_column outside the rows, is InvalidArgument too;
// NotFound, ResourceExhausted and DataLoss are ReadTextFile's.
#ifndef GRPS_DATA_CSV_READER_H_
#define GRPS_DATA_CSV_READER_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "data/dataset.h"
#include "data/text_file.h"

namespace grps {

struct CsvOptions {
  // The first line is a header and is skipped, whatever it holds.
  bool header = false;
  // The label's column, counted from 0; -1 is the last column.
  int32_t label_column = 0;
  // Labels must lie in [0, num_classes); 0 takes the largest label + 1
  // (see LibsvmOptions::num_classes for when to pass the count).
  int32_t num_classes = 0;
  // Largest text (after decompression) read; ResourceExhausted beyond it.
  // The parsed set is at most about twice the text's size (a feature "0,"
  // of 2 bytes becomes a 4-byte float).
  uint64_t max_bytes = kDefaultMaxTextBytes;
};

// Reads the file at `path`; errors as above, each naming the path.
absl::StatusOr<Dataset> ReadCsv(const std::string& path,
                                const CsvOptions& options = {});

// Parses a text already in memory; `name` stands for the path in error
// messages. options.max_bytes does not apply.
absl::StatusOr<Dataset> ParseCsv(absl::string_view text, absl::string_view name,
                                 const CsvOptions& options = {});

}  // namespace grps

#endif  // GRPS_DATA_CSV_READER_H_
