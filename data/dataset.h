// Dataset: labelled examples for classification, held in memory, and the
// loaders that build one from IDX files (MNIST, Fashion-MNIST).
#ifndef GRPS_DATA_DATASET_H_
#define GRPS_DATA_DATASET_H_

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"

namespace grps {

// num_examples rows of num_features float features (row-major) and one
// int32 label per row in [0, num_classes). The invariants are checked once,
// by Create; every Dataset that exists satisfies them. Immutable after
// construction, so concurrent reads from many threads are safe.
class Dataset {
 public:
  Dataset() = default;  // empty: no examples, no features, no classes.

  // Checks features.size() == labels.size() * num_features, num_features
  // >= 1, num_classes >= 1 and every label in [0, num_classes);
  // InvalidArgument otherwise.
  static absl::StatusOr<Dataset> Create(int64_t num_features,
                                        int32_t num_classes,
                                        std::vector<float> features,
                                        std::vector<int32_t> labels);

  int64_t num_examples() const { return static_cast<int64_t>(labels_.size()); }
  int64_t num_features() const { return num_features_; }
  int32_t num_classes() const { return num_classes_; }

  // Row-major, num_examples() x num_features().
  const std::vector<float>& features() const { return features_; }
  const std::vector<int32_t>& labels() const { return labels_; }
  // The num_features() features of example i; requires 0 <= i <
  // num_examples().
  absl::Span<const float> example(int64_t i) const {
    return absl::MakeConstSpan(features_.data() + i * num_features_,
                               num_features_);
  }
  int32_t label(int64_t i) const { return labels_[i]; }

  // A copy of examples [first, first + count) with the same num_features and
  // num_classes (so a slice still fits the model of the whole set).
  // OutOfRange unless 0 <= first, 0 <= count, first + count <= num_examples.
  absl::StatusOr<Dataset> Subset(int64_t first, int64_t count) const;

  // Copies the examples named by `indices`, in that order, into a batch:
  // the first indices.size() * num_features() floats of `features` and the
  // first indices.size() entries of `labels` (so buffers sized for a full
  // batch serve a last, shorter one). InvalidArgument if a span is too
  // small, OutOfRange if an index is outside [0, num_examples); nothing is
  // written on error.
  absl::Status Gather(absl::Span<const int64_t> indices,
                      absl::Span<float> features,
                      absl::Span<int32_t> labels) const;

 private:
  int64_t num_features_ = 0;
  int32_t num_classes_ = 0;
  std::vector<float> features_;
  std::vector<int32_t> labels_;
};

// The checks Dataset and SparseDataset share: OutOfRange unless 0 <= first,
// 0 <= count and first + count <= num_examples (Subset); OutOfRange naming
// the first index outside [0, num_examples) (Gather).
absl::Status CheckSubsetRange(int64_t first, int64_t count, int64_t num_examples);
absl::Status CheckExampleIndices(absl::Span<const int64_t> indices, int64_t num_examples);

// MNIST and Fashion-MNIST both label 10 classes (digits 0-9, ten kinds of
// clothing).
inline constexpr int32_t kMnistNumClasses = 10;

// Builds a Dataset from an IDX image file and an IDX label file (plain or
// gzip, see idx_reader.h). Pixel p becomes the feature p / 255.0f, so
// features lie in [0, 1]; an image of rows x cols gives rows * cols features.
//
// num_classes: when 0, it is the largest label + 1. That rule is right for
// a whole dataset but gives a slice missing the top class too few classes,
// so pass the count (e.g. kMnistNumClasses) when train and test must agree;
// a label >= num_classes is then InvalidArgument.
//
// Errors are idx_reader.h's, plus InvalidArgument when the two files'
// example counts differ or the files hold no examples.
absl::StatusOr<Dataset> LoadIdxDataset(const std::string& images_path,
                                       const std::string& labels_path,
                                       int32_t num_classes = 0);

enum class DatasetSplit { kTrain, kTest };

// "train" or "test"; anything else is InvalidArgument.
absl::StatusOr<DatasetSplit> ParseDatasetSplit(std::string_view name);
std::string_view DatasetSplitName(DatasetSplit split);

// Loads one split of a directory laid out as MNIST and Fashion-MNIST are
// distributed:
//   train: train-images-idx3-ubyte, train-labels-idx1-ubyte
//   test:  t10k-images-idx3-ubyte,  t10k-labels-idx1-ubyte
// each with or without a .gz suffix (the plain file wins when both exist).
// num_classes defaults to 10 so that train and test agree (see
// LoadIdxDataset). NotFound, naming both candidate names, when a file is
// missing.
absl::StatusOr<Dataset> LoadIdxDirectory(const std::string& dir,
                                         DatasetSplit split,
                                         int32_t num_classes = kMnistNumClasses);

}  // namespace grps

#endif  // GRPS_DATA_DATASET_H_
