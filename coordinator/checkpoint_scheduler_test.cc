#include "coordinator/checkpoint_scheduler.h"

#include "gtest/gtest.h"
#include "job/job_config.h"

namespace grps {
namespace {

const absl::Time kT0 = absl::FromUnixSeconds(1'700'000'000);

v1::JobConfig Config(v1::ConsistencyMode mode) {
  v1::JobConfig c = DefaultJobConfig();
  c.set_job_id("sched-job");
  c.set_mode(mode);
  c.set_checkpoint_dir("/ckpt");
  c.set_checkpoint_every_steps(100);
  return c;
}

v1::ShardCheckpoint Written(uint64_t id, uint32_t shard, uint64_t version) {
  v1::ShardCheckpoint r;
  r.set_id(id);
  r.set_shard(shard);
  r.set_state(v1::CHECKPOINT_STATE_WRITTEN);
  r.set_file(absl::StrCat("shard-0000", shard, ".ckpt"));
  r.set_bytes(1000);
  r.set_min_version(version);
  r.set_max_version(version);
  r.set_num_chunks(3);
  return r;
}

TEST(CheckpointScheduler, SspResumeStepsGoBackToAGradientAShardHeld) {
  // Two shards, two workers at steps 7 and 9 when the checkpoint was asked
  // for; shard 1 held a gradient of rank 1's step 5 (not in its file): the
  // manifest resumes rank 1 at 5, so that the gradient is computed again.
  CheckpointScheduler s(Config(v1::MODE_SSP), 2);
  s.Start(0, {7, 9}, 8, kT0);
  s.Report(0, Written(1, 0, 8), kT0);
  v1::ShardCheckpoint held = Written(1, 1, 8);
  (*held.mutable_held_from())[1] = 5;
  (*held.mutable_held_from())[7] = 0;  // no such rank: ignored
  s.Report(1, held, kT0);
  std::optional<v1::CheckpointManifest> m =
      s.TakeManifestToWrite(v1::ShardMap(), Config(v1::MODE_SSP), kT0);
  ASSERT_TRUE(m.has_value());
  ASSERT_EQ(m->worker_steps_size(), 2);
  EXPECT_EQ(m->worker_steps(0), 7u);
  EXPECT_EQ(m->worker_steps(1), 5u);
}

TEST(CheckpointScheduler, AReportToAnotherCoordinatorsRequestIsNotAnAnswer) {
  // A coordinator that took the job over asks again with an id its
  // predecessor used: the shard's report of the older request (same id)
  // does not count; its answer to this request does.
  CheckpointScheduler s(Config(v1::MODE_ASYNC), 1);
  s.set_coordinator_incarnation(2000);
  const v1::CheckpointRequest r = s.Start(0, {4}, 8, kT0);
  EXPECT_EQ(r.coordinator_incarnation(), 2000u);
  v1::ShardCheckpoint old = Written(r.id(), 0, 8);
  old.set_coordinator_incarnation(1000);
  s.Report(0, old, kT0);
  EXPECT_FALSE(s.TakeManifestToWrite(v1::ShardMap(), Config(v1::MODE_ASYNC), kT0).has_value());
  v1::ShardCheckpoint answer = Written(r.id(), 0, 9);
  answer.set_coordinator_incarnation(2000);
  s.Report(0, answer, kT0);
  std::optional<v1::CheckpointManifest> m =
      s.TakeManifestToWrite(v1::ShardMap(), Config(v1::MODE_ASYNC), kT0);
  ASSERT_TRUE(m.has_value());
  EXPECT_EQ(m->step(), 9u);
}

TEST(CheckpointScheduler, DisabledWithoutACheckpointDir) {
  v1::JobConfig c = Config(v1::MODE_SYNC);
  c.clear_checkpoint_dir();
  CheckpointScheduler s(c, 2);
  EXPECT_FALSE(s.enabled());
  EXPECT_FALSE(s.Due(1000, kT0));
}

TEST(CheckpointScheduler, DueEveryNGlobalSteps) {
  CheckpointScheduler s(Config(v1::MODE_SYNC), 2);
  EXPECT_FALSE(s.Due(99, kT0));
  EXPECT_TRUE(s.Due(100, kT0));
  s.Start(105, {}, 100, kT0);
  EXPECT_FALSE(s.Due(1000, kT0));  // one at a time
}

TEST(CheckpointScheduler, InSyncModeTheNextCheckpointByStepsIsDueNStepsPastTheLastCut) {
  // Asked for at global step 100, cut at 150: the next is due at 250, the
  // step CheckpointCuts is to cut it at.
  CheckpointScheduler s(Config(v1::MODE_SYNC), 1);
  s.Start(150, {}, 100, kT0);
  s.Report(0, Written(1, 0, 150), kT0);
  ASSERT_TRUE(s.TakeManifestToWrite(v1::ShardMap(), Config(v1::MODE_SYNC), kT0).has_value());
  s.FinishWrite(1, absl::OkStatus(), kT0);
  EXPECT_EQ(s.NextStepDue(), 250u);
  EXPECT_FALSE(s.Due(249, kT0));
  EXPECT_TRUE(s.Due(250, kT0));
}

TEST(CheckpointScheduler, InAsyncModeTheNextCheckpointByStepsIsDueNGlobalStepsPastTheLastAsked) {
  CheckpointScheduler s(Config(v1::MODE_ASYNC), 1);
  s.Start(0, {100}, 100, kT0);
  s.Report(0, Written(1, 0, 103), kT0);
  ASSERT_TRUE(s.TakeManifestToWrite(v1::ShardMap(), Config(v1::MODE_ASYNC), kT0).has_value());
  s.FinishWrite(1, absl::OkStatus(), kT0);
  EXPECT_EQ(s.NextStepDue(), 200u);
  EXPECT_FALSE(s.Due(199, kT0));
  EXPECT_TRUE(s.Due(200, kT0));
}

TEST(CheckpointScheduler, RequestGoesToEachShardUntilItReports) {
  CheckpointScheduler s(Config(v1::MODE_SYNC), 2);
  v1::CheckpointRequest r = s.Start(10, {}, 8, kT0);
  EXPECT_EQ(r.id(), 1u);
  EXPECT_EQ(r.dir(), "/ckpt/ckpt-00000001");
  ASSERT_TRUE(s.RequestFor(0).has_value());
  s.Report(0, Written(1, 0, 10), kT0);
  EXPECT_FALSE(s.RequestFor(0).has_value());
  EXPECT_TRUE(s.RequestFor(1).has_value());
  EXPECT_FALSE(s.TakeManifestToWrite(v1::ShardMap(), Config(v1::MODE_SYNC), kT0).has_value());
  s.Report(1, Written(1, 1, 10), kT0);
  std::optional<v1::CheckpointManifest> m =
      s.TakeManifestToWrite(v1::ShardMap(), Config(v1::MODE_SYNC), kT0 + absl::Seconds(1));
  ASSERT_TRUE(m.has_value());
  EXPECT_EQ(m->step(), 10u);
  EXPECT_EQ(m->shards_size(), 2);
  ASSERT_EQ(m->worker_steps_size(), 2);
  EXPECT_EQ(m->worker_steps(1), 10u);
  s.FinishWrite(1, absl::OkStatus(), kT0 + absl::Seconds(1));
  EXPECT_EQ(s.last_complete().id(), 1u);
  EXPECT_EQ(s.last_complete().state(), v1::CHECKPOINT_STATE_COMPLETE);
  EXPECT_EQ(s.last_complete().bytes(), 2000u);
  EXPECT_EQ(s.completed(), 1u);
  EXPECT_FALSE(s.pending());
}

TEST(CheckpointScheduler, AFailedShardFailsTheCheckpointAndRaisesTheFailureCount) {
  CheckpointScheduler s(Config(v1::MODE_SYNC), 2);
  s.Start(10, {}, 8, kT0);
  v1::ShardCheckpoint failed;
  failed.set_id(1);
  failed.set_state(v1::CHECKPOINT_STATE_FAILED);
  failed.set_error("chunk 3 already at version 12 > 10");
  s.Report(1, failed, kT0);
  EXPECT_FALSE(s.pending());
  EXPECT_EQ(s.consecutive_failures(), 1u);
  EXPECT_EQ(s.pending_summary().state(), v1::CHECKPOINT_STATE_FAILED);
  EXPECT_NE(s.pending_summary().error().find("version 12"), std::string::npos);
  // The first retry is due at once, with the next id.
  EXPECT_TRUE(s.Due(8, kT0));
  EXPECT_EQ(s.Start(20, {}, 8, kT0).id(), 2u);
  // A second failure in a row: the next one waits for the back-off, a third
  // for twice that.
  failed.set_id(2);
  s.Report(1, failed, kT0);
  EXPECT_EQ(s.consecutive_failures(), 2u);
  EXPECT_FALSE(s.Due(8, kT0 + CheckpointScheduler::kRetryBackoff - absl::Milliseconds(1)));
  EXPECT_TRUE(s.Due(8, kT0 + CheckpointScheduler::kRetryBackoff));
  const absl::Time t1 = kT0 + CheckpointScheduler::kRetryBackoff;
  EXPECT_EQ(s.Start(40, {}, 8, t1).id(), 3u);
  failed.set_id(3);
  s.Report(1, failed, t1);
  EXPECT_FALSE(s.Due(8, t1 + CheckpointScheduler::kRetryBackoff));
  EXPECT_TRUE(s.Due(8, t1 + 2 * CheckpointScheduler::kRetryBackoff));
}

TEST(CheckpointScheduler, SyncReportAtAnotherVersionOrWithAPathFails) {
  CheckpointScheduler s(Config(v1::MODE_SYNC), 1);
  s.Start(10, {}, 8, kT0);
  s.Report(0, Written(1, 0, 11), kT0);
  EXPECT_EQ(s.pending_summary().state(), v1::CHECKPOINT_STATE_FAILED);
  s.Start(12, {}, 8, kT0);
  v1::ShardCheckpoint bad = Written(2, 0, 12);
  bad.set_file("../escape");
  s.Report(0, bad, kT0);
  EXPECT_EQ(s.pending_summary().state(), v1::CHECKPOINT_STATE_FAILED);
}

TEST(CheckpointScheduler, AsyncStepIsTheLowestVersionAndWorkerStepsAreKept) {
  CheckpointScheduler s(Config(v1::MODE_ASYNC), 2);
  s.Start(0, {40, 37}, 0, kT0);
  v1::ShardCheckpoint a = Written(1, 0, 0);
  a.set_min_version(75);
  a.set_max_version(80);
  v1::ShardCheckpoint b = Written(1, 1, 0);
  b.set_min_version(77);
  b.set_max_version(79);
  s.Report(0, a, kT0);
  s.Report(1, b, kT0);
  std::optional<v1::CheckpointManifest> m =
      s.TakeManifestToWrite(v1::ShardMap(), Config(v1::MODE_ASYNC), kT0);
  ASSERT_TRUE(m.has_value());
  EXPECT_EQ(m->step(), 75u);
  ASSERT_EQ(m->worker_steps_size(), 2);
  EXPECT_EQ(m->worker_steps(0), 40u);
  EXPECT_EQ(m->worker_steps(1), 37u);
}

TEST(CheckpointScheduler, TimesOutAndAFailedManifestWriteFails) {
  CheckpointScheduler s(Config(v1::MODE_SYNC), 1);
  s.Start(10, {}, 8, kT0);
  EXPECT_FALSE(s.TimedOut(kT0 + CheckpointScheduler::kTimeout));
  EXPECT_TRUE(s.TimedOut(kT0 + CheckpointScheduler::kTimeout + absl::Seconds(1)));
  s.Fail("timed out", kT0);
  s.Start(10, {}, 8, kT0);
  s.Report(0, Written(2, 0, 10), kT0);
  ASSERT_TRUE(s.TakeManifestToWrite(v1::ShardMap(), Config(v1::MODE_SYNC), kT0).has_value());
  s.Fail("ignored while writing", kT0);
  EXPECT_TRUE(s.pending());
  s.FinishWrite(2, absl::UnavailableError("disk full"), kT0);
  EXPECT_EQ(s.SummaryOf(2).state(), v1::CHECKPOINT_STATE_FAILED);
  EXPECT_EQ(s.completed(), 0u);
}

TEST(CheckpointScheduler, AStatusAndAPersistedStateCarryTheNewestThePendingAndTheCount) {
  CheckpointScheduler s(Config(v1::MODE_SYNC), 1);
  s.Start(10, {}, 8, kT0);
  s.Report(0, Written(1, 0, 10), kT0);
  ASSERT_TRUE(s.TakeManifestToWrite(v1::ShardMap(), Config(v1::MODE_SYNC), kT0).has_value());
  s.FinishWrite(1, absl::OkStatus(), kT0);
  s.Start(20, {}, 18, kT0);  // checkpoint 2 pending

  v1::JobStatus status;
  s.AddTo(&status);
  EXPECT_EQ(status.last_checkpoint().id(), 1u);
  EXPECT_EQ(status.last_checkpoint().state(), v1::CHECKPOINT_STATE_COMPLETE);
  EXPECT_EQ(status.pending_checkpoint().id(), 2u);
  EXPECT_EQ(status.checkpoints_completed(), 1u);

  v1::CoordinatorState state;
  s.ExportTo(&state);
  EXPECT_EQ(state.next_checkpoint_id(), 3u);
  EXPECT_EQ(state.last_checkpoint().id(), 1u);
  EXPECT_EQ(state.checkpoints_completed(), 1u);
}

TEST(CheckpointScheduler, ATakenOverSchedulerGoesOnFromTheExportedIdAndNewestCheckpoint) {
  CheckpointScheduler s(Config(v1::MODE_SYNC), 1);
  s.Start(10, {}, 8, kT0);
  s.Report(0, Written(1, 0, 10), kT0);
  std::optional<v1::CheckpointManifest> manifest =
      s.TakeManifestToWrite(v1::ShardMap(), Config(v1::MODE_SYNC), kT0);
  ASSERT_TRUE(manifest.has_value());
  s.FinishWrite(1, absl::OkStatus(), kT0);
  v1::CoordinatorState state;
  s.ExportTo(&state);

  CheckpointScheduler next(Config(v1::MODE_SYNC), 1);
  next.TakeOver(state, manifest);
  EXPECT_EQ(next.next_id(), 2u);
  EXPECT_EQ(next.last_complete().id(), 1u);
  EXPECT_EQ(next.completed(), 1u);
  // A manifest that cannot be read: the id goes on, the newest is unknown.
  CheckpointScheduler blind(Config(v1::MODE_SYNC), 1);
  blind.TakeOver(state, std::nullopt);
  EXPECT_EQ(blind.next_id(), 2u);
  EXPECT_EQ(blind.last_complete().id(), 0u);
}

TEST(CheckpointScheduler, AResumesWarningsStayInTheStatusAndATakenOverJobs) {
  CheckpointScheduler s(Config(v1::MODE_SYNC), 1);
  s.AddWarning("1 checkpoint in /ck refused (ckpt-00000004: ...): the job started from step 0");
  s.set_final_missing("checkpoint 5 did not complete in 1m");
  v1::JobStatus status;
  s.AddTo(&status);
  ASSERT_EQ(status.warnings_size(), 2);
  EXPECT_EQ(status.warnings(0),
            "1 checkpoint in /ck refused (ckpt-00000004: ...): the job started from step 0");
  EXPECT_EQ(status.warnings(1),
            "no final checkpoint (checkpoint 5 did not complete in 1m): the final weights are "
            "not on disk; the job has no checkpoint");
  // The final one's is in the final status a taken-over job keeps; the
  // resume's goes on with the job.
  v1::CoordinatorState state;
  s.ExportTo(&state);
  CheckpointScheduler next(Config(v1::MODE_SYNC), 1);
  next.TakeOver(state, std::nullopt);
  status.Clear();
  next.AddTo(&status);
  ASSERT_EQ(status.warnings_size(), 1);
  EXPECT_EQ(status.warnings(0),
            "1 checkpoint in /ck refused (ckpt-00000004: ...): the job started from step 0");
}

TEST(CheckpointScheduler, NoCheckpointYetLeavesTheSummariesOut) {
  CheckpointScheduler s(Config(v1::MODE_SYNC), 1);
  v1::JobStatus status;
  s.AddTo(&status);
  EXPECT_FALSE(status.has_last_checkpoint());
  EXPECT_FALSE(status.has_pending_checkpoint());
  v1::CoordinatorState state;
  s.ExportTo(&state);
  EXPECT_FALSE(state.has_last_checkpoint());
  EXPECT_EQ(state.next_checkpoint_id(), 1u);
}

}  // namespace
}  // namespace grps
