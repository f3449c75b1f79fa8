// Reads sparse classification data in the libsvm (SVMlight) text format
// into a SparseDataset (sparse_dataset.h). One example per line:
//
//   label id:value id:value ...   # an optional comment
//
// separated by spaces or tabs. Everything from '#' to the end of a line is
// a comment; lines that hold nothing else are skipped, as are blank ones.
// The file may be stored plain or gzip-compressed (recognised by its magic
// bytes, see text_file.h).
//
// Labels are class indices: non-negative decimal integers. The binary
// convention of many libsvm sets, "-1" and "+1", is read as classes 0 and 1
// ("+1" and "1" are the same class); a file that uses -1 may hold no other
// labels than -1 and (+)1, since 0 would then mean the same class as -1.
// Any other label (a fraction, "+2", "-3") is refused.
//
// Ids are integers, strictly ascending within a line. libsvm numbers them
// from 1 and so does this reader by default: id j is stored as j - 1, and
// id 0 is refused. With zero_based, ids are stored as written and must be
// >= 0. Values are finite floats (text_file.h's ParseFiniteFloat). SVMlight's
// "qid:N" is not an id, so is refused like any other.
//
// Every malformed line makes the whole read fail (nothing half-loaded is
// returned) with InvalidArgument "PATH:LINE: what is wrong": a missing ':',
// an id or label that is not an integer, an id out of range (0 in a 1-based
// file, negative, >= feature_space), ids not ascending or duplicated, a
// value that is not a finite float, a label >= num_classes. A file with no
// examples is InvalidArgument too; NotFound, ResourceExhausted and DataLoss
// are ReadTextFile's.
#ifndef GRPS_DATA_LIBSVM_READER_H_
#define GRPS_DATA_LIBSVM_READER_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "data/sparse_dataset.h"
#include "data/text_file.h"

namespace grps {

struct LibsvmOptions {
  // Labels must lie in [0, num_classes); 0 takes the largest label + 1.
  // That rule suits a whole set but may give a train/test split different
  // counts, so pass the count when two files must agree.
  int32_t num_classes = 0;
  // false: ids are 1-based as libsvm writes them and are stored minus 1.
  // true: ids are stored as written.
  bool zero_based = false;
  // Every (stored) id must be below it; 0 takes the largest stored id + 1
  // (0 when the file holds no ids at all, which SparseDataset reads as no
  // bound). Pass it when train and test must share one id space.
  uint64_t feature_space = 0;
  // Largest text (after decompression) read; ResourceExhausted beyond it.
  // The parsed set is at most about six times the text's size (a line "0"
  // of 2 bytes becomes an 8-byte offset and a 4-byte label; an entry "1:1 "
  // of 4 bytes an 8-byte id and a 4-byte value).
  uint64_t max_bytes = kDefaultMaxTextBytes;
};

// Reads the file at `path`; errors as above, each naming the path.
absl::StatusOr<SparseDataset> ReadLibsvm(const std::string& path,
                                         const LibsvmOptions& options = {});

// Parses a text already in memory; `name` stands for the path in error
// messages. options.max_bytes does not apply.
absl::StatusOr<SparseDataset> ParseLibsvm(absl::string_view text,
                                          absl::string_view name,
                                          const LibsvmOptions& options = {});

}  // namespace grps

#endif  // GRPS_DATA_LIBSVM_READER_H_
