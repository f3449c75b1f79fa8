#include "coordinator/collectives.h"

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace grps {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

const absl::Time kNow = absl::FromUnixSeconds(1000);
const std::vector<uint32_t> kLive = {0, 1, 2};

TEST(Collectives, ARoundCompletesOnceEveryLiveWorkerContributedAndGivesAllInRankOrder) {
  Collectives c;
  absl::StatusOr<Collectives::Answer> two = c.Contribute("acc", 2, "c", kLive, kNow);
  ASSERT_TRUE(two.ok()) << two.status();
  EXPECT_FALSE(two->complete);
  absl::StatusOr<Collectives::Answer> zero = c.Contribute("acc", 0, "a", kLive, kNow);
  ASSERT_TRUE(zero.ok());
  EXPECT_EQ(zero->round, two->round);
  EXPECT_FALSE(zero->complete);
  absl::StatusOr<Collectives::Answer> one = c.Contribute("acc", 1, "b", kLive, kNow);
  ASSERT_TRUE(one.ok());
  ASSERT_TRUE(one->complete);
  EXPECT_THAT(one->ranks, ElementsAre(0, 1, 2));
  EXPECT_THAT(one->payloads, ElementsAre("a", "b", "c"));
  absl::StatusOr<Collectives::Answer> later = c.Result(two->round, 2, kLive, kNow);
  ASSERT_TRUE(later.ok());
  EXPECT_TRUE(later->complete);
  EXPECT_THAT(later->payloads, ElementsAre("a", "b", "c"));
}

TEST(Collectives, ARanksSecondCallOfANameGoesToTheNextRound) {
  Collectives c;
  const uint64_t first = c.Contribute("loss", 0, "epoch1", kLive, kNow)->round;
  const uint64_t second = c.Contribute("loss", 0, "epoch2", kLive, kNow)->round;
  EXPECT_NE(first, second);
  // Rank 1's first call pairs with rank 0's first, whatever came between.
  EXPECT_EQ(c.Contribute("loss", 1, "x", kLive, kNow)->round, first);
  EXPECT_EQ(c.Contribute("other", 1, "y", kLive, kNow)->round > second, true);
}

TEST(Collectives, ARankThatIsNoLongerLiveIsNotWaitedFor) {
  Collectives c;
  const uint64_t round = c.Contribute("m", 0, "a", kLive, kNow)->round;
  ASSERT_TRUE(c.Contribute("m", 2, "c", kLive, kNow).ok());
  // Rank 1 died before contributing; rank 2 died after: its payload counts.
  absl::StatusOr<Collectives::Answer> a = c.Result(round, 0, {0}, kNow);
  ASSERT_TRUE(a.ok());
  ASSERT_TRUE(a->complete);
  EXPECT_THAT(a->ranks, ElementsAre(0, 2));
}

TEST(Collectives, ARoundIsForgottenOnceEveryContributorHadIt) {
  Collectives c;
  const uint64_t round = c.Contribute("m", 0, "a", {0, 1}, kNow)->round;
  ASSERT_TRUE(c.Contribute("m", 1, "b", {0, 1}, kNow)->complete);
  EXPECT_EQ(c.rounds_held(), 1u);
  ASSERT_TRUE(c.Result(round, 0, {0, 1}, kNow)->complete);
  EXPECT_EQ(c.rounds_held(), 0u);
  EXPECT_EQ(c.Result(round, 0, {0, 1}, kNow).status().code(), absl::StatusCode::kNotFound);
}

TEST(Collectives, ACompleteRoundNobodyAsksForAgainIsForgottenAfterAWhile) {
  Collectives c;
  ASSERT_TRUE(c.Contribute("m", 0, "a", {0, 1}, kNow).ok());
  ASSERT_TRUE(c.Contribute("m", 1, "b", {0, 1}, kNow)->complete);  // rank 0 never asks
  EXPECT_EQ(c.rounds_held(), 1u);
  ASSERT_TRUE(c.Contribute("n", 0, "x", {0, 1}, kNow + Collectives::kKeepComplete +
                                                    absl::Seconds(1)).ok());
  EXPECT_EQ(c.rounds_held(), 1u);  // only "n"
}

TEST(Collectives, BadNamesPayloadsAndCallersAreRefused) {
  Collectives c;
  EXPECT_EQ(c.Contribute("", 0, "a", kLive, kNow).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(c.Contribute(std::string(Collectives::kMaxNameBytes + 1, 'n'), 0, "a", kLive, kNow)
                .status()
                .code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(c.Contribute("big", 0, std::string(Collectives::kMaxPayloadBytes + 1, 'x'), kLive,
                           kNow)
                  .status()
                  .message(),
              HasSubstr("at most"));
  const uint64_t round = c.Contribute("m", 0, "a", kLive, kNow)->round;
  EXPECT_EQ(c.Result(round, 1, kLive, kNow).status().code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(c.Result(round + 100, 0, kLive, kNow).status().code(),
            absl::StatusCode::kNotFound);
}

TEST(Collectives, OpenRoundsAndHeldBytesAreBounded) {
  Collectives c;
  for (size_t i = 0; i < Collectives::kMaxOpenRounds; ++i)
    ASSERT_TRUE(c.Contribute("m", 0, "a", kLive, kNow).ok()) << i;
  EXPECT_EQ(c.Contribute("m", 0, "a", kLive, kNow).status().code(),
            absl::StatusCode::kResourceExhausted);

  Collectives bytes;
  const std::string payload(Collectives::kMaxPayloadBytes, 'x');
  const size_t fit = Collectives::kMaxHeldBytes / payload.size();
  for (size_t i = 0; i < fit; ++i)
    ASSERT_TRUE(bytes.Contribute("m", 0, payload, kLive, kNow).ok()) << i;
  EXPECT_EQ(bytes.Contribute("m", 1, payload, kLive, kNow).status().code(),
            absl::StatusCode::kResourceExhausted);
}

}  // namespace
}  // namespace grps
