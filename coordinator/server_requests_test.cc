// ServerRequests as a specification, over real collaborators and a fixed
// clock: an ended job, or a user model not defined yet, takes no server; a
// registration gets a shard and an incarnation, and rolls the job back when
// a known shard restarts while the job runs or a shard cannot restore the
// ordered checkpoint (saying why); the answer carries the config, the map
// and the restore order. In a job with max_servers a server for a shard
// past the map stands by until a re-sharding takes it in, is told so just
// before its deadline, and gets its shard when it asks again after the
// move; a shard past max_servers is refused.
#include "coordinator/server_requests.h"

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>

#include "coordinator/testing/job_parts.h"
#include "coordinator/testing/test_job.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "job/job_config.h"
#include "job/shard_map.h"

namespace grps {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

const absl::Time kT0 = absl::FromUnixSeconds(1'700'000'000);

// A fixed job of two shards and two ranks that may checkpoint. The
// collaborators are JobStateMachine's, built from the config as it builds
// them; every call is made under mu_, as the machine makes it.
class ServerRequestsTest : public ::testing::Test {
 protected:
  virtual v1::JobConfig Config() const {
    return TestJobConfig(2, 2, v1::MODE_SYNC, "/nowhere/checkpoints");
  }

  void SetUp() override {
    config_ = Config();
    absl::StatusOr<v1::ShardMap> map = TestShardMap(config_);
    ASSERT_TRUE(map.ok()) << map.status();
    parts_ = std::make_unique<TestJobParts>(config_, *map);
    servers_ = std::make_unique<ServerRequests>(ServerRequests::Parts{
        .config = &config_,
        .clock = [this] { return now_; },
        .phase = &parts_->phase,
        .membership = &parts_->membership,
        .generations = &parts_->generations,
        .model = &parts_->model,
        .resharding = &parts_->resharding,
        .waits = &parts_->waits});
  }

  static std::string Address(uint32_t shard) {
    return "10.0.0." + std::to_string(shard) + ":7000";
  }
  // A server at Address(shard) asks for `shard` (-1: any).
  static v1::RegisterServerRequest Request(int32_t shard) {
    v1::RegisterServerRequest request;
    request.set_job_id("test-job");
    request.set_address(Address(shard < 0 ? 9 : static_cast<uint32_t>(shard)));
    if (shard >= 0) request.set_requested_shard(shard);
    return request;
  }
  absl::StatusOr<ServerRequests::Registered> Register(const v1::RegisterServerRequest& request,
                                                      const JobWait& wait = {}) {
    absl::MutexLock lock(&mu_);
    return servers_->Register(&mu_, request, wait, now_, [this] { ++reshard_ticks_; });
  }
  // A wait that ends well before a test would hang, past the standby's
  // answer margin.
  static JobWait ShortWait() {
    return {.deadline = absl::Now() + ServerRequests::kStandbyAnswerMargin +
                        absl::Milliseconds(100)};
  }
  // The job re-shards to three shards, shard 2 served by `standby`.
  void ReshardToThree(const Membership::Endpoint& standby) {
    absl::StatusOr<v1::ShardMap> built =
        BuildShardMap(ModelTensors(config_), 3, config_.chunk_bytes());
    ASSERT_TRUE(built.ok()) << built.status();
    ASSERT_TRUE(parts_->membership.Reshard(*built, {{2, standby}}, now_).ok());
  }

  absl::Mutex mu_;
  absl::Time now_ = kT0;
  v1::JobConfig config_;
  std::unique_ptr<TestJobParts> parts_;
  std::unique_ptr<ServerRequests> servers_;
  int reshard_ticks_ = 0;
};

// A job that may re-shard up to four shards.
class StandbyServerRequestsTest : public ServerRequestsTest {
 protected:
  v1::JobConfig Config() const override {
    v1::JobConfig config = ServerRequestsTest::Config();
    config.set_max_servers(4);
    return config;
  }
};

// A job whose model its first worker defines.
class UserModelServerRequestsTest : public ServerRequestsTest {
 protected:
  v1::JobConfig Config() const override {
    v1::JobConfig config = ServerRequestsTest::Config();
    config.set_model(v1::MODEL_USER);
    return config;
  }
};

// ---- Register ----

TEST_F(ServerRequestsTest, AJobThatEndedTakesNoServer) {
  parts_->phase.End(v1::JOB_STATE_STOPPED, "stopped by an operator", now_);
  const absl::Status refused = Register(Request(0)).status();
  EXPECT_TRUE(absl::IsFailedPrecondition(refused)) << refused;
  EXPECT_THAT(refused.message(), HasSubstr("ended"));
  EXPECT_THAT(parts_->membership.UnregisteredShards(), ElementsAre(0u, 1u));
}

TEST_F(UserModelServerRequestsTest, AServerWaitsUntilTheFirstWorkerDefinedTheModel) {
  const absl::Status early = Register(Request(0)).status();
  EXPECT_TRUE(absl::IsUnavailable(early)) << early;
  EXPECT_THAT(early.message(), HasSubstr("model is not defined yet"));
  EXPECT_THAT(parts_->membership.UnregisteredShards(), ElementsAre(0u, 1u));

  absl::StatusOr<std::optional<v1::ShardMap>> layout =
      parts_->model.Define(TestUserModel(4), v1::OPTIMIZER_UNSPECIFIED, 2);
  ASSERT_TRUE(layout.ok() && layout->has_value()) << layout.status();
  parts_->membership.SetLayout(**layout);
  absl::StatusOr<ServerRequests::Registered> r = Register(Request(0));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->shard, 0u);
}

TEST_F(ServerRequestsTest, AFirstRegistrationGetsAShardAndAnIncarnationAndRollsNothingBack) {
  absl::StatusOr<ServerRequests::Registered> any = Register(Request(-1));
  ASSERT_TRUE(any.ok()) << any.status();
  EXPECT_EQ(any->shard, 0u);  // the lowest never registered
  EXPECT_GT(any->incarnation, 0u);
  EXPECT_EQ(any->roll_back, std::nullopt);
  absl::StatusOr<ServerRequests::Registered> second = Register(Request(1));
  ASSERT_TRUE(second.ok()) << second.status();
  EXPECT_EQ(second->shard, 1u);
  EXPECT_GT(second->incarnation, any->incarnation);
  EXPECT_EQ(second->roll_back, std::nullopt);
  EXPECT_EQ(parts_->membership.shard_map().shards(1).address(), Address(1));
  EXPECT_DOUBLE_EQ(parts_->phase.ElapsedSeconds(now_ + absl::Seconds(5)), 5.0);  // its time starts
}

TEST_F(ServerRequestsTest, AKnownShardRegisteringAgainRollsTheJobBackOnlyWhileItRuns) {
  ASSERT_TRUE(Register(Request(0)).ok());
  absl::StatusOr<ServerRequests::Registered> waiting = Register(Request(0));
  ASSERT_TRUE(waiting.ok()) << waiting.status();
  EXPECT_EQ(waiting->roll_back, std::nullopt);  // nothing trained yet

  parts_->phase.Run();
  absl::StatusOr<ServerRequests::Registered> restarted = Register(Request(0));
  ASSERT_TRUE(restarted.ok()) << restarted.status();
  EXPECT_GT(restarted->incarnation, waiting->incarnation);
  EXPECT_EQ(restarted->roll_back, std::optional<std::string>("server of shard 0 restarted"));
}

TEST_F(ServerRequestsTest, AShardThatCannotRestoreTheOrderedCheckpointRollsTheJobBack) {
  v1::RestoreOrder order;
  order.set_checkpoint_id(3);
  order.set_step(30);
  parts_->generations.Next(order);
  v1::RegisterServerRequest stale = Request(0);
  stale.mutable_restore_failed()->set_id(2);  // an order the job left
  absl::StatusOr<ServerRequests::Registered> ignored = Register(stale);
  ASSERT_TRUE(ignored.ok()) << ignored.status();
  EXPECT_EQ(ignored->roll_back, std::nullopt);

  v1::RegisterServerRequest failed = Request(1);
  failed.mutable_restore_failed()->set_id(3);
  failed.mutable_restore_failed()->set_error("bad crc");
  absl::StatusOr<ServerRequests::Registered> r = Register(failed);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->shard, 1u);
  EXPECT_EQ(r->roll_back, std::optional<std::string>("shard 1 cannot restore checkpoint 3"));
  // Generations refuses it for the rest of the job.
  v1::CoordinatorState state;
  parts_->generations.ExportTo(&state);
  EXPECT_THAT(state.refused_checkpoints(), ElementsAre(3u));
}

// ---- Answer ----

TEST_F(ServerRequestsTest, TheAnswerCarriesTheConfigTheMapAndTheRestoreOrder) {
  absl::StatusOr<ServerRequests::Registered> r = Register(Request(1));
  ASSERT_TRUE(r.ok()) << r.status();
  v1::RestoreOrder order;
  order.set_checkpoint_id(3);
  parts_->generations.Next(order);
  const ServerRegistration answer = servers_->Answer(r->shard, r->incarnation);
  EXPECT_EQ(answer.response.shard(), 1u);
  EXPECT_EQ(answer.response.incarnation(), r->incarnation);
  EXPECT_EQ(answer.response.config().job_id(), "test-job");
  EXPECT_EQ(answer.response.config().num_servers(), 2u);
  ASSERT_EQ(answer.response.shard_map().shards_size(), 2);
  EXPECT_EQ(answer.response.shard_map().shards(1).address(), Address(1));
  EXPECT_EQ(answer.response.restore().generation(), 2u);
  EXPECT_EQ(answer.response.restore().checkpoint_id(), 3u);
  EXPECT_TRUE(answer.response.member_secret().empty());
  EXPECT_FALSE(answer.rolled_back);
}

// ---- Standbys ----

TEST_F(StandbyServerRequestsTest, AStandbyNotTakenInByItsDeadlineIsToldItWaitsForAReshard) {
  const absl::Time called = absl::Now();
  const absl::Status waited = Register(Request(2), ShortWait()).status();
  EXPECT_TRUE(absl::IsUnavailable(waited)) << waited;
  EXPECT_THAT(waited.message(), HasSubstr("standby: shard 2 waits for the job to re-shard"));
  EXPECT_LT(absl::Now() - called, absl::Seconds(30));
  EXPECT_EQ(reshard_ticks_, 1);  // the re-sharding may have waited for it
  // It keeps its place a moment after its call ended.
  absl::MutexLock lock(&mu_);
  const std::map<uint32_t, Membership::Endpoint> standbys = parts_->resharding.FreshStandbys();
  ASSERT_EQ(standbys.count(2), 1u);
  EXPECT_EQ(standbys.at(2).address, Address(2));
  EXPECT_EQ(parts_->membership.num_shards(), 2u);
}

TEST_F(StandbyServerRequestsTest, AShardPastMaxServersIsOutOfRange) {
  const absl::Status refused = Register(Request(4), ShortWait()).status();
  EXPECT_TRUE(absl::IsInvalidArgument(refused)) << refused;
  EXPECT_THAT(refused.message(), HasSubstr("up to 4 shards"));
  EXPECT_EQ(reshard_ticks_, 0);
}

TEST_F(StandbyServerRequestsTest, AWaitingStandbyGetsItsShardOnceTheMapTakesItIn) {
  std::thread reshard([this] {
    absl::MutexLock lock(&mu_);
    // Bounded so that a standby that never waits fails the test instead of
    // hanging it.
    ASSERT_TRUE(mu_.AwaitWithTimeout(
        absl::Condition(
            +[](Resharding* r) { return r->StandbyIncarnation(2) != 0; }, &parts_->resharding),
        absl::Seconds(30)))
        << "no standby waited";
    ReshardToThree({Address(2), parts_->resharding.StandbyIncarnation(2)});
    parts_->waits.Changed();
  });
  absl::StatusOr<ServerRequests::Registered> r =
      Register(Request(2), {.deadline = absl::Now() + absl::Seconds(60)});
  reshard.join();
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->shard, 2u);
  EXPECT_EQ(r->incarnation, parts_->membership.shard_map().shards(2).incarnation());
  EXPECT_EQ(r->roll_back, std::nullopt);
}

TEST_F(StandbyServerRequestsTest, AStandbyTakenInAfterItsCallEndedGetsItsShardWhenItAsksAgain) {
  EXPECT_TRUE(absl::IsUnavailable(Register(Request(2), ShortWait()).status()));
  {
    absl::MutexLock lock(&mu_);
    ReshardToThree(parts_->resharding.FreshStandbys().at(2));
  }
  const uint64_t taken_in = parts_->membership.shard_map().shards(2).incarnation();
  absl::StatusOr<ServerRequests::Registered> again = Register(Request(2));
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(again->shard, 2u);
  EXPECT_EQ(again->incarnation, taken_in);  // not a restart: no new incarnation
  EXPECT_EQ(again->roll_back, std::nullopt);
  EXPECT_EQ(parts_->resharding.StandbyIncarnation(2), 0u);  // its place is given up
}

}  // namespace
}  // namespace grps
