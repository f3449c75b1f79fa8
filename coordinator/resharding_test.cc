// Resharding as a specification: a move waits for a standby of every new
// shard, cuts a checkpoint (or adopts the pending one), cuts again after a
// failed cut, moves when its own cut is written, and is forgotten when the
// job ends or is asked back to where it is; standbys hold their place while
// they call and a moment after; a taken-over state goes on with the move.
#include "coordinator/resharding.h"

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "job/job_config.h"
#include "job/shard_map.h"

namespace grps {
namespace {

const absl::Time kStart = absl::FromUnixSeconds(1'700'000'000);

class ReshardingTest : public ::testing::Test {
 protected:
  ReshardingTest() : config_(Config()), resharding_(config_), checkpoints_(config_, 2) {}

  static v1::JobConfig Config() {
    v1::JobConfig config = DefaultJobConfig();
    config.set_job_id("reshard-job");
    config.set_num_servers(2);
    config.set_max_servers(4);
    config.set_checkpoint_dir("/nowhere");
    return config;
  }

  // Ticks a training job of `shards` shards; cuts start checkpoints in the
  // scheduler (their ids are recorded).
  void Tick(uint32_t shards = 2, bool training = true, bool ended = false) {
    resharding_.Tick({shards, ended, training}, checkpoints_,
                     [this](const std::string& why) -> absl::StatusOr<v1::CheckpointRequest> {
                       if (!cut_error_.ok()) return cut_error_;
                       whys_.push_back(why);
                       return checkpoints_.Start(10, {}, 10, kStart);
                     },
                     kStart);
  }
  // A server for `shard` stands by; its call waits.
  uint64_t StandBy(uint32_t shard) {
    return resharding_.StandBy(shard, "10.0.0." + std::to_string(shard) + ":7000", 2,
                               [this] { return ++incarnations_; });
  }

  v1::JobConfig config_;
  Resharding resharding_;
  CheckpointScheduler checkpoints_;
  absl::Status cut_error_;
  std::vector<std::string> whys_;
  uint64_t incarnations_ = 100;
};

TEST_F(ReshardingTest, ATargetIsCheckedAgainstTheJobsMaxServers) {
  EXPECT_TRUE(absl::IsInvalidArgument(resharding_.CheckTarget(0)));
  EXPECT_TRUE(absl::IsInvalidArgument(resharding_.CheckTarget(5)));
  EXPECT_TRUE(resharding_.CheckTarget(4).ok());
  v1::JobConfig fixed = Config();
  fixed.set_max_servers(0);
  EXPECT_TRUE(absl::IsFailedPrecondition(Resharding(fixed).CheckTarget(2)));
}

TEST_F(ReshardingTest, AMoveUpWaitsForAStandbyOfEveryNewShardThenCuts) {
  resharding_.Ask(4, 2);
  Tick();
  EXPECT_EQ(resharding_.Progress().phase(), "waiting for a server of shards 2, 3 to register");
  StandBy(2);
  Tick();
  EXPECT_EQ(resharding_.Progress().phase(), "waiting for a server of shard 3 to register");
  EXPECT_TRUE(whys_.empty());
  StandBy(3);
  Tick();
  ASSERT_EQ(whys_, std::vector<std::string>{"the cut of re-sharding to 4 shards"});
  const uint64_t cut = checkpoints_.pending_summary().id();
  EXPECT_EQ(resharding_.Progress().checkpoint_id(), cut);
  EXPECT_EQ(resharding_.Progress().phase(), "cutting at checkpoint " + std::to_string(cut));
  Tick();  // the cut is pending: no second one
  EXPECT_EQ(whys_.size(), 1u);
}

TEST_F(ReshardingTest, AMoveDownAdoptsThePendingCheckpointAsItsCut) {
  const uint64_t pending = checkpoints_.Start(10, {}, 10, kStart).id();
  resharding_.Ask(1, 2);
  Tick();
  EXPECT_TRUE(whys_.empty());
  EXPECT_EQ(resharding_.Progress().checkpoint_id(), pending);
}

TEST_F(ReshardingTest, ACutThatCannotStartYetSaysWhyAndIsTriedAgain) {
  resharding_.Ask(1, 2);
  cut_error_ = absl::UnavailableError("shard 1 is not alive");
  Tick();
  EXPECT_EQ(resharding_.Progress().phase(), "cannot cut yet: shard 1 is not alive");
  cut_error_ = absl::OkStatus();
  Tick();
  EXPECT_EQ(whys_.size(), 1u);
}

TEST_F(ReshardingTest, AFailedCutIsCutAgain) {
  resharding_.Ask(1, 2);
  Tick();
  const uint64_t first = checkpoints_.pending_summary().id();
  checkpoints_.Fail("a shard could not write", kStart);
  Tick();
  ASSERT_EQ(whys_.size(), 2u);
  EXPECT_NE(resharding_.Progress().checkpoint_id(), first);
}

TEST_F(ReshardingTest, OnlyItsOwnCutMovesTheJobAndTheMoveIsRecorded) {
  resharding_.Ask(1, 2);
  Tick();
  const uint64_t cut = checkpoints_.pending_summary().id();
  EXPECT_EQ(resharding_.CutWritten(cut + 7, 2), std::nullopt);
  EXPECT_EQ(resharding_.CutWritten(cut, 2), std::optional<uint32_t>(1));
  resharding_.Moved(2, 1, 42, kStart + absl::Seconds(3));
  EXPECT_FALSE(resharding_.asked());
  const v1::ReshardProgress progress = resharding_.Progress();
  EXPECT_EQ(progress.completed(), 1u);
  EXPECT_EQ(progress.last_from(), 2u);
  EXPECT_EQ(progress.last_to(), 1u);
  EXPECT_EQ(progress.last_step(), 42u);
  EXPECT_EQ(progress.last_seconds(), 3.0);
  EXPECT_EQ(progress.phase(), "");
}

TEST_F(ReshardingTest, PublishingItsCutMovesTheMembersAndAnotherCheckpointDoesNot) {
  absl::StatusOr<v1::ShardMap> map = BuildShardMap(ModelTensors(config_), 2, config_.chunk_bytes());
  ASSERT_TRUE(map.ok()) << map.status();
  Membership membership(*map, 1, absl::Seconds(1));
  for (uint32_t s = 0; s < 2; ++s)
    ASSERT_TRUE(membership.RegisterServer(s, "10.0.0." + std::to_string(s) + ":7000", kStart).ok());
  resharding_.Ask(3, 2);
  const uint64_t standby = StandBy(2);
  Tick();
  const uint64_t cut = checkpoints_.pending_summary().id();
  v1::CheckpointManifest manifest;
  manifest.set_id(cut + 7);
  manifest.set_step(42);
  Resharding::Publication other =
      resharding_.Publish(manifest, config_.chunk_bytes(), &membership, &checkpoints_, kStart);
  EXPECT_FALSE(other.moved);
  EXPECT_EQ(membership.num_shards(), 2u);

  manifest.set_id(cut);
  Resharding::Publication move =
      resharding_.Publish(manifest, config_.chunk_bytes(), &membership, &checkpoints_, kStart);
  EXPECT_TRUE(move.moved);
  EXPECT_FALSE(move.wait_again);
  EXPECT_EQ(move.from, 2u);
  EXPECT_EQ(move.to, 3u);
  EXPECT_EQ(membership.num_shards(), 3u);
  EXPECT_EQ(membership.shard_map().shards(2).incarnation(), standby);
  EXPECT_EQ(resharding_.Progress().last_step(), 42u);
  EXPECT_FALSE(resharding_.asked());
}

TEST_F(ReshardingTest, AMoveAskedBackToWhereTheJobIsEndsWithoutMoving) {
  resharding_.Ask(1, 2);
  Tick();
  const uint64_t cut = checkpoints_.pending_summary().id();
  resharding_.Ask(2, 2);
  EXPECT_EQ(resharding_.CutWritten(cut, 2), std::nullopt);
  EXPECT_FALSE(resharding_.asked());
  EXPECT_EQ(resharding_.Progress().completed(), 0u);
}

TEST_F(ReshardingTest, AnEndedJobForgetsTheMoveAndAJobNotTrainingWaits) {
  resharding_.Ask(1, 2);
  Tick(2, /*training=*/false);
  EXPECT_EQ(resharding_.Progress().phase(), "waits for a training job");
  EXPECT_TRUE(whys_.empty());
  Tick(2, /*training=*/false, /*ended=*/true);
  EXPECT_FALSE(resharding_.asked());
}

TEST_F(ReshardingTest, AStandbyHoldsItsPlaceUntilAnotherServerTakesIt) {
  const uint64_t first = StandBy(2);
  EXPECT_EQ(StandBy(2), first);  // the same server calling again
  EXPECT_EQ(resharding_.StandbyIncarnation(2), first);
  const uint64_t second = resharding_.StandBy(2, "10.0.0.9:7000", 2, [this] { return ++incarnations_; });
  EXPECT_NE(second, first);
  EXPECT_EQ(resharding_.StandbyIncarnation(2), second);  // the first one's wait ends
  EXPECT_EQ(resharding_.StandbyIncarnation(3), 0u);
}

TEST_F(ReshardingTest, AStandbyWhoseCallEndedStaysFreshForAMomentOnly) {
  const uint64_t incarnation = StandBy(2);
  resharding_.StandbyCallEnded(2, incarnation, /*taken=*/false);
  EXPECT_EQ(resharding_.FreshStandbys().count(2), 1u);  // real time: just now
  resharding_.StandbyCallEnded(2, incarnation + 1, /*taken=*/true);  // another's: ignored
  EXPECT_EQ(resharding_.StandbyIncarnation(2), incarnation);
  StandBy(2);
  resharding_.StandbyCallEnded(2, incarnation, /*taken=*/true);
  EXPECT_TRUE(resharding_.FreshStandbys().empty());
}

TEST_F(ReshardingTest, AStandbyTakenInThatAsksAgainIsAnsweredOnce) {
  const uint64_t incarnation = StandBy(2);
  EXPECT_FALSE(resharding_.TakenInAgain(2, "10.0.0.2:7000", incarnation + 1));
  EXPECT_FALSE(resharding_.TakenInAgain(2, "10.0.0.8:7000", incarnation));
  EXPECT_TRUE(resharding_.TakenInAgain(2, "10.0.0.2:7000", incarnation));
  EXPECT_FALSE(resharding_.TakenInAgain(2, "10.0.0.2:7000", incarnation));
}

TEST_F(ReshardingTest, ATakenOverStateGoesOnWithTheMoveAndKeepsTheRecord) {
  resharding_.Ask(1, 2);
  Tick();
  resharding_.Moved(3, 2, 7, kStart);
  resharding_.Ask(1, 2);
  v1::CoordinatorState state;
  resharding_.ExportTo(&state);

  Resharding after(config_);
  after.TakeOver(state);
  EXPECT_TRUE(after.asked());
  EXPECT_EQ(after.Progress().target_servers(), 1u);
  EXPECT_EQ(after.Progress().checkpoint_id(), 0u);  // a new cut
  EXPECT_EQ(after.Progress().completed(), 1u);
  v1::JobConfig fixed = Config();
  fixed.set_max_servers(0);
  Resharding without(fixed);
  without.TakeOver(state);
  EXPECT_FALSE(without.asked());
}

}  // namespace
}  // namespace grps

namespace grps {
namespace {

class ReshardMembersTest : public ::testing::Test {
 protected:
  void SetUp() override {
    config_ = DefaultJobConfig();
    config_.set_num_servers(2);
    config_.set_max_servers(4);
    absl::StatusOr<v1::ShardMap> map =
        BuildShardMap(ModelTensors(config_), 2, config_.chunk_bytes());
    ASSERT_TRUE(map.ok()) << map.status();
    membership_ = std::make_unique<Membership>(*map, 1, absl::Seconds(1));
    for (uint32_t s = 0; s < 2; ++s)
      ASSERT_TRUE(membership_->RegisterServer(s, "10.0.0." + std::to_string(s) + ":7000", kT0)
                      .ok());
  }
  static constexpr absl::Time kT0 = absl::FromUnixSeconds(1'700'000'000);

  v1::JobConfig config_;
  std::unique_ptr<Membership> membership_;
  CheckpointScheduler checkpoints_{DefaultJobConfig(), 2};
};

TEST_F(ReshardMembersTest, MovesTheMembersOntoTheNewCountWithTheStandbysAsNewShards) {
  const std::map<uint32_t, Membership::Endpoint> standbys = {{2, {"10.0.0.9:7000", 77}}};
  absl::StatusOr<std::map<uint32_t, uint64_t>> dropped = ReshardMembers(
      3, standbys, config_.chunk_bytes(), membership_.get(), &checkpoints_, kT0);
  ASSERT_TRUE(dropped.ok()) << dropped.status();
  EXPECT_TRUE(dropped->empty());
  EXPECT_EQ(membership_->num_shards(), 3u);
  EXPECT_EQ(membership_->shard_map().shards(2).address(), "10.0.0.9:7000");
  EXPECT_EQ(membership_->shard_map().shards(2).incarnation(), 77u);
}

TEST_F(ReshardMembersTest, FewerShardsDropTheShardsPastTheCount) {
  absl::StatusOr<std::map<uint32_t, uint64_t>> dropped =
      ReshardMembers(1, {}, config_.chunk_bytes(), membership_.get(), &checkpoints_, kT0);
  ASSERT_TRUE(dropped.ok()) << dropped.status();
  ASSERT_EQ(dropped->size(), 1u);
  EXPECT_EQ(dropped->begin()->first, 1u);
  EXPECT_EQ(membership_->num_shards(), 1u);
}

TEST_F(ReshardMembersTest, ANewShardWithoutAServerChangesNothing) {
  absl::StatusOr<std::map<uint32_t, uint64_t>> dropped =
      ReshardMembers(3, {}, config_.chunk_bytes(), membership_.get(), &checkpoints_, kT0);
  EXPECT_TRUE(absl::IsInvalidArgument(dropped.status())) << dropped.status();
  EXPECT_EQ(membership_->num_shards(), 2u);
}

TEST_F(ReshardMembersTest, AMapThatCannotBeBuiltIsAFailedPrecondition) {
  absl::StatusOr<std::map<uint32_t, uint64_t>> dropped =
      ReshardMembers(0, {}, config_.chunk_bytes(), membership_.get(), &checkpoints_, kT0);
  EXPECT_TRUE(absl::IsFailedPrecondition(dropped.status())) << dropped.status();
  EXPECT_EQ(membership_->num_shards(), 2u);
}

}  // namespace
}  // namespace grps
