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

}  // namespace

absl::StatusOr<SparseDataset> ParseLibsvm(absl::string_view text,
                                          absl::string_view name,
                                          const LibsvmOptions& options) {
  if (options.num_classes < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "num_classes must be >= 0, got ", options.num_classes));
  }
  const bool zero_based = options.zero_based;
  const uint64_t feature_space = options.feature_space;
  std::vector<int64_t> offsets{0};
  std::vector<int64_t> ids;
  std::vector<float> values;
  std::vector<int32_t> labels;
  // The first lines that used the -1 convention and a non-binary label:
  // both in one file is an error.
  int64_t minus_one_line = 0;
  int64_t not_binary_line = 0;
  int32_t not_binary_label = 0;
  int64_t largest_id = -1;

  TextLines lines(text);
  absl::string_view line;
  while (lines.Next(&line)) {
    const int64_t n = lines.number();
    auto error = [&](absl::string_view message) {
      return LineError(name, n, message);
    };
    line = line.substr(0, line.find('#'));
    absl::string_view token;
    if (!NextToken(&line, &token)) continue;  // blank or comment only

    absl::StatusOr<Label> label = ParseLabel(token);
    if (!label.ok()) return error(label.status().message());
    if (label->minus_one && minus_one_line == 0) minus_one_line = n;
    if (label->not_binary && not_binary_line == 0) {
      not_binary_line = n;
      not_binary_label = label->value;
    }
    if (minus_one_line != 0 && not_binary_line != 0) {
      return error(absl::StrCat(
          "labels mix the binary -1/+1 convention (line ", minus_one_line,
          " has -1, read as class 0) with class ", not_binary_label,
          " (line ", not_binary_line, ")"));
    }
    if (options.num_classes != 0 && label->value >= options.num_classes) {
      return error(absl::StrCat("label ", token, " is outside [0, ",
                                options.num_classes, ")"));
    }

    const size_t first_entry = ids.size();
    while (NextToken(&line, &token)) {
      const size_t colon = token.find(':');
      if (colon == absl::string_view::npos) {
        return error(
            absl::StrCat("\"", token, "\" is not id:value (no ':')"));
      }
      absl::StatusOr<int64_t> written = ParseInt64(token.substr(0, colon));
      if (!written.ok()) {
        return error(absl::StrCat("id of \"", token,
                                  "\": ", written.status().message()));
      }
      if (!zero_based && *written < 1) {
        return error(absl::StrCat(
            "id ", *written, " is not a 1-based libsvm id (ids start at 1; "
            "set zero_based for files whose ids start at 0)"));
      }
      if (*written < 0) {
        return error(absl::StrCat("id ", *written, " is negative"));
      }
      const int64_t id = zero_based ? *written : *written - 1;
      if (feature_space != 0 && static_cast<uint64_t>(id) >= feature_space) {
        return error(absl::StrCat(
            "id ", *written, " is outside the feature space of ",
            feature_space, " ids (", Written(0, zero_based), "..",
            Written(static_cast<int64_t>(feature_space - 1), zero_based),
            ")"));
      }
      if (ids.size() > first_entry && id <= ids.back()) {
        if (id == ids.back()) {
          return error(absl::StrCat("id ", *written, " appears twice"));
        }
        return error(absl::StrCat("id ", *written, " follows id ",
                                  Written(ids.back(), zero_based),
                                  "; ids must be ascending"));
      }
      absl::StatusOr<float> value = ParseFiniteFloat(token.substr(colon + 1));
      if (!value.ok()) {
        return error(absl::StrCat("value of id ", *written, ": ",
                                  value.status().message()));
      }
      ids.push_back(id);
      values.push_back(*value);
      largest_id = std::max(largest_id, id);
    }
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
