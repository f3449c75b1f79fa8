#include "data/dataset.h"

#include <sys/stat.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <iostream>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "data/idx_reader.h"
#include "data/testing/idx_test_files.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace grps {
namespace {

using ::testing::AllOf;
using ::testing::ElementsAre;
using ::testing::FloatEq;
using ::testing::HasSubstr;
using testing_files::IdxBytes;
using testing_files::MakeTempDir;
using testing_files::TempPath;
using testing_files::WriteFile;
using testing_files::WriteGzipFile;

// Writes `count` 1x2 images and their labels; image i is {i, 255 - i}.
void WritePair(const std::string& images_path, const std::string& labels_path,
               const std::vector<uint8_t>& labels, bool gzip = false) {
  std::vector<uint8_t> pixels;
  for (size_t i = 0; i < labels.size(); ++i) {
    pixels.push_back(uint8_t(i));
    pixels.push_back(uint8_t(255 - i));
  }
  const uint32_t count = labels.size();
  const std::string images = IdxBytes(kIdxImagesMagic, {count, 1, 2}, pixels);
  const std::string label_bytes = IdxBytes(kIdxLabelsMagic, {count}, labels);
  if (gzip) {
    WriteGzipFile(images_path, images);
    WriteGzipFile(labels_path, label_bytes);
  } else {
    WriteFile(images_path, images);
    WriteFile(labels_path, label_bytes);
  }
}

TEST(DatasetTest, LoadIdxDatasetScalesPixelsIntoUnitInterval) {
  const std::string images = TempPath("images");
  const std::string labels = TempPath("labels");
  WriteFile(images, IdxBytes(kIdxImagesMagic, {2, 2, 2},
                             {0, 255, 51, 102, 1, 2, 3, 4}));
  WriteFile(labels, IdxBytes(kIdxLabelsMagic, {2}, {1, 0}));
  absl::StatusOr<Dataset> dataset = LoadIdxDataset(images, labels);
  ASSERT_TRUE(dataset.ok()) << dataset.status();
  EXPECT_EQ(dataset->num_examples(), 2);
  EXPECT_EQ(dataset->num_features(), 4);
  EXPECT_THAT(dataset->example(0),
              ElementsAre(0.0f, 1.0f, FloatEq(0.2f), FloatEq(0.4f)));
  EXPECT_EQ(dataset->features()[4], 1.0f / 255.0f);
  EXPECT_THAT(dataset->labels(), ElementsAre(1, 0));
}

TEST(DatasetTest, LoadIdxDatasetReadsGzipPair) {
  const std::string images = TempPath("images.gz");
  const std::string labels = TempPath("labels.gz");
  WritePair(images, labels, {2, 0, 1}, /*gzip=*/true);
  absl::StatusOr<Dataset> dataset = LoadIdxDataset(images, labels);
  ASSERT_TRUE(dataset.ok()) << dataset.status();
  EXPECT_EQ(dataset->num_examples(), 3);
  EXPECT_EQ(dataset->num_features(), 2);
  EXPECT_THAT(dataset->example(2),
              ElementsAre(FloatEq(2.0f / 255), FloatEq(253.0f / 255)));
  EXPECT_THAT(dataset->labels(), ElementsAre(2, 0, 1));
}

TEST(DatasetTest, NumClassesIsLargestLabelPlusOneByDefault) {
  const std::string images = TempPath("images");
  const std::string labels = TempPath("labels");
  WritePair(images, labels, {0, 3, 1});
  absl::StatusOr<Dataset> dataset = LoadIdxDataset(images, labels);
  ASSERT_TRUE(dataset.ok()) << dataset.status();
  EXPECT_EQ(dataset->num_classes(), 4);
}

TEST(DatasetTest, ExplicitNumClassesIsKeptAndBoundsTheLabels) {
  const std::string images = TempPath("images");
  const std::string labels = TempPath("labels");
  WritePair(images, labels, {0, 3, 1});
  absl::StatusOr<Dataset> dataset =
      LoadIdxDataset(images, labels, kMnistNumClasses);
  ASSERT_TRUE(dataset.ok()) << dataset.status();
  EXPECT_EQ(dataset->num_classes(), 10);

  absl::StatusOr<Dataset> too_few = LoadIdxDataset(images, labels, 3);
  EXPECT_EQ(too_few.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(too_few.status().ToString(),
              AllOf(HasSubstr(labels), HasSubstr("label 3")));
}

TEST(DatasetTest, MismatchedImageAndLabelCountsAreInvalidArgument) {
  const std::string images = TempPath("images");
  const std::string labels = TempPath("labels");
  WritePair(images, labels, {0, 1, 2});
  WriteFile(labels, IdxBytes(kIdxLabelsMagic, {2}, {0, 1}));
  absl::StatusOr<Dataset> dataset = LoadIdxDataset(images, labels);
  EXPECT_EQ(dataset.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(dataset.status().ToString(),
              AllOf(HasSubstr("3 images"), HasSubstr("2 labels")));
}

TEST(DatasetTest, FilesWithNoExamplesAreInvalidArgument) {
  const std::string images = TempPath("images");
  const std::string labels = TempPath("labels");
  WritePair(images, labels, {});
  EXPECT_EQ(LoadIdxDataset(images, labels).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(DatasetTest, ReaderErrorsPassThrough) {
  const std::string images = TempPath("images");
  const std::string labels = TempPath("labels");
  WritePair(images, labels, {0, 1});
  EXPECT_EQ(LoadIdxDataset(images, TempPath("missing")).status().code(),
            absl::StatusCode::kNotFound);
  // The files swapped: each has the other's magic number.
  EXPECT_EQ(LoadIdxDataset(labels, images).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(DatasetTest, CreateChecksSizesAndLabels) {
  EXPECT_TRUE(Dataset::Create(2, 3, {0, 0, 0, 0}, {0, 2}).ok());
  EXPECT_EQ(Dataset::Create(2, 3, {0, 0, 0}, {0, 2}).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Dataset::Create(2, 3, {0, 0, 0, 0}, {0, 3}).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Dataset::Create(2, 3, {0, 0, 0, 0}, {-1, 0}).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Dataset::Create(0, 3, {}, {}).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Dataset::Create(2, 0, {}, {}).status().code(),
            absl::StatusCode::kInvalidArgument);
}

Dataset FourExamples() {
  // Example i has features {10i, 10i + 1} and label i % 3.
  absl::StatusOr<Dataset> dataset =
      Dataset::Create(2, 3, {0, 1, 10, 11, 20, 21, 30, 31}, {0, 1, 2, 0});
  EXPECT_TRUE(dataset.ok()) << dataset.status();
  return *std::move(dataset);
}

TEST(DatasetTest, SubsetCopiesTheSliceAndKeepsNumClasses) {
  absl::StatusOr<Dataset> subset = FourExamples().Subset(1, 2);
  ASSERT_TRUE(subset.ok()) << subset.status();
  EXPECT_EQ(subset->num_examples(), 2);
  EXPECT_EQ(subset->num_features(), 2);
  EXPECT_EQ(subset->num_classes(), 3);
  EXPECT_THAT(subset->features(), ElementsAre(10, 11, 20, 21));
  EXPECT_THAT(subset->labels(), ElementsAre(1, 2));
  EXPECT_EQ(FourExamples().Subset(4, 0)->num_examples(), 0);
}

TEST(DatasetTest, SubsetOutsideTheDatasetIsOutOfRange) {
  const Dataset dataset = FourExamples();
  EXPECT_EQ(dataset.Subset(3, 2).status().code(),
            absl::StatusCode::kOutOfRange);
  EXPECT_EQ(dataset.Subset(-1, 1).status().code(),
            absl::StatusCode::kOutOfRange);
  EXPECT_EQ(dataset.Subset(0, -1).status().code(),
            absl::StatusCode::kOutOfRange);
  EXPECT_EQ(dataset.Subset(5, 0).status().code(),
            absl::StatusCode::kOutOfRange);
}

TEST(DatasetTest, GatherCopiesExamplesInIndexOrder) {
  const Dataset dataset = FourExamples();
  std::vector<float> features(3 * 2, -1);  // room for 3, 2 gathered
  std::vector<int32_t> labels(3, -1);
  const std::vector<int64_t> indices = {3, 1};
  ASSERT_TRUE(dataset.Gather(indices, absl::MakeSpan(features),
                             absl::MakeSpan(labels))
                  .ok());
  EXPECT_THAT(features, ElementsAre(30, 31, 10, 11, -1, -1));
  EXPECT_THAT(labels, ElementsAre(0, 1, -1));
}

TEST(DatasetTest, GatherRejectsBadIndexOrSmallBufferWithoutWriting) {
  const Dataset dataset = FourExamples();
  std::vector<float> features(4, -1);
  std::vector<int32_t> labels(2, -1);
  const std::vector<int64_t> out_of_range = {0, 4};
  EXPECT_EQ(dataset
                .Gather(out_of_range, absl::MakeSpan(features),
                        absl::MakeSpan(labels))
                .code(),
            absl::StatusCode::kOutOfRange);
  const std::vector<int64_t> three = {0, 1, 2};
  EXPECT_EQ(dataset
                .Gather(three, absl::MakeSpan(features), absl::MakeSpan(labels))
                .code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(features, ElementsAre(-1, -1, -1, -1));
  EXPECT_THAT(labels, ElementsAre(-1, -1));
}

TEST(DatasetTest, ParseDatasetSplitAcceptsTrainAndTestOnly) {
  EXPECT_EQ(*ParseDatasetSplit("train"), DatasetSplit::kTrain);
  EXPECT_EQ(*ParseDatasetSplit("test"), DatasetSplit::kTest);
  EXPECT_EQ(ParseDatasetSplit("t10k").status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(DatasetSplitName(DatasetSplit::kTest), "test");
}

TEST(DatasetTest, LoadIdxDirectoryAcceptsNamesWithAndWithoutGz) {
  const std::string dir = MakeTempDir("mnist");
  WritePair(dir + "/train-images-idx3-ubyte", dir + "/train-labels-idx1-ubyte",
            {1, 2, 3, 4});
  WritePair(dir + "/t10k-images-idx3-ubyte.gz",
            dir + "/t10k-labels-idx1-ubyte.gz", {5, 6}, /*gzip=*/true);

  absl::StatusOr<Dataset> train = LoadIdxDirectory(dir, DatasetSplit::kTrain);
  ASSERT_TRUE(train.ok()) << train.status();
  EXPECT_THAT(train->labels(), ElementsAre(1, 2, 3, 4));
  EXPECT_EQ(train->num_classes(), kMnistNumClasses);

  absl::StatusOr<Dataset> test =
      LoadIdxDirectory(dir + "/", DatasetSplit::kTest);
  ASSERT_TRUE(test.ok()) << test.status();
  EXPECT_THAT(test->labels(), ElementsAre(5, 6));
  EXPECT_EQ(test->num_classes(), kMnistNumClasses);
}

TEST(DatasetTest, LoadIdxDirectoryPrefersThePlainFile) {
  const std::string dir = MakeTempDir("both");
  WritePair(dir + "/train-images-idx3-ubyte", dir + "/train-labels-idx1-ubyte",
            {1, 1});
  WritePair(dir + "/train-images-idx3-ubyte.gz",
            dir + "/train-labels-idx1-ubyte.gz", {2, 2, 2}, /*gzip=*/true);
  absl::StatusOr<Dataset> train = LoadIdxDirectory(dir, DatasetSplit::kTrain);
  ASSERT_TRUE(train.ok()) << train.status();
  EXPECT_THAT(train->labels(), ElementsAre(1, 1));
}

TEST(DatasetTest, LoadIdxDirectoryMissingFileIsNotFoundNamingBothNames) {
  const std::string dir = MakeTempDir("train_only");
  WritePair(dir + "/train-images-idx3-ubyte", dir + "/train-labels-idx1-ubyte",
            {1});
  absl::StatusOr<Dataset> test = LoadIdxDirectory(dir, DatasetSplit::kTest);
  EXPECT_EQ(test.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(test.status().ToString(),
              AllOf(HasSubstr("t10k-images-idx3-ubyte "),
                    HasSubstr("t10k-images-idx3-ubyte.gz")));
}

// Debian's dataset-fashion-mnist package; CI installs it.
constexpr char kFashionMnistDir[] = "/usr/share/datasets/fashion-mnist";

TEST(DatasetTest, LoadsRealFashionMnistTrainAndTestSplits) {
  struct stat st;
  if (stat(kFashionMnistDir, &st) != 0) {
    GTEST_SKIP() << kFashionMnistDir
                 << " is missing; install Debian's dataset-fashion-mnist "
                    "package to run this test";
  }
  struct Expected {
    DatasetSplit split;
    int64_t examples;
    std::vector<int32_t> first_labels;
  };
  const Expected splits[] = {
      {DatasetSplit::kTrain, 60000, {9, 0, 0, 3, 0, 2, 7, 2, 5, 5}},
      {DatasetSplit::kTest, 10000, {9, 2, 1, 1, 6, 1, 4, 6, 5, 7}},
  };
  for (const Expected& expected : splits) {
    SCOPED_TRACE(DatasetSplitName(expected.split));
    const auto start = std::chrono::steady_clock::now();
    absl::StatusOr<Dataset> dataset =
        LoadIdxDirectory(kFashionMnistDir, expected.split);
    const double seconds = std::chrono::duration<double>(
                               std::chrono::steady_clock::now() - start)
                               .count();
    ASSERT_TRUE(dataset.ok()) << dataset.status();
    std::cout << "Fashion-MNIST " << DatasetSplitName(expected.split) << ": "
              << dataset->num_examples() << " examples loaded in " << seconds
              << " s\n";

    EXPECT_EQ(dataset->num_examples(), expected.examples);
    EXPECT_EQ(dataset->num_features(), 28 * 28);
    EXPECT_EQ(dataset->num_classes(), 10);
    const auto [min_it, max_it] = std::minmax_element(
        dataset->features().begin(), dataset->features().end());
    EXPECT_EQ(*min_it, 0.0f);
    EXPECT_EQ(*max_it, 1.0f);
    EXPECT_TRUE(std::equal(expected.first_labels.begin(),
                           expected.first_labels.end(),
                           dataset->labels().begin()));
    // Fashion-MNIST is balanced: every class has a tenth of the examples.
    std::vector<int64_t> per_class(10, 0);
    for (int32_t label : dataset->labels()) ++per_class[label];
    for (int c = 0; c < 10; ++c) {
      EXPECT_EQ(per_class[c], expected.examples / 10) << "class " << c;
    }
  }
}

}  // namespace
}  // namespace grps
