#include "data/csv_reader.h"

#include <algorithm>
#include <limits>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace grps {
namespace {

absl::string_view TrimSpaces(absl::string_view field) {
  while (!field.empty() && (field.front() == ' ' || field.front() == '\t')) {
    field.remove_prefix(1);
  }
  while (!field.empty() && (field.back() == ' ' || field.back() == '\t')) {
    field.remove_suffix(1);
  }
  return field;
}

absl::StatusOr<int32_t> ParseLabel(absl::string_view field) {
  absl::StatusOr<int64_t> value = ParseInt64(field);
  if (!value.ok()) return value.status();
  if (*value < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(*value, " is negative (labels are class indices)"));
  }
  // Below int32's largest, so that largest label + 1 classes fits too.
  if (*value >= std::numeric_limits<int32_t>::max()) {
    return absl::InvalidArgumentError(
        absl::StrCat(*value, " is too large for a class index"));
  }
  return static_cast<int32_t>(*value);
}

absl::Status CheckOptions(const CsvOptions& options) {
  if (options.num_classes < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "num_classes must be >= 0, got ", options.num_classes));
  }
  if (options.label_column < -1) {
    return absl::InvalidArgumentError(
        absl::StrCat("label_column must be >= 0, or -1 for the last column; "
                     "got ", options.label_column));
  }
  return absl::OkStatus();
}

// The shape every row must have, fixed by the first row.
struct RowShape {
  int64_t columns = 0;         // 0 until the first row is read
  int64_t first_row_line = 0;  // where `columns` was set
  int64_t label_column = 0;
};

// Checks the column count of the row on line `n` against *shape, which the
// first row sets. The error's message says what is wrong with the row.
absl::Status CheckColumns(absl::string_view line, int64_t n,
                          const CsvOptions& options, RowShape* shape) {
  const int64_t row_columns = std::count(line.begin(), line.end(), ',') + 1;
  if (shape->columns == 0) {
    if (row_columns < 2) {
      return absl::InvalidArgumentError(
          "a row needs a label and at least one feature, this one has 1 "
          "column");
    }
    if (options.label_column >= row_columns) {
      return absl::InvalidArgumentError(
          absl::StrCat("label_column ", options.label_column,
                       " is outside the row's ", row_columns, " columns"));
    }
    shape->columns = row_columns;
    shape->first_row_line = n;
    shape->label_column =
        options.label_column == -1 ? row_columns - 1 : options.label_column;
  } else if (row_columns != shape->columns) {
    return absl::InvalidArgumentError(
        absl::StrCat("row has ", row_columns, " columns, but line ",
                     shape->first_row_line, " has ", shape->columns));
  }
  return absl::OkStatus();
}

// Appends the row's label and features. The error's message says which
// field is wrong and how.
absl::Status ParseRow(absl::string_view line, int64_t label_column,
                      int32_t num_classes, std::vector<float>* features,
                      std::vector<int32_t>* labels) {
  int64_t column = 0;
  while (true) {
    const size_t comma = line.find(',');
    const absl::string_view field = TrimSpaces(line.substr(0, comma));
    if (column == label_column) {
      absl::StatusOr<int32_t> label = ParseLabel(field);
      if (!label.ok()) {
        return absl::InvalidArgumentError(absl::StrCat(
            "label (column ", column, "): ", label.status().message()));
      }
      if (num_classes != 0 && *label >= num_classes) {
        return absl::InvalidArgumentError(absl::StrCat(
            "label ", *label, " is outside [0, ", num_classes, ")"));
      }
      labels->push_back(*label);
    } else {
      absl::StatusOr<float> value = ParseFiniteFloat(field);
      if (!value.ok()) {
        return absl::InvalidArgumentError(
            absl::StrCat("column ", column, ": ", value.status().message()));
      }
      features->push_back(*value);
    }
    if (comma == absl::string_view::npos) return absl::OkStatus();
    line.remove_prefix(comma + 1);
    ++column;
  }
}

}  // namespace

absl::StatusOr<Dataset> ParseCsv(absl::string_view text, absl::string_view name,
                                 const CsvOptions& options) {
  if (absl::Status s = CheckOptions(options); !s.ok()) return s;
  constexpr absl::string_view kUtf8Bom = "\xef\xbb\xbf";
  if (absl::StartsWith(text, kUtf8Bom)) text.remove_prefix(kUtf8Bom.size());

  std::vector<float> features;
  std::vector<int32_t> labels;
  RowShape shape;
  TextLines lines(text);
  absl::string_view line;
  while (lines.Next(&line)) {
    const int64_t n = lines.number();
    if (n == 1 && options.header) continue;
    if (TrimSpaces(line).empty()) continue;
    absl::Status s = CheckColumns(line, n, options, &shape);
    if (s.ok()) {
      s = ParseRow(line, shape.label_column, options.num_classes, &features,
                   &labels);
    }
    if (!s.ok()) return LineError(name, n, s.message());
  }

  if (labels.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(name, " holds no rows"));
  }
  int32_t num_classes = options.num_classes;
  if (num_classes == 0) {
    num_classes = 1 + *std::max_element(labels.begin(), labels.end());
  }
  return Dataset::Create(shape.columns - 1, num_classes, std::move(features),
                         std::move(labels));
}

absl::StatusOr<Dataset> ReadCsv(const std::string& path,
                                const CsvOptions& options) {
  absl::StatusOr<std::string> text = ReadTextFile(path, options.max_bytes);
  if (!text.ok()) return text.status();
  return ParseCsv(*text, path, options);
}

}  // namespace grps
