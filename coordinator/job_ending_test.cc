// JobEnding as a specification, over a real Membership: who evaluates while
// training and after, the final live set each live server must hear (and
// hear again at the same membership epoch), which evaluation is final,
// when a job done training completes, and who must hear the end before the
// coordinator may leave.
#include "coordinator/job_ending.h"

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
const absl::Duration kTimeout = absl::Seconds(1);

class JobEndingTest : public ::testing::Test {
 protected:
  void SetUp() override {
    absl::StatusOr<v1::ShardMap> map =
        BuildShardMap(ModelTensors(DefaultJobConfig()), 2, 64 * 1024);
    ASSERT_TRUE(map.ok()) << map.status();
    membership_ = std::make_unique<Membership>(*map, 3, kTimeout);
    ending_ = std::make_unique<JobEnding>("ending-job", membership_.get());
    for (uint32_t s = 0; s < 2; ++s) {
      absl::StatusOr<Membership::Registration> r =
          membership_->RegisterServer(s, "10.0.0." + std::to_string(s) + ":5000", kT0);
      ASSERT_TRUE(r.ok()) << r.status();
    }
    for (uint32_t rank = 0; rank < 3; ++rank) {
      absl::StatusOr<Membership::Registration> r =
          membership_->RegisterWorker(rank, "host", "cpu", kT0, /*holds_live_rank=*/false);
      ASSERT_TRUE(r.ok()) << r.status();
      workers_.push_back(r->incarnation);
    }
  }
  void Finish(uint32_t rank, absl::Time at = kT0) {
    v1::WorkerProgress progress;
    progress.set_step(10);
    ASSERT_TRUE(membership_->FinishWorker(rank, workers_[rank], progress, at).ok());
  }
  void FinishAll() {
    for (uint32_t rank = 0; rank < 3; ++rank) Finish(rank);
  }
  static v1::HeartbeatRequest WorkerBeat(uint32_t rank) {
    v1::HeartbeatRequest request;
    request.set_worker_rank(rank);
    return request;
  }
  static v1::HeartbeatRequest ServerBeat(uint32_t shard, bool final_report) {
    v1::HeartbeatRequest request;
    request.set_server_shard(shard);
    request.set_final_report(final_report);
    return request;
  }

  std::unique_ptr<Membership> membership_;
  std::unique_ptr<JobEnding> ending_;
  std::vector<uint64_t> workers_;
};

TEST_F(JobEndingTest, TheEvaluatorIsTheLowestAliveRankThenTheLowestFinishedStillHeartbeating) {
  Finish(0);
  EXPECT_EQ(ending_->Evaluator(false, false, kT0), std::optional<uint32_t>(1));
  Finish(1, kT0 + absl::Seconds(1));
  Finish(2, kT0 + absl::Seconds(1));
  // Rank 0 has been silent past the timeout: rank 1 evaluates.
  EXPECT_EQ(ending_->Evaluator(false, true, kT0 + absl::Milliseconds(1500)),
            std::optional<uint32_t>(1));
  EXPECT_EQ(ending_->Evaluator(false, true, kT0 + absl::Seconds(5)), std::nullopt);
  EXPECT_EQ(ending_->Evaluator(true, true, kT0), std::nullopt);  // ended, none final
}

TEST_F(JobEndingTest, AServerHearsTheFinalLiveSetWithItsSecondHeartbeatAtTheSameEpoch) {
  FinishAll();
  EXPECT_FALSE(ending_->ServersHeardFinalLiveSet());
  ending_->NoteServerHeartbeat(0);
  ending_->NoteServerHeartbeat(1);
  EXPECT_FALSE(ending_->ServersHeardFinalLiveSet());  // the replies carry it
  ending_->NoteServerHeartbeat(0);
  EXPECT_FALSE(ending_->ServersHeardFinalLiveSet());
  ending_->NoteServerHeartbeat(1);
  EXPECT_TRUE(ending_->ServersHeardFinalLiveSet());
  // Training not done any more (a roll-back): heard again from the start.
  ending_->Reset();
  EXPECT_FALSE(ending_->ServersHeardFinalLiveSet());
}

TEST_F(JobEndingTest, OnlyAnEvaluationMadeAfterTrainingWasDoneIsFinalAndCompletesTheJob) {
  EXPECT_EQ(ending_->RecordEvaluation(0, {0.5f, 1.0f}, /*final=*/false),
            "; test accuracy (not final: training is not done) 0.5, loss 1");
  FinishAll();
  EXPECT_EQ(ending_->Completion(kT0), std::nullopt);  // a finished worker may evaluate
  EXPECT_EQ(ending_->RecordEvaluation(1, {0.75f, 0.5f}, /*final=*/true),
            "; final test accuracy 0.75, loss 0.5");
  EXPECT_EQ(ending_->Completion(kT0), std::optional<std::string>("every worker finished"));
  EXPECT_EQ(ending_->Evaluator(true, true, kT0), std::optional<uint32_t>(1));
  v1::JobStatus status;
  ending_->AddTo(&status);
  EXPECT_TRUE(status.has_final_eval());
  EXPECT_FLOAT_EQ(status.final_test_accuracy(), 0.75f);
  ending_->Reset();  // a roll-back: that evaluation is of weights the job left
  EXPECT_EQ(ending_->Completion(kT0), std::nullopt);
}

TEST_F(JobEndingTest, AJobDoneTrainingCompletesWithoutAnEvaluationItCannotHave) {
  FinishAll();
  ending_->Decline();
  EXPECT_EQ(ending_->Completion(kT0),
            std::optional<std::string>("every worker finished; no final evaluation: the "
                                       "evaluating worker's program has none"));
  ending_->Reset();
  EXPECT_EQ(ending_->Completion(kT0 + absl::Seconds(5)),
            std::optional<std::string>("every worker finished; no final evaluation: no "
                                       "finished worker was still heartbeating to run it"));
}

TEST_F(JobEndingTest, TrainingDoneIsAnnouncedOncePerPhaseAndSaysWhoDidNotFinish) {
  Finish(0);
  Finish(1);
  membership_->DetectFailures(kT0 + absl::Seconds(2));  // rank 2 silent: dead
  EXPECT_TRUE(ending_->NoteTrainingDone());
  EXPECT_FALSE(ending_->NoteTrainingDone());
  EXPECT_TRUE(ending_->training_was_done());
  EXPECT_EQ(ending_->TrainingDoneMessage(),
            "worker 2 died before finishing; the others finished");
  ending_->Reset();
  EXPECT_TRUE(ending_->NoteTrainingDone());
}

TEST_F(JobEndingTest, EveryLiveMemberMustHearTheEndAServerWithItsFinalReport) {
  Finish(0);
  EXPECT_FALSE(ending_->EveryLiveMemberSawEnd(kT0));
  ending_->ToldEnd(WorkerBeat(1));
  ending_->ToldEnd(WorkerBeat(2));
  ending_->ToldEnd(ServerBeat(0, /*final_report=*/true));
  ending_->ToldEnd(ServerBeat(1, /*final_report=*/false));
  EXPECT_FALSE(ending_->EveryLiveMemberSawEnd(kT0));  // rank 0 still heartbeats; shard 1
  ending_->ToldEnd(WorkerBeat(0));
  EXPECT_FALSE(ending_->EveryLiveMemberSawEnd(kT0));
  ending_->ToldEnd(ServerBeat(1, /*final_report=*/true));
  EXPECT_TRUE(ending_->EveryLiveMemberSawEnd(kT0));
}

}  // namespace
}  // namespace grps
