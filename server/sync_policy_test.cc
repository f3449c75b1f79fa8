// The rules of sync (server/sync_policy.cc), on a fake chunk.
#include <memory>
#include <utility>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/consistency_policy.h"
#include "server/testing/policy_test_target.h"

namespace grps {
namespace {

using ::testing::ElementsAre;

struct Sync {
  explicit Sync(uint32_t workers, uint32_t backup = 0,
                v1::LateGradientPolicy late = v1::LATE_GRADIENTS_FOLD)
      : config(PolicyTestConfig(v1::MODE_SYNC, workers)), live(LiveSet::All(workers)) {
    config.set_backup_workers(backup);
    config.set_late_gradients(late);
    policy = MakeSyncPolicy(config);
  }
  // A job of `config`, `live` its live set.
  Sync(v1::JobConfig job, LiveSet live_set) : config(std::move(job)), live(std::move(live_set)) {
    policy = MakeSyncPolicy(config);
  }
  // Rank `rank`'s gradient of its step `step`, computed on `base`.
  GradientFate Push(uint32_t rank, uint64_t base, std::vector<float> values, uint64_t step = 0,
                    const v1::OptimizerConfig* optimizer = nullptr) {
    const ChunkGradientMeta g{rank, 1, step, base, optimizer};
    EXPECT_TRUE(policy->Check(g, chunk).ok());
    return policy->Accept(g, Grad(values), chunk, live);
  }

  // A heartbeat told the shard of these incarnations, by rank.
  void Hear(std::vector<uint64_t> incarnations) {
    live.incarnations = std::move(incarnations);
    policy->LiveSetChanged(chunk, live);
  }

  v1::JobConfig config;
  LiveSet live;
  std::unique_ptr<ChunkPolicy> policy;
  FakeTarget chunk{1};
};

TEST(SyncPolicy, AStepIsAppliedOnceEveryLiveWorkerContributedWithTheAverage) {
  Sync sync(2);
  EXPECT_EQ(sync.Push(0, 0, {2}), GradientFate::kAggregated);
  EXPECT_TRUE(sync.chunk.updates.empty());
  EXPECT_EQ(sync.Push(1, 0, {4}), GradientFate::kAggregated);
  ASSERT_EQ(sync.chunk.updates.size(), 1u);
  EXPECT_THAT(sync.chunk.updates[0].grad, ElementsAre(3.0f));
  EXPECT_EQ(sync.chunk.updates[0].staleness, -1);  // sync measures none
}

TEST(SyncPolicy, AStepSumsItsContributionsInRankOrderWhateverTheArrivalOrder) {
  // In float, (1e8 + -1e8) + 1 = 1 but (1 + 1e8) + -1e8 = 0.
  Sync sync(3);
  sync.Push(2, 0, {1});
  sync.Push(0, 0, {1e8f});
  sync.Push(1, 0, {-1e8f});
  ASSERT_EQ(sync.chunk.updates.size(), 1u);
  EXPECT_THAT(sync.chunk.updates[0].grad, ElementsAre(1.0f / 3.0f));
}

TEST(SyncPolicy, HeldContributionsFollowInRankOrderAfterARankThatGaveNothing) {
  // One backup worker: ranks 3, 2, 1 complete the step in that order, rank
  // 0 gives nothing. Their contributions go in as 1, 2, 3.
  Sync sync(4, /*backup=*/1);
  sync.Push(3, 0, {1});
  sync.Push(2, 0, {-1e8f});
  sync.Push(1, 0, {1e8f});
  ASSERT_EQ(sync.chunk.updates.size(), 1u);
  EXPECT_THAT(sync.chunk.updates[0].grad, ElementsAre(1.0f / 3.0f));
}

TEST(SyncPolicy, FoldedLateGradientsGoInAfterTheContributionsInRankOrder) {
  Sync sync(3, /*backup=*/1);
  sync.Push(0, 0, {5});
  sync.Push(1, 0, {5});  // step 0 completes without rank 2
  ASSERT_EQ(sync.chunk.updates.size(), 1u);
  EXPECT_EQ(sync.Push(2, 0, {1}), GradientFate::kLateFolded);
  sync.Push(1, 1, {-1e8f}, 1);
  sync.Push(0, 1, {1e8f}, 1);
  ASSERT_EQ(sync.chunk.updates.size(), 2u);
  // (1e8 + -1e8) + 1, averaged over the two contributions and the fold.
  EXPECT_THAT(sync.chunk.updates[1].grad, ElementsAre(1.0f / 3.0f));
}

TEST(SyncPolicy, BackupWorkersLetAStepCompleteWithTheFirstNMinusB) {
  Sync sync(3, /*backup=*/1);
  sync.Push(0, 0, {2});
  EXPECT_TRUE(sync.chunk.updates.empty());
  sync.Push(1, 0, {4});
  ASSERT_EQ(sync.chunk.updates.size(), 1u);
  EXPECT_THAT(sync.chunk.updates[0].grad, ElementsAre(3.0f));
}

TEST(SyncPolicy, ALateGradientDroppedIsNotApplied) {
  Sync sync(2, /*backup=*/1, v1::LATE_GRADIENTS_DROP);
  sync.Push(0, 0, {2});
  ASSERT_EQ(sync.chunk.updates.size(), 1u);
  EXPECT_EQ(sync.Push(1, 0, {100}), GradientFate::kLateDropped);
  EXPECT_TRUE(IsLate(GradientFate::kLateDropped));
  sync.Push(0, 1, {4}, 1);
  ASSERT_EQ(sync.chunk.updates.size(), 2u);
  EXPECT_THAT(sync.chunk.updates[1].grad, ElementsAre(4.0f));
}

TEST(SyncPolicy, ShrinkingTheLiveSetCompletesAnOpenStep) {
  Sync sync(2);
  sync.Push(0, 0, {2});
  EXPECT_TRUE(sync.chunk.updates.empty());
  sync.live.live[1] = false;
  sync.live.count = 1;
  EXPECT_TRUE(sync.policy->LiveSetChanged(sync.chunk, sync.live));
  ASSERT_EQ(sync.chunk.updates.size(), 1u);
  EXPECT_THAT(sync.chunk.updates[0].grad, ElementsAre(2.0f));
}

// The Python rejoin drill's extra step: at the job's end a straggler's last
// gradient came late to one shard, and when the workers left, that shard
// applied it as a step of its own, one past the others and the job's end.
TEST(SyncPolicy, LateGradientsAloneAreNoStepWhenTheLiveSetEmpties) {
  Sync sync(2, /*backup=*/1);
  sync.Push(0, 0, {2});
  ASSERT_EQ(sync.chunk.updates.size(), 1u);
  EXPECT_EQ(sync.Push(1, 0, {4}), GradientFate::kLateFolded);
  sync.live.live = {false, false};
  sync.live.count = 0;
  EXPECT_FALSE(sync.policy->LiveSetChanged(sync.chunk, sync.live));
  EXPECT_EQ(sync.chunk.updates.size(), 1u);
  // The fold goes into the next step somebody takes.
  sync.live = LiveSet::All(2);
  sync.Push(0, 1, {2}, 1);
  ASSERT_EQ(sync.chunk.updates.size(), 2u);
  EXPECT_THAT(sync.chunk.updates[1].grad, ElementsAre(3.0f));
}

// The elastic drill's split: a joiner that one shard counted in its quorum
// a step before another did trained a step behind there for good. Every
// shard now counts it from the step the coordinator names.
TEST(SyncPolicy, ALiveWorkerCountsTowardTheQuorumFromItsCountsFromStepOn) {
  Sync sync(2);
  sync.live.counts_from = {0, 2};  // rank 1 joined: it counts from step 2
  sync.Push(0, 0, {2});
  ASSERT_EQ(sync.chunk.updates.size(), 1u);  // step 0 did not wait for rank 1
  EXPECT_EQ(sync.Push(1, 1, {4}, 1), GradientFate::kAggregated);  // in time: in the sum
  sync.Push(0, 1, {2}, 1);
  ASSERT_EQ(sync.chunk.updates.size(), 2u);
  EXPECT_THAT(sync.chunk.updates[1].grad, ElementsAre(3.0f));
  // From step 2 on, the step waits for it.
  sync.Push(0, 2, {2}, 2);
  EXPECT_EQ(sync.chunk.updates.size(), 2u);
  sync.Push(1, 2, {6}, 2);
  ASSERT_EQ(sync.chunk.updates.size(), 3u);
  EXPECT_THAT(sync.chunk.updates[2].grad, ElementsAre(4.0f));
}

TEST(SyncPolicy, AStepThatNoLiveWorkerCountsTowardYetCompletesWithWhatItHolds) {
  // The only live rank restarted: it counts from step 5.
  Sync sync(1);
  sync.live.counts_from = {5};
  sync.Push(0, 0, {2});
  ASSERT_EQ(sync.chunk.updates.size(), 1u);
}

TEST(SyncPolicy, ASecondGradientOnTheSameVersionIsRefused) {
  Sync sync(2);
  sync.Push(0, 0, {2});
  const absl::Status again = sync.policy->Check({0, 1, 1, 0}, sync.chunk);
  EXPECT_TRUE(absl::IsFailedPrecondition(again)) << again;
  EXPECT_TRUE(absl::IsFailedPrecondition(sync.policy->Check({1, 1, 0, 1}, sync.chunk)))
      << "computed on a version the chunk never had";
}

TEST(SyncPolicy, AnAggregatedGradientIsAcknowledgedAtTheVersionItsStepCompletes) {
  Sync sync(2);
  const ChunkGradientMeta g{0, 1, 0, 0};
  EXPECT_EQ(sync.policy->AckVersion(g, sync.Push(0, 0, {2}), sync.chunk), 1u);
  EXPECT_EQ(sync.chunk.version(), 0u);
}

TEST(SyncPolicy, APullWaitsForTheStepItsWorkerContributedTo) {
  Sync sync(2);
  EXPECT_TRUE(sync.policy->ReadyToServe(0, 0, sync.chunk, sync.live));
  sync.Push(0, 0, {2});
  EXPECT_FALSE(sync.policy->ReadyToServe(0, 1, sync.chunk, sync.live));
  EXPECT_TRUE(sync.policy->ReadyToServe(1, 0, sync.chunk, sync.live));
  sync.Push(1, 0, {2});
  EXPECT_TRUE(sync.policy->ReadyToServe(0, 1, sync.chunk, sync.live));
}

TEST(SyncPolicy, ARestartedWorkersNewIncarnationReadsAtOnceUntilItContributes) {
  Sync sync(2);
  sync.Hear({1, 1});
  sync.Push(0, 0, {2});
  sync.Push(1, 0, {2});
  sync.Push(1, 1, {2}, 1);  // rank 1 waits for step 1, and dies
  EXPECT_FALSE(sync.policy->ReadyToServe(1, 2, sync.chunk, sync.live));
  // Its new incarnation, heard of before it pushed, reads at once.
  sync.Hear({1, 2});
  EXPECT_TRUE(sync.policy->ReadyToServe(1, 1, sync.chunk, sync.live));
}

TEST(SyncPolicy, ANewIncarnationThatPushedBeforeItWasHeardOfWaitsForItsStep) {
  // A restarted worker pushes as soon as it registered; the shard hears of
  // its incarnation a heartbeat later. That must not release its pull early:
  // it would read the version it computed on again, and its next gradient on
  // that version is refused as a replay (seen in python_faults' rejoin).
  Sync sync(2);
  sync.Hear({1, 1});
  sync.Push(0, 0, {2});
  sync.Push(1, 0, {2});
  ASSERT_EQ(sync.chunk.version(), 1u);
  const ChunkGradientMeta reborn{1, 2, 1, 1};  // incarnation 2, step 1 on version 1
  ASSERT_TRUE(sync.policy->Check(reborn, sync.chunk).ok());
  sync.policy->Accept(reborn, Grad({2}), sync.chunk, sync.live);
  sync.Hear({1, 2});
  EXPECT_FALSE(sync.policy->ReadyToServe(1, 2, sync.chunk, sync.live))
      << "step 1 is still open: the pull waits for it";
  sync.Push(0, 1, {2}, 1);
  EXPECT_EQ(sync.chunk.version(), 2u);
  EXPECT_TRUE(sync.policy->ReadyToServe(1, 2, sync.chunk, sync.live));
}

TEST(SyncPolicy, ACheckpointIsCutAtItsVersionExactly) {
  Sync sync(1);
  FakeTarget at_three(1, 3);
  EXPECT_EQ(sync.policy->Cut(0, at_three), CheckpointCut::kNow);
  EXPECT_EQ(sync.policy->Cut(3, at_three), CheckpointCut::kNow);
  EXPECT_EQ(sync.policy->Cut(5, at_three), CheckpointCut::kArmed);
  EXPECT_EQ(sync.policy->Cut(2, at_three), CheckpointCut::kPast);
}

TEST(SyncPolicy, ACheckpointsMarkLeavesOutThePushesOfTheOpenStep) {
  Sync sync(1);
  FakeTarget at_three(1, 3);
  v1::DedupMark open;  // a push of step 3 is in the open step's sum
  open.set_valid(true);
  open.set_step(3);
  EXPECT_FALSE(sync.policy->KeepMark(0, at_three, &open).has_value());
  EXPECT_TRUE(open.valid());
  EXPECT_EQ(open.step(), 2u);
  v1::DedupMark applied;
  applied.set_valid(true);
  applied.set_step(2);
  sync.policy->KeepMark(0, at_three, &applied);
  EXPECT_EQ(applied.step(), 2u);
  FakeTarget at_zero(1, 0);
  v1::DedupMark first;
  first.set_valid(true);
  first.set_step(0);
  sync.policy->KeepMark(0, at_zero, &first);
  EXPECT_FALSE(first.valid());
}

// --- Elastic jobs: the linear scaling rule ---------------------------------

// An elastic job started by `workers` workers, up to `max_workers`, with
// the first `live` ranks live.
Sync Elastic(uint32_t workers, uint32_t max_workers, uint32_t live) {
  v1::JobConfig config = PolicyTestConfig(v1::MODE_SYNC, workers);
  config.set_max_workers(max_workers);
  return Sync(config, LiveSet::First(max_workers, live));
}

TEST(SyncPolicy, AnElasticStepOfTwiceNumWorkersGradientsIsAppliedAtTwiceTheLearningRate) {
  Sync sync = Elastic(/*workers=*/2, /*max_workers=*/4, /*live=*/4);
  sync.Push(0, 0, {1});
  sync.Push(1, 0, {2});
  sync.Push(2, 0, {3});
  EXPECT_TRUE(sync.chunk.updates.empty()) << "every live rank contributes";
  sync.Push(3, 0, {6});
  ASSERT_EQ(sync.chunk.updates.size(), 1u);
  EXPECT_FLOAT_EQ(sync.chunk.updates[0].lr, 2.0f);
  EXPECT_THAT(sync.chunk.updates[0].grad, ElementsAre(3.0f)) << "still the average";
}

TEST(SyncPolicy, AnElasticStepOfNumWorkersGradientsIsAppliedAtTheScheduledLearningRate) {
  Sync sync = Elastic(/*workers=*/2, /*max_workers=*/4, /*live=*/2);
  sync.Push(0, 0, {1});
  sync.Push(1, 0, {3});
  ASSERT_EQ(sync.chunk.updates.size(), 1u);
  EXPECT_FLOAT_EQ(sync.chunk.updates[0].lr, 1.0f);
  EXPECT_THAT(sync.chunk.updates[0].grad, ElementsAre(2.0f));
}

TEST(SyncPolicy, AnElasticStepOfFewerThanNumWorkersGradientsIsAppliedAtAScaledDownRate) {
  // A worker left: one of two starting workers remains.
  Sync sync = Elastic(/*workers=*/2, /*max_workers=*/4, /*live=*/1);
  sync.Push(0, 0, {4});
  ASSERT_EQ(sync.chunk.updates.size(), 1u);
  EXPECT_FLOAT_EQ(sync.chunk.updates[0].lr, 0.5f);
}

TEST(SyncPolicy, TheElasticScaleCountsAGradientOfARankOutsideTheLiveSet) {
  // Rank 2 joined and pushed before the shard heard it is live: it counts
  // in the average (and so in the scale), not toward the quorum.
  Sync sync = Elastic(/*workers=*/2, /*max_workers=*/4, /*live=*/2);
  sync.Push(2, 0, {3});
  sync.Push(0, 0, {3});
  EXPECT_TRUE(sync.chunk.updates.empty());
  sync.Push(1, 0, {3});
  ASSERT_EQ(sync.chunk.updates.size(), 1u);
  EXPECT_FLOAT_EQ(sync.chunk.updates[0].lr, 1.5f);
}

TEST(SyncPolicy, TheElasticScaleCountsFoldedLateGradients) {
  // One backup worker: step 0 completes with 2 of 3; rank 2's late
  // gradient is folded into step 1, averaged over 3.
  v1::JobConfig config = PolicyTestConfig(v1::MODE_SYNC, 2);
  config.set_max_workers(3);
  config.set_backup_workers(1);
  Sync sync(config, LiveSet::First(3, 3));
  sync.Push(0, 0, {1});
  sync.Push(1, 0, {1});
  ASSERT_EQ(sync.chunk.updates.size(), 1u);
  EXPECT_FLOAT_EQ(sync.chunk.updates[0].lr, 1.0f);
  EXPECT_EQ(sync.Push(2, 0, {1}), GradientFate::kLateFolded);
  sync.Push(0, 1, {1}, 1);
  sync.Push(1, 1, {1}, 1);
  ASSERT_EQ(sync.chunk.updates.size(), 2u);
  EXPECT_FLOAT_EQ(sync.chunk.updates[1].lr, 1.5f);
}

TEST(SyncPolicy, ANonElasticStepIsAppliedAtTheScheduledLearningRateWhoeverContributes) {
  Sync four(4);
  for (uint32_t r = 0; r < 4; ++r) four.Push(r, 0, {1});
  ASSERT_EQ(four.chunk.updates.size(), 1u);
  EXPECT_FLOAT_EQ(four.chunk.updates[0].lr, 1.0f);

  Sync backup(4, /*backup=*/2);  // completes with 2 of 4
  backup.Push(0, 0, {1});
  backup.Push(1, 0, {1});
  ASSERT_EQ(backup.chunk.updates.size(), 1u);
  EXPECT_FLOAT_EQ(backup.chunk.updates[0].lr, 1.0f);
}

TEST(SyncPolicy, TheElasticScaleMultipliesTheScheduledLearningRate) {
  v1::JobConfig config = PolicyTestConfig(v1::MODE_SYNC, 2);
  config.set_max_workers(4);
  config.mutable_optimizer()->set_learning_rate(0.25f);
  Sync sync(config, LiveSet::First(4, 4));
  for (uint32_t r = 0; r < 4; ++r) sync.Push(r, 0, {1});
  ASSERT_EQ(sync.chunk.updates.size(), 1u);
  EXPECT_FLOAT_EQ(sync.chunk.updates[0].lr, 0.5f);
}

// The program's optimizer (an SGD param group, its lr from a scheduler).
v1::OptimizerConfig Program(float lr, float momentum) {
  v1::OptimizerConfig o;
  o.set_kind(v1::OPTIMIZER_MOMENTUM);
  o.set_learning_rate(lr);
  o.set_momentum(momentum);
  return o;
}

TEST(SyncPolicy, AStepRunsTheProgramsOptimizerThatTheLowestContributingRankNamed) {
  Sync sync(3);
  const v1::OptimizerConfig low = Program(0.25f, 0.5f), high = Program(4.0f, 0.1f);
  sync.Push(2, 0, {1}, 0, &high);
  sync.Push(0, 0, {1}, 0, &low);   // lower: its optimizer runs the step
  sync.Push(1, 0, {1}, 0, &high);
  ASSERT_EQ(sync.chunk.updates.size(), 1u);
  ASSERT_TRUE(sync.chunk.updates[0].optimizer.has_value());
  EXPECT_FLOAT_EQ(sync.chunk.updates[0].optimizer->momentum(), 0.5f);
  EXPECT_FLOAT_EQ(sync.chunk.updates[0].lr, 0.25f) << "the program's lr, not the schedule's";
  // The next step starts afresh: rank 0 names none, so the job's runs.
  sync.Push(1, 1, {1}, 1, &high);
  sync.Push(0, 1, {1}, 1);
  sync.Push(2, 1, {1}, 1, &high);
  ASSERT_EQ(sync.chunk.updates.size(), 2u);
  EXPECT_FALSE(sync.chunk.updates[1].optimizer.has_value());
  EXPECT_FLOAT_EQ(sync.chunk.updates[1].lr, 1.0f);
}

TEST(SyncPolicy, TheElasticScaleMultipliesTheProgramsLearningRate) {
  v1::JobConfig config = PolicyTestConfig(v1::MODE_SYNC, 2);
  config.set_max_workers(4);
  Sync sync(config, LiveSet::First(4, 4));
  const v1::OptimizerConfig program = Program(0.25f, 0.0f);
  for (uint32_t r = 0; r < 4; ++r) sync.Push(r, 0, {1}, 0, &program);
  ASSERT_EQ(sync.chunk.updates.size(), 1u);
  EXPECT_FLOAT_EQ(sync.chunk.updates[0].lr, 0.5f);
}

}  // namespace
}  // namespace grps
