// RollBacks as a specification: a roll-back takes the job to the next
// generation with its restore order, and every collaborator forgets what
// the job did since: the pending checkpoint fails, finished ranks train
// again from their steps, training is not done, no global step is known.
#include "coordinator/roll_backs.h"

#include <memory>
#include <string>

#include "coordinator/testing/job_parts.h"
#include "coordinator/testing/test_job.h"
#include "gtest/gtest.h"

namespace grps {
namespace {

const absl::Time kNow = absl::FromUnixSeconds(1'700'000'000);

class RollBacksTest : public ::testing::Test {
 protected:
  void SetUp() override {
    config_ = TestJobConfig(1, 2, v1::MODE_ASYNC, folder_.path());
    absl::StatusOr<v1::ShardMap> map = TestShardMap(config_);
    ASSERT_TRUE(map.ok()) << map.status();
    parts_ = std::make_unique<TestJobParts>(config_, *map);
    roll_backs_ = std::make_unique<RollBacks>(RollBacks::Parts{
        .job_id = config_.job_id(),
        .generations = &parts_->generations,
        .checkpoints = &parts_->checkpoints,
        .membership = &parts_->membership,
        .data = &parts_->data,
        .ending = &parts_->ending,
        .cuts = &parts_->cuts,
        .global_step = &parts_->global_step});
    ASSERT_TRUE(parts_->membership.RegisterServer(0, "10.0.0.1:7000", kNow).ok());
    for (uint32_t rank = 0; rank < 2; ++rank) {
      absl::StatusOr<Membership::Registration> r =
          parts_->membership.RegisterWorker(rank, "host", "cpu", kNow, /*holds_live_rank=*/false);
      ASSERT_TRUE(r.ok()) << r.status();
      workers_.push_back(r->incarnation);
    }
  }

  // Rank 0 finished at step 30 and training is done, with a checkpoint
  // pending and the global step known.
  void TrainAndFinish() {
    v1::WorkerProgress progress;
    progress.set_step(30);
    ASSERT_TRUE(parts_->membership.FinishWorker(0, workers_[0], progress, kNow).ok());
    ASSERT_TRUE(parts_->ending.NoteTrainingDone());
    parts_->global_step.Note(30, kNow);
    absl::StatusOr<v1::CheckpointRequest> started =
        parts_->cuts.Start({.training_done = false}, kNow, "a test");
    ASSERT_TRUE(started.ok()) << started.status();
    ASSERT_TRUE(parts_->checkpoints.pending());
  }

  TestFolder folder_{"roll_backs_test"};
  v1::JobConfig config_;
  std::unique_ptr<TestJobParts> parts_;
  std::unique_ptr<RollBacks> roll_backs_;
  std::vector<uint64_t> workers_;
};

TEST_F(RollBacksTest, ARollBackWithoutACheckpointRestartsFromTheInitialValues) {
  TrainAndFinish();
  ASSERT_EQ(parts_->generations.current(), 1u);
  roll_backs_->Back("a test", kNow);
  EXPECT_EQ(parts_->generations.current(), 2u);
  EXPECT_EQ(parts_->generations.order().generation(), 2u);
  EXPECT_EQ(parts_->generations.order().checkpoint_id(), 0u);
}

TEST_F(RollBacksTest, EveryCollaboratorForgetsWhatTheJobDidSince) {
  TrainAndFinish();
  roll_backs_->Back("a test", kNow);
  EXPECT_FALSE(parts_->checkpoints.pending()) << "the pending checkpoint fails";
  EXPECT_TRUE(parts_->membership.RanksInState(v1::MEMBER_STATE_FINISHED).empty())
      << "the finished rank trains again";
  EXPECT_EQ(parts_->membership.RanksInState(v1::MEMBER_STATE_ALIVE), (std::vector<uint32_t>{0, 1}));
  EXPECT_FALSE(parts_->ending.training_was_done());
  EXPECT_FALSE(parts_->global_step.step().has_value());
}

TEST_F(RollBacksTest, ToAGivenOrderSetsItsGeneration) {
  v1::RestoreOrder cut;
  cut.set_checkpoint_id(7);
  cut.set_step(70);
  cut.set_generation(99);  // set here, not by the caller
  roll_backs_->To(cut, "re-sharded", kNow);
  EXPECT_EQ(parts_->generations.current(), 2u);
  EXPECT_EQ(parts_->generations.order().checkpoint_id(), 7u);
  EXPECT_EQ(parts_->generations.order().step(), 70u);
}

TEST_F(RollBacksTest, AMembersNewerGenerationIsFollowedPastAndAnOlderOneIgnored) {
  roll_backs_->Follow(1, kNow);
  EXPECT_EQ(parts_->generations.current(), 1u);
  roll_backs_->Follow(5, kNow);
  EXPECT_EQ(parts_->generations.current(), 6u);
  roll_backs_->Follow(3, kNow);
  EXPECT_EQ(parts_->generations.current(), 6u);
}

}  // namespace
}  // namespace grps
