// Fuzz target: the libsvm parser (data/libsvm_reader.h), which reads the
// sparse data sets of the embedding model. The input is a file's text, given
// to ParseLibsvm in memory (ReadTextFile's plain and gzip reading is
// data/text_file_test's; the idx_reader target fuzzes the same zlib calls).
//
// Besides not crashing, what the reader promises:
//   * a set it returns satisfies SparseDataset's invariants (Create accepts
//     its parts again), holds an example, and its feature_space bounds its ids;
//   * a refusal is InvalidArgument naming the text ("input:LINE: ..." or
//     "input holds no examples");
//   * a text read 1-based reads 0-based too, every id (and the feature
//     space) one higher;
//   * passing the classes and feature space it inferred reads the same set;
//   * CRLF line ends read like LF ones.
#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "data/libsvm_reader.h"
#include "fuzz/fuzz_check.h"

namespace grps {
namespace {

constexpr char kName[] = "input";

bool Same(const SparseDataset& a, const SparseDataset& b) {
  return a.num_classes() == b.num_classes() && a.feature_space() == b.feature_space() &&
         a.offsets() == b.offsets() && a.all_ids() == b.all_ids() &&
         a.all_values() == b.all_values() && a.labels() == b.labels();
}

void CheckRead(const absl::StatusOr<SparseDataset>& data) {
  if (!data.ok()) {
    FUZZ_CHECK(data.status().code() == absl::StatusCode::kInvalidArgument,
               data.status().ToString());
    FUZZ_CHECK(absl::StartsWith(data.status().message(), absl::StrCat(kName, ":")) ||
                   data.status().message() == absl::StrCat(kName, " holds no examples"),
               data.status().ToString());
    return;
  }
  FUZZ_CHECK(data->num_examples() >= 1, "an empty set was returned");
  absl::StatusOr<SparseDataset> again =
      SparseDataset::Create(data->num_classes(), data->feature_space(), data->offsets(),
                            data->all_ids(), data->all_values(), data->labels());
  FUZZ_CHECK(again.ok(), again.status().ToString());
  if (data->nnz() > 0) FUZZ_CHECK(data->feature_space() > 0, "ids without a feature space");
}

}  // namespace
}  // namespace grps

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* bytes, size_t size) {
  using namespace grps;
  const absl::string_view text(reinterpret_cast<const char*>(bytes), size);

  const absl::StatusOr<SparseDataset> one_based = ParseLibsvm(text, kName);
  CheckRead(one_based);
  LibsvmOptions zero;
  zero.zero_based = true;
  const absl::StatusOr<SparseDataset> zero_based = ParseLibsvm(text, kName, zero);
  CheckRead(zero_based);
  if (!one_based.ok()) return 0;

  FUZZ_CHECK(zero_based.ok(), zero_based.status().ToString());
  FUZZ_CHECK(zero_based->offsets() == one_based->offsets() &&
                 zero_based->labels() == one_based->labels() &&
                 zero_based->all_values() == one_based->all_values() &&
                 zero_based->feature_space() ==
                     (one_based->nnz() > 0 ? one_based->feature_space() + 1 : 0),
             "0-based and 1-based reads differ in more than the ids");
  for (int64_t k = 0; k < one_based->nnz(); ++k) {
    FUZZ_CHECK(zero_based->all_ids()[k] == one_based->all_ids()[k] + 1,
               absl::StrCat("id ", k, " is ", zero_based->all_ids()[k], " 0-based but ",
                            one_based->all_ids()[k], " 1-based"));
  }

  LibsvmOptions pinned;
  pinned.num_classes = one_based->num_classes();
  pinned.feature_space = one_based->feature_space();
  const absl::StatusOr<SparseDataset> pinned_read = ParseLibsvm(text, kName, pinned);
  // feature_space 0 (no ids) passed back means "infer" again: still the same.
  FUZZ_CHECK(pinned_read.ok() && Same(*pinned_read, *one_based),
             absl::StrCat("passing the inferred options changed the read: ",
                          pinned_read.status().ToString()));

  if (!absl::StrContains(text, '\r')) {
    const std::string crlf = absl::StrReplaceAll(text, {{"\n", "\r\n"}});
    const absl::StatusOr<SparseDataset> crlf_read = ParseLibsvm(crlf, kName);
    FUZZ_CHECK(crlf_read.ok() && Same(*crlf_read, *one_based),
               absl::StrCat("CRLF line ends read differently: ", crlf_read.status().ToString()));
  }
  return 0;
}
