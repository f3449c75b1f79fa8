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
  // The first whole window, 40 steps a second, is an estimate too: the step
  // may have stood still at its start.
  g.Note(40, kStart + absl::Seconds(1));
  EXPECT_DOUBLE_EQ(g.rate(), 40);
  EXPECT_FALSE(g.RateMeasured());
  g.Note(60, kStart + absl::Milliseconds(1500));  // moving all along: 40 a second
  EXPECT_DOUBLE_EQ(g.rate(), 40);
  EXPECT_TRUE(g.RateMeasured());
}

TEST(GlobalStep, AWindowInWhichTheStepStoodStillIsNoRate) {
  // The shards report step 0 while the workers start; the step moves 0.9 s
  // in, at 400 a second.
  GlobalStep g;
  g.Note(0, kStart);
  g.Note(0, kStart + absl::Milliseconds(500));
  EXPECT_FALSE(g.RateMeasured());
  g.Note(40, kStart + absl::Seconds(1));  // moving for 0.1 s of the window
  EXPECT_FALSE(g.RateMeasured());
  g.Note(240, kStart + absl::Milliseconds(1500));
  EXPECT_TRUE(g.RateMeasured());
  EXPECT_DOUBLE_EQ(g.FastestRecentRate(), 400);
}

TEST(GlobalStep, TheRateIsMeasuredOnTheHighestVersionTheLowestMayBeAHeartbeatOld) {
  // Two shards at 400 steps a second report 3 ms apart: at the first
  // report the lowest is the other's version of 500 ms before.
  GlobalStep g;
  g.Note(0, kStart);
  g.Note(0, kStart + absl::Milliseconds(3));
  for (int i = 1; i <= 3; ++i) {
    const absl::Time at = kStart + i * absl::Milliseconds(500);
    g.Note(200 * (i - 1), 200 * i, at);
    g.Note(200 * i, 200 * i, at + absl::Milliseconds(3));
  }
  EXPECT_EQ(g.step(), 600u);
  EXPECT_TRUE(g.RateMeasured());
  EXPECT_DOUBLE_EQ(g.FastestRecentRate(), 400);
}

TEST(GlobalStep, TheFastestRecentRateOutlivesASlowSpellForThirtySeconds) {
  GlobalStep g;
  g.Note(0, kStart);
  g.Note(50, kStart + absl::Seconds(1));   // from a standstill: an estimate
  g.Note(150, kStart + absl::Seconds(2));  // 100 a second
  g.Note(160, kStart + absl::Seconds(3));  // 10 a second: a worker restarts
  EXPECT_DOUBLE_EQ(g.rate(), 10);
  EXPECT_DOUBLE_EQ(g.FastestRecentRate(), 100);
  // Thirty seconds on, at 10 a second, the fast window is forgotten.
  uint64_t step = 160;
  for (int s = 4; s <= 34; ++s) g.Note(step += 10, kStart + absl::Seconds(s));
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
