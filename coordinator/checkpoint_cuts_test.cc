// CheckpointCuts as a specification, over a real Membership, GlobalStep and
// CheckpointScheduler: a cut needs every shard alive and (in sync, while
// training) every shard's version; a sync cut is a margin ahead of the
// fastest shard and never past the last step; async cuts each chunk as it
// is; a periodic cut when due and a timeout; the final checkpoint is
// asked for once training is done, tried again after a failure, and given
// up at its deadline or when the shards' final versions differ.
#include "coordinator/checkpoint_cuts.h"

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "job/job_config.h"
#include "job/shard_map.h"

namespace grps {
namespace {

const absl::Time kT0 = absl::FromUnixSeconds(1'700'000'000);

class CheckpointCutsTest : public ::testing::Test {
 protected:
  void Make(v1::ConsistencyMode mode) {
    config_ = DefaultJobConfig();
    config_.set_job_id("cuts-job");
    config_.set_mode(mode);
    config_.set_num_servers(2);
    config_.set_num_workers(1);
    config_.set_heartbeat_interval_ms(100);
    config_.set_heartbeat_timeout_ms(1000);
    config_.set_checkpoint_dir("/nowhere");
    absl::StatusOr<v1::ShardMap> map =
        BuildShardMap(ModelTensors(config_), 2, config_.chunk_bytes());
    ASSERT_TRUE(map.ok()) << map.status();
    membership_ = std::make_unique<Membership>(*map, 1, absl::Seconds(1));
    scheduler_ = std::make_unique<CheckpointScheduler>(config_, 2);
    cuts_ = std::make_unique<CheckpointCuts>(config_, scheduler_.get(), membership_.get(),
                                             &global_step_);
    for (uint32_t s = 0; s < 2; ++s) {
      absl::StatusOr<Membership::Registration> r =
          membership_->RegisterServer(s, "10.0.0." + std::to_string(s) + ":5000", kT0);
      ASSERT_TRUE(r.ok()) << r.status();
      servers_.push_back(r->incarnation);
    }
    absl::StatusOr<Membership::Registration> w =
        membership_->RegisterWorker(0, "host", "cpu", kT0, /*holds_live_rank=*/false);
    ASSERT_TRUE(w.ok()) << w.status();
    worker_ = w->incarnation;
  }
  // Shard `s` reports `version` at kT0 + `at`.
  void Version(uint32_t s, uint64_t version, absl::Duration at = absl::ZeroDuration()) {
    v1::ShardStatus status;
    status.set_version(version);
    status.set_num_chunks(1);
    bool revived = false;
    ASSERT_TRUE(membership_->ServerHeartbeat(s, servers_[s], status, kT0 + at, &revived).ok());
  }
  // Both shards at `version` at kT0 + `at`, as the global step sees it.
  void Steps(uint64_t version, absl::Duration at) {
    Version(0, version, at);
    Version(1, version, at);
    global_step_.Note(version, kT0 + at);
  }
  // Periodic checkpoints every `steps` steps and/or `seconds` seconds.
  void Periodic(uint64_t steps, uint32_t seconds) {
    config_.set_checkpoint_every_steps(steps);
    config_.set_checkpoint_every_seconds(seconds);
    scheduler_ = std::make_unique<CheckpointScheduler>(config_, 2);
    cuts_ = std::make_unique<CheckpointCuts>(config_, scheduler_.get(), membership_.get(),
                                             &global_step_);
  }
  // The worker at `step` of `total`.
  void Worker(uint64_t step, uint64_t total) {
    v1::WorkerProgress progress;
    progress.set_step(step);
    progress.set_total_steps(total);
    bool revived = false;
    ASSERT_TRUE(membership_->WorkerHeartbeat(0, worker_, &progress, kT0, &revived).ok());
  }

  v1::JobConfig config_;
  std::unique_ptr<Membership> membership_;
  GlobalStep global_step_;
  std::unique_ptr<CheckpointScheduler> scheduler_;
  std::unique_ptr<CheckpointCuts> cuts_;
  std::vector<uint64_t> servers_;
  uint64_t worker_ = 0;
  const CheckpointCuts::Job training_{};
  const CheckpointCuts::Job done_{.training_done = true};
};

TEST_F(CheckpointCutsTest, ASyncCutWaitsForEveryShardsVersion) {
  Make(v1::MODE_SYNC);
  Version(0, 10);
  absl::StatusOr<v1::CheckpointRequest> cut = cuts_->Start(training_, kT0, "test");
  ASSERT_TRUE(absl::IsUnavailable(cut.status()));
  EXPECT_EQ(cut.status().message(), "waiting for the version of shard 1");
  EXPECT_FALSE(scheduler_->pending());
}

TEST_F(CheckpointCutsTest, ASyncCutIsAMarginAheadOfTheFastestShardButNotPastTheLastStep) {
  Make(v1::MODE_SYNC);
  Version(0, 10);
  Version(1, 12);
  Worker(11, 1000);
  absl::StatusOr<v1::CheckpointRequest> cut = cuts_->Start(training_, kT0, "test");
  ASSERT_TRUE(cut.ok()) << cut.status();
  EXPECT_EQ(cut->version(), 12u + 4);  // no rate measured: the least margin
  scheduler_->Fail("test", kT0);
  Worker(11, 14);
  EXPECT_EQ(cuts_->SyncVersion(training_), 14u);
  // Once training is done, the finished workers' step.
  Worker(14, 14);
  EXPECT_EQ(cuts_->SyncVersion(done_), 14u);
}

TEST_F(CheckpointCutsTest, AfterATakeOverASyncCutWaitsForTheStepRate) {
  Make(v1::MODE_SYNC);
  Version(0, 10);
  Version(1, 10);
  global_step_.Restart(kT0);
  const CheckpointCuts::Job taken_over{.taken_over = true};
  EXPECT_EQ(cuts_->Start(taken_over, kT0 + absl::Milliseconds(500), "test").status().message(),
            "measuring the step rate since the take-over");
  EXPECT_TRUE(cuts_->Start(taken_over, kT0 + absl::Seconds(1), "test").ok());
}

TEST_F(CheckpointCutsTest, AsTrainingStartsAPeriodicSyncCutWaitsForTheStepRate) {
  // The shards stand at 0 while the workers start; the step moves at 100 a
  // second from about 1 s in. Cut before a whole window measured that, the
  // margin would be a fraction of what it needs (the least one, with no
  // rate at all), and the shards past the cut before they hear of it.
  Make(v1::MODE_SYNC);
  Periodic(10, 0);
  Worker(0, 1000);
  global_step_.Restart(kT0);  // the job runs
  Steps(0, absl::ZeroDuration());
  Steps(0, absl::Milliseconds(600));
  Steps(40, absl::Milliseconds(1100));  // moving for part of the window: 80 a second
  cuts_->Tick(training_, /*training=*/true, kT0 + absl::Milliseconds(1200));
  EXPECT_FALSE(scheduler_->pending());
  Steps(90, absl::Milliseconds(1600));
  cuts_->Tick(training_, /*training=*/true, kT0 + absl::Milliseconds(1600));
  ASSERT_TRUE(scheduler_->pending());
  EXPECT_EQ(scheduler_->pending_summary().step(), 90u + 32);  // 3 intervals of 10 steps, and 2
}

TEST_F(CheckpointCutsTest, APeriodicSyncCutByStepsIsAskedForEarlyAndCutAtExactlyTheDueStep) {
  // 100 steps a second, 10 a heartbeat interval: a cut asked for now is at
  // least 32 steps ahead of the shards; every 200 steps.
  Make(v1::MODE_SYNC);
  Periodic(200, 0);
  Worker(0, 1000);
  Steps(0, absl::ZeroDuration());
  Steps(50, absl::Milliseconds(500));
  Steps(100, absl::Seconds(1));
  cuts_->Tick(training_, /*training=*/true, kT0 + absl::Seconds(1));
  EXPECT_FALSE(scheduler_->pending());  // 132 at the soonest: 200 can wait
  Steps(150, absl::Milliseconds(1500));
  cuts_->Tick(training_, /*training=*/true, kT0 + absl::Milliseconds(1500));
  ASSERT_TRUE(scheduler_->pending());  // 182 at the soonest: 200 is asked for now
  EXPECT_EQ(scheduler_->pending_summary().step(), 200u);
}

TEST_F(CheckpointCutsTest, APeriodicSyncCutTooLateForTheDueStepIsCutAMarginAheadOfTheShards) {
  Make(v1::MODE_SYNC);
  Periodic(100, 0);
  Worker(0, 1000);
  Steps(0, absl::ZeroDuration());
  Steps(50, absl::Milliseconds(500));
  Steps(100, absl::Seconds(1));
  cuts_->Tick(training_, /*training=*/true, kT0 + absl::Seconds(1));
  ASSERT_TRUE(scheduler_->pending());
  EXPECT_EQ(scheduler_->pending_summary().step(), 100u + 32);
  EXPECT_EQ(scheduler_->NextStepDue(), 232u);
}

TEST_F(CheckpointCutsTest, NoPeriodicSyncCutBeforeAShardIsPastTheLastOne) {
  // Every second; the shards stand at step 0 (the workers are loading).
  Make(v1::MODE_SYNC);
  Periodic(0, 1);
  Steps(0, absl::ZeroDuration());
  cuts_->Tick(training_, /*training=*/true, kT0);
  cuts_->Tick(training_, /*training=*/true, kT0 + absl::Seconds(2));
  EXPECT_FALSE(scheduler_->pending());
  Steps(1, absl::Seconds(3));
  cuts_->Tick(training_, /*training=*/true, kT0 + absl::Seconds(5));
  EXPECT_TRUE(scheduler_->pending());
}

TEST_F(CheckpointCutsTest, NoPeriodicSyncCutAtTheLastStepWhereTheFinalOneIsCut) {
  Make(v1::MODE_SYNC);
  Periodic(100, 0);
  Worker(10, 120);
  Steps(0, absl::ZeroDuration());
  Steps(50, absl::Milliseconds(500));
  Steps(100, absl::Seconds(1));
  cuts_->Tick(training_, /*training=*/true, kT0 + absl::Seconds(1));
  EXPECT_FALSE(scheduler_->pending());  // 132 at the soonest: past the last step, 120
}

TEST_F(CheckpointCutsTest, ACutNeedsEveryShardAlive) {
  Make(v1::MODE_ASYNC);
  Version(0, 10, absl::Seconds(2));
  membership_->DetectFailures(kT0 + absl::Seconds(2));  // shard 1 silent for 2 s
  absl::StatusOr<v1::CheckpointRequest> cut =
      cuts_->Start(training_, kT0 + absl::Seconds(2), "test");
  EXPECT_EQ(cut.status().message(), "shard 1 is not alive; a checkpoint needs every shard");
}

TEST_F(CheckpointCutsTest, AnAsyncCutTakesEachChunkAsItIsWithoutWaitingForVersions) {
  Make(v1::MODE_ASYNC);
  Worker(7, 100);
  absl::StatusOr<v1::CheckpointRequest> cut = cuts_->Start(training_, kT0, "test");
  ASSERT_TRUE(cut.ok()) << cut.status();
  EXPECT_EQ(cut->version(), 0u);
  EXPECT_TRUE(scheduler_->pending());
}

TEST_F(CheckpointCutsTest, AnOperatorJoinsThePendingCheckpointOrAsksForOne) {
  Make(v1::MODE_ASYNC);
  absl::StatusOr<uint64_t> first = cuts_->Join(training_, kT0, "an operator");
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_TRUE(scheduler_->pending());
  absl::StatusOr<uint64_t> again = cuts_->Join(training_, kT0, "another operator");
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(*again, *first);
  scheduler_->Fail("a test", kT0);
  absl::StatusOr<uint64_t> next = cuts_->Join(training_, kT0, "an operator");
  ASSERT_TRUE(next.ok()) << next.status();
  EXPECT_EQ(*next, *first + 1);
}

TEST_F(CheckpointCutsTest, ACheckpointPastItsTimeoutFailsAndOnlyATrainingJobIsCutPeriodically) {
  Make(v1::MODE_ASYNC);
  config_.set_checkpoint_every_steps(1);
  scheduler_ = std::make_unique<CheckpointScheduler>(config_, 2);
  cuts_ =
      std::make_unique<CheckpointCuts>(config_, scheduler_.get(), membership_.get(), &global_step_);
  global_step_.Note(5, kT0);
  EXPECT_FALSE(cuts_->Tick(training_, /*training=*/false, kT0));
  EXPECT_FALSE(scheduler_->pending());
  EXPECT_FALSE(cuts_->Tick(training_, /*training=*/true, kT0));
  ASSERT_TRUE(scheduler_->pending());
  const uint64_t id = scheduler_->pending_summary().id();
  EXPECT_TRUE(cuts_->Tick(training_, /*training=*/false,
                          kT0 + CheckpointScheduler::kTimeout + absl::Seconds(1)));
  EXPECT_EQ(scheduler_->SummaryOf(id).state(), v1::CHECKPOINT_STATE_FAILED);
}

TEST_F(CheckpointCutsTest, TheFinalCheckpointIsAskedForOnceAndSettlesWhenItCompletes) {
  Make(v1::MODE_ASYNC);
  EXPECT_FALSE(cuts_->FinalSettled(done_, kT0));
  ASSERT_TRUE(scheduler_->pending());
  const uint64_t id = scheduler_->pending_summary().id();
  EXPECT_FALSE(cuts_->FinalSettled(done_, kT0 + absl::Seconds(1)));
  EXPECT_EQ(scheduler_->pending_summary().id(), id);  // not asked again
  scheduler_->Fail("a shard could not write", kT0 + absl::Seconds(2));
  EXPECT_FALSE(cuts_->FinalSettled(done_, kT0 + absl::Seconds(2)));  // tried again
  EXPECT_FALSE(cuts_->FinalSettled(done_, kT0 + absl::Seconds(3)));
  ASSERT_TRUE(scheduler_->pending());
  EXPECT_NE(scheduler_->pending_summary().id(), id);
  // Past its deadline the job ends without it.
  EXPECT_TRUE(cuts_->FinalSettled(done_, kT0 + CheckpointScheduler::kTimeout));
  cuts_->ForgetFinal();
  scheduler_->Fail("test", kT0);
  EXPECT_FALSE(cuts_->FinalSettled(done_, kT0 + CheckpointScheduler::kTimeout));
}

// Its folder turned into a file: every try fails at once. Tried again a
// retry's pause apart (not 600 times in its minute), and the job ends
// warning that its final weights are not on disk.
TEST_F(CheckpointCutsTest, AFinalCheckpointThatKeepsFailingIsTriedOnceASecondAndWarnedOf) {
  Make(v1::MODE_ASYNC);
  uint64_t asked = 0;
  absl::Time now = kT0;
  for (; now < kT0 + CheckpointScheduler::kTimeout; now += absl::Milliseconds(100)) {
    if (cuts_->FinalSettled(done_, now)) break;
    if (scheduler_->pending()) {
      ++asked;
      scheduler_->Fail("shard 0: cannot create folder /ck/ckpt-00000004: Not a directory", now);
    }
  }
  EXPECT_FALSE(cuts_->FinalSettled(done_, now - absl::Milliseconds(100)));
  EXPECT_TRUE(cuts_->FinalSettled(done_, now));
  const int64_t tries = CheckpointScheduler::kTimeout / CheckpointScheduler::kRetryBackoff;
  EXPECT_GE(asked, 2u);
  EXPECT_LE(asked, static_cast<uint64_t>(tries) + 1);
  v1::JobStatus status;
  scheduler_->AddTo(&status);
  ASSERT_EQ(status.warnings_size(), 1);
  EXPECT_EQ(status.warnings(0),
            "no final checkpoint (shard 0: cannot create folder /ck/ckpt-00000004: Not a "
            "directory): the final weights are not on disk; the job has no checkpoint");
  // A roll-back: training is not done any more, nor the warning said.
  cuts_->ForgetFinal();
  status.Clear();
  scheduler_->AddTo(&status);
  EXPECT_EQ(status.warnings_size(), 0);
}

TEST_F(CheckpointCutsTest, AFinalCheckpointThatCompletesLeavesNoWarning) {
  Make(v1::MODE_ASYNC);
  EXPECT_FALSE(cuts_->FinalSettled(done_, kT0));
  scheduler_->Fail("a shard could not write", kT0);
  EXPECT_FALSE(cuts_->FinalSettled(done_, kT0));
  EXPECT_FALSE(cuts_->FinalSettled(done_, kT0 + CheckpointScheduler::kRetryBackoff));
  ASSERT_TRUE(scheduler_->pending());
  const uint64_t id = scheduler_->pending_summary().id();
  v1::ShardCheckpoint written;
  written.set_id(id);
  written.set_state(v1::CHECKPOINT_STATE_WRITTEN);
  for (uint32_t s = 0; s < 2; ++s) {
    written.set_shard(s);
    written.set_file("shard-" + std::to_string(s) + ".ckpt");
    scheduler_->Report(s, written, kT0 + absl::Seconds(2));
  }
  std::optional<v1::CheckpointManifest> manifest =
      scheduler_->TakeManifestToWrite(membership_->shard_map(), config_, kT0 + absl::Seconds(2));
  ASSERT_TRUE(manifest.has_value());
  scheduler_->FinishWrite(id, absl::OkStatus(), kT0 + absl::Seconds(2));
  EXPECT_TRUE(cuts_->FinalSettled(done_, kT0 + absl::Seconds(3)));
  v1::JobStatus status;
  scheduler_->AddTo(&status);
  EXPECT_EQ(status.warnings_size(), 0);
}

TEST_F(CheckpointCutsTest, AFinalSyncCutTheShardsNeverReachIsGivenUpAtOnce) {
  Make(v1::MODE_SYNC);
  Version(0, 10);
  Version(1, 12);
  Worker(12, 12);
  EXPECT_FALSE(cuts_->FinalSettled(done_, kT0));
  ASSERT_TRUE(scheduler_->pending());
  EXPECT_EQ(scheduler_->pending_summary().step(), 12u);
  EXPECT_FALSE(cuts_->FinalSettled(done_, kT0));  // shard 0 may still get there
  const CheckpointCuts::Job final_versions{.training_done = true, .versions_final = true};
  EXPECT_TRUE(cuts_->FinalSettled(final_versions, kT0));
  EXPECT_FALSE(scheduler_->pending());
}

TEST_F(CheckpointCutsTest, WithoutACheckpointFolderTheFinalCheckpointIsSettled) {
  Make(v1::MODE_SYNC);
  config_.clear_checkpoint_dir();
  scheduler_ = std::make_unique<CheckpointScheduler>(config_, 2);
  cuts_ =
      std::make_unique<CheckpointCuts>(config_, scheduler_.get(), membership_.get(), &global_step_);
  EXPECT_TRUE(cuts_->FinalSettled(done_, kT0));
  EXPECT_FALSE(cuts_->Tick(training_, true, kT0));
}

}  // namespace
}  // namespace grps
