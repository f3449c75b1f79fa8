#include "coordinator/job_waits.h"

#include <atomic>
#include <optional>
#include <thread>

#include "gtest/gtest.h"

namespace grps {
namespace {

// A wait under a mutex, as the machine holds it, with a condition the test
// sets from another thread.
class JobWaitsTest : public ::testing::Test {
 protected:
  absl::Status Wait(const JobWait& wait, absl::Duration margin = absl::ZeroDuration()) {
    absl::MutexLock lock(&mu_);
    return waits_.Until(
        &mu_, wait,
        [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) -> std::optional<absl::Status> {
          if (done_) return absl::OkStatus();
          return std::nullopt;
        },
        [] { return absl::DeadlineExceededError("at the deadline"); }, margin, &waiting_);
  }
  // Runs `f` under the mutex once a caller waits.
  void OnceWaiting(std::function<void()> f) {
    helper_ = std::thread([this, f = std::move(f)] {
      absl::MutexLock lock(&mu_);
      mu_.Await(absl::Condition(
          +[](int* waiting) { return *waiting > 0; }, &waiting_));
      f();
    });
  }
  void TearDown() override {
    if (helper_.joinable()) helper_.join();
  }

  absl::Mutex mu_;
  JobWaits waits_ ABSL_GUARDED_BY(mu_);
  bool done_ ABSL_GUARDED_BY(mu_) = false;
  int waiting_ ABSL_GUARDED_BY(mu_) = 0;
  std::thread helper_;
};

TEST_F(JobWaitsTest, AnOutcomeKnownAlreadyIsReturnedWithoutWaiting) {
  {
    absl::MutexLock lock(&mu_);
    done_ = true;
  }
  EXPECT_TRUE(Wait({.deadline = absl::InfinitePast()}).ok());
  absl::MutexLock lock(&mu_);
  EXPECT_EQ(waiting_, 0);
}

TEST_F(JobWaitsTest, AChangeEndsTheWaitWithItsOutcome) {
  OnceWaiting([this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    done_ = true;
    waits_.Changed();
  });
  EXPECT_TRUE(Wait({.deadline = absl::Now() + absl::Seconds(60)}).ok());
  absl::MutexLock lock(&mu_);
  EXPECT_EQ(waiting_, 0);
}

TEST_F(JobWaitsTest, ReleasingEndsEveryWaitAndRefusesNewOnes) {
  OnceWaiting([this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { waits_.Release(); });
  const absl::Status waited = Wait({.deadline = absl::Now() + absl::Seconds(60)});
  EXPECT_TRUE(absl::IsUnavailable(waited)) << waited;
  EXPECT_TRUE(absl::IsUnavailable(Wait({})));
  absl::MutexLock lock(&mu_);
  EXPECT_TRUE(waits_.released());
}

TEST_F(JobWaitsTest, AnOutcomeComesBeforeTheRelease) {
  absl::MutexLock lock(&mu_);
  done_ = true;
  waits_.Release();
  EXPECT_TRUE(waits_
                  .Until(
                      &mu_, {}, [] { return std::optional<absl::Status>(absl::OkStatus()); },
                      [] { return absl::DeadlineExceededError(""); })
                  .ok());
}

TEST_F(JobWaitsTest, ACallerThatLeftIsCancelled) {
  std::atomic<bool> left{false};
  OnceWaiting([&left] { left = true; });
  const absl::Status waited = Wait(
      {.deadline = absl::Now() + absl::Seconds(60), .cancelled = [&left] { return left.load(); }});
  EXPECT_TRUE(absl::IsCancelled(waited)) << waited;
}

TEST_F(JobWaitsTest, TheDeadlineLessTheMarginEndsTheWait) {
  const absl::Time deadline = absl::Now() + absl::Milliseconds(300);
  const absl::Status waited = Wait({.deadline = deadline}, absl::Milliseconds(250));
  EXPECT_TRUE(absl::IsDeadlineExceeded(waited)) << waited;
  EXPECT_EQ(waited.message(), "at the deadline");
  EXPECT_LT(absl::Now(), deadline + absl::Seconds(30));  // bounded, not exact
}

TEST_F(JobWaitsTest, UntilDoneIsOkOnceItsConditionHoldsAndCountsItsCallers) {
  OnceWaiting([this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    done_ = true;
    waits_.Changed();
  });
  absl::MutexLock lock(&mu_);
  const absl::Status waited = waits_.UntilDone(
      &mu_, {.deadline = absl::Now() + absl::Seconds(60)},
      [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return done_; },
      [] { return absl::DeadlineExceededError("at the deadline"); }, &waiting_);
  EXPECT_TRUE(waited.ok()) << waited;
  EXPECT_EQ(waiting_, 0);
}

TEST_F(JobWaitsTest, SleepReportsTheDeadline) {
  absl::MutexLock lock(&mu_);
  EXPECT_TRUE(waits_.Sleep(&mu_, absl::Now() + absl::Milliseconds(1)));
}

}  // namespace
}  // namespace grps
