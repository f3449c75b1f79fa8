#include "worker/evaluator.h"

#include <atomic>
#include <vector>

#include "absl/synchronization/notification.h"
#include "gtest/gtest.h"

namespace grps {
namespace {

// Two features, two classes; a softmax model whose weights are the identity
// predicts the class of the larger feature, which is right for 3 of 4.
Dataset FourExamples() {
  return *Dataset::Create(2, 2, {1, 0, 0, 1, 1, 0, 0, 1}, {0, 1, 1, 1});
}
const std::vector<int64_t> kWidths = {2, 2};
const std::vector<float> kIdentity = {1, 0, 0, 1, /*bias*/ 0, 0};

TEST(Evaluator, EvaluateNowReportsTheAccuracyOfTheGivenWeights) {
  const Dataset test = FourExamples();
  Evaluator evaluator(kWidths, &test, [](const Evaluator::Result&) {});
  const Evaluator::Result r = evaluator.EvaluateNow(7, kIdentity);
  EXPECT_EQ(r.step, 7u);
  EXPECT_EQ(r.eval.examples, 4);
  EXPECT_DOUBLE_EQ(r.eval.accuracy, 0.75);
  // Swapped weights predict the other class: right for 1 of 4.
  EXPECT_DOUBLE_EQ(evaluator.EvaluateNow(8, {0, 1, 1, 0, 0, 0}).eval.accuracy, 0.25);
}

TEST(Evaluator, SubmitEvaluatesOnItsOwnThreadAndSkipsWhileBusy) {
  const Dataset test = FourExamples();
  absl::Notification first_reported, release;
  std::atomic<int> results{0};
  std::atomic<double> first_accuracy{-1};
  Evaluator evaluator(kWidths, &test, [&](const Evaluator::Result& r) {
    if (results++ == 0) {
      first_accuracy = r.eval.accuracy;
      first_reported.Notify();
      release.WaitForNotification();  // keeps the evaluator busy
    }
  });
  ASSERT_TRUE(evaluator.Submit(100, kIdentity));
  ASSERT_TRUE(first_reported.WaitForNotificationWithTimeout(absl::Seconds(10)));
  EXPECT_DOUBLE_EQ(first_accuracy.load(), 0.75);
  // Busy: the next snapshot is skipped, not queued.
  EXPECT_FALSE(evaluator.Submit(200, kIdentity));
  release.Notify();
  evaluator.WaitIdle();
  EXPECT_EQ(results.load(), 1);
  EXPECT_TRUE(evaluator.Submit(300, kIdentity));
  evaluator.WaitIdle();
  EXPECT_EQ(results.load(), 2);
}

}  // namespace
}  // namespace grps
