// The waiting pulls and their timer (server/waiting_pulls.h), with pulls
// that are ready when a test says so.
#include "server/waiting_pulls.h"

#include <algorithm>
#include <atomic>
#include <memory>
#include <thread>

#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"

namespace grps {
namespace {

// What became of a pull; outlives it (the pulls own and destroy theirs).
struct Answer {
  absl::Notification finished;
  absl::Status status;
};

// Ready when `ready` is set; fails DEADLINE_EXCEEDED at its deadline.
class FakePull final : public WaitingPull {
 public:
  FakePull(std::shared_ptr<std::atomic<bool>> ready, absl::Time deadline,
           std::shared_ptr<Answer> answer)
      : ready_(std::move(ready)), deadline_(deadline), answer_(std::move(answer)) {}
  absl::Time deadline() const override { return deadline_; }
  void Finish() override {
    answer_->status = error;
    answer_->finished.Notify();
  }
  bool Examine() {
    if (ready_->load()) return true;
    if (absl::Now() < deadline_) return false;
    Fail(absl::DeadlineExceededError("late"));
    return true;
  }

 private:
  const std::shared_ptr<std::atomic<bool>> ready_;
  const absl::Time deadline_;
  const std::shared_ptr<Answer> answer_;
};

struct Pulls {
  explicit Pulls(size_t max = 8)
      : pulls(max, "shard 0",
              [](WaitingPull& p) { return static_cast<FakePull&>(p).Examine(); }) {}
  std::shared_ptr<Answer> Add(absl::Time deadline = absl::InfiniteFuture()) {
    auto answer = std::make_shared<Answer>();
    pulls.Add(std::make_unique<FakePull>(ready, deadline, answer));
    return answer;
  }

  std::shared_ptr<std::atomic<bool>> ready = std::make_shared<std::atomic<bool>>(false);
  WaitingPulls pulls;
};

TEST(WaitingPulls, APullReadyOnArrivalIsAnsweredInAdd) {
  Pulls p;
  p.ready->store(true);
  std::shared_ptr<Answer> answer = p.Add();
  EXPECT_TRUE(answer->finished.HasBeenNotified());
  EXPECT_TRUE(answer->status.ok());
  EXPECT_EQ(p.pulls.size(), 0u);
}

TEST(WaitingPulls, APullWaitsUntilAWakeFindsItReady) {
  Pulls p;
  std::shared_ptr<Answer> answer = p.Add();
  EXPECT_FALSE(answer->finished.HasBeenNotified());
  EXPECT_EQ(p.pulls.size(), 1u);
  p.ready->store(true);
  p.pulls.Wake();
  EXPECT_TRUE(answer->finished.HasBeenNotified());
  EXPECT_TRUE(answer->status.ok());
  EXPECT_EQ(p.pulls.size(), 0u);
}

TEST(WaitingPulls, TheTimerEndsAPullAtItsDeadlineWithoutAWake) {
  Pulls p;
  p.Add();  // waits forever: the timer must not wait for it
  std::shared_ptr<Answer> answer = p.Add(absl::Now() + absl::Milliseconds(50));
  ASSERT_TRUE(answer->finished.WaitForNotificationWithTimeout(absl::Seconds(30)));
  EXPECT_TRUE(absl::IsDeadlineExceeded(answer->status)) << answer->status;
  EXPECT_EQ(p.pulls.size(), 1u);
}

TEST(WaitingPulls, PullsPastTheLimitAreRefusedWithResourceExhausted) {
  Pulls p(/*max=*/2);
  p.Add();
  p.Add();
  std::shared_ptr<Answer> third = p.Add();
  ASSERT_TRUE(third->finished.HasBeenNotified());
  EXPECT_TRUE(absl::IsResourceExhausted(third->status)) << third->status;
  EXPECT_NE(third->status.message().find("shard 0 has 2 pulls waiting"), absl::string_view::npos);
  EXPECT_EQ(p.pulls.size(), 2u);
}

TEST(WaitingPulls, OneThreadExaminesAtATimeAndLooksAgainForTheOthers) {
  // The first look blocks until the test lets it go, and finds the pull not
  // ready; only a second look, asked for meanwhile, can answer it.
  absl::Notification examining, go_on;
  std::atomic<int> examiners{0};
  std::atomic<int> most{0};
  std::atomic<int> looks{0};
  std::atomic<bool> ready{false};
  WaitingPulls pulls(8, "shard 0", [&](WaitingPull&) {
    const int now = ++examiners;
    most = std::max(most.load(), now);
    bool answer = ready.load();
    if (++looks == 1) {
      examining.Notify();
      go_on.WaitForNotification();
      answer = false;
    }
    --examiners;
    return answer;
  });
  auto answer = std::make_shared<Answer>();
  auto pull = std::make_unique<FakePull>(std::make_shared<std::atomic<bool>>(false),
                                         absl::InfiniteFuture(), answer);
  std::thread first([&] { pulls.Add(std::move(pull)); });
  examining.WaitForNotification();
  ready = true;
  pulls.Wake();  // the first thread examines: this one leaves a note, returns
  EXPECT_FALSE(answer->finished.HasBeenNotified());
  EXPECT_EQ(pulls.size(), 1u) << "a pull being examined counts as waiting";
  go_on.Notify();
  first.join();
  EXPECT_TRUE(answer->finished.HasBeenNotified()) << "the first thread looked again";
  EXPECT_EQ(looks.load(), 2);
  EXPECT_EQ(most.load(), 1);
}

TEST(WaitingPulls, AnExaminerThatMadeOthersReadyLooksAgain) {
  std::atomic<int> looks{0};
  WaitingPulls* self = nullptr;
  WaitingPulls pulls(8, "shard 0", [&](WaitingPull&) {
    if (++looks == 2) self->LookAgain();  // as a read that applied held updates
    return looks.load() >= 3;
  });
  self = &pulls;
  auto answer = std::make_shared<Answer>();
  pulls.Add(std::make_unique<FakePull>(std::make_shared<std::atomic<bool>>(false),
                                       absl::InfiniteFuture(), answer));  // look 1: waits
  pulls.Wake();  // look 2 asks for look 3
  EXPECT_TRUE(answer->finished.HasBeenNotified());
  EXPECT_EQ(looks.load(), 3);
}

}  // namespace
}  // namespace grps
