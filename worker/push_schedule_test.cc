// PushSchedule: a shard's parts one at a time, within the credit, in the
// model's order or a strict one; and the credit a push measures for the next.
#include "worker/push_schedule.h"

#include <optional>
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

TEST(PushSchedule, TheLeastCreditHoldsTwoOfEachShardsLargestParts) {
  constexpr size_t kKiB = 1024, kMiB = kKiB * kKiB;
  // Parts of 256 KiB (the default): kMinCredit holds many.
  EXPECT_EQ(PushSchedule::LeastCredit({256 * kKiB, 256 * kKiB}), PushSchedule::kMinCredit);
  EXPECT_EQ(PushSchedule::LeastCredit(std::vector<size_t>(4, 256 * kKiB)),
            PushSchedule::kMinCredit);
  EXPECT_EQ(PushSchedule::LeastCredit({}), PushSchedule::kMinCredit);
  // Chunks of 4 MiB: two of them a shard, with their headers.
  for (size_t shards : {1, 2, 4}) {
    const size_t least = PushSchedule::LeastCredit(std::vector<size_t>(shards, 4 * kMiB));
    EXPECT_GT(least, 2 * shards * 4 * kMiB) << shards << " shards";
    EXPECT_LT(least, 2 * shards * 4 * kMiB + 2 * shards * 64 * kKiB);
  }
  // Each shard its own: one of 4 MiB parts beside three of 256 KiB needs
  // room for two of each, not eight of 4 MiB.
  const size_t mixed = PushSchedule::LeastCredit({4 * kMiB, 256 * kKiB, 256 * kKiB, 256 * kKiB});
  EXPECT_GT(mixed, 2 * 4 * kMiB + 3 * 2 * 256 * kKiB);
  EXPECT_LT(mixed, 2 * 4 * kMiB + 3 * 2 * 256 * kKiB + 8 * 64 * kKiB);
}

// Shard 0 on this machine, shard 1 across the network: 100 bytes of credit
// each.
PushSchedule::Credits TwoLinks() { return {100, 100, {true, false}}; }

TEST(PushSchedule, EachLinkHasACreditOfItsOwn) {
  PushSchedule schedule(TwoLinks(), {});
  for (size_t call = 0; call < 6; ++call) schedule.Enqueue(call, call % 2, 40);
  // Two calls of 40 a link: the loopback's do not take the network's credit.
  EXPECT_EQ(schedule.Start(), (Calls{0, 1}));
  schedule.Written(0);
  schedule.Written(1);
  EXPECT_EQ(schedule.Start(), (Calls{2, 3}));
  schedule.Written(2);
  schedule.Written(3);
  EXPECT_EQ(schedule.Start(), Calls{});  // a third of 40 fits neither credit
  // A reply frees its own link's credit only.
  schedule.Replied(1, true);
  EXPECT_EQ(schedule.Start(), Calls{5});
  schedule.Written(5);
  schedule.Replied(0, true);
  EXPECT_EQ(schedule.Start(), Calls{4});
}

TEST(PushSchedule, AFullLinkHoldsBackNoCallOfTheOther) {
  // The network's credit is spent; the loopback's later calls still go.
  PushSchedule schedule(TwoLinks(), {});
  schedule.Enqueue(0, 1, 90);
  schedule.Enqueue(1, 1, 90);
  schedule.Enqueue(2, 0, 90);
  EXPECT_EQ(schedule.Start(), (Calls{0, 2}));
  schedule.Written(0);
  schedule.Written(2);
  EXPECT_EQ(schedule.Start(), Calls{});
  schedule.Enqueue(3, 0, 5);
  EXPECT_EQ(schedule.Start(), Calls{3});
}

TEST(PushSchedule, OnlyTheNetworksCallsAreMeasured) {
  // The loopback's replies, however many bytes, measure nothing.
  const size_t bytes = PushSchedule::kMinCredit;
  PushSchedule::Credits credits = TwoLinks();
  credits.network = credits.local = 4 * bytes;
  {
    PushSchedule schedule(credits, {});
    schedule.Enqueue(0, /*shard=*/0, bytes);
    schedule.Enqueue(1, /*shard=*/0, bytes);
    EXPECT_EQ(schedule.Start(), Calls{0});
    schedule.Written(0);
    EXPECT_EQ(schedule.Start(), Calls{1});
    schedule.Written(1);
    schedule.Replied(0, true);
    schedule.Replied(1, true);
    EXPECT_EQ(schedule.Measured(), std::nullopt);
  }
  PushSchedule schedule(credits, {});
  schedule.Enqueue(0, /*shard=*/1, bytes);
  EXPECT_EQ(schedule.Start(), Calls{0});
  schedule.Written(0);
  schedule.Replied(0, true);
  EXPECT_NE(schedule.Measured(), std::nullopt);
}

}  // namespace
}  // namespace grps
