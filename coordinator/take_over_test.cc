// The take-over's checks and reads as a specification: which persisted
// states are taken back, which newest checkpoint a taken-over job knows, and
// how a state of another shard count re-shards the membership.
#include "coordinator/take_over.h"

#include <string>

#include "checkpoint/checkpoint.h"
#include "coordinator/testing/job_parts.h"
#include "coordinator/testing/test_job.h"
#include "gtest/gtest.h"

namespace grps {
namespace {

const absl::Time kNow = absl::FromUnixSeconds(1'700'000'000);

class TakeOverTest : public ::testing::Test {
 protected:
  void SetUp() override {
    config_ = TestJobConfig(2, 1, v1::MODE_SYNC, folder_.path());
    state_.mutable_config()->set_job_id(config_.job_id());
    state_.set_state(v1::JOB_STATE_RUNNING);
  }

  // The state names checkpoint `id` as its newest, in its folder.
  void NameNewest(uint64_t id) {
    state_.mutable_last_checkpoint()->set_id(id);
    state_.mutable_last_checkpoint()->set_dir(CheckpointFolder(folder_.path(), id));
  }
  void WriteManifestOf(uint64_t id, uint64_t written_id) {
    v1::CheckpointManifest manifest;
    manifest.set_job_id(config_.job_id());
    manifest.set_id(written_id);
    manifest.set_step(40);
    manifest.add_worker_steps(40);
    ASSERT_TRUE(WriteManifest(Env::Default(), CheckpointFolder(folder_.path(), id), manifest).ok());
  }

  TestFolder folder_{"take_over_test"};
  v1::JobConfig config_;
  v1::CoordinatorState state_;
};

TEST_F(TakeOverTest, OnlyAWaitingOrRunningStateOfThisJobIsTakenBack) {
  EXPECT_TRUE(CheckTakeOver(state_, config_.job_id(), "state.pb").ok());
  state_.set_state(v1::JOB_STATE_WAITING);
  EXPECT_TRUE(CheckTakeOver(state_, config_.job_id(), "state.pb").ok());

  state_.set_state(v1::JOB_STATE_COMPLETED);
  absl::Status ended = CheckTakeOver(state_, config_.job_id(), "state.pb");
  EXPECT_TRUE(absl::IsInvalidArgument(ended)) << ended;
  EXPECT_EQ(ended.message(),
            "state.pb: job is completed; only a waiting or running job is taken back");

  state_.set_state(v1::JOB_STATE_RUNNING);
  absl::Status other = CheckTakeOver(state_, "another-job", "state.pb");
  EXPECT_TRUE(absl::IsInvalidArgument(other)) << other;
  EXPECT_EQ(other.message(),
            "state.pb is of job '" + config_.job_id() + "', not 'another-job'");
}

TEST_F(TakeOverTest, TheNewestCheckpointIsReadFromItsManifest) {
  EXPECT_FALSE(NewestCheckpoint(Env::Default(), state_, "state.pb").has_value());
  NameNewest(3);
  WriteManifestOf(3, 3);
  std::optional<v1::CheckpointManifest> newest =
      NewestCheckpoint(Env::Default(), state_, "state.pb");
  ASSERT_TRUE(newest.has_value());
  EXPECT_EQ(newest->id(), 3u);
  EXPECT_EQ(newest->step(), 40u);
}

TEST_F(TakeOverTest, AManifestMissingOrOfAnotherCheckpointIsNotTheNewest) {
  NameNewest(3);
  EXPECT_FALSE(NewestCheckpoint(Env::Default(), state_, "state.pb").has_value());
  WriteManifestOf(3, 2);  // the folder of 3 holds 2's manifest
  EXPECT_FALSE(NewestCheckpoint(Env::Default(), state_, "state.pb").has_value());
}

class AdoptShardCountTest : public TakeOverTest {
 protected:
  void SetUp() override {
    TakeOverTest::SetUp();
    config_.set_max_servers(4);
    absl::StatusOr<v1::ShardMap> map = TestShardMap(config_);
    ASSERT_TRUE(map.ok()) << map.status();
    membership_ = std::make_unique<Membership>(*map, 1, absl::Seconds(1));
    checkpoints_ = std::make_unique<CheckpointScheduler>(config_, config_.num_servers());
  }
  void AddServer(uint32_t shard) {
    v1::ShardEndpoint* e = state_.add_shards();
    e->set_shard(shard);
    e->set_address("10.0.0." + std::to_string(shard) + ":7000");
    e->set_incarnation(100 + shard);
  }

  std::unique_ptr<Membership> membership_;
  std::unique_ptr<CheckpointScheduler> checkpoints_;
};

TEST_F(AdoptShardCountTest, AStateOfAnotherCountReShardsTheMembershipOntoItsServers) {
  for (uint32_t s = 0; s < 3; ++s) AddServer(s);
  ASSERT_TRUE(
      AdoptShardCount(state_, config_, membership_.get(), checkpoints_.get(), kNow).ok());
  EXPECT_EQ(membership_->num_shards(), 3u);
  EXPECT_EQ(membership_->shard_map().shards(2).address(), "10.0.0.2:7000");
  EXPECT_EQ(membership_->shard_map().shards(2).incarnation(), 102u);
}

TEST_F(AdoptShardCountTest, TheSameCountOrAJobThatDoesNotReShardChangesNothing) {
  for (uint32_t s = 0; s < 2; ++s) AddServer(s);
  const v1::ShardMap before = membership_->shard_map();
  ASSERT_TRUE(
      AdoptShardCount(state_, config_, membership_.get(), checkpoints_.get(), kNow).ok());
  EXPECT_EQ(membership_->shard_map().SerializeAsString(), before.SerializeAsString());
  AddServer(2);
  config_.set_max_servers(0);
  ASSERT_TRUE(
      AdoptShardCount(state_, config_, membership_.get(), checkpoints_.get(), kNow).ok());
  EXPECT_EQ(membership_->num_shards(), 2u);
}

TEST_F(AdoptShardCountTest, ACountPastMaxServersIsRefused) {
  for (uint32_t s = 0; s < 5; ++s) AddServer(s);
  absl::Status refused =
      AdoptShardCount(state_, config_, membership_.get(), checkpoints_.get(), kNow);
  EXPECT_TRUE(absl::IsInvalidArgument(refused)) << refused;
  EXPECT_EQ(refused.message(), "the state has 5 shards; the job may have 1 to 4");
  EXPECT_EQ(membership_->num_shards(), 2u);
}

TEST_F(AdoptShardCountTest, AStateWhoseServersDoNotCoverItsCountIsRefused) {
  AddServer(0);
  AddServer(1);
  AddServer(3);  // shard 2 has no server
  absl::Status refused =
      AdoptShardCount(state_, config_, membership_.get(), checkpoints_.get(), kNow);
  EXPECT_TRUE(absl::IsInvalidArgument(refused)) << refused;
  EXPECT_EQ(membership_->num_shards(), 2u);
}

}  // namespace
}  // namespace grps
