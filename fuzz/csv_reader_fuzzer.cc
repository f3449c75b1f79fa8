// Fuzz target: the CSV parser (data/csv_reader.h), which reads dense data
// sets from text. The input is a file's text, given to ParseCsv in memory
// (ReadTextFile's plain and gzip reading is data/text_file_test's).
//
// Besides not crashing, what the reader promises:
//   * a set it returns satisfies Dataset's invariants (Create accepts its
//     parts again) and holds a row of a label and at least one feature;
//   * a refusal is InvalidArgument naming the text ("input:LINE: ..." or
//     "input holds no rows");
//   * with header, the text reads as it does without its first line;
//   * label_column -1 reads as the last column's number does;
//   * CRLF line ends read like LF ones.
#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "data/csv_reader.h"
#include "fuzz/fuzz_check.h"

namespace grps {
namespace {

constexpr char kName[] = "input";

bool Same(const Dataset& a, const Dataset& b) {
  return a.num_features() == b.num_features() && a.num_classes() == b.num_classes() &&
         a.features() == b.features() && a.labels() == b.labels();
}

// Whether two reads agree: both refused with the same code, or the same set.
bool SameRead(const absl::StatusOr<Dataset>& a, const absl::StatusOr<Dataset>& b) {
  if (a.ok() != b.ok()) return false;
  return a.ok() ? Same(*a, *b) : a.status().code() == b.status().code();
}

void CheckRead(const absl::StatusOr<Dataset>& data) {
  if (!data.ok()) {
    FUZZ_CHECK(data.status().code() == absl::StatusCode::kInvalidArgument,
               data.status().ToString());
    FUZZ_CHECK(absl::StartsWith(data.status().message(), absl::StrCat(kName, ":")) ||
                   data.status().message() == absl::StrCat(kName, " holds no rows"),
               data.status().ToString());
    return;
  }
  FUZZ_CHECK(data->num_examples() >= 1 && data->num_features() >= 1,
             absl::StrCat(data->num_examples(), " rows of ", data->num_features(), " features"));
  absl::StatusOr<Dataset> again = Dataset::Create(data->num_features(), data->num_classes(),
                                                  data->features(), data->labels());
  FUZZ_CHECK(again.ok(), again.status().ToString());
}

}  // namespace
}  // namespace grps

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* bytes, size_t size) {
  using namespace grps;
  const absl::string_view text(reinterpret_cast<const char*>(bytes), size);

  const absl::StatusOr<Dataset> plain = ParseCsv(text, kName);
  CheckRead(plain);

  CsvOptions header;
  header.header = true;
  const absl::StatusOr<Dataset> with_header = ParseCsv(text, kName, header);
  CheckRead(with_header);
  const size_t newline = text.find('\n');
  const absl::string_view rest =
      newline == absl::string_view::npos ? absl::string_view() : text.substr(newline + 1);
  // A byte order mark is only skipped at the start of the text.
  if (!absl::StartsWith(rest, "\xef\xbb\xbf")) {
    FUZZ_CHECK(SameRead(with_header, ParseCsv(rest, kName)),
               "a header line is not read as if it were absent");
  }

  CsvOptions last;
  last.label_column = -1;
  const absl::StatusOr<Dataset> label_last = ParseCsv(text, kName, last);
  CheckRead(label_last);
  if (label_last.ok()) {
    CsvOptions numbered;
    numbered.label_column = static_cast<int32_t>(label_last->num_features());
    FUZZ_CHECK(SameRead(label_last, ParseCsv(text, kName, numbered)),
               "label_column -1 and the last column's number read differently");
  }

  if (!absl::StrContains(text, '\r')) {
    const std::string crlf = absl::StrReplaceAll(text, {{"\n", "\r\n"}});
    FUZZ_CHECK(SameRead(plain, ParseCsv(crlf, kName)), "CRLF line ends read differently");
  }
  return 0;
}
