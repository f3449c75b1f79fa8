#include "data/dataset.h"

#include <sys/stat.h>

#include <algorithm>
#include <array>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "data/idx_reader.h"

namespace grps {

absl::StatusOr<Dataset> Dataset::Create(int64_t num_features,
                                        int32_t num_classes,
                                        std::vector<float> features,
                                        std::vector<int32_t> labels) {
  if (num_features < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("a dataset needs at least one feature, got ",
                     num_features));
  }
  if (num_classes < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "a dataset needs at least one class, got ", num_classes));
  }
  const uint64_t rows = labels.size();
  if (features.size() % static_cast<uint64_t>(num_features) != 0 ||
      features.size() / static_cast<uint64_t>(num_features) != rows) {
    return absl::InvalidArgumentError(absl::StrCat(
        "dataset holds ", features.size(), " features for ", rows,
        " labels; expected ", num_features, " features per example"));
  }
  for (uint64_t i = 0; i < rows; ++i) {
    if (labels[i] < 0 || labels[i] >= num_classes) {
      return absl::InvalidArgumentError(
          absl::StrCat("label ", labels[i], " of example ", i,
                       " is outside [0, ", num_classes, ")"));
    }
  }
  Dataset dataset;
  dataset.num_features_ = num_features;
  dataset.num_classes_ = num_classes;
  dataset.features_ = std::move(features);
  dataset.labels_ = std::move(labels);
  return dataset;
}

absl::Status CheckSubsetRange(int64_t first, int64_t count, int64_t num_examples) {
  if (first < 0 || count < 0 || first > num_examples || count > num_examples - first) {
    return absl::OutOfRangeError(absl::StrCat(
        "subset [", first, ", ", first, " + ", count,
        ") is not within the dataset's ", num_examples, " examples"));
  }
  return absl::OkStatus();
}

absl::Status CheckExampleIndices(absl::Span<const int64_t> indices, int64_t num_examples) {
  for (int64_t index : indices) {
    if (index < 0 || index >= num_examples) {
      return absl::OutOfRangeError(absl::StrCat(
          "example index ", index, " is outside [0, ", num_examples, ")"));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<Dataset> Dataset::Subset(int64_t first, int64_t count) const {
  if (absl::Status s = CheckSubsetRange(first, count, num_examples()); !s.ok()) return s;
  Dataset subset;
  subset.num_features_ = num_features_;
  subset.num_classes_ = num_classes_;
  subset.features_.assign(features_.begin() + first * num_features_,
                          features_.begin() + (first + count) * num_features_);
  subset.labels_.assign(labels_.begin() + first,
                        labels_.begin() + first + count);
  return subset;
}

absl::Status Dataset::Gather(absl::Span<const int64_t> indices,
                             absl::Span<float> features,
                             absl::Span<int32_t> labels) const {
  const uint64_t n = indices.size();
  if (features.size() < n * static_cast<uint64_t>(num_features_) ||
      labels.size() < n) {
    return absl::InvalidArgumentError(absl::StrCat(
        "batch of ", n, " examples needs ", n * num_features_,
        " features and ", n, " labels; buffers hold ", features.size(),
        " and ", labels.size()));
  }
  if (absl::Status s = CheckExampleIndices(indices, num_examples()); !s.ok()) return s;
  for (uint64_t i = 0; i < n; ++i) {
    std::memcpy(features.data() + i * num_features_,
                features_.data() + indices[i] * num_features_,
                num_features_ * sizeof(float));
    labels[i] = labels_[indices[i]];
  }
  return absl::OkStatus();
}

absl::StatusOr<Dataset> LoadIdxDataset(const std::string& images_path,
                                       const std::string& labels_path,
                                       int32_t num_classes) {
  if (num_classes < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("num_classes must be >= 0, got ", num_classes));
  }
  absl::StatusOr<IdxImages> images = ReadIdxImages(images_path);
  if (!images.ok()) return images.status();
  absl::StatusOr<IdxLabels> labels = ReadIdxLabels(labels_path);
  if (!labels.ok()) return labels.status();

  const int64_t count = images->count;
  if (count != static_cast<int64_t>(labels->labels.size())) {
    return absl::InvalidArgumentError(absl::StrCat(
        images_path, " holds ", count, " images but ", labels_path,
        " holds ", labels->labels.size(), " labels"));
  }
  if (count == 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        images_path, " and ", labels_path, " hold no examples"));
  }

  int32_t classes = num_classes;
  if (classes == 0) {
    classes = 1 + *std::max_element(labels->labels.begin(),
                                    labels->labels.end());
  }
  std::vector<int32_t> label_values(labels->labels.begin(),
                                    labels->labels.end());
  for (int64_t i = 0; i < count; ++i) {
    if (label_values[i] >= classes) {
      return absl::InvalidArgumentError(absl::StrCat(
          labels_path, ": label ", label_values[i], " of example ", i,
          " is outside [0, ", classes, ")"));
    }
  }

  // p / 255.0f through a table: the same values as dividing, 0 and 255 map
  // exactly to 0.0f and 1.0f.
  std::array<float, 256> scale;
  for (int p = 0; p < 256; ++p) scale[p] = static_cast<float>(p) / 255.0f;
  std::vector<float> features(images->pixels.size());
  for (size_t i = 0; i < features.size(); ++i) {
    features[i] = scale[images->pixels[i]];
  }
  return Dataset::Create(images->rows * images->cols, classes,
                         std::move(features), std::move(label_values));
}

absl::StatusOr<DatasetSplit> ParseDatasetSplit(std::string_view name) {
  if (name == "train") return DatasetSplit::kTrain;
  if (name == "test") return DatasetSplit::kTest;
  return absl::InvalidArgumentError(absl::StrCat(
      "unknown dataset split \"", std::string(name),
      "\" (expected train or test)"));
}

std::string_view DatasetSplitName(DatasetSplit split) {
  return split == DatasetSplit::kTrain ? "train" : "test";
}

namespace {

// dir/base if that file exists, else dir/base.gz if that does; NotFound
// naming both otherwise.
absl::StatusOr<std::string> FindPlainOrGzip(const std::string& dir,
                                            const std::string& base) {
  std::string plain = base;
  if (!dir.empty()) {
    plain = absl::StrCat(dir, dir.back() == '/' ? "" : "/", base);
  }
  const std::string gzip = absl::StrCat(plain, ".gz");
  struct stat st;
  if (stat(plain.c_str(), &st) == 0) return plain;
  if (stat(gzip.c_str(), &st) == 0) return gzip;
  return absl::NotFoundError(
      absl::StrCat("neither ", plain, " nor ", gzip, " exists"));
}

}  // namespace

absl::StatusOr<Dataset> LoadIdxDirectory(const std::string& dir,
                                         DatasetSplit split,
                                         int32_t num_classes) {
  const std::string prefix = split == DatasetSplit::kTrain ? "train" : "t10k";
  absl::StatusOr<std::string> images =
      FindPlainOrGzip(dir, prefix + "-images-idx3-ubyte");
  if (!images.ok()) return images.status();
  absl::StatusOr<std::string> labels =
      FindPlainOrGzip(dir, prefix + "-labels-idx1-ubyte");
  if (!labels.ok()) return labels.status();
  return LoadIdxDataset(*images, *labels, num_classes);
}

}  // namespace grps
