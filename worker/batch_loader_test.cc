#include "worker/batch_loader.h"

#include <atomic>
#include <thread>
#include <vector>

#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gtest/gtest.h"

namespace grps {
namespace {

struct Batch {
  uint64_t step = 0;
  std::thread::id made_by;
};

TEST(BatchLoader, PreparesTheNextStepOnItsOwnThreadWhileTheCallerHoldsThisOne) {
  std::atomic<int> calls{0};
  BatchLoader<Batch> loader([&](uint64_t step, Batch* out) {
    ++calls;
    out->step = step;
    out->made_by = std::this_thread::get_id();
    return absl::OkStatus();
  });
  // The first batch is made in the caller's thread: nothing was asked for.
  absl::StatusOr<Batch*> first = loader.Take(0, 1);
  ASSERT_TRUE(first.ok());
  EXPECT_EQ((*first)->step, 0u);
  EXPECT_EQ((*first)->made_by, std::this_thread::get_id());
  for (uint64_t step = 1; step < 50; ++step) {
    absl::StatusOr<Batch*> b = loader.Take(step, step + 1);
    ASSERT_TRUE(b.ok());
    EXPECT_EQ((*b)->step, step);
    EXPECT_NE((*b)->made_by, std::this_thread::get_id()) << "step " << step;
  }
  EXPECT_EQ(loader.prepared_ahead(), 49u);
}

TEST(BatchLoader, AStepOtherThanTheOneAskedForIsPreparedInTheCallersThread) {
  BatchLoader<Batch> loader([&](uint64_t step, Batch* out) {
    out->step = step;
    out->made_by = std::this_thread::get_id();
    return absl::OkStatus();
  });
  ASSERT_TRUE(loader.Take(10, 11).ok());
  // A roll-back: step 3, not 11.
  absl::StatusOr<Batch*> b = loader.Take(3, std::nullopt);
  ASSERT_TRUE(b.ok());
  EXPECT_EQ((*b)->step, 3u);
  EXPECT_EQ((*b)->made_by, std::this_thread::get_id());
  EXPECT_EQ(loader.prepared_ahead(), 0u);
}

TEST(BatchLoader, PeekReadyShowsTheNextBatchOnlyOnceItIsPreparedAndTakeReturnsIt) {
  absl::Notification release;
  BatchLoader<std::vector<int>> loader([&](uint64_t step, std::vector<int>* out) {
    if (step == 1) release.WaitForNotification();
    out->assign(1000, static_cast<int>(step));
    return absl::OkStatus();
  });
  ASSERT_TRUE(loader.Take(0, 1).ok());
  // Still being prepared: PeekReady does not wait for it.
  EXPECT_EQ(loader.PeekReady(1), nullptr);
  release.Notify();
  const std::vector<int>* peeked = nullptr;
  for (int i = 0; i < 2000 && peeked == nullptr; ++i) {
    peeked = loader.PeekReady(1);
    if (peeked == nullptr) absl::SleepFor(absl::Milliseconds(1));
  }
  ASSERT_NE(peeked, nullptr);
  EXPECT_EQ(peeked->front(), 1);
  EXPECT_EQ(loader.PeekReady(2), nullptr);  // not the step it holds
  const std::vector<int> seen = *peeked;
  absl::StatusOr<std::vector<int>*> taken = loader.Take(1, std::nullopt);
  ASSERT_TRUE(taken.ok());
  EXPECT_EQ(**taken, seen);
  EXPECT_EQ(loader.prepared_ahead(), 1u);
  EXPECT_EQ(loader.PeekReady(1), nullptr);  // taken: nothing is ahead now
}

TEST(BatchLoader, TheBatchTheCallerHoldsIsNotTouchedWhileTheNextIsPrepared) {
  absl::Notification release;
  BatchLoader<std::vector<int>> loader([&](uint64_t step, std::vector<int>* out) {
    if (step == 1) release.WaitForNotification();
    out->assign(1000, static_cast<int>(step));
    return absl::OkStatus();
  });
  absl::StatusOr<std::vector<int>*> held = loader.Take(0, 1);
  ASSERT_TRUE(held.ok());
  std::vector<int>* zero = *held;
  release.Notify();
  for (int i = 0; i < 1000; ++i) ASSERT_EQ((*zero)[i], 0);
  absl::StatusOr<std::vector<int>*> next = loader.Take(1, std::nullopt);
  ASSERT_TRUE(next.ok());
  EXPECT_EQ((**next)[999], 1);
}

TEST(BatchLoader, AnErrorPreparingTheStepIsReturnedByTake) {
  BatchLoader<Batch> loader([&](uint64_t step, Batch* out) {
    if (step == 2) return absl::OutOfRangeError("index 99 outside the data");
    out->step = step;
    return absl::OkStatus();
  });
  ASSERT_TRUE(loader.Take(1, 2).ok());
  absl::StatusOr<Batch*> b = loader.Take(2, 3);
  EXPECT_EQ(b.status().code(), absl::StatusCode::kOutOfRange);
}

}  // namespace
}  // namespace grps
