#include "data/libsvm_reader.h"

#include <algorithm>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"

namespace grps {
namespace {

// Cuts the next space- or tab-separated token off the front of *rest;
// false when only separators are left.
bool NextToken(absl::string_view* rest, absl::string_view* token) {
  size_t begin = 0;
  while (begin < rest->size() && ((*rest)[begin] == ' ' ||
                                  (*rest)[begin] == '\t')) {
    ++begin;
  }
  if (begin == rest->size()) return false;
  size_t end = begin;
  while (end < rest->size() && (*rest)[end] != ' ' && (*rest)[end] != '\t') {
    ++end;
  }
  *token = rest->substr(begin, end - begin);
  rest->remove_prefix(end);
  return true;
}

// A parsed label: its class, and whether it was written "-1" (the binary
// convention) or as a class other than 1 (which that convention excludes).
struct Label {
  int32_t value = 0;
  bool minus_one = false;
  bool not_binary = false;
};

absl::StatusOr<Label> ParseLabel(absl::string_view token) {
  Label label;
  if (token == "-1") {
    label.minus_one = true;
    return label;
  }
  if (token == "+1") {
    label.value = 1;
    return label;
  }
  absl::StatusOr<int64_t> value = ParseInt64(token);
  if (!value.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("label ", value.status().message(),
                     " (labels are class indices >= 0, or -1/+1)"));
  }
  if (*value < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "label ", *value, " is negative (of negative labels only -1 is "
        "read, as class 0 of a -1/+1 set)"));
  }
  // Below int32's largest, so that largest label + 1 classes fits too.
  if (*value >= std::numeric_limits<int32_t>::max()) {
    return absl::InvalidArgumentError(
        absl::StrCat("label ", *value, " is too large for a class index"));
  }
  label.value = static_cast<int32_t>(*value);
  label.not_binary = label.value != 1;
  return label;
}

// The text of one id for messages: as the file writes it.
int64_t Written(int64_t stored, bool zero_based) {
  return zero_based ? stored : stored + 1;
}

// The label conventions a file used, and where each was first seen: the
// binary -1/+1 one and classes other than 1. Both in one file is an error.
class LabelConventions {
 public:
  // Notes the label of line `n`; the error's message says where the two
  // conventions met.
  absl::Status Note(const Label& label, int64_t n) {
    if (label.minus_one && minus_one_line_ == 0) minus_one_line_ = n;
    if (label.not_binary && not_binary_line_ == 0) {
      not_binary_line_ = n;
      not_binary_label_ = label.value;
    }
    if (minus_one_line_ != 0 && not_binary_line_ != 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "labels mix the binary -1/+1 convention (line ", minus_one_line_,
          " has -1, read as class 0) with class ", not_binary_label_,
          " (line ", not_binary_line_, ")"));
    }
    return absl::OkStatus();
  }

 private:
  int64_t minus_one_line_ = 0;
  int64_t not_binary_line_ = 0;
  int32_t not_binary_label_ = 0;
};

// One "id:value" token into *id (as stored: 0-based) and *value. `previous`
// is the id before it in the row (-1: none). The error's message says what
// is wrong with the entry.
absl::Status ParseEntry(absl::string_view token, const LibsvmOptions& options,
                        int64_t previous, int64_t* id, float* value) {
  const bool zero_based = options.zero_based;
  const uint64_t feature_space = options.feature_space;
  const size_t colon = token.find(':');
  if (colon == absl::string_view::npos) {
    return absl::InvalidArgumentError(
        absl::StrCat("\"", token, "\" is not id:value (no ':')"));
  }
  absl::StatusOr<int64_t> written = ParseInt64(token.substr(0, colon));
  if (!written.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "id of \"", token, "\": ", written.status().message()));
  }
  if (!zero_based && *written < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "id ", *written, " is not a 1-based libsvm id (ids start at 1; "
        "set zero_based for files whose ids start at 0)"));
  }
  if (*written < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("id ", *written, " is negative"));
  }
  *id = zero_based ? *written : *written - 1;
  if (feature_space != 0 && static_cast<uint64_t>(*id) >= feature_space) {
    return absl::InvalidArgumentError(absl::StrCat(
        "id ", *written, " is outside the feature space of ", feature_space,
        " ids (", Written(0, zero_based), "..",
        Written(static_cast<int64_t>(feature_space - 1), zero_based), ")"));
  }
  if (previous >= 0 && *id <= previous) {
    if (*id == previous) {
      return absl::InvalidArgumentError(
          absl::StrCat("id ", *written, " appears twice"));
    }
    return absl::InvalidArgumentError(absl::StrCat(
        "id ", *written, " follows id ", Written(previous, zero_based),
        "; ids must be ascending"));
  }
  absl::StatusOr<float> parsed = ParseFiniteFloat(token.substr(colon + 1));
  if (!parsed.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "value of id ", *written, ": ", parsed.status().message()));
  }
  *value = *parsed;
  return absl::OkStatus();
}

// Appends the entries left in *rest (one example's) to *ids and *values,
// raising *largest_id.
absl::Status ParseEntries(absl::string_view* rest, const LibsvmOptions& options,
                          std::vector<int64_t>* ids, std::vector<float>* values,
                          int64_t* largest_id) {
  int64_t previous = -1;
  absl::string_view token;
  while (NextToken(rest, &token)) {
    int64_t id = 0;
    float value = 0;
    if (absl::Status s = ParseEntry(token, options, previous, &id, &value);
        !s.ok()) {
      return s;
    }
    ids->push_back(id);
    values->push_back(value);
    *largest_id = std::max(*largest_id, id);
    previous = id;
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<SparseDataset> ParseLibsvm(absl::string_view text,
                                          absl::string_view name,
                                          const LibsvmOptions& options) {
  if (options.num_classes < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "num_classes must be >= 0, got ", options.num_classes));
  }
  std::vector<int64_t> offsets{0};
  std::vector<int64_t> ids;
  std::vector<float> values;
  std::vector<int32_t> labels;
  LabelConventions conventions;
  int64_t largest_id = -1;

  TextLines lines(text);
  absl::string_view line;
  while (lines.Next(&line)) {
    const int64_t n = lines.number();
    line = line.substr(0, line.find('#'));
    absl::string_view token;
    if (!NextToken(&line, &token)) continue;  // blank or comment only

    absl::StatusOr<Label> label = ParseLabel(token);
    absl::Status s = label.status();
    if (s.ok()) s = conventions.Note(*label, n);
    if (s.ok() && options.num_classes != 0 &&
        label->value >= options.num_classes) {
      s = absl::InvalidArgumentError(absl::StrCat(
          "label ", token, " is outside [0, ", options.num_classes, ")"));
    }
    if (s.ok()) s = ParseEntries(&line, options, &ids, &values, &largest_id);
    if (!s.ok()) return LineError(name, n, s.message());
    offsets.push_back(static_cast<int64_t>(ids.size()));
    labels.push_back(label->value);
  }

  if (labels.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(name, " holds no examples"));
  }
  int32_t num_classes = options.num_classes;
  if (num_classes == 0) {
    num_classes = 1 + *std::max_element(labels.begin(), labels.end());
  }
  const uint64_t feature_space = options.feature_space;
  return SparseDataset::Create(
      num_classes,
      feature_space != 0 ? feature_space
                         : static_cast<uint64_t>(largest_id) + 1,
      std::move(offsets), std::move(ids), std::move(values),
      std::move(labels));
}

absl::StatusOr<SparseDataset> ReadLibsvm(const std::string& path,
                                         const LibsvmOptions& options) {
  absl::StatusOr<std::string> text = ReadTextFile(path, options.max_bytes);
  if (!text.ok()) return text.status();
  return ParseLibsvm(*text, path, options);
}

}  // namespace grps
