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

// Two examples of one feature each, two classes; with rows that are the
// one-hot of each feature's class and an identity head, the embedding model
// is right for both.
TEST(Evaluator, TheEmbeddingTargetReadsTheTestSetsRowsAtTheStepOfTheWeights) {
  const std::vector<int64_t> offsets = {0, 1, 2};
  const std::vector<int64_t> features = {5, 9};
  const std::vector<float> values = {1, 1};
  const std::vector<int32_t> labels = {0, 1};
  absl::StatusOr<SparseBatch> test =
      SparseBatch::Create({offsets, features, values, labels}, /*table_rows=*/0);
  ASSERT_TRUE(test.ok()) << test.status();
  std::vector<int64_t> asked;
  uint64_t asked_clock = 0;
  bool fail = false;
  RowReader read = [&](int32_t, absl::Span<const int64_t> ids, uint64_t clock,
                       float* out) -> absl::Status {
    if (fail) return absl::UnavailableError("shard 1: down");
    asked.assign(ids.begin(), ids.end());
    asked_clock = clock;
    for (size_t i = 0; i < ids.size(); ++i) {
      out[2 * i] = ids[i] == 5 ? 1 : 0;
      out[2 * i + 1] = ids[i] == 9 ? 1 : 0;
    }
    return absl::OkStatus();
  };
  Evaluator evaluator(
      MakeEmbeddingEvalTarget({2, 2}, EmbeddingCombiner::kSum, *std::move(test), read),
      [](const Evaluator::Result&) {});
  Evaluator::Result r = evaluator.EvaluateNow(12, kIdentity);
  ASSERT_TRUE(r.error.ok()) << r.error;
  EXPECT_EQ(asked, (std::vector<int64_t>{5, 9}));
  EXPECT_EQ(asked_clock, 12u);
  EXPECT_EQ(r.eval.examples, 2);
  EXPECT_DOUBLE_EQ(r.eval.accuracy, 1.0);
  // Swapped head weights: wrong for both.
  EXPECT_DOUBLE_EQ(evaluator.EvaluateNow(13, {0, 1, 1, 0, 0, 0}).eval.accuracy, 0.0);
  // Rows that cannot be read: no evaluation, and the reason.
  fail = true;
  r = evaluator.EvaluateNow(14, kIdentity);
  EXPECT_EQ(r.error.code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(r.eval.examples, 0);
}

}  // namespace
}  // namespace grps
