#include "data/sparse_dataset.h"

#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "absl/status/status.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace grps {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;

// The parts of a SparseDataset, valid as built: three examples of two,
// zero and three ids, labels in [0, 3), ids below 10.
struct Parts {
  int32_t num_classes = 3;
  uint64_t feature_space = 10;
  std::vector<int64_t> offsets{0, 2, 2, 5};
  std::vector<int64_t> ids{1, 7, 0, 4, 9};
  std::vector<float> values{0.5f, 1.0f, 2.0f, -3.0f, 4.0f};
  std::vector<int32_t> labels{2, 0, 1};

  absl::StatusOr<SparseDataset> Create() const {
    return SparseDataset::Create(num_classes, feature_space, offsets, ids,
                                 values, labels);
  }
};

void ExpectInvalid(const Parts& parts, const std::string& message) {
  absl::StatusOr<SparseDataset> dataset = parts.Create();
  ASSERT_FALSE(dataset.ok());
  EXPECT_EQ(dataset.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(dataset.status().message(), HasSubstr(message));
}

TEST(SparseDatasetTest, CreateKeepsExamplesInCsrForm) {
  absl::StatusOr<SparseDataset> dataset = Parts().Create();
  ASSERT_TRUE(dataset.ok()) << dataset.status();
  EXPECT_EQ(dataset->num_examples(), 3);
  EXPECT_EQ(dataset->nnz(), 5);
  EXPECT_EQ(dataset->num_classes(), 3);
  EXPECT_EQ(dataset->feature_space(), 10u);
  EXPECT_THAT(dataset->ids(0), ElementsAre(1, 7));
  EXPECT_THAT(dataset->values(0), ElementsAre(0.5f, 1.0f));
  EXPECT_THAT(dataset->ids(1), IsEmpty());
  EXPECT_THAT(dataset->values(1), IsEmpty());
  EXPECT_THAT(dataset->ids(2), ElementsAre(0, 4, 9));
  EXPECT_THAT(dataset->values(2), ElementsAre(2.0f, -3.0f, 4.0f));
  EXPECT_EQ(dataset->label(0), 2);
  EXPECT_THAT(dataset->labels(), ElementsAre(2, 0, 1));
  EXPECT_THAT(dataset->offsets(), ElementsAre(0, 2, 2, 5));
}

TEST(SparseDatasetTest, DefaultIsEmpty) {
  SparseDataset dataset;
  EXPECT_EQ(dataset.num_examples(), 0);
  EXPECT_EQ(dataset.nnz(), 0);
  EXPECT_EQ(dataset.num_classes(), 0);
  EXPECT_THAT(dataset.offsets(), ElementsAre(0));
}

TEST(SparseDatasetTest, CreateAcceptsNoExamples) {
  Parts parts;
  parts.offsets = {0};
  parts.ids = {};
  parts.values = {};
  parts.labels = {};
  absl::StatusOr<SparseDataset> dataset = parts.Create();
  ASSERT_TRUE(dataset.ok()) << dataset.status();
  EXPECT_EQ(dataset->num_examples(), 0);
}

TEST(SparseDatasetTest, FeatureSpaceZeroBoundsIdsOnlyBelow) {
  Parts parts;
  parts.feature_space = 0;
  parts.ids = {1, std::numeric_limits<int64_t>::max(), 0, 4, 9};
  absl::StatusOr<SparseDataset> dataset = parts.Create();
  ASSERT_TRUE(dataset.ok()) << dataset.status();
  EXPECT_EQ(dataset->feature_space(), 0u);

  parts.ids = {1, 7, -1, 4, 9};
  ExpectInvalid(parts, "id -1 of example 2 is outside [0, unbounded)");
}

TEST(SparseDatasetTest, RefusesNoClasses) {
  Parts parts;
  parts.num_classes = 0;
  ExpectInvalid(parts, "at least one class");
}

TEST(SparseDatasetTest, RefusesOffsetsNotOneMoreThanLabels) {
  Parts parts;
  parts.offsets = {0, 2, 5};
  ExpectInvalid(parts, "3 offsets for 3 labels; expected 4");
}

TEST(SparseDatasetTest, RefusesIdsAndValuesOfDifferentLengths) {
  Parts parts;
  parts.values.pop_back();
  ExpectInvalid(parts, "5 ids but 4 values");
}

TEST(SparseDatasetTest, RefusesFirstOffsetNotZero) {
  Parts parts;
  parts.offsets = {1, 2, 2, 5};
  ExpectInvalid(parts, "first offset must be 0, got 1");
}

TEST(SparseDatasetTest, RefusesLastOffsetNotNnz) {
  Parts parts;
  parts.offsets = {0, 2, 2, 4};
  ExpectInvalid(parts, "last offset is 4 but the dataset holds 5 ids");
}

TEST(SparseDatasetTest, RefusesDecreasingOffsets) {
  Parts parts;
  parts.offsets = {0, 3, 2, 5};
  ExpectInvalid(parts, "offsets decrease at example 1: 3 then 2");
}

TEST(SparseDatasetTest, RefusesLabelOutsideClasses) {
  Parts parts;
  parts.labels = {2, 3, 1};
  ExpectInvalid(parts, "label 3 of example 1 is outside [0, 3)");
  parts.labels = {2, 0, -1};
  ExpectInvalid(parts, "label -1 of example 2");
}

TEST(SparseDatasetTest, RefusesIdOutsideFeatureSpace) {
  Parts parts;
  parts.ids = {1, 10, 0, 4, 9};
  ExpectInvalid(parts, "id 10 of example 0 is outside [0, 10)");
  parts.ids = {-2, 7, 0, 4, 9};
  ExpectInvalid(parts, "id -2 of example 0 is outside [0, 10)");
}

TEST(SparseDatasetTest, RefusesIdsNotStrictlyAscendingWithinAnExample) {
  Parts parts;
  parts.ids = {1, 7, 0, 4, 4};
  ExpectInvalid(parts, "ids of example 2 are not strictly ascending: 4 then 4");
  parts.ids = {7, 1, 0, 4, 9};
  ExpectInvalid(parts, "ids of example 0 are not strictly ascending: 7 then 1");
}

TEST(SparseDatasetTest, IdsMayRepeatAcrossExamples) {
  Parts parts;
  parts.ids = {4, 9, 4, 7, 9};  // example 2 starts again at 4
  EXPECT_TRUE(parts.Create().ok());
}

TEST(SparseDatasetTest, RefusesNonFiniteValues) {
  for (float bad : {std::nanf(""), std::numeric_limits<float>::infinity(),
                    -std::numeric_limits<float>::infinity()}) {
    Parts parts;
    parts.values[3] = bad;
    ExpectInvalid(parts, "of id 4 in example 2 is not finite");
  }
}

TEST(SparseDatasetTest, SubsetRebasesOffsetsAndKeepsClassesAndSpace) {
  absl::StatusOr<SparseDataset> dataset = Parts().Create();
  ASSERT_TRUE(dataset.ok());
  absl::StatusOr<SparseDataset> tail = dataset->Subset(1, 2);
  ASSERT_TRUE(tail.ok()) << tail.status();
  EXPECT_EQ(tail->num_examples(), 2);
  EXPECT_EQ(tail->num_classes(), 3);
  EXPECT_EQ(tail->feature_space(), 10u);
  EXPECT_THAT(tail->offsets(), ElementsAre(0, 0, 3));
  EXPECT_THAT(tail->ids(1), ElementsAre(0, 4, 9));
  EXPECT_THAT(tail->values(1), ElementsAre(2.0f, -3.0f, 4.0f));
  EXPECT_THAT(tail->labels(), ElementsAre(0, 1));

  absl::StatusOr<SparseDataset> none = dataset->Subset(3, 0);
  ASSERT_TRUE(none.ok()) << none.status();
  EXPECT_EQ(none->num_examples(), 0);
  EXPECT_EQ(none->nnz(), 0);
}

TEST(SparseDatasetTest, SubsetOutsideTheExamplesIsOutOfRange) {
  absl::StatusOr<SparseDataset> dataset = Parts().Create();
  ASSERT_TRUE(dataset.ok());
  for (auto [first, count] : std::vector<std::pair<int64_t, int64_t>>{
           {-1, 1}, {0, 4}, {2, 2}, {4, 0}, {0, -1}}) {
    EXPECT_EQ(dataset->Subset(first, count).status().code(),
              absl::StatusCode::kOutOfRange)
        << first << " + " << count;
  }
}

TEST(SparseDatasetTest, GatherBuildsABatchInIndexOrder) {
  absl::StatusOr<SparseDataset> dataset = Parts().Create();
  ASSERT_TRUE(dataset.ok());
  SparseDataset::Batch batch;
  const std::vector<int64_t> indices{2, 1, 0, 2};
  ASSERT_TRUE(dataset->Gather(indices, &batch).ok());
  EXPECT_THAT(batch.offsets, ElementsAre(0, 3, 3, 5, 8));
  EXPECT_THAT(batch.ids, ElementsAre(0, 4, 9, 1, 7, 0, 4, 9));
  EXPECT_THAT(batch.values,
              ElementsAre(2.0f, -3.0f, 4.0f, 0.5f, 1.0f, 2.0f, -3.0f, 4.0f));
  EXPECT_THAT(batch.labels, ElementsAre(1, 0, 2, 1));

  // A reused batch is replaced, not appended to.
  const std::vector<int64_t> one{0};
  ASSERT_TRUE(dataset->Gather(one, &batch).ok());
  EXPECT_THAT(batch.offsets, ElementsAre(0, 2));
  EXPECT_THAT(batch.ids, ElementsAre(1, 7));
  EXPECT_THAT(batch.labels, ElementsAre(2));
}

TEST(SparseDatasetTest, GatherOfABadIndexChangesNothing) {
  absl::StatusOr<SparseDataset> dataset = Parts().Create();
  ASSERT_TRUE(dataset.ok());
  SparseDataset::Batch batch;
  const std::vector<int64_t> first{0};
  ASSERT_TRUE(dataset->Gather(first, &batch).ok());
  const std::vector<int64_t> bad{1, 3};
  absl::Status status = dataset->Gather(bad, &batch);
  EXPECT_EQ(status.code(), absl::StatusCode::kOutOfRange);
  EXPECT_THAT(status.message(), HasSubstr("example index 3"));
  EXPECT_THAT(batch.ids, ElementsAre(1, 7));
  EXPECT_THAT(batch.labels, ElementsAre(2));
}

}  // namespace
}  // namespace grps
