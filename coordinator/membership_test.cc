#include "coordinator/membership.h"

#include <cmath>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "job/job_config.h"
#include "job/shard_map.h"

namespace grps {
namespace {

using ::testing::ElementsAre;

const absl::Time kT0 = absl::FromUnixSeconds(1'700'000'000);
const absl::Duration kTimeout = absl::Seconds(5);

v1::ShardMap MapWithShards(uint32_t shards) {
  absl::StatusOr<v1::ShardMap> map =
      BuildShardMap(ModelTensors(DefaultJobConfig()), shards, 64 * 1024);
  EXPECT_TRUE(map.ok()) << map.status();
  return *map;
}

class MembershipTest : public ::testing::Test {
 protected:
  MembershipTest() : m_(MapWithShards(2), 3, kTimeout) {}

  Membership::Registration Server(int32_t shard, const std::string& address,
                                  absl::Time now = kT0) {
    absl::StatusOr<Membership::Registration> r = m_.RegisterServer(shard, address, now);
    EXPECT_TRUE(r.ok()) << r.status();
    return r.ok() ? *r : Membership::Registration{};
  }
  Membership::Registration Worker(int32_t rank, absl::Time now = kT0) {
    absl::StatusOr<Membership::Registration> r = m_.RegisterWorker(rank, "host", "cpu", now,
                                                                   /*holds_live_rank=*/false);
    EXPECT_TRUE(r.ok()) << r.status();
    return r.ok() ? *r : Membership::Registration{};
  }
  absl::Status Beat(uint32_t rank, uint64_t incarnation, absl::Time now,
                    bool* revived = nullptr) {
    bool ignored = false;
    v1::WorkerProgress p;
    return m_.WorkerHeartbeat(rank, incarnation, &p, now,
                              revived != nullptr ? revived : &ignored);
  }

  Membership m_;
};

TEST_F(MembershipTest, ServerGetsRequestedShardOrLowestFree) {
  EXPECT_EQ(Server(1, "10.0.0.1:5000").slot, 1u);
  EXPECT_EQ(Server(-1, "10.0.0.2:5000").slot, 0u);
  EXPECT_TRUE(m_.AllShardsRegistered());
  absl::StatusOr<Membership::Registration> extra =
      m_.RegisterServer(-1, "10.0.0.3:5000", kT0);
  EXPECT_EQ(extra.status().code(), absl::StatusCode::kResourceExhausted);
}

TEST_F(MembershipTest, RegistrationsFillTheShardMapAndBumpItsEpoch) {
  EXPECT_EQ(m_.shard_map().epoch(), 0u);
  ASSERT_EQ(m_.shard_map().shards_size(), 2);
  EXPECT_TRUE(m_.shard_map().shards(0).address().empty());
  Membership::Registration a = Server(-1, "10.0.0.1:5000");
  Server(-1, "10.0.0.2:5000");
  EXPECT_EQ(m_.shard_map().epoch(), 2u);
  EXPECT_EQ(m_.shard_map().shards(0).address(), "10.0.0.1:5000");
  EXPECT_EQ(m_.shard_map().shards(0).incarnation(), a.incarnation);
  EXPECT_EQ(m_.shard_map().shards(1).address(), "10.0.0.2:5000");
  EXPECT_TRUE(ValidateShardMap(m_.shard_map()).ok());
}

TEST_F(MembershipTest, DeadShardIsRetakenWithNewIncarnationAndEndpoint) {
  Membership::Registration old = Server(-1, "10.0.0.1:5000");
  Server(-1, "10.0.0.2:5000", kT0 + absl::Seconds(4));
  m_.DetectFailures(kT0 + absl::Seconds(6));
  EXPECT_THAT(m_.ShardsInState(v1::MEMBER_STATE_DEAD), ElementsAre(0u));
  const uint64_t epoch = m_.shard_map().epoch();

  Membership::Registration fresh = Server(-1, "10.0.0.9:6000", kT0 + absl::Seconds(7));
  EXPECT_EQ(fresh.slot, 0u);
  EXPECT_TRUE(fresh.rejoined);
  EXPECT_GT(fresh.incarnation, old.incarnation);
  EXPECT_EQ(m_.shard_map().epoch(), epoch + 1);
  EXPECT_EQ(m_.shard_map().shards(0).address(), "10.0.0.9:6000");
  EXPECT_EQ(m_.shard_map().shards(0).incarnation(), fresh.incarnation);
}

TEST_F(MembershipTest, ServerRestartingAtItsAddressGetsItsShardBack) {
  Server(-1, "10.0.0.1:5000");
  Membership::Registration b = Server(-1, "10.0.0.2:5000");
  // Still ALIVE (restarted faster than the timeout), no shard requested.
  Membership::Registration again = Server(-1, "10.0.0.2:5000");
  EXPECT_EQ(again.slot, 1u);
  EXPECT_TRUE(again.rejoined);
  EXPECT_GT(again.incarnation, b.incarnation);
}

TEST_F(MembershipTest, AddressOfALiveShardCannotServeAnother) {
  Server(0, "10.0.0.1:5000");
  absl::StatusOr<Membership::Registration> r = m_.RegisterServer(1, "10.0.0.1:5000", kT0);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(m_.shard_map().shards(1).address().empty());
}

TEST_F(MembershipTest, MalformedServerRequestsAreRejectedAndChangeNothing) {
  for (const char* address : {"", "nohost", ":5000", "host:", "host:0",
                              "host:70000", "host:12ab", "ho st:5000",
                              "host\n:5000"}) {
    EXPECT_EQ(m_.RegisterServer(-1, address, kT0).status().code(),
              absl::StatusCode::kInvalidArgument)
        << address;
  }
  EXPECT_EQ(m_.RegisterServer(2, "h:1", kT0).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(m_.RegisterServer(-7, "h:1", kT0).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(m_.RegisterServer(-1, std::string(300, 'h') + ":1", kT0).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(m_.shard_map().epoch(), 0u);
  EXPECT_EQ(m_.UnregisteredShards().size(), 2u);
}

TEST_F(MembershipTest, WorkerGetsRequestedRankOrLowestFree) {
  EXPECT_EQ(Worker(2).slot, 2u);
  EXPECT_EQ(Worker(-1).slot, 0u);
  EXPECT_EQ(Worker(-1).slot, 1u);
  EXPECT_EQ(m_.RegisterWorker(-1, "h", "cpu", kT0, false).status().code(),
            absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(m_.RegisterWorker(3, "h", "cpu", kT0, false).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(m_.RegisterWorker(-1, std::string(1000, 'h'), "cpu", kT0, false).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(m_.RegisterWorker(-1, "host", "cpu\x1b[31m", kT0, false).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(m_.live_workers().ranks, ElementsAre(0u, 1u, 2u));
}

TEST_F(MembershipTest, IncarnationsGrowAndStartFromTheClock) {
  Membership::Registration a = Worker(-1);
  Membership::Registration b = Worker(-1);
  EXPECT_GE(a.incarnation, static_cast<uint64_t>(absl::ToUnixMillis(kT0)));
  EXPECT_GT(b.incarnation, a.incarnation);
}

TEST_F(MembershipTest, ALiveRankIsNotHandedOverToAnotherRegistration) {
  Membership::Registration live = Worker(1);
  const uint64_t epoch = m_.membership_epoch();
  absl::StatusOr<Membership::Registration> taken =
      m_.RegisterWorker(1, "stranger", "cpu", kT0 + absl::Seconds(1), false);
  EXPECT_EQ(taken.status().code(), absl::StatusCode::kAlreadyExists);
  EXPECT_NE(taken.status().message().find("rank 1 is alive"), std::string::npos);
  EXPECT_EQ(m_.membership_epoch(), epoch);
  EXPECT_EQ(m_.LiveIncarnation(1), live.incarnation);
  EXPECT_TRUE(Beat(1, live.incarnation, kT0 + absl::Seconds(1)).ok());
  // Once the old incarnation is declared dead, the rank is free again.
  m_.DetectFailures(kT0 + absl::Seconds(7));
  EXPECT_EQ(m_.LiveIncarnation(1), std::nullopt);
  EXPECT_TRUE(m_.RegisterWorker(1, "stranger", "cpu", kT0 + absl::Seconds(7), false).ok());
}

TEST_F(MembershipTest, TheHolderOfALiveRankMayRegisterItAgain) {
  Membership::Registration live = Worker(1);
  absl::StatusOr<Membership::Registration> again =
      m_.RegisterWorker(1, "host", "cpu", kT0 + absl::Seconds(1), /*holds_live_rank=*/true);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_TRUE(again->rejoined);
  EXPECT_GT(again->incarnation, live.incarnation);
}

TEST_F(MembershipTest, ReturningWorkerGetsNewIncarnationAndFencesTheOldOne) {
  Membership::Registration old = Worker(1);
  const uint64_t epoch = m_.membership_epoch();
  m_.DetectFailures(kT0 + absl::Seconds(6));
  Membership::Registration fresh = Worker(1, kT0 + absl::Seconds(6));
  EXPECT_TRUE(fresh.rejoined);
  EXPECT_GT(fresh.incarnation, old.incarnation);
  EXPECT_GT(m_.membership_epoch(), epoch);
  EXPECT_THAT(m_.live_workers().incarnations, ElementsAre(fresh.incarnation));

  absl::Status stale = Beat(1, old.incarnation, kT0 + absl::Seconds(7));
  EXPECT_EQ(stale.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(stale.message().find("stale incarnation"), std::string::npos);
  EXPECT_TRUE(Beat(1, fresh.incarnation, kT0 + absl::Seconds(7)).ok());
}

TEST_F(MembershipTest, HeartbeatFromUnknownMemberIsNotFound) {
  EXPECT_EQ(Beat(0, 1, kT0).code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(Beat(99, 1, kT0).code(), absl::StatusCode::kNotFound);
  bool revived = false;
  EXPECT_EQ(m_.ServerHeartbeat(5, 1, v1::ShardStatus(), kT0, &revived).code(),
            absl::StatusCode::kNotFound);
  Membership::Registration s = Server(0, "h:1");
  EXPECT_EQ(m_.ServerHeartbeat(0, s.incarnation + 1, v1::ShardStatus(), kT0, &revived)
                .code(),
            absl::StatusCode::kFailedPrecondition);
}

TEST_F(MembershipTest, SilentWorkerIsDeadOnlyAfterTheTimeout) {
  Membership::Registration w0 = Worker(0);
  Worker(1);
  Worker(2);
  const uint64_t epoch = m_.membership_epoch();
  ASSERT_TRUE(Beat(0, w0.incarnation, kT0 + absl::Seconds(3)).ok());

  EXPECT_TRUE(m_.DetectFailures(kT0 + kTimeout).empty());
  EXPECT_EQ(m_.membership_epoch(), epoch);

  Membership::Failures f = m_.DetectFailures(kT0 + kTimeout + absl::Milliseconds(1));
  EXPECT_THAT(f.ranks, ElementsAre(1u, 2u));
  EXPECT_TRUE(f.shards.empty());
  EXPECT_EQ(m_.membership_epoch(), epoch + 1);
  EXPECT_THAT(m_.live_workers().ranks, ElementsAre(0u));
  EXPECT_THAT(m_.live_workers().incarnations, ElementsAre(w0.incarnation));
  EXPECT_THAT(m_.RanksInState(v1::MEMBER_STATE_DEAD), ElementsAre(1u, 2u));
  // Ranks 1 and 2 are already dead and not reported again.
  EXPECT_THAT(m_.DetectFailures(kT0 + absl::Seconds(60)).ranks, ElementsAre(0u));
}

TEST_F(MembershipTest, SilentServerIsDeadWithoutChangingLiveWorkers) {
  Server(0, "h:1");
  Worker(0, kT0 + absl::Seconds(4));
  const uint64_t epoch = m_.membership_epoch();
  Membership::Failures f = m_.DetectFailures(kT0 + absl::Seconds(6));
  EXPECT_THAT(f.shards, ElementsAre(0u));
  EXPECT_TRUE(f.ranks.empty());
  EXPECT_EQ(m_.membership_epoch(), epoch);
}

TEST_F(MembershipTest, HeartbeatFromDeadMemberWithCurrentIncarnationRevivesIt) {
  Membership::Registration w = Worker(0);
  m_.DetectFailures(kT0 + absl::Seconds(6));
  ASSERT_TRUE(m_.live_workers().ranks.empty());
  const uint64_t epoch = m_.membership_epoch();
  bool revived = false;
  ASSERT_TRUE(Beat(0, w.incarnation, kT0 + absl::Seconds(7), &revived).ok());
  EXPECT_TRUE(revived);
  EXPECT_EQ(m_.membership_epoch(), epoch + 1);
  EXPECT_THAT(m_.live_workers().ranks, ElementsAre(0u));
}

TEST_F(MembershipTest, DeadRankIsRetakenBeforeNoneIsFree) {
  Worker(0);
  Worker(1, kT0 + absl::Seconds(4));
  Worker(2, kT0 + absl::Seconds(4));
  m_.DetectFailures(kT0 + absl::Seconds(6));
  Membership::Registration r = Worker(-1, kT0 + absl::Seconds(6));
  EXPECT_EQ(r.slot, 0u);
  EXPECT_TRUE(r.rejoined);
}

TEST_F(MembershipTest, FinishedWorkerLeavesTheLiveSetAndKeepsItsRank) {
  Membership::Registration w = Worker(0);
  Worker(1);
  const uint64_t epoch = m_.membership_epoch();
  v1::WorkerProgress done;
  done.set_step(100);
  ASSERT_TRUE(m_.FinishWorker(0, w.incarnation, done, kT0).ok());
  ASSERT_TRUE(m_.FinishWorker(0, w.incarnation, done, kT0).ok());  // a retry
  EXPECT_EQ(m_.membership_epoch(), epoch + 1);
  EXPECT_THAT(m_.live_workers().ranks, ElementsAre(1u));
  EXPECT_THAT(m_.RanksInState(v1::MEMBER_STATE_FINISHED), ElementsAre(0u));
  // Finished is not dead: silence does not change it, nor may it be retaken.
  m_.DetectFailures(kT0 + absl::Minutes(1));
  EXPECT_THAT(m_.RanksInState(v1::MEMBER_STATE_FINISHED), ElementsAre(0u));
  EXPECT_EQ(m_.RegisterWorker(0, "h", "cpu", kT0, false).status().code(),
            absl::StatusCode::kFailedPrecondition);
}

TEST_F(MembershipTest, AWorkerThatLeavesIsOutOfTheLiveSetAtOnceAndItsRankIsFree) {
  Worker(0);
  Membership::Registration w1 = Worker(1);
  Worker(2);
  const uint64_t epoch = m_.membership_epoch();
  v1::WorkerProgress at;
  at.set_step(40);
  ASSERT_TRUE(m_.LeaveWorker(1, w1.incarnation, at, kT0).ok());
  ASSERT_TRUE(m_.LeaveWorker(1, w1.incarnation, at, kT0).ok());  // a retry
  EXPECT_EQ(m_.membership_epoch(), epoch + 1);
  EXPECT_THAT(m_.live_workers().ranks, ElementsAre(0u, 2u));
  EXPECT_THAT(m_.RanksInState(v1::MEMBER_STATE_LEFT), ElementsAre(1u));
  // Left is neither dead nor revived by a late heartbeat of the old process.
  EXPECT_THAT(m_.DetectFailures(kT0 + absl::Minutes(1)).ranks, ElementsAre(0u, 2u));
  bool revived = true;
  ASSERT_TRUE(m_.WorkerHeartbeat(1, w1.incarnation, nullptr, kT0, &revived).ok());
  EXPECT_FALSE(revived);
  EXPECT_THAT(m_.RanksInState(v1::MEMBER_STATE_LEFT), ElementsAre(1u));
  // A new worker takes the rank and resumes at its step; the old
  // incarnation is fenced off.
  Membership::Registration back = Worker(1, kT0 + absl::Minutes(1));
  EXPECT_EQ(back.slot, 1u);
  EXPECT_TRUE(back.rejoined);
  EXPECT_EQ(back.start_step, 40u);
  EXPECT_EQ(m_.LeaveWorker(1, w1.incarnation, at, kT0).code(),
            absl::StatusCode::kFailedPrecondition);
}

TEST_F(MembershipTest, OnlyALiveUnfinishedRankLeavesOrIsDrained) {
  Membership::Registration w0 = Worker(0);
  Membership::Registration w1 = Worker(1);
  v1::WorkerProgress done;
  ASSERT_TRUE(m_.FinishWorker(0, w0.incarnation, done, kT0).ok());
  EXPECT_EQ(m_.LeaveWorker(0, w0.incarnation, done, kT0).code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(m_.RequestDrain(0).code(), absl::StatusCode::kFailedPrecondition);  // finished
  EXPECT_EQ(m_.RequestDrain(2).code(), absl::StatusCode::kFailedPrecondition);  // never came
  EXPECT_EQ(m_.RequestDrain(3).code(), absl::StatusCode::kNotFound);
  EXPECT_FALSE(m_.DrainRequested(1));
  ASSERT_TRUE(m_.RequestDrain(1).ok());
  EXPECT_TRUE(m_.DrainRequested(1));
  // A drained rank stays live until it leaves; then the drain is spent, and a
  // worker that takes the rank again is not drained.
  EXPECT_THAT(m_.live_workers().ranks, ElementsAre(1u));
  ASSERT_TRUE(m_.LeaveWorker(1, w1.incarnation, done, kT0).ok());
  EXPECT_FALSE(m_.DrainRequested(1));
  Worker(1);
  EXPECT_FALSE(m_.DrainRequested(1));
}

TEST_F(MembershipTest, FinishedWorkerKeepsHeartbeatingAndStaysFinished) {
  Membership::Registration w = Worker(0);
  Worker(1);
  v1::WorkerProgress done;
  done.set_step(100);
  ASSERT_TRUE(m_.FinishWorker(0, w.incarnation, done, kT0).ok());
  const uint64_t epoch = m_.membership_epoch();
  bool revived = true;
  ASSERT_TRUE(m_.WorkerHeartbeat(0, w.incarnation, &done, kT0 + absl::Seconds(4),
                                 &revived)
                  .ok());
  EXPECT_FALSE(revived);
  EXPECT_THAT(m_.RanksInState(v1::MEMBER_STATE_FINISHED), ElementsAre(0u));
  EXPECT_EQ(m_.membership_epoch(), epoch);
  EXPECT_THAT(m_.live_workers().ranks, ElementsAre(1u));
  EXPECT_EQ(m_.WorkerStatuses(kT0 + absl::Seconds(5))[0].last_heartbeat_ms_ago(),
            1000u);
}

TEST_F(MembershipTest, FinishedRanksHeartbeatingLeavesOutTheSilentOnes) {
  Membership::Registration w0 = Worker(0);
  Membership::Registration w1 = Worker(1);
  Worker(2);
  v1::WorkerProgress done;
  ASSERT_TRUE(m_.FinishWorker(0, w0.incarnation, done, kT0).ok());
  ASSERT_TRUE(m_.FinishWorker(1, w1.incarnation, done, kT0).ok());
  ASSERT_TRUE(Beat(1, w1.incarnation, kT0 + absl::Seconds(3)).ok());
  EXPECT_THAT(m_.FinishedRanksHeartbeating(kT0 + kTimeout), ElementsAre(0u, 1u));
  // Rank 2 is alive, not finished; rank 0 has been silent past the timeout.
  EXPECT_THAT(m_.FinishedRanksHeartbeating(kT0 + absl::Seconds(6)), ElementsAre(1u));
  EXPECT_TRUE(m_.FinishedRanksHeartbeating(kT0 + absl::Seconds(9)).empty());
}

TEST_F(MembershipTest, RestartedWorkerGetsTheStepItsRankReached) {
  Membership::Registration first = Worker(1);
  EXPECT_EQ(first.start_step, 0u);
  v1::WorkerProgress p;
  p.set_step(42);
  bool revived = false;
  ASSERT_TRUE(m_.WorkerHeartbeat(1, first.incarnation, &p, kT0, &revived).ok());
  m_.DetectFailures(kT0 + absl::Seconds(6));
  Membership::Registration second = Worker(1, kT0 + absl::Seconds(6));
  EXPECT_EQ(second.start_step, 42u);
  // The new incarnation reports its startup step 0 and dies: the rank still
  // resumes from 42.
  p.set_step(0);
  ASSERT_TRUE(m_.WorkerHeartbeat(1, second.incarnation, &p, kT0 + absl::Seconds(6),
                                 &revived)
                  .ok());
  m_.DetectFailures(kT0 + absl::Seconds(12));
  Membership::Registration third = Worker(1, kT0 + absl::Seconds(12));
  EXPECT_EQ(third.start_step, 42u);
  EXPECT_EQ(Worker(0).start_step, 0u);
}

TEST_F(MembershipTest, ImplausibleProgressIsRejectedAndChangesNothing) {
  Membership::Registration w = Worker(0);
  bool revived = false;
  v1::WorkerProgress good;
  good.set_step(7);
  ASSERT_TRUE(m_.WorkerHeartbeat(0, w.incarnation, &good, kT0, &revived).ok());
  for (auto bad : {+[](v1::WorkerProgress* p) { p->set_samples_per_sec(NAN); },
                   +[](v1::WorkerProgress* p) { p->set_samples_per_sec(-1); },
                   +[](v1::WorkerProgress* p) { p->set_test_accuracy(1.5f); }}) {
    v1::WorkerProgress p;
    p.set_step(99);
    bad(&p);
    EXPECT_EQ(m_.WorkerHeartbeat(0, w.incarnation, &p, kT0 + absl::Seconds(4), &revived)
                  .code(),
              absl::StatusCode::kInvalidArgument);
  }
  EXPECT_EQ(m_.WorkerStatuses(kT0)[0].progress().step(), 7u);
  // The rejected heartbeats did not count as signs of life either.
  EXPECT_THAT(m_.DetectFailures(kT0 + absl::Seconds(6)).ranks, ElementsAre(0u));
}

TEST_F(MembershipTest, OnlyANewEvaluationBecomesTheLatest) {
  Membership::Registration a = Worker(0);
  Membership::Registration b = Worker(1);
  bool revived = false;
  v1::WorkerProgress p;
  p.set_test_accuracy(-1);
  ASSERT_TRUE(m_.WorkerHeartbeat(0, a.incarnation, &p, kT0, &revived).ok());
  v1::WorkerProgress unset;  // accuracy 0 and loss 0: no evaluation
  ASSERT_TRUE(m_.WorkerHeartbeat(1, b.incarnation, &unset, kT0, &revived).ok());
  EXPECT_FALSE(m_.latest_evaluation().has_value());

  p.set_test_accuracy(0.80f);
  p.set_test_loss(0.5f);
  ASSERT_TRUE(m_.WorkerHeartbeat(0, a.incarnation, &p, kT0, &revived).ok());
  v1::WorkerProgress q;
  q.set_test_accuracy(0.85f);
  q.set_test_loss(0.4f);
  ASSERT_TRUE(m_.WorkerHeartbeat(1, b.incarnation, &q, kT0, &revived).ok());
  // Worker 0 repeats its older evaluation: not new, so not the latest.
  ASSERT_TRUE(m_.WorkerHeartbeat(0, a.incarnation, &p, kT0, &revived).ok());
  ASSERT_TRUE(m_.latest_evaluation().has_value());
  EXPECT_FLOAT_EQ(m_.latest_evaluation()->accuracy, 0.85f);
  EXPECT_FLOAT_EQ(m_.latest_evaluation()->loss, 0.4f);
}

TEST_F(MembershipTest, StatusesCarryIdentityStateAndHeartbeatAge) {
  Membership::Registration s = Server(1, "10.0.0.1:5000");
  Membership::Registration w = Worker(2);
  bool revived = false;
  v1::ShardStatus reported;
  reported.set_shard(7);  // the registered identity wins
  reported.set_address("elsewhere:1");
  reported.set_version(42);
  reported.set_num_chunks(3);
  ASSERT_TRUE(m_.ServerHeartbeat(1, s.incarnation, reported,
                                 kT0 + absl::Milliseconds(500), &revived)
                  .ok());
  const absl::Time now = kT0 + absl::Seconds(2);
  std::vector<v1::ShardStatus> shards = m_.ShardStatuses(now);
  ASSERT_EQ(shards.size(), 2u);
  EXPECT_EQ(shards[0].state(), v1::MEMBER_STATE_UNSPECIFIED);
  EXPECT_TRUE(shards[0].address().empty());
  EXPECT_EQ(shards[1].shard(), 1u);
  EXPECT_EQ(shards[1].address(), "10.0.0.1:5000");
  EXPECT_EQ(shards[1].incarnation(), s.incarnation);
  EXPECT_EQ(shards[1].version(), 42u);
  EXPECT_EQ(shards[1].state(), v1::MEMBER_STATE_ALIVE);
  EXPECT_EQ(shards[1].last_heartbeat_ms_ago(), 1500u);

  std::vector<v1::WorkerStatus> workers = m_.WorkerStatuses(now);
  ASSERT_EQ(workers.size(), 3u);
  EXPECT_EQ(workers[0].state(), v1::MEMBER_STATE_UNSPECIFIED);
  EXPECT_EQ(workers[2].rank(), 2u);
  EXPECT_EQ(workers[2].incarnation(), w.incarnation);
  EXPECT_EQ(workers[2].host(), "host");
  EXPECT_EQ(workers[2].backend(), "cpu");
  EXPECT_EQ(workers[2].state(), v1::MEMBER_STATE_ALIVE);
  EXPECT_EQ(workers[2].last_heartbeat_ms_ago(), 2000u);
}

}  // namespace
}  // namespace grps

namespace grps {
namespace {

TEST_F(MembershipTest, ResetResumeStepsSetsStartStepsAndRevivesFinishedRanksWithStepsLeft) {
  Membership::Registration w0 = Worker(0);
  Membership::Registration w1 = Worker(1);
  v1::WorkerProgress done;
  done.set_step(100);
  done.set_total_steps(100);
  ASSERT_TRUE(m_.FinishWorker(0, w0.incarnation, done, kT0).ok());
  ASSERT_TRUE(m_.FinishWorker(1, w1.incarnation, done, kT0).ok());
  const uint64_t epoch = m_.membership_epoch();
  std::vector<uint32_t> revived = m_.ResetResumeSteps({40, 100, 7}, kT0);
  EXPECT_THAT(revived, ElementsAre(0));  // rank 1 has no steps left
  EXPECT_GT(m_.membership_epoch(), epoch);
  EXPECT_THAT(m_.RanksInState(v1::MEMBER_STATE_ALIVE), ElementsAre(0));
  EXPECT_THAT(m_.RanksInState(v1::MEMBER_STATE_FINISHED), ElementsAre(1));
  // Rank 2 never registered: its first registration starts at step 7.
  EXPECT_EQ(Worker(2).start_step, 7u);
}

TEST_F(MembershipTest, AdoptionTakesUnknownMembersButNeverAnOlderIncarnation) {
  ASSERT_TRUE(m_.AdoptServer(1, 500, "10.0.0.9:5000", kT0).ok());
  EXPECT_EQ(m_.shard_map().shards(1).address(), "10.0.0.9:5000");
  EXPECT_THAT(m_.ShardsInState(v1::MEMBER_STATE_ALIVE), ElementsAre(1));
  EXPECT_TRUE(absl::IsFailedPrecondition(m_.AdoptServer(1, 400, "10.0.0.9:5000", kT0)));
  EXPECT_TRUE(absl::IsInvalidArgument(m_.AdoptServer(1, 600, "no port", kT0)));
  ASSERT_TRUE(m_.AdoptWorker(2, 700, /*finished=*/true, nullptr, kT0).ok());
  EXPECT_THAT(m_.RanksInState(v1::MEMBER_STATE_FINISHED), ElementsAre(2));
  EXPECT_TRUE(absl::IsFailedPrecondition(m_.AdoptWorker(2, 700, false, nullptr, kT0)));
  // Later registrations get incarnations above every adopted one.
  EXPECT_GT(Worker(0, absl::FromUnixMillis(1)).incarnation, 700u);
}

TEST_F(MembershipTest, ExportedStateImportsIntoAFreshMembership) {
  Membership::Registration s0 = Server(0, "10.0.0.1:5000");
  Server(1, "10.0.0.2:5000");
  Membership::Registration w0 = Worker(0);
  Membership::Registration w1 = Worker(1);
  v1::WorkerProgress done;
  done.set_step(30);
  ASSERT_TRUE(m_.FinishWorker(1, w1.incarnation, done, kT0).ok());
  Membership::Registration w2 = Worker(2);
  ASSERT_TRUE(m_.LeaveWorker(2, w2.incarnation, done, kT0).ok());
  v1::CoordinatorState state;
  m_.ExportTo(&state);

  Membership fresh(MapWithShards(2), 3, kTimeout);
  const absl::Time later = kT0 + absl::Minutes(5);
  ASSERT_TRUE(fresh.ImportFrom(state, later).ok());
  bool revived = false;
  v1::ShardStatus status;
  EXPECT_TRUE(fresh.ServerHeartbeat(0, s0.incarnation, status, later, &revived).ok());
  EXPECT_TRUE(fresh.WorkerHeartbeat(0, w0.incarnation, nullptr, later, &revived).ok());
  EXPECT_THAT(fresh.RanksInState(v1::MEMBER_STATE_FINISHED), ElementsAre(1));
  EXPECT_THAT(fresh.RanksInState(v1::MEMBER_STATE_LEFT), ElementsAre(2));
  EXPECT_THAT(fresh.live_workers().ranks, ElementsAre(0));
  EXPECT_EQ(fresh.shard_map().shards(1).address(), "10.0.0.2:5000");
  // Imported members count as heard from now: none is dead yet.
  EXPECT_TRUE(fresh.DetectFailures(later + kTimeout).empty());

  Membership other_shape(MapWithShards(1), 3, kTimeout);
  EXPECT_TRUE(absl::IsInvalidArgument(other_shape.ImportFrom(state, later)));
}

// ---- Elastic jobs: ranks beyond the starting ones, and joining ranks ----

TEST_F(MembershipTest, EveryRankIsAwaitedUnlessStartWorkersSaysFewer) {
  EXPECT_THAT(m_.UnregisteredRanks(), ElementsAre(0u, 1u, 2u));
  Membership elastic(MapWithShards(1), 4, kTimeout, /*start_workers=*/2);
  EXPECT_EQ(elastic.num_workers(), 4u);
  EXPECT_THAT(elastic.UnregisteredRanks(), ElementsAre(0u, 1u));
  ASSERT_TRUE(elastic.RegisterWorker(3, "host", "cpu", kT0, false).ok());
  EXPECT_THAT(elastic.UnregisteredRanks(), ElementsAre(0u, 1u));
  ASSERT_TRUE(elastic.RegisterWorker(-1, "host", "cpu", kT0, false).ok());
  EXPECT_THAT(elastic.UnregisteredRanks(), ElementsAre(1u));
  ASSERT_TRUE(elastic.RegisterWorker(1, "host", "cpu", kT0, false).ok());
  EXPECT_TRUE(elastic.UnregisteredRanks().empty());  // rank 2 is not awaited
  // More start ranks than ranks: all of them.
  Membership all(MapWithShards(1), 2, kTimeout, /*start_workers=*/5);
  EXPECT_THAT(all.UnregisteredRanks(), ElementsAre(0u, 1u));
}

TEST_F(MembershipTest, AJoiningRankIsAliveButOutOfTheLiveSetUntilItIsReady) {
  Membership::Registration w0 = Worker(0);
  Membership::Registration w1 = Worker(1);
  const uint64_t epoch = m_.membership_epoch();
  absl::StatusOr<Membership::Registration> joining =
      m_.RegisterWorker(2, "host", "cpu", kT0, false, /*joining=*/true);
  ASSERT_TRUE(joining.ok()) << joining.status();
  EXPECT_EQ(m_.membership_epoch(), epoch + 1);
  EXPECT_EQ(m_.LiveIncarnation(2), joining->incarnation);
  EXPECT_THAT(m_.RanksInState(v1::MEMBER_STATE_ALIVE), ElementsAre(0u, 1u, 2u));
  EXPECT_THAT(m_.live_workers().ranks, ElementsAre(0u, 1u));
  // Its heartbeats keep it alive without making it ready.
  ASSERT_TRUE(Beat(2, joining->incarnation, kT0 + absl::Seconds(1)).ok());
  EXPECT_THAT(m_.live_workers().ranks, ElementsAre(0u, 1u));

  EXPECT_TRUE(m_.MarkReady(2));
  EXPECT_EQ(m_.membership_epoch(), epoch + 2);
  EXPECT_THAT(m_.live_workers().ranks, ElementsAre(0u, 1u, 2u));
  EXPECT_THAT(m_.live_workers().incarnations,
              ElementsAre(w0.incarnation, w1.incarnation, joining->incarnation));
  EXPECT_FALSE(m_.MarkReady(2));  // once
  EXPECT_EQ(m_.membership_epoch(), epoch + 2);
}

TEST_F(MembershipTest, MarkReadyIsFalseAndChangesNothingForARankThatIsNotJoining) {
  Worker(0);
  const uint64_t epoch = m_.membership_epoch();
  EXPECT_FALSE(m_.MarkReady(0));  // registered as a member, not joining
  EXPECT_FALSE(m_.MarkReady(1));  // never registered
  EXPECT_FALSE(m_.MarkReady(3));  // out of range
  EXPECT_EQ(m_.membership_epoch(), epoch);
  // A joining rank that died is not made ready by it either.
  ASSERT_TRUE(m_.RegisterWorker(1, "host", "cpu", kT0, false, /*joining=*/true).ok());
  m_.DetectFailures(kT0 + kTimeout + absl::Seconds(1));
  ASSERT_THAT(m_.RanksInState(v1::MEMBER_STATE_DEAD), ElementsAre(0u, 1u));
  const uint64_t after = m_.membership_epoch();
  EXPECT_FALSE(m_.MarkReady(1));
  EXPECT_EQ(m_.membership_epoch(), after);
  EXPECT_TRUE(m_.live_workers().ranks.empty());
}

TEST_F(MembershipTest, ARegistrationThatIsNotJoiningEntersTheLiveSetAtOnce) {
  Worker(0);
  absl::StatusOr<Membership::Registration> joining =
      m_.RegisterWorker(1, "host", "cpu", kT0, false, /*joining=*/true);
  ASSERT_TRUE(joining.ok()) << joining.status();
  v1::WorkerProgress at;
  ASSERT_TRUE(m_.LeaveWorker(1, joining->incarnation, at, kT0).ok());
  // The rank's next worker registers as a member (the job was not running).
  Membership::Registration back = Worker(1);
  EXPECT_TRUE(back.rejoined);
  EXPECT_THAT(m_.live_workers().ranks, ElementsAre(0u, 1u));
  EXPECT_FALSE(m_.MarkReady(1));
}

}  // namespace
}  // namespace grps
