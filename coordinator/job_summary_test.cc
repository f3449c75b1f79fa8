#include "coordinator/job_summary.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace grps {
namespace {

using ::testing::HasSubstr;

v1::WorkerStatus* AddWorker(v1::JobStatus* status, v1::MemberState state,
                            uint64_t step) {
  v1::WorkerStatus* w = status->add_workers();
  w->set_rank(status->workers_size() - 1);
  w->set_state(state);
  w->mutable_progress()->set_step(step);
  return w;
}

v1::ShardStatus* AddShard(v1::JobStatus* status, v1::MemberState state,
                          uint64_t version, uint64_t chunks) {
  v1::ShardStatus* s = status->add_shards();
  s->set_shard(status->shards_size() - 1);
  s->set_state(state);
  s->set_version(version);
  s->set_num_chunks(chunks);
  return s;
}

TEST(JobSummary, MedianAveragesTheMiddlePairOfAnEvenCount) {
  EXPECT_EQ(MedianStep({}), 0);
  EXPECT_EQ(MedianStep({7}), 7);
  EXPECT_EQ(MedianStep({30, 10, 20}), 20);
  EXPECT_EQ(MedianStep({10, 100}), 55);
}

TEST(JobSummary, StragglerIsMoreThanThreeStepsOrTenPercentBehindTheMedian) {
  EXPECT_FALSE(IsStraggler(7, 10));   // 3 behind: allowed
  EXPECT_TRUE(IsStraggler(6, 10));    // 4 behind
  EXPECT_FALSE(IsStraggler(90, 100)); // 10 behind, 10% allowed
  EXPECT_TRUE(IsStraggler(89, 100));
  EXPECT_FALSE(IsStraggler(120, 100));  // ahead is never straggling
}

TEST(JobSummary, FlagsOnlyLiveWorkersFarBehindTheLiveMedian) {
  v1::JobStatus status;
  AddWorker(&status, v1::MEMBER_STATE_ALIVE, 100);
  AddWorker(&status, v1::MEMBER_STATE_ALIVE, 95);
  AddWorker(&status, v1::MEMBER_STATE_ALIVE, 50);
  AddWorker(&status, v1::MEMBER_STATE_DEAD, 3);      // not counted, not flagged
  AddWorker(&status, v1::MEMBER_STATE_FINISHED, 0);  // likewise
  SummarizeJobStatus(&status);
  EXPECT_FALSE(status.workers(0).straggler());
  EXPECT_FALSE(status.workers(1).straggler());
  EXPECT_TRUE(status.workers(2).straggler());
  EXPECT_FALSE(status.workers(3).straggler());
  EXPECT_FALSE(status.workers(4).straggler());
}

TEST(JobSummary, GlobalStepIsTheLowestVersionOfLiveShardsHoldingChunks) {
  v1::JobStatus status;
  AddWorker(&status, v1::MEMBER_STATE_ALIVE, 40);
  AddShard(&status, v1::MEMBER_STATE_ALIVE, 12, 4);
  AddShard(&status, v1::MEMBER_STATE_ALIVE, 11, 4);
  AddShard(&status, v1::MEMBER_STATE_DEAD, 2, 4);    // dead: ignored
  AddShard(&status, v1::MEMBER_STATE_ALIVE, 0, 0);   // holds nothing: ignored
  SummarizeJobStatus(&status);
  EXPECT_EQ(status.global_step(), 11u);
}

TEST(JobSummary, GlobalStepFallsBackToTheFurthestWorkerBeforeShardsReport) {
  v1::JobStatus status;
  AddWorker(&status, v1::MEMBER_STATE_ALIVE, 40);
  AddWorker(&status, v1::MEMBER_STATE_DEAD, 55);
  AddShard(&status, v1::MEMBER_STATE_ALIVE, 0, 0);  // no status reported yet
  SummarizeJobStatus(&status);
  EXPECT_EQ(status.global_step(), 55u);
}

TEST(JobSummary, RatesSumAndLossAveragesOverLiveWorkers) {
  v1::JobStatus status;
  v1::WorkerStatus* a = AddWorker(&status, v1::MEMBER_STATE_ALIVE, 10);
  a->mutable_progress()->set_samples_per_sec(100);
  a->mutable_progress()->set_loss(1.0f);
  a->mutable_progress()->set_total_steps(500);
  v1::WorkerStatus* b = AddWorker(&status, v1::MEMBER_STATE_ALIVE, 10);
  b->mutable_progress()->set_samples_per_sec(50);
  b->mutable_progress()->set_loss(0.5f);
  b->mutable_progress()->set_total_steps(600);
  v1::WorkerStatus* dead = AddWorker(&status, v1::MEMBER_STATE_DEAD, 10);
  dead->mutable_progress()->set_samples_per_sec(1000);
  dead->mutable_progress()->set_loss(9.0f);
  SummarizeJobStatus(&status);
  EXPECT_FLOAT_EQ(status.samples_per_sec(), 150);
  EXPECT_FLOAT_EQ(status.loss(), 0.75f);
  EXPECT_EQ(status.total_steps(), 600u);
}

TEST(JobSummary, FinishedJobKeepsTheLastReportedLoss) {
  v1::JobStatus status;
  AddWorker(&status, v1::MEMBER_STATE_FINISHED, 10)->mutable_progress()->set_loss(0.2f);
  AddWorker(&status, v1::MEMBER_STATE_FINISHED, 10)->mutable_progress()->set_loss(0.4f);
  SummarizeJobStatus(&status);
  EXPECT_FLOAT_EQ(status.loss(), 0.3f);
  EXPECT_FLOAT_EQ(status.samples_per_sec(), 0);
}

TEST(JobSummary, LateAndTooStaleGradientsSumOverShardsAndByWorker) {
  v1::JobStatus status;
  AddWorker(&status, v1::MEMBER_STATE_ALIVE, 10);
  AddWorker(&status, v1::MEMBER_STATE_DEAD, 4);
  AddWorker(&status, v1::MEMBER_STATE_ALIVE, 10);
  v1::ShardStatus* a = AddShard(&status, v1::MEMBER_STATE_ALIVE, 10, 2);
  a->set_late_gradients(5);
  a->set_too_stale(1);
  a->add_late_by_worker(0);
  a->add_late_by_worker(5);  // shorter than the worker list: rank 2 has none
  v1::ShardStatus* b = AddShard(&status, v1::MEMBER_STATE_DEAD, 9, 2);
  b->set_late_gradients(3);
  b->set_too_stale(2);
  b->add_late_by_worker(1);
  b->add_late_by_worker(1);
  b->add_late_by_worker(1);
  b->add_late_by_worker(7);  // a rank the job does not have: ignored

  SummarizeJobStatus(&status);

  EXPECT_EQ(status.late_gradients(), 8u);
  EXPECT_EQ(status.too_stale(), 3u);
  EXPECT_EQ(status.workers(0).late_gradients(), 1u);
  EXPECT_EQ(status.workers(1).late_gradients(), 6u);
  EXPECT_EQ(status.workers(2).late_gradients(), 1u);
}

v1::JobStatus EndedWithLedger(v1::JobState state, uint64_t consumed, uint64_t total,
                              uint64_t refused_reports) {
  v1::JobStatus status;
  status.set_state(state);
  status.mutable_data()->set_total_blocks(total);
  status.mutable_data()->set_consumed(consumed);
  status.mutable_data()->set_leased(total - consumed);
  status.mutable_data()->set_refused_reports(refused_reports);
  return status;
}

TEST(JobSummary, ACompletedJobWhoseLedgerMissedABlockSaysSo) {
  v1::JobStatus status = EndedWithLedger(v1::JOB_STATE_COMPLETED, 1999, 2000, 0);
  AddCompletionWarnings(&status);
  ASSERT_EQ(status.warnings_size(), 1);
  EXPECT_THAT(status.warnings(0), HasSubstr("1 of the job's 2000 blocks of examples was never "
                                            "trained (1 still leased at the end)"));
}

TEST(JobSummary, ACompletedJobWithABlockTrainedTwiceSaysSo) {
  v1::JobStatus status = EndedWithLedger(v1::JOB_STATE_COMPLETED, 2000, 2000, 3);
  AddCompletionWarnings(&status);
  ASSERT_EQ(status.warnings_size(), 1);
  EXPECT_THAT(status.warnings(0), HasSubstr("3 blocks were reported trained by a rank"));
}

TEST(JobSummary, ACompletedSyncJobWhoseShardsEndedAtDifferentVersionsSaysSo) {
  v1::JobStatus status;
  status.set_state(v1::JOB_STATE_COMPLETED);
  status.set_mode(v1::MODE_SYNC);
  AddShard(&status, v1::MEMBER_STATE_ALIVE, 541, 2);
  AddShard(&status, v1::MEMBER_STATE_ALIVE, 542, 2);
  AddShard(&status, v1::MEMBER_STATE_ALIVE, 0, 0);  // a shard that holds no chunk
  AddCompletionWarnings(&status);
  ASSERT_EQ(status.warnings_size(), 1);
  EXPECT_THAT(status.warnings(0),
              HasSubstr("the sync shards ended at different versions (shard 0 at 541, "
                        "shard 1 at 542)"));
  // Async shards count gradients, not steps: theirs may differ.
  status.clear_warnings();
  status.set_mode(v1::MODE_ASYNC);
  AddCompletionWarnings(&status);
  EXPECT_EQ(status.warnings_size(), 0);
  // Sync shards at one version.
  status.set_mode(v1::MODE_SYNC);
  status.mutable_shards(1)->set_version(541);
  AddCompletionWarnings(&status);
  EXPECT_EQ(status.warnings_size(), 0);
}

TEST(JobSummary, NoWarningForAWholeLedgerARunningOrStoppedJobOrNoLedger) {
  v1::JobStatus whole = EndedWithLedger(v1::JOB_STATE_COMPLETED, 2000, 2000, 0);
  v1::JobStatus running = EndedWithLedger(v1::JOB_STATE_RUNNING, 10, 2000, 0);
  v1::JobStatus stopped = EndedWithLedger(v1::JOB_STATE_STOPPED, 10, 2000, 0);
  v1::JobStatus fixed;  // a job that splits its data by rank has no ledger
  fixed.set_state(v1::JOB_STATE_COMPLETED);
  for (v1::JobStatus* status : {&whole, &running, &stopped, &fixed}) {
    AddCompletionWarnings(status);
    EXPECT_EQ(status->warnings_size(), 0) << status->DebugString();
  }
}

}  // namespace
}  // namespace grps
