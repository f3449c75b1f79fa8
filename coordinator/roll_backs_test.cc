// RollBacks as a specification: a roll-back takes the job to the next
// generation with its restore order, and every collaborator forgets what
// the job did since: the pending checkpoint fails, finished ranks train
// again from their steps, training is not done, no global step is known.
#include "coordinator/roll_backs.h"

#include <filesystem>
#include <memory>
#include <string>

#include "coordinator/testing/test_job.h"
#include "gtest/gtest.h"

namespace grps {
namespace {

const absl::Time kNow = absl::FromUnixSeconds(1'700'000'000);

class RollBacksTest : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = (std::filesystem::temp_directory_path() /
             ("roll_backs_test-" + std::to_string(getpid()) + "-" +
              ::testing::UnitTest::GetInstance()->current_test_info()->name()))
                .string();
    config_ = TestJobConfig(1, 2, v1::MODE_ASYNC, root_);
    absl::StatusOr<v1::ShardMap> map = TestShardMap(config_);
    ASSERT_TRUE(map.ok()) << map.status();
    membership_ = std::make_unique<Membership>(*map, 2, absl::Seconds(1));
    checkpoints_ = std::make_unique<CheckpointScheduler>(config_, 1);
    generations_ = std::make_unique<Generations>(config_, Env::Default());
    cuts_ = std::make_unique<CheckpointCuts>(config_, checkpoints_.get(), membership_.get(),
                                             &global_step_);
    ending_ = std::make_unique<JobEnding>(config_.job_id(), membership_.get());
    roll_backs_ = std::make_unique<RollBacks>(RollBacks::Parts{.job_id = config_.job_id(),
                                                               .generations = generations_.get(),
                                                               .checkpoints = checkpoints_.get(),
                                                               .membership = membership_.get(),
                                                               .data = &data_,
                                                               .ending = ending_.get(),
                                                               .cuts = cuts_.get(),
                                                               .global_step = &global_step_});
    ASSERT_TRUE(membership_->RegisterServer(0, "10.0.0.1:7000", kNow).ok());
    for (uint32_t rank = 0; rank < 2; ++rank) {
      absl::StatusOr<Membership::Registration> r =
          membership_->RegisterWorker(rank, "host", "cpu", kNow, /*holds_live_rank=*/false);
      ASSERT_TRUE(r.ok()) << r.status();
      workers_.push_back(r->incarnation);
    }
  }

  // Rank 0 finished at step 30 and training is done, with a checkpoint
  // pending and the global step known.
  void TrainAndFinish() {
    v1::WorkerProgress progress;
    progress.set_step(30);
    ASSERT_TRUE(membership_->FinishWorker(0, workers_[0], progress, kNow).ok());
    ASSERT_TRUE(ending_->NoteTrainingDone());
    global_step_.Note(30, kNow);
    absl::StatusOr<v1::CheckpointRequest> started =
        cuts_->Start({.training_done = false}, kNow, "a test");
    ASSERT_TRUE(started.ok()) << started.status();
    ASSERT_TRUE(checkpoints_->pending());
  }

  std::string root_;
  v1::JobConfig config_;
  std::unique_ptr<Membership> membership_;
  std::unique_ptr<CheckpointScheduler> checkpoints_;
  std::unique_ptr<Generations> generations_;
  GlobalStep global_step_;
  std::unique_ptr<CheckpointCuts> cuts_;
  std::unique_ptr<JobEnding> ending_;
  ElasticData data_;
  std::unique_ptr<RollBacks> roll_backs_;
  std::vector<uint64_t> workers_;
};

TEST_F(RollBacksTest, ARollBackWithoutACheckpointRestartsFromTheInitialValues) {
  TrainAndFinish();
  ASSERT_EQ(generations_->current(), 1u);
  roll_backs_->Back("a test", kNow);
  EXPECT_EQ(generations_->current(), 2u);
  EXPECT_EQ(generations_->order().generation(), 2u);
  EXPECT_EQ(generations_->order().checkpoint_id(), 0u);
}

TEST_F(RollBacksTest, EveryCollaboratorForgetsWhatTheJobDidSince) {
  TrainAndFinish();
  roll_backs_->Back("a test", kNow);
  EXPECT_FALSE(checkpoints_->pending()) << "the pending checkpoint fails";
  EXPECT_TRUE(membership_->RanksInState(v1::MEMBER_STATE_FINISHED).empty())
      << "the finished rank trains again";
  EXPECT_EQ(membership_->RanksInState(v1::MEMBER_STATE_ALIVE), (std::vector<uint32_t>{0, 1}));
  EXPECT_FALSE(ending_->training_was_done());
  EXPECT_FALSE(global_step_.step().has_value());
}

TEST_F(RollBacksTest, ToAGivenOrderSetsItsGeneration) {
  v1::RestoreOrder cut;
  cut.set_checkpoint_id(7);
  cut.set_step(70);
  cut.set_generation(99);  // set here, not by the caller
  roll_backs_->To(cut, "re-sharded", kNow);
  EXPECT_EQ(generations_->current(), 2u);
  EXPECT_EQ(generations_->order().checkpoint_id(), 7u);
  EXPECT_EQ(generations_->order().step(), 70u);
}

TEST_F(RollBacksTest, AMembersNewerGenerationIsFollowedPastAndAnOlderOneIgnored) {
  roll_backs_->Follow(1, kNow);
  EXPECT_EQ(generations_->current(), 1u);
  roll_backs_->Follow(5, kNow);
  EXPECT_EQ(generations_->current(), 6u);
  roll_backs_->Follow(3, kNow);
  EXPECT_EQ(generations_->current(), 6u);
}

}  // namespace
}  // namespace grps
