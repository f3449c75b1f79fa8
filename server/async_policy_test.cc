// The rules of async (server/async_policy.cc), on a fake chunk.
#include <memory>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "job/job_config.h"
#include "server/consistency_policy.h"
#include "server/testing/policy_test_target.h"

namespace grps {
namespace {

using ::testing::ElementsAre;

TEST(AsyncPolicy, EveryGradientIsAppliedOnArrivalWithItsStaleness) {
  const v1::JobConfig config = PolicyTestConfig(v1::MODE_ASYNC, 2);
  std::unique_ptr<ChunkPolicy> policy = MakeAsyncPolicy(config);
  const LiveSet live = LiveSet::All(2);
  FakeTarget chunk(1);
  EXPECT_EQ(policy->Accept({0, 1, 0, 0}, Grad({2}), chunk, live), GradientFate::kApplied);
  EXPECT_EQ(policy->Accept({1, 1, 0, 0}, Grad({4}), chunk, live), GradientFate::kApplied);
  ASSERT_EQ(chunk.updates.size(), 2u);
  EXPECT_THAT(chunk.updates[1].grad, ElementsAre(4.0f));
  EXPECT_EQ(chunk.updates[0].staleness, 0);
  EXPECT_EQ(chunk.updates[1].staleness, 1);
  // One worker's batch: lr / workers.
  EXPECT_FLOAT_EQ(chunk.updates[0].lr, 0.5f);
  EXPECT_EQ(policy->AckVersion({1, 1, 0, 0}, GradientFate::kApplied, chunk), 2u);
}

TEST(AsyncPolicy, AStalenessAwareLearningRateIsDividedByOnePlusTheStaleness) {
  v1::JobConfig config = PolicyTestConfig(v1::MODE_ASYNC, 1);
  config.set_staleness_aware_lr(true);
  std::unique_ptr<ChunkPolicy> policy = MakeAsyncPolicy(config);
  FakeTarget chunk(1, 3);
  policy->Accept({0, 1, 3, 0}, Grad({1}), chunk, LiveSet::All(1));
  ASSERT_EQ(chunk.updates.size(), 1u);
  EXPECT_EQ(chunk.updates[0].staleness, 3);
  EXPECT_FLOAT_EQ(chunk.updates[0].lr, 0.25f);
}

TEST(AsyncPolicy, AGradientStalerThanMaxStalenessIsTooStaleAndNotApplied) {
  v1::JobConfig config = PolicyTestConfig(v1::MODE_ASYNC, 1);
  config.set_max_staleness(2);
  std::unique_ptr<ChunkPolicy> policy = MakeAsyncPolicy(config);
  FakeTarget chunk(1, 5);
  EXPECT_EQ(policy->Accept({0, 1, 0, 2}, Grad({1}), chunk, LiveSet::All(1)),
            GradientFate::kTooStale);
  EXPECT_TRUE(chunk.updates.empty());
  EXPECT_EQ(policy->Accept({0, 1, 1, 3}, Grad({1}), chunk, LiveSet::All(1)),
            GradientFate::kApplied);
}

TEST(AsyncPolicy, AGradientOnAVersionNeverServedIsRefused) {
  std::unique_ptr<ChunkPolicy> policy = MakeAsyncPolicy(PolicyTestConfig(v1::MODE_ASYNC, 1));
  FakeTarget chunk(1, 2);
  EXPECT_TRUE(policy->Check({0, 1, 0, 2}, chunk).ok());
  EXPECT_TRUE(absl::IsFailedPrecondition(policy->Check({0, 1, 0, 3}, chunk)));
}

TEST(AsyncPolicy, PullsNeverWait) {
  std::unique_ptr<ChunkPolicy> policy = MakeAsyncPolicy(PolicyTestConfig(v1::MODE_ASYNC, 2));
  FakeTarget chunk(1);
  EXPECT_TRUE(policy->ReadyToServe(0, 1000, chunk, LiveSet::All(2)));
}

TEST(AsyncPolicy, ACheckpointTakesEachChunkAsItIsWithItsMarks) {
  std::unique_ptr<ChunkPolicy> policy = MakeAsyncPolicy(PolicyTestConfig(v1::MODE_ASYNC, 1));
  FakeTarget chunk(1, 3);
  EXPECT_EQ(policy->Cut(0, chunk), CheckpointCut::kNow);
  EXPECT_EQ(policy->Cut(7, chunk), CheckpointCut::kNow);
  v1::DedupMark mark;
  mark.set_valid(true);
  mark.set_step(9);
  EXPECT_FALSE(policy->KeepMark(0, chunk, &mark).has_value());
  EXPECT_TRUE(mark.valid());
  EXPECT_EQ(mark.step(), 9u);
}

TEST(AsyncPolicy, AnUpdateRunsThePushersProgramOptimizerAtItsLearningRateOverTheWorkers) {
  const v1::JobConfig config = PolicyTestConfig(v1::MODE_ASYNC, 2);
  std::unique_ptr<ChunkPolicy> policy = MakeAsyncPolicy(config);
  FakeTarget chunk(1);
  v1::OptimizerConfig program;
  program.set_kind(v1::OPTIMIZER_SGD);
  program.set_learning_rate(0.3f);
  policy->Accept({0, 1, 0, 0, &program}, Grad({1}), chunk, LiveSet::All(2));
  policy->Accept({1, 1, 0, 1}, Grad({1}), chunk, LiveSet::All(2));
  ASSERT_EQ(chunk.updates.size(), 2u);
  ASSERT_TRUE(chunk.updates[0].optimizer.has_value());
  EXPECT_FLOAT_EQ(chunk.updates[0].lr, 0.15f);
  EXPECT_FALSE(chunk.updates[1].optimizer.has_value()) << "the job's";
  EXPECT_FLOAT_EQ(chunk.updates[1].lr, 0.5f);
}

}  // namespace
}  // namespace grps
