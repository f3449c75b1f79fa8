#include "launcher/progress_line.h"

#include <algorithm>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace grps {
namespace {

using ::testing::HasSubstr;
using ::testing::StartsWith;

v1::WorkerStatus* AddWorker(v1::JobStatus* s, uint64_t step, uint64_t total,
                            v1::MemberState state = v1::MEMBER_STATE_ALIVE) {
  v1::WorkerStatus* w = s->add_workers();
  w->set_rank(s->workers_size() - 1);
  w->set_state(state);
  w->mutable_progress()->set_step(step);
  w->mutable_progress()->set_total_steps(total);
  return w;
}

JobProgress Running(double step, uint64_t total) {
  JobProgress p;
  p.state = v1::JOB_STATE_RUNNING;
  p.step = step;
  p.total = total;
  p.loss = 0.4321f;
  p.test_accuracy = 0.8123f;
  p.samples_per_sec = 2345.4f;
  p.elapsed_seconds = 12.3;
  return p;
}

TEST(ProgressOf, AveragesWorkerStepsAndCountsMembers) {
  v1::JobStatus s;
  s.set_state(v1::JOB_STATE_RUNNING);
  s.mutable_config()->set_num_servers(2);
  s.mutable_config()->set_num_workers(3);
  s.add_shards()->set_address("127.0.0.1:1");
  s.add_shards();  // not registered yet
  s.set_global_step(90);
  AddWorker(&s, 100, 400);
  AddWorker(&s, 200, 400);
  AddWorker(&s, 400, 400, v1::MEMBER_STATE_FINISHED);
  JobProgress p = ProgressOf(s);
  EXPECT_DOUBLE_EQ(p.step, (100 + 200 + 400) / 3.0);
  EXPECT_EQ(p.total, 400u);
  EXPECT_EQ(p.servers_up, 1);
  EXPECT_EQ(p.servers_wanted, 2);
  EXPECT_EQ(p.workers_up, 3);
  EXPECT_EQ(p.workers_wanted, 3);
}

TEST(ProgressOf, UsesTheGlobalStepWhenNoWorkerReportedATotal) {
  v1::JobStatus s;
  s.set_state(v1::JOB_STATE_RUNNING);
  s.set_global_step(42);
  s.set_total_steps(100);
  AddWorker(&s, 0, 0);
  JobProgress p = ProgressOf(s);
  EXPECT_DOUBLE_EQ(p.step, 42);
  EXPECT_EQ(p.total, 100u);
}

TEST(EtaEstimator, IsUnknownUntilASecondOfProgress) {
  EtaEstimator eta;
  absl::Time t0 = absl::FromUnixSeconds(1000);
  EXPECT_FALSE(eta.SecondsLeft(100).has_value());
  eta.Observe(t0, 10);
  eta.Observe(t0 + absl::Milliseconds(500), 15);
  EXPECT_FALSE(eta.SecondsLeft(100).has_value());
  eta.Observe(t0 + absl::Seconds(3), 10);  // no progress since the baseline
  EXPECT_FALSE(eta.SecondsLeft(100).has_value());
}

TEST(EtaEstimator, ExtrapolatesTheRateSinceTheFirstObservation) {
  EtaEstimator eta;
  absl::Time t0 = absl::FromUnixSeconds(1000);
  eta.Observe(t0, 20);  // start-up time before this does not count
  eta.Observe(t0 + absl::Seconds(10), 120);  // 10 steps/s
  ASSERT_TRUE(eta.SecondsLeft(400).has_value());
  EXPECT_DOUBLE_EQ(*eta.SecondsLeft(400), 28.0);
  EXPECT_DOUBLE_EQ(*eta.SecondsLeft(100), 0.0);  // already past: never negative
}

TEST(FormatEta, ShowsMinutesSecondsOrHours) {
  EXPECT_EQ(FormatEta(std::nullopt), "?");
  EXPECT_EQ(FormatEta(42.4), "0:42");
  EXPECT_EQ(FormatEta(725), "12:05");
  EXPECT_EQ(FormatEta(3723), "1:02:03");
}

TEST(ProgressBar, FillsInProportionAndShowsFiguresAndEta) {
  std::string bar = ProgressBar(Running(120, 400), 42.0, 100);
  ASSERT_THAT(bar, StartsWith("["));
  size_t close = bar.find(']');
  ASSERT_NE(close, std::string::npos);
  std::string inside = bar.substr(1, close - 1);
  size_t filled = std::count(inside.begin(), inside.end(), '#');
  EXPECT_EQ(filled + std::count(inside.begin(), inside.end(), '-'), inside.size());
  EXPECT_EQ(filled, static_cast<size_t>(0.3 * inside.size()));
  EXPECT_THAT(bar, HasSubstr("120/400"));
  EXPECT_THAT(bar, HasSubstr("30%"));
  EXPECT_THAT(bar, HasSubstr("loss 0.4321"));
  EXPECT_THAT(bar, HasSubstr("acc 0.8123"));
  EXPECT_THAT(bar, HasSubstr("2345 samples/s"));
  EXPECT_THAT(bar, HasSubstr("ETA 0:42"));
  EXPECT_LE(bar.size(), 100u);
}

TEST(ProgressBar, NeverExceedsTheWidth) {
  for (int width : {20, 40, 79, 200})
    EXPECT_LE(ProgressBar(Running(5, 10), 1.0, width).size(),
              static_cast<size_t>(width));
}

// The bar between the brackets.
std::string BarOf(const std::string& line) {
  return line.substr(1, line.find(']') - 1);
}

TEST(ProgressBar, IsFullAtTheEndAndEmptyAtTheStart) {
  std::string done = BarOf(ProgressBar(Running(400, 400), 0.0, 100));
  EXPECT_FALSE(done.empty());
  EXPECT_EQ(done, std::string(done.size(), '#'));
  std::string start = ProgressBar(Running(0, 400), std::nullopt, 100);
  EXPECT_EQ(BarOf(start), std::string(BarOf(start).size(), '-'));
  EXPECT_THAT(start, HasSubstr("ETA ?"));
}

TEST(ProgressBar, ShowsRegisteredMembersWhileWaiting) {
  JobProgress p;
  p.state = v1::JOB_STATE_WAITING;
  p.servers_up = 1;
  p.servers_wanted = 2;
  p.workers_wanted = 2;
  EXPECT_EQ(ProgressBar(p, std::nullopt, 100),
            "waiting for members: servers 1/2, workers 0/2");
}

TEST(ProgressLine, HasElapsedStepPercentLossAccuracyRateAndEta) {
  JobProgress p = Running(120, 400);
  p.test_accuracy = -1;
  EXPECT_EQ(ProgressLine(p, 75.0),
            "[12.3s] step 120/400 (30%)  loss 0.4321  test acc -  2345 samples/s  "
            "ETA 1:15");
}

}  // namespace
}  // namespace grps
