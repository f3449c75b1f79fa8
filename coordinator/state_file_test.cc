#include "coordinator/state_file.h"

#include <filesystem>
#include <memory>
#include <string>

#include "gtest/gtest.h"

namespace grps {
namespace {

const absl::Time kStart = absl::FromUnixSeconds(1'700'000'000);

class StateFileTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() /
           ("state_file_test-" + std::to_string(getpid()) + "-" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::create_directories(dir_);
    path_ = (dir_ / "coordinator.state").string();
    file_ = std::make_unique<StateFile>(Env::Default(), path_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  // Writes `state` at kStart + `at`; whether the file holds it afterwards.
  bool WriteHolds(const v1::CoordinatorState& state, absl::Duration at, bool force = false) {
    EXPECT_TRUE(file_->Write([&] { return state; }, kStart + at, force).ok());
    absl::StatusOr<std::string> read = Env::Default()->ReadFile(path_);
    return read.ok() && *read == state.SerializeAsString();
  }

  std::filesystem::path dir_;
  std::string path_;
  std::unique_ptr<StateFile> file_;
};

v1::CoordinatorState State(v1::JobState job_state, uint64_t step) {
  v1::CoordinatorState s;
  s.set_state(job_state);
  v1::WorkerStatus* w = s.add_workers();
  w->set_rank(0);
  w->mutable_progress()->set_step(step);
  return s;
}

TEST_F(StateFileTest, TheFirstStateIsWrittenAtOnce) {
  EXPECT_TRUE(WriteHolds(State(v1::JOB_STATE_WAITING, 0), absl::ZeroDuration()));
}

TEST_F(StateFileTest, AMaterialChangeWaitsAtMostItsThrottle) {
  ASSERT_TRUE(WriteHolds(State(v1::JOB_STATE_WAITING, 0), absl::ZeroDuration()));
  EXPECT_FALSE(WriteHolds(State(v1::JOB_STATE_RUNNING, 0), absl::Milliseconds(100)));
  EXPECT_TRUE(WriteHolds(State(v1::JOB_STATE_RUNNING, 0), StateFile::kMaterialEvery));
}

TEST_F(StateFileTest, ProgressAloneIsWrittenEveryFiveSeconds) {
  v1::CoordinatorState state = State(v1::JOB_STATE_RUNNING, 0);
  ASSERT_TRUE(WriteHolds(state, absl::ZeroDuration()));
  state.mutable_workers(0)->mutable_progress()->set_loss(0.5f);
  EXPECT_FALSE(WriteHolds(state, absl::Seconds(1)));
  EXPECT_FALSE(WriteHolds(state, absl::Seconds(4)));
  EXPECT_TRUE(WriteHolds(state, StateFile::kProgressEvery));
}

TEST_F(StateFileTest, AWorkersStepIsMaterial) {
  ASSERT_TRUE(WriteHolds(State(v1::JOB_STATE_RUNNING, 10), absl::ZeroDuration()));
  EXPECT_TRUE(WriteHolds(State(v1::JOB_STATE_RUNNING, 11), StateFile::kMaterialEvery));
}

TEST_F(StateFileTest, ForceWritesAnyChangeAtOnceAndNothingUnchanged) {
  ASSERT_TRUE(WriteHolds(State(v1::JOB_STATE_RUNNING, 0), absl::ZeroDuration()));
  v1::CoordinatorState progress = State(v1::JOB_STATE_RUNNING, 0);
  progress.mutable_workers(0)->mutable_progress()->set_loss(0.5f);
  EXPECT_TRUE(WriteHolds(progress, absl::Milliseconds(1), /*force=*/true));
  // The clock alone is no change, forced or not.
  v1::CoordinatorState later = progress;
  later.set_elapsed_seconds(100);
  EXPECT_FALSE(WriteHolds(later, absl::Seconds(60), /*force=*/true));
}

TEST(StateFileWithoutAPath, WritesNothing) {
  StateFile file(Env::Default(), "");
  EXPECT_TRUE(file.Write([] { return v1::CoordinatorState(); }, kStart, true).ok());
}

}  // namespace
}  // namespace grps
