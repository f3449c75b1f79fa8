#include "data/batch_iterator.h"

#include <cstdint>
#include <numeric>
#include <vector>

#include "absl/status/status.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace grps {
namespace {

using ::testing::ElementsAre;
using ::testing::IsEmpty;

std::vector<int64_t> Order(int64_t n) {
  std::vector<int64_t> order(n);
  std::iota(order.begin(), order.end(), 100);
  return order;
}

std::vector<int64_t> ToVector(absl::Span<const int64_t> span) {
  return std::vector<int64_t>(span.begin(), span.end());
}

TEST(BatchIteratorTest, KeepMakesAShortLastBatch) {
  absl::StatusOr<BatchIterator> batches =
      BatchIterator::Create(Order(10), 4, LastBatch::kKeep);
  ASSERT_TRUE(batches.ok()) << batches.status();
  ASSERT_EQ(batches->num_batches(), 3);
  EXPECT_THAT(batches->Batch(0), ElementsAre(100, 101, 102, 103));
  EXPECT_THAT(batches->Batch(1), ElementsAre(104, 105, 106, 107));
  EXPECT_THAT(batches->Batch(2), ElementsAre(108, 109));
}

TEST(BatchIteratorTest, DropLeavesOutTheShortLastBatch) {
  absl::StatusOr<BatchIterator> batches =
      BatchIterator::Create(Order(10), 4, LastBatch::kDrop);
  ASSERT_TRUE(batches.ok()) << batches.status();
  ASSERT_EQ(batches->num_batches(), 2);
  EXPECT_THAT(batches->Batch(1), ElementsAre(104, 105, 106, 107));
  EXPECT_THAT(batches->Batch(2), IsEmpty());
}

TEST(BatchIteratorTest, ExactMultipleGivesFullBatchesEitherWay) {
  for (LastBatch last : {LastBatch::kDrop, LastBatch::kKeep}) {
    absl::StatusOr<BatchIterator> batches =
        BatchIterator::Create(Order(12), 4, last);
    ASSERT_TRUE(batches.ok());
    EXPECT_EQ(batches->num_batches(), 3);
    EXPECT_THAT(batches->Batch(2), ElementsAre(108, 109, 110, 111));
  }
}

TEST(BatchIteratorTest, BatchLargerThanOrderIsOneShortBatchOrNone) {
  EXPECT_EQ(BatchIterator::Create(Order(3), 8, LastBatch::kDrop)
                ->num_batches(),
            0);
  absl::StatusOr<BatchIterator> kept =
      BatchIterator::Create(Order(3), 8, LastBatch::kKeep);
  ASSERT_EQ(kept->num_batches(), 1);
  EXPECT_THAT(kept->Batch(0), ElementsAre(100, 101, 102));
  EXPECT_EQ(BatchIterator::Create({}, 8, LastBatch::kKeep)->num_batches(), 0);
}

TEST(BatchIteratorTest, NextWalksEveryBatchOnceThenStopsAndResetRestarts) {
  absl::StatusOr<BatchIterator> batches =
      BatchIterator::Create(Order(5), 2, LastBatch::kKeep);
  ASSERT_TRUE(batches.ok());
  std::vector<std::vector<int64_t>> seen;
  absl::Span<const int64_t> batch;
  while (batches->Next(&batch)) seen.push_back(ToVector(batch));
  EXPECT_THAT(seen, ElementsAre(ElementsAre(100, 101), ElementsAre(102, 103),
                                ElementsAre(104)));
  EXPECT_FALSE(batches->Next(&batch));
  batches->Reset();
  ASSERT_TRUE(batches->Next(&batch));
  EXPECT_THAT(batch, ElementsAre(100, 101));
}

TEST(BatchIteratorTest, BatchOutsideTheEpochIsEmpty) {
  absl::StatusOr<BatchIterator> batches =
      BatchIterator::Create(Order(5), 2, LastBatch::kKeep);
  EXPECT_THAT(batches->Batch(-1), IsEmpty());
  EXPECT_THAT(batches->Batch(3), IsEmpty());
}

TEST(BatchIteratorTest, RejectsBatchSizeBelowOne) {
  EXPECT_EQ(BatchIterator::Create(Order(5), 0, LastBatch::kKeep)
                .status()
                .code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(BatchIterator::Create(Order(5), -3, LastBatch::kDrop)
                .status()
                .code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace grps
