// JobReport as a specification: a status and a persisted state assembled
// from the collaborators that keep each part: the phase and its message (or
// who a waiting job waits for), the members, the checkpoints, the
// generation; the persisted state is what a take-over reads back.
#include "coordinator/job_report.h"

#include <memory>
#include <string>

#include "coordinator/testing/test_job.h"
#include "gtest/gtest.h"

namespace grps {
namespace {

const absl::Time kT0 = absl::FromUnixSeconds(1'700'000'000);

class JobReportTest : public ::testing::Test {
 protected:
  void SetUp() override {
    config_ = TestJobConfig(2, 2, v1::MODE_SYNC, "/nowhere");
    absl::StatusOr<v1::ShardMap> map = TestShardMap(config_);
    ASSERT_TRUE(map.ok()) << map.status();
    membership_ = std::make_unique<Membership>(*map, 2, absl::Seconds(1));
    checkpoints_ = std::make_unique<CheckpointScheduler>(config_, 2);
    generations_ = std::make_unique<Generations>(config_, Env::Default());
    model_ = std::make_unique<JobModel>(config_);
    ending_ = std::make_unique<JobEnding>(config_.job_id(), membership_.get());
    resharding_ = std::make_unique<Resharding>(config_);
    report_ = std::make_unique<JobReport>(JobReport::Parts{.config = &config_,
                                                           .phase = &phase_,
                                                           .membership = membership_.get(),
                                                           .model = model_.get(),
                                                           .ending = ending_.get(),
                                                           .checkpoints = checkpoints_.get(),
                                                           .generations = generations_.get(),
                                                           .global_step = &global_step_,
                                                           .data = &data_,
                                                           .resharding = resharding_.get()});
  }
  void RegisterAll() {
    for (uint32_t s = 0; s < 2; ++s)
      ASSERT_TRUE(membership_->RegisterServer(s, "10.0.0." + std::to_string(s) + ":7000", kT0)
                      .ok());
    for (uint32_t rank = 0; rank < 2; ++rank)
      ASSERT_TRUE(membership_->RegisterWorker(rank, "host", "cpu", kT0, false).ok());
    phase_.NoteRegistration(kT0);
    phase_.Run();
  }

  v1::JobConfig config_;
  JobPhase phase_{"test-job"};
  std::unique_ptr<Membership> membership_;
  std::unique_ptr<CheckpointScheduler> checkpoints_;
  std::unique_ptr<Generations> generations_;
  std::unique_ptr<JobModel> model_;
  std::unique_ptr<JobEnding> ending_;
  std::unique_ptr<Resharding> resharding_;
  GlobalStep global_step_;
  ElasticData data_;
  std::unique_ptr<JobReport> report_;
};

TEST_F(JobReportTest, AWaitingJobSaysWhoItWaitsFor) {
  ASSERT_TRUE(membership_->RegisterServer(0, "10.0.0.0:7000", kT0).ok());
  ASSERT_TRUE(membership_->RegisterWorker(1, "host", "cpu", kT0, false).ok());
  const v1::JobStatus status = report_->Status(false, kT0);
  EXPECT_EQ(status.state(), v1::JOB_STATE_WAITING);
  EXPECT_EQ(status.message(), "waiting for shard 1 and worker 0 to register");
}

TEST_F(JobReportTest, ARunningJobsStatusCarriesItsMembersCheckpointsAndGeneration) {
  RegisterAll();
  checkpoints_->Start(10, {}, 8, kT0);
  const v1::JobStatus status = report_->Status(false, kT0 + absl::Seconds(5));
  EXPECT_EQ(status.job_id(), "test-job");
  EXPECT_EQ(status.state(), v1::JOB_STATE_RUNNING);
  EXPECT_EQ(status.workers_size(), 2);
  EXPECT_EQ(status.shards_size(), 2);
  EXPECT_EQ(status.pending_checkpoint().id(), 1u);
  EXPECT_EQ(status.generation(), 1u);
  EXPECT_DOUBLE_EQ(status.elapsed_seconds(), 5);
  EXPECT_EQ(status.config().num_servers(), 2u);
  EXPECT_EQ(status.test_accuracy(), -1);  // no evaluation yet
  EXPECT_FALSE(status.has_reshard());     // the job does not re-shard
}

TEST_F(JobReportTest, AnEndedJobSaysWhy) {
  RegisterAll();
  phase_.End(v1::JOB_STATE_STOPPED, "asked to stop", kT0);
  EXPECT_EQ(report_->Status(false, kT0).message(), "asked to stop");
}

TEST_F(JobReportTest, ThePersistedStateIsWhatATakeOverReadsBack) {
  RegisterAll();
  const v1::CoordinatorState state = report_->State(kT0 + absl::Seconds(3));
  EXPECT_EQ(state.config().job_id(), "test-job");
  EXPECT_EQ(state.state(), v1::JOB_STATE_RUNNING);
  EXPECT_EQ(state.shards_size(), 2);
  EXPECT_EQ(state.next_checkpoint_id(), 1u);
  EXPECT_DOUBLE_EQ(state.elapsed_seconds(), 3);
  EXPECT_EQ(state.unix_time_ms(), static_cast<uint64_t>(absl::ToUnixMillis(kT0)) + 3000);
  Membership taken_over(membership_->shard_map(), 2, absl::Seconds(1));
  EXPECT_TRUE(taken_over.ImportFrom(state, kT0).ok());
}

}  // namespace
}  // namespace grps
