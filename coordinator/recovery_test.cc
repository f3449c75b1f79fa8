// Recovery as a specification: a running job fails once a shard has been
// dead, or it has had no training or finished worker, for longer than the
// recovery timeout; never before, and never when it is not running.
#include "coordinator/recovery.h"

#include <algorithm>
#include <memory>
#include <string>
#include <vector>

#include "coordinator/testing/test_job.h"
#include "gtest/gtest.h"

namespace grps {
namespace {

const absl::Time kT0 = absl::FromUnixSeconds(1'700'000'000);
const absl::Duration kTimeout = absl::Seconds(1);  // TestJobConfig's heartbeat timeout

class RecoveryTest : public ::testing::Test {
 protected:
  void SetUp() override {
    config_ = TestJobConfig(2, 2, v1::MODE_ASYNC, "");
    config_.set_recovery_timeout_ms(10'000);
    absl::StatusOr<v1::ShardMap> map = TestShardMap(config_);
    ASSERT_TRUE(map.ok()) << map.status();
    membership_ = std::make_unique<Membership>(*map, 2, kTimeout);
    for (uint32_t s = 0; s < 2; ++s)
      ASSERT_TRUE(membership_->RegisterServer(s, "10.0.0." + std::to_string(s) + ":7000", kT0)
                      .ok());
    for (uint32_t rank = 0; rank < 2; ++rank) {
      absl::StatusOr<Membership::Registration> r =
          membership_->RegisterWorker(rank, "host", "cpu", kT0, /*holds_live_rank=*/false);
      ASSERT_TRUE(r.ok()) << r.status();
      workers_.push_back(r->incarnation);
    }
    phase_.Run();
  }
  // Every member but shard 0's server and the ranks in `silent` heartbeats
  // at `at`; then failures are detected.
  void Beat(absl::Time at, const std::vector<uint32_t>& silent_ranks, bool shard0_silent) {
    bool revived = false;
    for (uint32_t s = shard0_silent ? 1 : 0; s < 2; ++s)
      ASSERT_TRUE(membership_
                      ->ServerHeartbeat(s, membership_->shard_map().shards(s).incarnation(), {},
                                        at, &revived)
                      .ok());
    for (uint32_t rank = 0; rank < 2; ++rank)
      if (std::find(silent_ranks.begin(), silent_ranks.end(), rank) == silent_ranks.end()) {
        ASSERT_TRUE(membership_->WorkerHeartbeat(rank, workers_[rank], nullptr, at, &revived).ok());
      }
    membership_->DetectFailures(at);
  }
  std::optional<std::string> Failure(absl::Time at) {
    return RecoveryFailure(*membership_, config_, &phase_, at);
  }

  v1::JobConfig config_;
  std::unique_ptr<Membership> membership_;
  JobPhase phase_{"test-job"};
  std::vector<uint64_t> workers_;
};

TEST_F(RecoveryTest, AShardDeadForTheRecoveryTimeoutFailsTheJob) {
  // Shard 0 last heartbeated at kT0: dead from kT0 + 1 s, failed from 11 s.
  for (int s = 1; s <= 10; ++s) {
    Beat(kT0 + absl::Seconds(s), {}, /*shard0_silent=*/true);
    EXPECT_FALSE(Failure(kT0 + absl::Seconds(s)).has_value()) << s;
  }
  Beat(kT0 + absl::Seconds(11), {}, /*shard0_silent=*/true);
  EXPECT_EQ(Failure(kT0 + absl::Seconds(11)),
            "shard 0 has been dead for 10s and no server took it over");
}

TEST_F(RecoveryTest, ATimeUnderASecondIsSaidInMilliseconds) {
  config_.set_recovery_timeout_ms(250);
  Beat(kT0 + absl::Milliseconds(1300), {}, /*shard0_silent=*/true);
  EXPECT_EQ(Failure(kT0 + absl::Milliseconds(1300)),
            "shard 0 has been dead for 300ms and no server took it over");
}

TEST_F(RecoveryTest, NoWorkerForTheRecoveryTimeoutFailsTheJob) {
  Beat(kT0 + absl::Seconds(2), {0, 1}, false);  // both dead
  EXPECT_FALSE(Failure(kT0 + absl::Seconds(2)).has_value());
  Beat(kT0 + absl::Seconds(11), {0, 1}, false);
  EXPECT_FALSE(Failure(kT0 + absl::Seconds(11)).has_value());
  Beat(kT0 + absl::Seconds(12), {0, 1}, false);
  EXPECT_EQ(Failure(kT0 + absl::Seconds(12)),
            "every worker died before finishing; none came back within 10s");
}

TEST_F(RecoveryTest, AWorkerThatLeftIsNamedInTheFailure) {
  v1::WorkerProgress progress;
  ASSERT_TRUE(membership_->LeaveWorker(1, workers_[1], progress, kT0).ok());
  Beat(kT0 + absl::Seconds(2), {0, 1}, false);
  EXPECT_FALSE(Failure(kT0 + absl::Seconds(2)).has_value());
  Beat(kT0 + absl::Seconds(12), {0, 1}, false);
  EXPECT_EQ(Failure(kT0 + absl::Seconds(12)),
            "every worker died or left before finishing; none came back within 10s");
}

TEST_F(RecoveryTest, AJobNotRunningNeverFailsHere) {
  phase_.End(v1::JOB_STATE_STOPPED, "stopped", kT0);
  Beat(kT0 + absl::Seconds(30), {0, 1}, /*shard0_silent=*/true);
  EXPECT_FALSE(Failure(kT0 + absl::Seconds(30)).has_value());
  EXPECT_FALSE(Failure(kT0 + absl::Seconds(60)).has_value());
}

}  // namespace
}  // namespace grps
