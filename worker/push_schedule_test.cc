// PushSchedule: a shard's parts one at a time, within the credit, in the
// model's order or a strict one; and the credit a push measures for the next.
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

// A strict order, as a staged sync push's: calls 3, 2, 1, 0 on shards 1,
// 0, 1, 0.
std::vector<PushSchedule::Placed> Reverse() { return {{3, 1}, {2, 0}, {1, 1}, {0, 0}}; }

TEST(PushSchedule, InAStrictOrderAShardsCallsStartInThatOrderWhateverWasReadyFirst) {
  PushSchedule schedule(1000, Reverse());
  schedule.Enqueue(0, 0, 10);  // ready first, but shard 0's turn is call 2's
  schedule.Enqueue(1, 1, 10);  // shard 1's turn is call 3's
  EXPECT_EQ(schedule.Start(), Calls{});
  schedule.Enqueue(3, 1, 10);
  EXPECT_EQ(schedule.Start(), Calls{3});
  schedule.Written(3);
  EXPECT_EQ(schedule.Start(), Calls{1});  // shard 1's next; shard 0 still waits for 2
  schedule.Enqueue(2, 0, 10);
  EXPECT_EQ(schedule.Start(), Calls{2});
  schedule.Written(2);
  EXPECT_EQ(schedule.Start(), Calls{0});
}

TEST(PushSchedule, ABypassedCallDoesNotHoldItsShardsNextOne) {
  PushSchedule schedule(1000, Reverse());
  schedule.Enqueue(0, 0, 10);
  EXPECT_EQ(schedule.Start(), Calls{});
  schedule.Bypass(2);  // shard 0's call 2 went by a lane
  EXPECT_EQ(schedule.Start(), Calls{0});
}

TEST(PushSchedule, InAStrictOrderTheCallFirstInItPassesTheCredit) {
  // Every worker sends the same order, so the first call not done is one
  // each worker has sent or may send: no worker waits on a full credit for
  // a copy another cannot send.
  PushSchedule schedule(100, Reverse());
  schedule.Enqueue(3, 1, 60);
  schedule.Enqueue(2, 0, 60);
  EXPECT_EQ(schedule.Start(), Calls{3});  // 2 is past the credit
  schedule.Replied(3, true);
  schedule.Written(3);
  EXPECT_EQ(schedule.Start(), Calls{2});
  schedule.Enqueue(1, 1, 60);
  EXPECT_EQ(schedule.Start(), Calls{});  // behind call 2, in flight, past the credit
  schedule.Replied(2, true);
  EXPECT_EQ(schedule.Start(), Calls{1});
}

TEST(PushSchedule, WithoutAnOrderReadyCallsGoInIndexOrder) {
  PushSchedule schedule(1000);
  schedule.Enqueue(3, 1, 10);
  schedule.Enqueue(0, 0, 10);
  EXPECT_EQ(schedule.Start(), (Calls{0, 3}));
  schedule.Bypass(1);  // nothing to bypass without an order
  EXPECT_EQ(schedule.Start(), Calls{});
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

TEST(PushSchedule, TheLeastCreditHoldsTwoOfTheLargestPartsAShard) {
  // Parts of 256 KiB (the default): kMinCredit holds many.
  EXPECT_EQ(PushSchedule::LeastCredit(256 << 10, 2), PushSchedule::kMinCredit);
  EXPECT_EQ(PushSchedule::LeastCredit(256 << 10, 4), PushSchedule::kMinCredit);
  // Chunks of 4 MiB: two of them a shard, with their headers.
  for (size_t shards : {1, 2, 4}) {
    const size_t least = PushSchedule::LeastCredit(4 << 20, shards);
    EXPECT_GT(least, 2 * shards * (size_t{4} << 20)) << shards << " shards";
    EXPECT_LT(least, 2 * shards * (size_t{4} << 20) + 2 * shards * (size_t{64} << 10));
  }
}

}  // namespace
}  // namespace grps
