#include "coordinator/quorum_counts.h"

#include <vector>

#include "gtest/gtest.h"

namespace grps {
namespace {

Membership::LiveWorkers Live(std::vector<uint32_t> ranks, std::vector<uint64_t> incarnations) {
  return {std::move(ranks), std::move(incarnations)};
}

QuorumCounts::Job Running(uint64_t global_step, uint64_t generation = 1) {
  return {generation, /*running=*/true, /*sync_training=*/true, global_step};
}

// The cut a joining rank is given; counts how often it was asked.
struct Cut {
  uint64_t step = 0;
  int asked = 0;
  std::function<uint64_t()> fn() {
    return [this] {
      ++asked;
      return step;
    };
  }
};

TEST(QuorumCounts, TheRanksThatStartTheJobCountAtOnce) {
  QuorumCounts q;
  Cut cut{50};
  // While the job waits, then as it starts running: nobody waits.
  EXPECT_EQ(q.CountsFrom(Live({0, 1}, {1, 1}), {1, false, true, 0}, cut.fn()),
            (std::vector<uint64_t>{0, 0}));
  EXPECT_EQ(q.CountsFrom(Live({0, 1}, {1, 1}), Running(0), cut.fn()),
            (std::vector<uint64_t>{0, 0}));
  EXPECT_EQ(cut.asked, 0);
}

TEST(QuorumCounts, ARankThatJoinsARunningSyncJobCountsFromTheCutAndKeepsIt) {
  QuorumCounts q;
  Cut cut{50};
  q.CountsFrom(Live({0, 1}, {1, 1}), Running(0), cut.fn());
  q.CountsFrom(Live({0}, {1}), Running(30), cut.fn());  // rank 1 died
  // Rank 1 restarted (incarnation 2): it counts from the cut, ahead of
  // every shard; rank 0 counts as before.
  EXPECT_EQ(q.CountsFrom(Live({0, 1}, {1, 2}), Running(40), cut.fn()),
            (std::vector<uint64_t>{0, 50}));
  EXPECT_EQ(cut.asked, 1);
  // Later replies give it the same step, whatever the cut is now.
  cut.step = 90;
  EXPECT_EQ(q.CountsFrom(Live({0, 1}, {1, 2}), Running(60), cut.fn()),
            (std::vector<uint64_t>{0, 50}));
  EXPECT_EQ(cut.asked, 1);
}

TEST(QuorumCounts, ARollBackMakesEveryRankCountAtOnce) {
  QuorumCounts q;
  Cut cut{50};
  q.CountsFrom(Live({0, 1}, {1, 1}), Running(0), cut.fn());
  q.CountsFrom(Live({0}, {1}), Running(30), cut.fn());
  EXPECT_EQ(q.CountsFrom(Live({0, 1}, {1, 2}), Running(40, /*generation=*/2), cut.fn()),
            (std::vector<uint64_t>{0, 0}));
}

TEST(QuorumCounts, NobodyWaitsWhenNoOtherRankCountsYet) {
  QuorumCounts q;
  Cut cut{50};
  q.CountsFrom(Live({0, 1}, {1, 1}), Running(0), cut.fn());
  q.CountsFrom(Live({0, 1}, {1, 2}), Running(10), cut.fn());  // rank 1 counts from 50
  // Rank 0 restarts too before the shards reach 50: no rank counts now,
  // so neither waits for the other.
  EXPECT_EQ(q.CountsFrom(Live({0, 1}, {2, 2}), Running(20), cut.fn()),
            (std::vector<uint64_t>{0, 50}));
  EXPECT_EQ(cut.asked, 1);
}

TEST(QuorumCounts, AJoinerWaitsForNothingOnceASyncJobIsDoneTrainingOrInAsync) {
  QuorumCounts q;
  Cut cut{50};
  q.CountsFrom(Live({0, 1}, {1, 1}), Running(0), cut.fn());
  const QuorumCounts::Job not_sync_training{1, /*running=*/true, /*sync_training=*/false, 30};
  EXPECT_EQ(q.CountsFrom(Live({0, 1}, {1, 2}), not_sync_training, cut.fn()),
            (std::vector<uint64_t>{0, 0}));
  EXPECT_EQ(cut.asked, 0);
}

}  // namespace
}  // namespace grps
