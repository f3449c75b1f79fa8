#include "coordinator/job_phase.h"

#include "gtest/gtest.h"

namespace grps {
namespace {

const absl::Time kStart = absl::FromUnixSeconds(1'700'000'000);

TEST(JobPhase, WaitsThenRunsThenEndsWithItsMessage) {
  JobPhase phase("job-a");
  EXPECT_TRUE(phase.waiting());
  EXPECT_FALSE(phase.ended());
  phase.Run();
  EXPECT_TRUE(phase.running());
  phase.End(v1::JOB_STATE_STOPPED, "asked to", kStart);
  EXPECT_TRUE(phase.ended());
  EXPECT_FALSE(phase.running());
  EXPECT_EQ(phase.message(), "asked to");
  const absl::Status refused = phase.EndedError();
  EXPECT_TRUE(absl::IsFailedPrecondition(refused)) << refused;
  EXPECT_NE(refused.message().find("job-a"), absl::string_view::npos) << refused;
}

TEST(JobPhase, EveryFinalStateIsAnEnd) {
  for (v1::JobState final_state :
       {v1::JOB_STATE_COMPLETED, v1::JOB_STATE_STOPPED, v1::JOB_STATE_FAILED}) {
    JobPhase phase("j");
    phase.End(final_state, "", kStart);
    EXPECT_TRUE(phase.ended()) << final_state;
  }
}

TEST(JobPhase, TheJobsTimeRunsFromTheFirstRegistrationToTheEnd) {
  JobPhase phase("j");
  EXPECT_EQ(phase.ElapsedSeconds(kStart), 0);
  phase.NoteRegistration(kStart);
  phase.NoteRegistration(kStart + absl::Seconds(5));  // not the first
  EXPECT_DOUBLE_EQ(phase.ElapsedSeconds(kStart + absl::Seconds(10)), 10);
  phase.End(v1::JOB_STATE_COMPLETED, "done", kStart + absl::Seconds(12));
  EXPECT_DOUBLE_EQ(phase.ElapsedSeconds(kStart + absl::Seconds(60)), 12);
}

TEST(JobPhase, ATakeOverAddsTheEarlierTimeAndCountsAndHoldsDeathsForItsGrace) {
  v1::CoordinatorState state;
  state.set_state(v1::JOB_STATE_RUNNING);
  state.set_message("was running");
  state.set_elapsed_seconds(100);
  state.set_worker_leaves(2);
  state.set_worker_joins(3);
  JobPhase phase("j");
  EXPECT_TRUE(phase.MayDeclareDeaths(kStart));
  phase.TakeOver(state, kStart, absl::Seconds(4));
  EXPECT_TRUE(phase.running());
  EXPECT_TRUE(phase.taken_over());
  EXPECT_FALSE(phase.MayDeclareDeaths(kStart + absl::Seconds(3)));
  EXPECT_TRUE(phase.MayDeclareDeaths(kStart + absl::Seconds(4)));
  EXPECT_DOUBLE_EQ(phase.ElapsedSeconds(kStart + absl::Seconds(7)), 107);
  phase.NoteLeave();
  phase.NoteJoin();

  v1::CoordinatorState exported;
  phase.ExportTo(&exported, kStart + absl::Seconds(7));
  EXPECT_EQ(exported.state(), v1::JOB_STATE_RUNNING);
  EXPECT_EQ(exported.message(), "was running");
  EXPECT_DOUBLE_EQ(exported.elapsed_seconds(), 107);
  EXPECT_EQ(exported.worker_leaves(), 3u);
  EXPECT_EQ(exported.worker_joins(), 4u);
  v1::JobStatus status;
  phase.AddTo(&status, kStart + absl::Seconds(7));
  EXPECT_TRUE(status.coordinator_restarted());
  EXPECT_EQ(status.worker_leaves(), 3u);
  EXPECT_EQ(status.worker_joins(), 4u);
  EXPECT_DOUBLE_EQ(status.elapsed_seconds(), 107);
}

TEST(JobPhase, AnAdoptionIsATakeOverWithoutGrace) {
  JobPhase phase("j");
  phase.NoteAdoption();
  EXPECT_TRUE(phase.taken_over());
  EXPECT_TRUE(phase.MayDeclareDeaths(kStart));
}

TEST(JobPhase, AJobNotStartedReportsNoTime) {
  JobPhase phase("j");
  phase.Run();  // the phase alone does not start the clock
  v1::JobStatus status;
  phase.AddTo(&status, kStart);
  EXPECT_EQ(status.elapsed_seconds(), 0);
  v1::CoordinatorState state;
  phase.ExportTo(&state, kStart);
  EXPECT_EQ(state.elapsed_seconds(), 0);
}

TEST(JobPhase, CountsTheTimeWithoutWorkersFromWhenItBegan) {
  JobPhase phase("j");
  EXPECT_EQ(phase.WithoutWorkers(false, kStart), absl::ZeroDuration());
  EXPECT_EQ(phase.WithoutWorkers(true, kStart + absl::Seconds(1)), absl::ZeroDuration());
  EXPECT_EQ(phase.WithoutWorkers(true, kStart + absl::Seconds(6)), absl::Seconds(5));
  // A worker came back: the count starts over.
  EXPECT_EQ(phase.WithoutWorkers(false, kStart + absl::Seconds(7)), absl::ZeroDuration());
  EXPECT_EQ(phase.WithoutWorkers(true, kStart + absl::Seconds(8)), absl::ZeroDuration());
  EXPECT_EQ(phase.WithoutWorkers(true, kStart + absl::Seconds(9)), absl::Seconds(1));
}

}  // namespace
}  // namespace grps
