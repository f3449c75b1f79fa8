#include "data/sparse_features.h"

#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "absl/status/status.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace grps {
namespace {

using ::testing::Each;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;

// Three examples of four features in [0, 1], labels in [0, 5).
Dataset Dense() {
  absl::StatusOr<Dataset> dense = Dataset::Create(
      4, 5,
      {0.0f, 0.1f, 0.5f, 1.0f,   // buckets -, 0, 2, 3 (of 4)
       0.0f, 0.0f, 0.0f, 0.0f,   // all zero: no ids
       0.25f, 0.0f, 0.74f, 0.01f},
      {4, 0, 2});
  EXPECT_TRUE(dense.ok()) << dense.status();
  return *std::move(dense);
}

TEST(SparseFromDenseTest, OneIdPerNonZeroFeatureAndBucket) {
  SparseFeatureOptions options;
  options.buckets = 4;
  absl::StatusOr<SparseDataset> sparse = SparseFromDense(Dense(), options);
  ASSERT_TRUE(sparse.ok()) << sparse.status();
  EXPECT_EQ(sparse->num_examples(), 3);
  EXPECT_EQ(sparse->num_classes(), 5);
  EXPECT_EQ(sparse->feature_space(), 16u);  // 4 features x 4 buckets
  // id = feature * 4 + bucket.
  EXPECT_THAT(sparse->ids(0), ElementsAre(1 * 4 + 0, 2 * 4 + 2, 3 * 4 + 3));
  EXPECT_THAT(sparse->ids(1), IsEmpty());
  EXPECT_THAT(sparse->ids(2), ElementsAre(0 * 4 + 1, 2 * 4 + 2, 3 * 4 + 0));
  EXPECT_THAT(sparse->all_values(), Each(1.0f));
  EXPECT_THAT(sparse->labels(), ElementsAre(4, 0, 2));
}

TEST(SparseFromDenseTest, MaxValueScalesTheBuckets) {
  absl::StatusOr<Dataset> dense =
      Dataset::Create(3, 2, {255.0f, 127.0f, 128.0f}, {1});
  ASSERT_TRUE(dense.ok());
  SparseFeatureOptions options;
  options.buckets = 2;
  options.max_value = 255.0f;
  absl::StatusOr<SparseDataset> sparse = SparseFromDense(*dense, options);
  ASSERT_TRUE(sparse.ok()) << sparse.status();
  EXPECT_THAT(sparse->ids(0), ElementsAre(0 * 2 + 1, 1 * 2 + 0, 2 * 2 + 1));
}

TEST(SparseFromDenseTest, OneBucketIsNonZeroIndicators) {
  SparseFeatureOptions options;
  options.buckets = 1;
  absl::StatusOr<SparseDataset> sparse = SparseFromDense(Dense(), options);
  ASSERT_TRUE(sparse.ok()) << sparse.status();
  EXPECT_EQ(sparse->feature_space(), 4u);
  EXPECT_THAT(sparse->ids(0), ElementsAre(1, 2, 3));
  EXPECT_THAT(sparse->ids(2), ElementsAre(0, 2, 3));
}

TEST(SparseFromDenseTest, RefusesFeaturesOutsideTheRange) {
  for (float bad : {-0.1f, 1.01f, std::nanf(""),
                    std::numeric_limits<float>::infinity()}) {
    absl::StatusOr<Dataset> dense = Dataset::Create(2, 2, {0.5f, bad}, {1});
    ASSERT_TRUE(dense.ok());
    absl::StatusOr<SparseDataset> sparse = SparseFromDense(*dense);
    EXPECT_EQ(sparse.status().code(), absl::StatusCode::kInvalidArgument)
        << bad;
    EXPECT_THAT(sparse.status().message(),
                HasSubstr("feature 1 of example 0"));
  }
}

TEST(SparseFromDenseTest, RefusesBadOptions) {
  SparseFeatureOptions no_buckets;
  no_buckets.buckets = 0;
  EXPECT_EQ(SparseFromDense(Dense(), no_buckets).status().code(),
            absl::StatusCode::kInvalidArgument);
  for (float max_value : {0.0f, -1.0f, std::nanf(""),
                          std::numeric_limits<float>::infinity()}) {
    SparseFeatureOptions options;
    options.max_value = max_value;
    EXPECT_EQ(SparseFromDense(Dense(), options).status().code(),
              absl::StatusCode::kInvalidArgument)
        << max_value;
  }
}

TEST(SparseFromDenseTest, EmptyDatasetHasNoClassesAndIsRefused) {
  EXPECT_EQ(SparseFromDense(Dataset()).status().code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace grps
