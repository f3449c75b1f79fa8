#include "data/partition.h"

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "gtest/gtest.h"

namespace grps {
namespace {

TEST(PartitionTest, CoversEveryExampleExactlyOnceForSeveralWorldSizes) {
  for (int64_t n : {0, 1, 7, 100, 101, 60000}) {
    for (int world : {1, 2, 3, 4, 7, 16, 101}) {
      SCOPED_TRACE(testing::Message() << "n=" << n << " world=" << world);
      std::vector<int> owners(n, 0);
      int64_t smallest = INT64_MAX, largest = 0;
      for (int rank = 0; rank < world; ++rank) {
        absl::StatusOr<PartitionRange> range =
            PartitionForRank(n, rank, world);
        ASSERT_TRUE(range.ok()) << range.status();
        ASSERT_LE(0, range->begin);
        ASSERT_LE(range->begin, range->end);
        ASSERT_LE(range->end, n);
        for (int64_t i = range->begin; i < range->end; ++i) ++owners[i];
        smallest = std::min(smallest, range->size());
        largest = std::max(largest, range->size());
      }
      for (int64_t i = 0; i < n; ++i) {
        ASSERT_EQ(owners[i], 1) << "example " << i;
      }
      EXPECT_LE(largest - smallest, 1);
    }
  }
}

TEST(PartitionTest, RanksTakeConsecutiveBlocksAndTheFirstOnesTheRemainder) {
  // 10 examples over 4 ranks: 3, 3, 2, 2.
  EXPECT_EQ(*PartitionForRank(10, 0, 4), (PartitionRange{0, 3}));
  EXPECT_EQ(*PartitionForRank(10, 1, 4), (PartitionRange{3, 6}));
  EXPECT_EQ(*PartitionForRank(10, 2, 4), (PartitionRange{6, 8}));
  EXPECT_EQ(*PartitionForRank(10, 3, 4), (PartitionRange{8, 10}));
}

TEST(PartitionTest, OneRankGetsEverything) {
  EXPECT_EQ(*PartitionForRank(60000, 0, 1), (PartitionRange{0, 60000}));
}

TEST(PartitionTest, MoreRanksThanExamplesLeavesTheLastRanksEmpty) {
  EXPECT_EQ(PartitionForRank(2, 1, 5)->size(), 1);
  EXPECT_EQ(PartitionForRank(2, 2, 5)->size(), 0);
  EXPECT_EQ(PartitionForRank(2, 4, 5)->size(), 0);
}

TEST(PartitionTest, RejectsRankOutsideWorldAndBadSizes) {
  EXPECT_EQ(PartitionForRank(10, 4, 4).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(PartitionForRank(10, -1, 4).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(PartitionForRank(10, 0, 0).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(PartitionForRank(-1, 0, 1).status().code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace grps
