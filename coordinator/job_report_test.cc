// JobReport as a specification: a status and a persisted state assembled
// from the collaborators that keep each part: the phase and its message (or
// who a waiting job waits for), the members, the checkpoints, the
// generation; the persisted state is what a take-over reads back.
#include "coordinator/job_report.h"

#include <memory>
#include <string>

#include "coordinator/testing/job_parts.h"
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
    parts_ = std::make_unique<TestJobParts>(config_, *map);
    report_ = std::make_unique<JobReport>(JobReport::Parts{
        .config = &config_,
        .phase = &parts_->phase,
        .membership = &parts_->membership,
        .model = &parts_->model,
        .ending = &parts_->ending,
        .checkpoints = &parts_->checkpoints,
        .generations = &parts_->generations,
        .global_step = &parts_->global_step,
        .data = &parts_->data,
        .resharding = &parts_->resharding});
  }
  void RegisterAll() {
    for (uint32_t s = 0; s < 2; ++s)
      ASSERT_TRUE(
          parts_->membership.RegisterServer(s, "10.0.0." + std::to_string(s) + ":7000", kT0).ok());
    for (uint32_t rank = 0; rank < 2; ++rank)
      ASSERT_TRUE(parts_->membership.RegisterWorker(rank, "host", "cpu", kT0, false).ok());
    parts_->phase.NoteRegistration(kT0);
    parts_->phase.Run();
  }

  v1::JobConfig config_;
  std::unique_ptr<TestJobParts> parts_;
  std::unique_ptr<JobReport> report_;
};

TEST_F(JobReportTest, AWaitingJobSaysWhoItWaitsFor) {
  ASSERT_TRUE(parts_->membership.RegisterServer(0, "10.0.0.0:7000", kT0).ok());
  ASSERT_TRUE(parts_->membership.RegisterWorker(1, "host", "cpu", kT0, false).ok());
  const v1::JobStatus status = report_->Status(false, kT0);
  EXPECT_EQ(status.state(), v1::JOB_STATE_WAITING);
  EXPECT_EQ(status.message(), "waiting for shard 1 and worker 0 to register");
}

TEST_F(JobReportTest, ARunningJobsStatusCarriesItsMembersCheckpointsAndGeneration) {
  RegisterAll();
  parts_->checkpoints.Start(10, {}, 8, kT0);
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
  parts_->phase.End(v1::JOB_STATE_STOPPED, "asked to stop", kT0);
  EXPECT_EQ(report_->Status(false, kT0).message(), "asked to stop");
}

TEST_F(JobReportTest, ThePersistedStateIsWhatATakeOverReadsBack) {
  RegisterAll();
  const v1::CoordinatorState state = report_->State(false, kT0 + absl::Seconds(3));
  EXPECT_EQ(state.config().job_id(), "test-job");
  EXPECT_EQ(state.state(), v1::JOB_STATE_RUNNING);
  EXPECT_FALSE(state.has_final_status());  // the job has not ended
  EXPECT_EQ(state.shards_size(), 2);
  EXPECT_EQ(state.next_checkpoint_id(), 1u);
  EXPECT_DOUBLE_EQ(state.elapsed_seconds(), 3);
  EXPECT_EQ(state.unix_time_ms(), static_cast<uint64_t>(absl::ToUnixMillis(kT0)) + 3000);
  Membership taken_over(parts_->membership.shard_map(), 2, absl::Seconds(1));
  EXPECT_TRUE(taken_over.ImportFrom(state, kT0).ok());
}

// grps-local reads how the job ended from the state file when it did not
// hear the coordinator's last snapshot.
TEST_F(JobReportTest, AnEndedJobsStateCarriesTheStatusItEndedWith) {
  RegisterAll();
  parts_->phase.End(v1::JOB_STATE_STOPPED, "asked to stop", kT0);
  const v1::CoordinatorState state = report_->State(false, kT0 + absl::Seconds(1));
  ASSERT_TRUE(state.has_final_status());
  EXPECT_EQ(state.final_status().state(), v1::JOB_STATE_STOPPED);
  EXPECT_EQ(state.final_status().message(), "asked to stop");
  EXPECT_EQ(state.final_status().job_id(), "test-job");
  EXPECT_EQ(state.final_status().SerializeAsString(),
            report_->Status(false, kT0 + absl::Seconds(1)).SerializeAsString());
}

}  // namespace
}  // namespace grps
