// PushSchedule: a shard's parts one at a time, within the credit, in the
// model's order; and the credit a push measures for the next.
#include "worker/push_schedule.h"

#include <vector>

#include "gtest/gtest.h"

namespace grps {
namespace {

using Calls = std::vector<size_t>;

TEST(PushSchedule, AShardsNextCallStartsOnceTheOneBeforeIsWritten) {
  PushSchedule schedule(1000);
  schedule.Enqueue(0, /*shard=*/0, 10);
  schedule.Enqueue(1, /*shard=*/0, 10);
  schedule.Enqueue(2, /*shard=*/1, 10);
  EXPECT_EQ(schedule.Start(), (Calls{0, 2}));
  EXPECT_EQ(schedule.Start(), Calls{});
  schedule.Written(0);
  EXPECT_EQ(schedule.Start(), Calls{1});
}

TEST(PushSchedule, ACallPastTheCreditWaitsForAReply) {
  PushSchedule schedule(100);
  schedule.Enqueue(0, 0, 60);
  schedule.Enqueue(1, 1, 60);
  EXPECT_EQ(schedule.Start(), Calls{0});
  schedule.Written(0);
  EXPECT_EQ(schedule.Start(), Calls{});  // written, but its reply has not come
  schedule.Replied(0, true);
  EXPECT_EQ(schedule.Start(), Calls{1});
}

TEST(PushSchedule, ACallAheadOfEveryCallInFlightPassesTheCredit) {
  // A worker whose hooks made part 1 ready first must still send part 0,
  // which the other workers' pushes wait for.
  PushSchedule schedule(100);
  schedule.Enqueue(1, 0, 60);
  EXPECT_EQ(schedule.Start(), Calls{1});
  schedule.Enqueue(0, 1, 60);
  EXPECT_EQ(schedule.Start(), Calls{0});
}

TEST(PushSchedule, AFailedCallGivesItsCreditBackWithoutBeingMeasured) {
  PushSchedule schedule(PushSchedule::kInFlightBytes);
  schedule.Enqueue(0, 0, PushSchedule::kInFlightBytes);
  schedule.Enqueue(1, 1, 1);
  EXPECT_EQ(schedule.Start(), Calls{0});
  schedule.Replied(0, false);
  EXPECT_EQ(schedule.Start(), Calls{1});
  EXPECT_FALSE(schedule.Measured().has_value());
}

TEST(PushSchedule, MeasuresTheNextCreditOnceItsRepliesBroughtMinCreditBytes) {
  PushSchedule schedule(PushSchedule::kInFlightBytes);
  schedule.Enqueue(0, 0, PushSchedule::kMinCredit - 1);
  schedule.Enqueue(1, 1, 1);
  EXPECT_EQ(schedule.Start(), (Calls{0, 1}));
  schedule.Replied(0, true);
  EXPECT_FALSE(schedule.Measured().has_value());
  schedule.Replied(1, true);
  const std::optional<size_t> credit = schedule.Measured();
  ASSERT_TRUE(credit.has_value());
  EXPECT_GE(*credit, PushSchedule::kMinCredit);
  EXPECT_LE(*credit, PushSchedule::kInFlightBytes);
}

TEST(PushSchedule, CreditForIsThreeRoundTripsOfTheRateWithinItsBounds) {
  // 60 MB/s and 10 ms: 3 x 0.6 MB is below kMinCredit.
  EXPECT_EQ(PushSchedule::CreditFor(60'000'000, absl::Seconds(1), absl::Milliseconds(10)),
            PushSchedule::kMinCredit);
  // 60 MB/s and 50 ms: 3 x 3 MB.
  EXPECT_NEAR(static_cast<double>(PushSchedule::CreditFor(60'000'000, absl::Seconds(1),
                                                          absl::Milliseconds(50))),
              9e6, 1e3);
  EXPECT_EQ(PushSchedule::CreditFor(1'250'000'000, absl::Seconds(1), absl::Milliseconds(13)),
            PushSchedule::kInFlightBytes);
  EXPECT_EQ(PushSchedule::CreditFor(0, absl::ZeroDuration(), absl::InfiniteDuration()),
            PushSchedule::kInFlightBytes);
}

}  // namespace
}  // namespace grps
