#include "coordinator/global_step.h"

#include "gtest/gtest.h"

namespace grps {
namespace {

const absl::Time kStart = absl::FromUnixSeconds(1'700'000'000);

TEST(GlobalStep, KnowsNothingBeforeTheShardsReport) {
  GlobalStep g;
  EXPECT_FALSE(g.step().has_value());
  EXPECT_EQ(g.moved(), absl::InfinitePast());
  EXPECT_EQ(g.rate(), 0);
  EXPECT_FALSE(g.RateMeasured());
}

TEST(GlobalStep, MovesOnlyWhenTheStepChanges) {
  GlobalStep g;
  g.Note(10, kStart);
  EXPECT_EQ(g.step(), 10u);
  EXPECT_EQ(g.moved(), kStart);
  g.Note(10, kStart + absl::Seconds(2));
  EXPECT_EQ(g.moved(), kStart);
  g.Note(11, kStart + absl::Seconds(3));
  EXPECT_EQ(g.moved(), kStart + absl::Seconds(3));
}

TEST(GlobalStep, MeasuresTheRateOverWindowsOfHalfASecond) {
  GlobalStep g;
  g.Note(0, kStart);
  g.Note(20, kStart + absl::Milliseconds(400));  // a first estimate: 50 a second
  EXPECT_DOUBLE_EQ(g.rate(), 50);
  EXPECT_FALSE(g.RateMeasured());
  g.Note(40, kStart + absl::Seconds(1));  // the whole window: 40 steps a second
  EXPECT_DOUBLE_EQ(g.rate(), 40);
  EXPECT_TRUE(g.RateMeasured());
}

TEST(GlobalStep, TheFastestRecentRateOutlivesASlowSpellForThirtySeconds) {
  GlobalStep g;
  g.Note(0, kStart);
  g.Note(100, kStart + absl::Seconds(1));  // 100 a second
  g.Note(110, kStart + absl::Seconds(2));  // 10 a second: a worker restarts
  EXPECT_DOUBLE_EQ(g.rate(), 10);
  EXPECT_DOUBLE_EQ(g.FastestRecentRate(), 100);
  // Thirty seconds on, at 10 a second, the fast window is forgotten.
  uint64_t step = 110;
  for (int s = 3; s <= 33; ++s) g.Note(step += 10, kStart + absl::Seconds(s));
  EXPECT_DOUBLE_EQ(g.FastestRecentRate(), 10);
}

TEST(GlobalStep, ARollBackForgetsTheStepAndMeasuresAgainFromTheLowerOne) {
  GlobalStep g;
  g.Note(0, kStart);
  g.Note(50, kStart + absl::Seconds(1));
  g.Forget(kStart + absl::Seconds(2));
  EXPECT_FALSE(g.step().has_value());
  EXPECT_EQ(g.moved(), kStart + absl::Seconds(2));
  // The shards report the checkpoint's step, below the anchor: no negative
  // rate, a new anchor.
  g.Note(20, kStart + absl::Seconds(3));
  g.Note(30, kStart + absl::Seconds(4));
  EXPECT_DOUBLE_EQ(g.rate(), 10);
}

TEST(GlobalStep, ARestartCountsAsAMoveAndKeepsTheStep) {
  GlobalStep g;
  g.Note(7, kStart);
  g.Restart(kStart + absl::Seconds(5));
  EXPECT_EQ(g.step(), 7u);
  EXPECT_EQ(g.moved(), kStart + absl::Seconds(5));
}

}  // namespace
}  // namespace grps
