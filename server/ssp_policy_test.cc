// The rules of ssp (server/ssp_policy.cc), on a fake chunk.
#include <memory>
#include <optional>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/consistency_policy.h"
#include "server/testing/policy_test_target.h"

namespace grps {
namespace {

struct Ssp {
  Ssp(uint32_t workers, uint32_t bound)
      : config(PolicyTestConfig(v1::MODE_SSP, workers)), live(LiveSet::All(workers)) {
    config.set_staleness_bound(bound);
    policy = MakeSspPolicy(config);
  }
  GradientFate Push(uint32_t rank, uint64_t clock,
                    const v1::OptimizerConfig* optimizer = nullptr) {
    return policy->Accept({rank, 1, clock, chunk.version(), optimizer}, Grad({1}), chunk, live);
  }

  v1::JobConfig config;
  LiveSet live;
  std::unique_ptr<ChunkPolicy> policy;
  FakeTarget chunk{1};
};

TEST(SspPolicy, APullWaitsUntilTheSlowestLiveWorkerIsWithinSClocks) {
  Ssp ssp(2, /*bound=*/1);
  EXPECT_TRUE(ssp.policy->ReadyToServe(0, 1, ssp.chunk, ssp.live));
  EXPECT_FALSE(ssp.policy->ReadyToServe(0, 2, ssp.chunk, ssp.live));
  EXPECT_EQ(ssp.Push(0, 0), GradientFate::kApplied);
  EXPECT_FALSE(ssp.policy->ReadyToServe(0, 2, ssp.chunk, ssp.live)) << "rank 1 is at clock 0";
  EXPECT_EQ(ssp.Push(1, 0), GradientFate::kApplied);
  EXPECT_TRUE(ssp.policy->ReadyToServe(0, 2, ssp.chunk, ssp.live));
}

TEST(SspPolicy, AGradientIsHeldUntilEveryLiveWorkerPushedItsClockMinusS) {
  Ssp ssp(2, /*bound=*/0);
  EXPECT_EQ(ssp.Push(0, 0), GradientFate::kHeld);
  EXPECT_EQ(ssp.policy->held(), 1u);
  EXPECT_FALSE(ssp.policy->Served(0, 0, ssp.chunk, ssp.live));
  EXPECT_FALSE(ssp.policy->Served(1, 0, ssp.chunk, ssp.live)) << "a read's reply can be lost";
  EXPECT_TRUE(ssp.chunk.updates.empty());
  EXPECT_EQ(ssp.Push(1, 0), GradientFate::kApplied);
  EXPECT_EQ(ssp.chunk.updates.size(), 2u);
  EXPECT_EQ(ssp.policy->held(), 0u);
}

TEST(SspPolicy, AReadAgainAfterALostReplyGetsTheSameValues) {
  Ssp ssp(2, /*bound=*/0);
  ssp.policy->Served(0, 0, ssp.chunk, ssp.live);
  ssp.policy->Served(1, 0, ssp.chunk, ssp.live);  // its reply never reaches rank 1
  EXPECT_EQ(ssp.Push(0, 0), GradientFate::kHeld);
  const uint64_t version = ssp.chunk.version();
  ASSERT_TRUE(ssp.policy->ReadyToServe(1, 0, ssp.chunk, ssp.live));
  ssp.policy->Served(1, 0, ssp.chunk, ssp.live);  // rank 1 reads clock 0 again
  EXPECT_EQ(ssp.chunk.version(), version) << "rank 1's second read saw rank 0's clock 0";
  EXPECT_EQ(ssp.Push(1, 0), GradientFate::kApplied);
  EXPECT_EQ(ssp.chunk.version(), version + 2);
}

TEST(SspPolicy, APullOfTheNextClockFinishesTheReadOfThisOne) {
  Ssp ssp(2, /*bound=*/1);
  EXPECT_EQ(ssp.Push(0, 1), GradientFate::kHeld) << "rank 1 may still read clock 0";
  EXPECT_FALSE(ssp.policy->Served(1, 0, ssp.chunk, ssp.live));
  EXPECT_TRUE(ssp.policy->Served(1, 1, ssp.chunk, ssp.live));
  EXPECT_EQ(ssp.chunk.updates.size(), 1u);
}

TEST(SspPolicy, ATooStaleGradientStillFinishesItsRanksRead) {
  Ssp ssp(2, /*bound=*/0);
  ssp.config.set_max_staleness(1);
  ssp.policy = MakeSspPolicy(ssp.config);
  EXPECT_EQ(ssp.Push(0, 0), GradientFate::kHeld);
  EXPECT_EQ(ssp.policy->Accept({1, 1, 0, 0}, Grad({1}), ssp.chunk, ssp.live),
            GradientFate::kApplied);
  ASSERT_EQ(ssp.chunk.version(), 2u);
  EXPECT_EQ(ssp.policy->Accept({0, 1, 1, 0}, Grad({1}), ssp.chunk, ssp.live),
            GradientFate::kTooStale);
  EXPECT_EQ(ssp.policy->Accept({1, 1, 1, 2}, Grad({1}), ssp.chunk, ssp.live),
            GradientFate::kApplied)
      << "rank 0's too-stale gradient of clock 1 did not finish its read of clock 1";
}

TEST(SspPolicy, AHeldGradientKeepsItsProgramsOptimizerUntilItIsApplied) {
  Ssp ssp(2, /*bound=*/0);
  {
    v1::OptimizerConfig program;  // gone once the push's call returns
    program.set_kind(v1::OPTIMIZER_SGD);
    program.set_learning_rate(0.8f);
    EXPECT_EQ(ssp.Push(0, 0, &program), GradientFate::kHeld);
  }
  EXPECT_EQ(ssp.Push(1, 0), GradientFate::kApplied);
  ASSERT_EQ(ssp.chunk.updates.size(), 2u);
  ASSERT_TRUE(ssp.chunk.updates[0].optimizer.has_value());  // rank 0's, released first
  EXPECT_FLOAT_EQ(ssp.chunk.updates[0].lr, 0.4f);
  EXPECT_FALSE(ssp.chunk.updates[1].optimizer.has_value());
}

TEST(SspPolicy, ADeadWorkerHoldsNobody) {
  Ssp ssp(2, /*bound=*/0);
  ssp.policy->Served(0, 0, ssp.chunk, ssp.live);
  EXPECT_EQ(ssp.Push(0, 0), GradientFate::kHeld);
  ssp.live.live[1] = false;
  ssp.live.count = 1;
  EXPECT_TRUE(ssp.policy->LiveSetChanged(ssp.chunk, ssp.live));
  EXPECT_EQ(ssp.chunk.updates.size(), 1u);
}

TEST(SspPolicy, AReadWithoutAClockFinishesNothing) {
  Ssp ssp(2, /*bound=*/0);
  EXPECT_EQ(ssp.Push(0, 0), GradientFate::kHeld);
  EXPECT_FALSE(ssp.policy->ServedWithoutClock(1, ssp.chunk, ssp.live));
  EXPECT_EQ(ssp.policy->held(), 1u);
}

TEST(SspPolicy, AGradientStalerThanMaxStalenessIsTooStale) {
  Ssp ssp(1, /*bound=*/3);
  ssp.config.set_max_staleness(1);
  ssp.policy = MakeSspPolicy(ssp.config);
  FakeTarget chunk(1, 3);
  EXPECT_EQ(ssp.policy->Accept({0, 1, 0, 1}, Grad({1}), chunk, ssp.live),
            GradientFate::kTooStale);
  EXPECT_EQ(ssp.policy->Accept({0, 1, 1, 2}, Grad({1}), chunk, ssp.live),
            GradientFate::kApplied);
  ASSERT_EQ(chunk.updates.size(), 1u);
  EXPECT_EQ(chunk.updates[0].staleness, 1);
}

TEST(SspPolicy, ACheckpointsMarkLeavesOutAHeldGradientAndSaysWhereToComputeAgain) {
  Ssp ssp(2, /*bound=*/0);
  ssp.policy->Served(0, 2, ssp.chunk, ssp.live);
  EXPECT_EQ(ssp.Push(0, 2), GradientFate::kHeld);
  EXPECT_EQ(ssp.policy->Cut(5, ssp.chunk), CheckpointCut::kNow);
  v1::DedupMark mark;
  mark.set_valid(true);
  mark.set_step(2);
  EXPECT_EQ(ssp.policy->KeepMark(0, ssp.chunk, &mark), std::optional<uint64_t>(2));
  EXPECT_TRUE(mark.valid());
  EXPECT_EQ(mark.step(), 1u);
  v1::DedupMark other;  // rank 1 holds nothing
  other.set_valid(true);
  other.set_step(4);
  EXPECT_FALSE(ssp.policy->KeepMark(1, ssp.chunk, &other).has_value());
  EXPECT_EQ(other.step(), 4u);
}

TEST(SspPolicy, AHeldFirstStepLeavesNoMark) {
  Ssp ssp(2, /*bound=*/0);
  EXPECT_EQ(ssp.Push(0, 0), GradientFate::kHeld);
  v1::DedupMark mark;
  mark.set_valid(true);
  mark.set_step(0);
  EXPECT_EQ(ssp.policy->KeepMark(0, ssp.chunk, &mark), std::optional<uint64_t>(0));
  EXPECT_FALSE(mark.valid());
}

TEST(SspPolicy, ARestoredChunksClocksStartAtTheResumeSteps) {
  Ssp ssp(2, /*bound=*/1);
  const uint64_t resume[] = {5, 5};
  ssp.policy->Restored(resume);
  EXPECT_TRUE(ssp.policy->ReadyToServe(0, 6, ssp.chunk, ssp.live));
  EXPECT_FALSE(ssp.policy->ReadyToServe(0, 7, ssp.chunk, ssp.live));
}

TEST(SspPolicy, AWorkerBackFromTheDeadRejoinsAtTheSlowestClock) {
  Ssp ssp(2, /*bound=*/1);
  ssp.live.live[1] = false;
  ssp.live.count = 1;
  ssp.policy->LiveSetChanged(ssp.chunk, ssp.live);
  for (uint64_t clock = 0; clock < 8; ++clock) {
    ssp.policy->Served(0, clock, ssp.chunk, ssp.live);
    ASSERT_EQ(ssp.Push(0, clock), GradientFate::kApplied);
  }
  ssp.live = LiveSet::All(2);
  ssp.policy->LiveSetChanged(ssp.chunk, ssp.live);
  // Rank 1's clock 0 counts as rank 0's clock 8: neither waits for the other.
  EXPECT_TRUE(ssp.policy->ReadyToServe(1, 0, ssp.chunk, ssp.live));
  EXPECT_TRUE(ssp.policy->ReadyToServe(0, 9, ssp.chunk, ssp.live));
}

// A worker back from the dead reads no clock before the one it rejoins at:
// the others' gradients up to that clock plus s go in before its first push.
TEST(SspPolicy, AWorkerBackFromTheDeadHoldsNoGradientOfAClockItWillNotRead) {
  Ssp ssp(2, /*bound=*/1);
  ssp.live.live[1] = false;
  ssp.live.count = 1;
  ssp.policy->LiveSetChanged(ssp.chunk, ssp.live);
  for (uint64_t clock = 0; clock < 8; ++clock)
    ASSERT_EQ(ssp.Push(0, clock), GradientFate::kApplied);
  ssp.live = LiveSet::All(2);
  ssp.policy->LiveSetChanged(ssp.chunk, ssp.live);
  ASSERT_TRUE(ssp.policy->ReadyToServe(1, 0, ssp.chunk, ssp.live));  // rejoins at clock 8
  EXPECT_EQ(ssp.Push(0, 8), GradientFate::kApplied);
  EXPECT_EQ(ssp.Push(0, 9), GradientFate::kHeld) << "rank 1 may still read clock 8";
  EXPECT_EQ(ssp.Push(1, 0), GradientFate::kApplied);  // its clock 8
  EXPECT_EQ(ssp.policy->held(), 0u);
}

}  // namespace
}  // namespace grps
