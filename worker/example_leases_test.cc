// ExampleLeases (worker/example_leases.h): a worker's leases of the
// coordinator's example ledger, against a fake coordinator that hands out
// consecutive blocks and records every request, and against the real
// ExampleLedger.
#include "worker/example_leases.h"

#include <cstdint>
#include <functional>
#include <optional>
#include <set>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "coordinator/example_ledger.h"
#include "data/epoch_shuffler.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "job/job_config.h"
#include "proto/grps.pb.h"

namespace grps {
namespace {

using ::testing::ElementsAre;
using ::testing::ElementsAreArray;
using ::testing::IsEmpty;

// (block, step) of each report in a request, in order.
std::vector<std::pair<uint64_t, uint64_t>> Reports(const v1::LeaseExamplesRequest& r) {
  std::vector<std::pair<uint64_t, uint64_t>> reports;
  for (const v1::TrainedBlock& t : r.trained()) reports.emplace_back(t.block(), t.step());
  return reports;
}

// A coordinator that hands out blocks 0, 1, 2, ... in order, up to
// `total_blocks`, min(want, left) at a time; exhausted when it wanted some
// and none is left (as ExampleLedger says). Records every request.
struct FakeCoordinator {
  explicit FakeCoordinator(uint64_t total_blocks, uint64_t blocks_per_epoch = 100)
      : total_blocks(total_blocks), blocks_per_epoch(blocks_per_epoch) {}

  absl::StatusOr<v1::LeaseExamplesResponse> Lease(v1::LeaseExamplesRequest request) {
    requests.push_back(request);
    if (during_call) {
      std::function<void()> hook = std::move(during_call);
      during_call = nullptr;
      hook();
    }
    if (!fail_next.ok()) {
      const absl::Status s = fail_next;
      fail_next = absl::OkStatus();
      return s;
    }
    v1::LeaseExamplesResponse response;
    response.set_blocks_per_epoch(blocks_per_epoch);
    uint32_t given = 0;
    while (given < request.want() && next < total_blocks) {
      response.add_blocks(next++);
      ++given;
    }
    response.set_exhausted(request.want() > 0 && given == 0);
    if (exhaust_with_last && next == total_blocks) response.set_exhausted(true);
    return response;
  }

  ExampleLeases::LeaseCall Call() {
    return [this](v1::LeaseExamplesRequest r) { return Lease(std::move(r)); };
  }

  const uint64_t total_blocks;
  const uint64_t blocks_per_epoch;
  uint64_t next = 0;
  // The next call fails with this (once).
  absl::Status fail_next;
  // Runs once inside the next call (the lease is in flight).
  std::function<void()> during_call;
  // The response that hands out the last block says exhausted already.
  bool exhaust_with_last = false;
  std::vector<v1::LeaseExamplesRequest> requests;
};

uint64_t MustBlock(ExampleLeases& leases, uint64_t step) {
  absl::StatusOr<uint64_t> block = leases.BlockFor(step);
  EXPECT_TRUE(block.ok()) << "step " << step << ": " << block.status();
  return block.ok() ? *block : ~uint64_t{0};
}

// --- BlockFor -------------------------------------------------------------

TEST(ExampleLeases, BlockForTheSameStepTwiceReturnsTheSameBlockWithoutLeasingAgain) {
  FakeCoordinator coordinator(100);
  ExampleLeases leases(coordinator.Call(), 1000, 10, 7, /*per_lease=*/1);
  const uint64_t first = MustBlock(leases, 0);
  EXPECT_EQ(MustBlock(leases, 0), first);
  EXPECT_EQ(coordinator.requests.size(), 1u);
  // The next step takes the next block (a new lease: per_lease is 1).
  EXPECT_NE(MustBlock(leases, 1), first);
  EXPECT_EQ(MustBlock(leases, 0), first);
}

TEST(ExampleLeases, ConsecutiveStepsGetConsecutiveLeasedBlocks) {
  FakeCoordinator coordinator(100);
  ExampleLeases leases(coordinator.Call(), 1000, 10, 7, /*per_lease=*/3);
  std::vector<uint64_t> blocks;
  for (uint64_t step = 0; step < 7; ++step) blocks.push_back(MustBlock(leases, step));
  EXPECT_THAT(blocks, ElementsAre(0, 1, 2, 3, 4, 5, 6));
  EXPECT_EQ(coordinator.requests.size(), 3u);
}

TEST(ExampleLeases, StepsMayStartAnywhereAndTakeTheHeldBlocksInLeaseOrder) {
  // A worker resumes at step 40: its steps need not start at 0.
  FakeCoordinator coordinator(100);
  ExampleLeases leases(coordinator.Call(), 1000, 10, 7, /*per_lease=*/4);
  EXPECT_EQ(MustBlock(leases, 40), 0u);
  EXPECT_EQ(MustBlock(leases, 41), 1u);
  EXPECT_EQ(MustBlock(leases, 40), 0u);
}

TEST(ExampleLeases, ALeaseAsksForPerLeaseBlocksAndNamesTheTrainingSetSize) {
  FakeCoordinator coordinator(100);
  ExampleLeases leases(coordinator.Call(), 1234, 10, 7, /*per_lease=*/5);
  MustBlock(leases, 0);
  ASSERT_EQ(coordinator.requests.size(), 1u);
  EXPECT_EQ(coordinator.requests[0].want(), 5u);
  EXPECT_EQ(coordinator.requests[0].train_examples(), 1234u);
  EXPECT_THAT(Reports(coordinator.requests[0]), IsEmpty());
}

TEST(ExampleLeases, ANewLeaseIsRequestedOnlyWhenNoBlockIsHeld) {
  FakeCoordinator coordinator(100);
  ExampleLeases leases(coordinator.Call(), 1000, 10, 7, /*per_lease=*/4);
  for (uint64_t step = 0; step < 4; ++step) {
    MustBlock(leases, step);
    EXPECT_EQ(coordinator.requests.size(), 1u) << "step " << step;
  }
  MustBlock(leases, 4);
  EXPECT_EQ(coordinator.requests.size(), 2u);
}

TEST(ExampleLeases, ALeaseOfFewerBlocksThanWantedIsUsedUpBeforeTheNextLease) {
  FakeCoordinator coordinator(3);  // hands out 3 though 8 are wanted
  ExampleLeases leases(coordinator.Call(), 1000, 10, 7, /*per_lease=*/8);
  EXPECT_EQ(MustBlock(leases, 0), 0u);
  EXPECT_EQ(MustBlock(leases, 1), 1u);
  EXPECT_EQ(MustBlock(leases, 2), 2u);
  EXPECT_EQ(coordinator.requests.size(), 1u);
}

// --- Trained and the reports ----------------------------------------------

TEST(ExampleLeases, ANewLeaseCarriesTheBlocksTrainedSinceTheLastCallAfterThoseReportedBefore) {
  FakeCoordinator coordinator(100);
  ExampleLeases leases(coordinator.Call(), 1000, 10, 7, /*per_lease=*/2);
  MustBlock(leases, 10);  // block 0
  MustBlock(leases, 11);  // block 1
  leases.Trained(10);
  leases.Trained(11);
  MustBlock(leases, 12);  // a new lease: blocks 2, 3
  ASSERT_EQ(coordinator.requests.size(), 2u);
  EXPECT_THAT(Reports(coordinator.requests[1]),
              ElementsAre(std::make_pair(0u, 10u), std::make_pair(1u, 11u)));

  leases.Trained(12);
  MustBlock(leases, 13);  // held: no call
  leases.Trained(13);
  MustBlock(leases, 14);
  ASSERT_EQ(coordinator.requests.size(), 3u);
  // Blocks 0 and 1 again (a coordinator that restarted from a state file
  // a little behind learns them), then what was trained since.
  EXPECT_THAT(Reports(coordinator.requests[2]),
              ElementsAre(std::make_pair(0u, 10u), std::make_pair(1u, 11u), std::make_pair(2u, 12u),
                          std::make_pair(3u, 13u)));
}

TEST(ExampleLeases, OnlyTheLastKResentReportsAreSentAgain) {
  constexpr uint64_t kSteps = ExampleLeases::kResent + 20;
  FakeCoordinator coordinator(kSteps + 1);
  ExampleLeases leases(coordinator.Call(), 1000, 10, 7, /*per_lease=*/1);
  for (uint64_t step = 0; step <= kSteps; ++step) {
    ASSERT_EQ(MustBlock(leases, step), step);
    leases.Trained(step);
  }
  // Each step's lease reported the step before: the last one carries steps
  // kSteps - 1 - kResent .. kSteps - 2 again, then kSteps - 1.
  ASSERT_EQ(coordinator.requests.size(), kSteps + 1);
  const auto reports = Reports(coordinator.requests.back());
  ASSERT_EQ(reports.size(), ExampleLeases::kResent + 1);
  EXPECT_EQ(reports.front(), std::make_pair(kSteps - 1 - ExampleLeases::kResent,
                                            kSteps - 1 - ExampleLeases::kResent));
  EXPECT_EQ(reports.back(), std::make_pair(kSteps - 1, kSteps - 1));
  for (size_t i = 1; i < reports.size(); ++i)
    EXPECT_EQ(reports[i].second, reports[i - 1].second + 1) << "in the order trained";
}

TEST(ExampleLeases, ACallCarriesTheBlocksHeldAndAssignedButNotTrained) {
  FakeCoordinator coordinator(100);
  ExampleLeases leases(coordinator.Call(), 1000, 10, 7, /*per_lease=*/4);
  MustBlock(leases, 0);
  EXPECT_THAT(coordinator.requests[0].held(), IsEmpty());
  MustBlock(leases, 1);
  MustBlock(leases, 2);
  leases.Trained(0);
  // Block 3 held, 1 and 2 assigned untrained, 0 trained.
  ASSERT_TRUE(leases.Flush().ok());
  ASSERT_EQ(coordinator.requests.size(), 2u);
  EXPECT_THAT(std::set<uint64_t>(coordinator.requests[1].held().begin(),
                                 coordinator.requests[1].held().end()),
              ElementsAre(1, 2, 3));
  EXPECT_EQ(coordinator.requests[1].held_size(), 3);
}

TEST(ExampleLeases, AStepNotYetTrainedIsNotReported) {
  FakeCoordinator coordinator(100);
  ExampleLeases leases(coordinator.Call(), 1000, 10, 7, /*per_lease=*/1);
  MustBlock(leases, 0);
  MustBlock(leases, 1);  // step 0 assigned, not trained
  ASSERT_EQ(coordinator.requests.size(), 2u);
  EXPECT_THAT(Reports(coordinator.requests[1]), IsEmpty());
  // Still assigned: the same block.
  EXPECT_EQ(MustBlock(leases, 0), 0u);
}

TEST(ExampleLeases, TrainedForAStepWithNoBlockChangesNothingAndAStepIsReportedOnce) {
  FakeCoordinator coordinator(100);
  ExampleLeases leases(coordinator.Call(), 1000, 10, 7, /*per_lease=*/1);
  leases.Trained(5);  // never assigned
  MustBlock(leases, 0);
  leases.Trained(0);
  leases.Trained(0);  // again: no-op
  MustBlock(leases, 1);
  ASSERT_EQ(coordinator.requests.size(), 2u);
  EXPECT_THAT(Reports(coordinator.requests[0]), IsEmpty());
  EXPECT_THAT(Reports(coordinator.requests[1]), ElementsAre(std::make_pair(0u, 0u)));
}

TEST(ExampleLeases, ATrainedStepGetsANewBlockWhenAskedAgain) {
  // Trained forgets the step's assignment: asking for it again takes the
  // next block (the trainer never does; this pins the bookkeeping).
  FakeCoordinator coordinator(100);
  ExampleLeases leases(coordinator.Call(), 1000, 10, 7, /*per_lease=*/4);
  EXPECT_EQ(MustBlock(leases, 0), 0u);
  leases.Trained(0);
  EXPECT_EQ(MustBlock(leases, 0), 1u);
}

// --- Exhaustion -----------------------------------------------------------

TEST(ExampleLeases, OutOfRangeOnceTheLedgerIsExhaustedAndNothingIsHeld) {
  FakeCoordinator coordinator(3);
  ExampleLeases leases(coordinator.Call(), 1000, 10, 7, /*per_lease=*/2);
  EXPECT_EQ(MustBlock(leases, 0), 0u);
  EXPECT_EQ(MustBlock(leases, 1), 1u);
  EXPECT_EQ(MustBlock(leases, 2), 2u);  // the second lease: block 2 only
  leases.Trained(0);
  leases.Trained(1);
  leases.Trained(2);
  absl::StatusOr<uint64_t> none = leases.BlockFor(3);
  EXPECT_TRUE(absl::IsOutOfRange(none.status())) << none.status();
  ASSERT_EQ(coordinator.requests.size(), 3u);
  EXPECT_THAT(Reports(coordinator.requests[2]),
              ElementsAre(std::make_pair(0u, 0u), std::make_pair(1u, 1u), std::make_pair(2u, 2u)))
      << "the call that found the ledger exhausted still reported";
  // Exhausted stays exhausted: no further call.
  none = leases.BlockFor(4);
  EXPECT_TRUE(absl::IsOutOfRange(none.status())) << none.status();
  EXPECT_EQ(coordinator.requests.size(), 3u);
}

TEST(ExampleLeases, AnAssignedStepKeepsItsBlockAfterTheLedgerIsExhausted) {
  FakeCoordinator coordinator(1);
  ExampleLeases leases(coordinator.Call(), 1000, 10, 7, /*per_lease=*/1);
  EXPECT_EQ(MustBlock(leases, 0), 0u);
  EXPECT_TRUE(absl::IsOutOfRange(leases.BlockFor(1).status()));
  EXPECT_EQ(MustBlock(leases, 0), 0u);
}

TEST(ExampleLeases, BlocksHeldWhenTheResponseSaysExhaustedAreStillHandedOut) {
  FakeCoordinator coordinator(3);
  coordinator.exhaust_with_last = true;
  ExampleLeases leases(coordinator.Call(), 1000, 10, 7, /*per_lease=*/8);
  EXPECT_EQ(MustBlock(leases, 0), 0u);
  EXPECT_EQ(MustBlock(leases, 1), 1u);
  EXPECT_EQ(MustBlock(leases, 2), 2u);
  EXPECT_TRUE(absl::IsOutOfRange(leases.BlockFor(3).status()));
  EXPECT_EQ(coordinator.requests.size(), 1u) << "exhausted: no call for step 3";
}

// --- Failing calls --------------------------------------------------------

TEST(ExampleLeases, AFailingCallReturnsItsErrorAndKeepsTheReportsForTheNextCall) {
  FakeCoordinator coordinator(100);
  ExampleLeases leases(coordinator.Call(), 1000, 10, 7, /*per_lease=*/2);
  MustBlock(leases, 0);
  MustBlock(leases, 1);
  leases.Trained(0);
  coordinator.fail_next = absl::UnavailableError("coordinator down");
  absl::StatusOr<uint64_t> failed = leases.BlockFor(2);
  EXPECT_TRUE(absl::IsUnavailable(failed.status())) << failed.status();
  ASSERT_EQ(coordinator.requests.size(), 2u);
  EXPECT_THAT(Reports(coordinator.requests[1]), ElementsAre(std::make_pair(0u, 0u)));

  // A block trained after the failure goes after the kept reports.
  leases.Trained(1);
  EXPECT_EQ(MustBlock(leases, 2), 2u);
  ASSERT_EQ(coordinator.requests.size(), 3u);
  EXPECT_THAT(Reports(coordinator.requests[2]),
              ElementsAre(std::make_pair(0u, 0u), std::make_pair(1u, 1u)));
}

TEST(ExampleLeases, AFailedCallLeasesNothingAndIsNotExhausted) {
  FakeCoordinator coordinator(100);
  ExampleLeases leases(coordinator.Call(), 1000, 10, 7, /*per_lease=*/2);
  coordinator.fail_next = absl::AbortedError("rolled back");
  EXPECT_TRUE(absl::IsAborted(leases.BlockFor(0).status()));
  EXPECT_EQ(MustBlock(leases, 0), 0u);
  EXPECT_EQ(coordinator.requests.size(), 2u);
}

// --- Flush ----------------------------------------------------------------

TEST(ExampleLeases, FlushSendsThePendingReportsWithWantZero) {
  FakeCoordinator coordinator(100);
  ExampleLeases leases(coordinator.Call(), 1000, 10, 7, /*per_lease=*/4);
  MustBlock(leases, 0);
  MustBlock(leases, 1);
  leases.Trained(0);
  leases.Trained(1);
  ASSERT_TRUE(leases.Flush().ok());
  ASSERT_EQ(coordinator.requests.size(), 2u);
  EXPECT_EQ(coordinator.requests[1].want(), 0u);
  EXPECT_EQ(coordinator.requests[1].train_examples(), 1000u);
  EXPECT_THAT(Reports(coordinator.requests[1]),
              ElementsAre(std::make_pair(0u, 0u), std::make_pair(1u, 1u)));
  // Reported: a second Flush makes no call, and a step takes a held block.
  ASSERT_TRUE(leases.Flush().ok());
  EXPECT_EQ(coordinator.requests.size(), 2u);
  EXPECT_EQ(MustBlock(leases, 2), 2u);  // still held
  EXPECT_EQ(coordinator.requests.size(), 2u);
}

TEST(ExampleLeases, FlushWithNothingPendingMakesNoCall) {
  FakeCoordinator coordinator(100);
  ExampleLeases leases(coordinator.Call(), 1000, 10, 7, /*per_lease=*/4);
  EXPECT_TRUE(leases.Flush().ok());
  MustBlock(leases, 0);  // assigned, not trained
  EXPECT_TRUE(leases.Flush().ok());
  EXPECT_EQ(coordinator.requests.size(), 1u);
}

TEST(ExampleLeases, AFailedFlushKeepsTheReportsForTheNextFlush) {
  FakeCoordinator coordinator(100);
  ExampleLeases leases(coordinator.Call(), 1000, 10, 7, /*per_lease=*/4);
  MustBlock(leases, 0);
  leases.Trained(0);
  coordinator.fail_next = absl::UnavailableError("coordinator down");
  EXPECT_TRUE(absl::IsUnavailable(leases.Flush()));
  EXPECT_TRUE(leases.Flush().ok());
  ASSERT_EQ(coordinator.requests.size(), 3u);
  EXPECT_THAT(Reports(coordinator.requests[2]), ElementsAre(std::make_pair(0u, 0u)));
  EXPECT_EQ(coordinator.requests[2].want(), 0u);
}

TEST(ExampleLeases, FlushLeasesNothing) {
  // The coordinator's answer to a report-only call is not taken as a lease.
  FakeCoordinator coordinator(1);
  ExampleLeases leases(coordinator.Call(), 1000, 10, 7, /*per_lease=*/1);
  MustBlock(leases, 0);
  leases.Trained(0);
  ASSERT_TRUE(leases.Flush().ok());
  // Not exhausted by the flush: the next step asks (and finds it exhausted).
  EXPECT_TRUE(absl::IsOutOfRange(leases.BlockFor(1).status()));
  EXPECT_EQ(coordinator.requests.size(), 3u);
  EXPECT_GT(coordinator.requests[2].want(), 0u);
}

// --- Reset ----------------------------------------------------------------

TEST(ExampleLeases, ResetDropsHeldAndAssignedBlocksAndPendingReports) {
  FakeCoordinator coordinator(100);
  ExampleLeases leases(coordinator.Call(), 1000, 10, 7, /*per_lease=*/4);
  EXPECT_EQ(MustBlock(leases, 0), 0u);
  EXPECT_EQ(MustBlock(leases, 1), 1u);
  leases.Trained(0);
  leases.Reset();
  EXPECT_TRUE(leases.Flush().ok());
  EXPECT_EQ(coordinator.requests.size(), 1u) << "the report was dropped";
  // Step 1's block and the held 2 and 3 are gone: a new lease, no reports.
  EXPECT_EQ(MustBlock(leases, 1), 4u);
  ASSERT_EQ(coordinator.requests.size(), 2u);
  EXPECT_THAT(Reports(coordinator.requests[1]), IsEmpty());
}

TEST(ExampleLeases, ResetForgetsTheReportsSentBeforeToo) {
  FakeCoordinator coordinator(100);
  ExampleLeases leases(coordinator.Call(), 1000, 10, 7, /*per_lease=*/1);
  MustBlock(leases, 0);
  leases.Trained(0);
  MustBlock(leases, 1);  // reports block 0
  ASSERT_THAT(Reports(coordinator.requests[1]), ElementsAre(std::make_pair(0u, 0u)));
  leases.Reset();
  MustBlock(leases, 0);
  ASSERT_EQ(coordinator.requests.size(), 3u);
  EXPECT_THAT(Reports(coordinator.requests[2]), IsEmpty());
  EXPECT_THAT(coordinator.requests[2].held(), IsEmpty());
}

TEST(ExampleLeases, TrainedForAStepAssignedBeforeResetReportsNothing) {
  FakeCoordinator coordinator(100);
  ExampleLeases leases(coordinator.Call(), 1000, 10, 7, /*per_lease=*/4);
  MustBlock(leases, 0);
  leases.Reset();
  leases.Trained(0);
  EXPECT_TRUE(leases.Flush().ok());
  EXPECT_EQ(coordinator.requests.size(), 1u);
}

TEST(ExampleLeases, ResetAfterExhaustionLeasesAgain) {
  // A roll-back gives blocks back to the ledger: lease again.
  FakeCoordinator coordinator(1);
  ExampleLeases leases(coordinator.Call(), 1000, 10, 7, /*per_lease=*/1);
  MustBlock(leases, 0);
  EXPECT_TRUE(absl::IsOutOfRange(leases.BlockFor(1).status()));
  leases.Reset();
  const size_t before = coordinator.requests.size();
  EXPECT_TRUE(absl::IsOutOfRange(leases.BlockFor(0).status()));  // the fake has none
  EXPECT_EQ(coordinator.requests.size(), before + 1) << "asked again after the reset";
}

TEST(ExampleLeases, ALeaseInFlightDuringResetIsDroppedAndLeasedAgain) {
  FakeCoordinator coordinator(100);
  ExampleLeases leases(coordinator.Call(), 1000, 10, 7, /*per_lease=*/2);
  coordinator.during_call = [&leases] { leases.Reset(); };
  // The first lease (blocks 0, 1) comes back after the reset: dropped; the
  // step takes the next lease's first block.
  EXPECT_EQ(MustBlock(leases, 0), 2u);
  EXPECT_EQ(MustBlock(leases, 1), 3u);
  EXPECT_EQ(coordinator.requests.size(), 2u);
}

TEST(ExampleLeases, ReportsOfACallInFlightDuringResetAreNotSentAgain) {
  FakeCoordinator coordinator(100);
  ExampleLeases leases(coordinator.Call(), 1000, 10, 7, /*per_lease=*/1);
  MustBlock(leases, 0);
  leases.Trained(0);
  coordinator.during_call = [&leases] { leases.Reset(); };
  EXPECT_EQ(MustBlock(leases, 1), 2u);  // block 1's lease was dropped
  ASSERT_EQ(coordinator.requests.size(), 3u);
  EXPECT_THAT(Reports(coordinator.requests[1]), ElementsAre(std::make_pair(0u, 0u)));
  EXPECT_THAT(Reports(coordinator.requests[2]), IsEmpty());
}

TEST(ExampleLeases, ReportsOfAFailedCallInFlightDuringResetAreDropped) {
  // The call took the reports, Reset forgot everything while it was in
  // flight, then it failed: the reports must not come back (the
  // coordinator rolled back; a stale report could mark a block it leases
  // again as trained).
  FakeCoordinator coordinator(100);
  ExampleLeases leases(coordinator.Call(), 1000, 10, 7, /*per_lease=*/1);
  MustBlock(leases, 0);
  leases.Trained(0);
  coordinator.during_call = [&leases] { leases.Reset(); };
  coordinator.fail_next = absl::AbortedError("rolled back");
  EXPECT_TRUE(absl::IsAborted(leases.BlockFor(1).status()));
  ASSERT_EQ(coordinator.requests.size(), 2u);
  EXPECT_THAT(Reports(coordinator.requests[1]), ElementsAre(std::make_pair(0u, 0u)));
  EXPECT_TRUE(leases.Flush().ok());
  EXPECT_EQ(coordinator.requests.size(), 2u) << "nothing pending after the reset";
  MustBlock(leases, 0);
  ASSERT_EQ(coordinator.requests.size(), 3u);
  EXPECT_THAT(Reports(coordinator.requests[2]), IsEmpty());
}

// --- Examples and EpochOf ---------------------------------------------------

TEST(ExampleLeases, ExamplesAreTheBlocksPositionsOfItsEpochsShuffledOrder) {
  const uint64_t n = 50, step_examples = 4, seed = 99;
  const uint64_t per_epoch = n / step_examples;  // 12
  FakeCoordinator coordinator(100, per_epoch);
  ExampleLeases leases(coordinator.Call(), n, step_examples, seed);
  MustBlock(leases, 0);  // learns blocks_per_epoch
  for (uint64_t block : {0u, 1u, 11u, 12u, 13u, 30u}) {
    const std::vector<int64_t> order =
        EpochShuffler(seed, PartitionRange{0, static_cast<int64_t>(n)}).Order(block / per_epoch);
    const uint64_t begin = (block % per_epoch) * step_examples;
    const std::vector<int64_t> want(order.begin() + begin, order.begin() + begin + step_examples);
    absl::Span<const int64_t> got = leases.Examples(block);
    EXPECT_THAT(std::vector<int64_t>(got.begin(), got.end()), ElementsAreArray(want))
        << "block " << block;
  }
}

TEST(ExampleLeases, TheBlocksOfAnEpochCoverItsTrainedPositionsExactlyOnce) {
  // 50 examples, 4 a block: 12 blocks an epoch, the last 2 positions of
  // each epoch's order dropped.
  const uint64_t n = 50, step_examples = 4, seed = 3;
  const uint64_t per_epoch = n / step_examples;
  FakeCoordinator coordinator(100, per_epoch);
  ExampleLeases leases(coordinator.Call(), n, step_examples, seed);
  MustBlock(leases, 0);
  for (uint64_t epoch = 0; epoch < 3; ++epoch) {
    std::multiset<int64_t> seen;
    for (uint64_t b = epoch * per_epoch; b < (epoch + 1) * per_epoch; ++b) {
      absl::Span<const int64_t> got = leases.Examples(b);
      EXPECT_EQ(got.size(), step_examples);
      seen.insert(got.begin(), got.end());
    }
    const std::vector<int64_t> order =
        EpochShuffler(seed, PartitionRange{0, static_cast<int64_t>(n)}).Order(epoch);
    const std::multiset<int64_t> trained(order.begin(), order.begin() + per_epoch * step_examples);
    EXPECT_EQ(seen, trained) << "epoch " << epoch;
    EXPECT_EQ(std::set<int64_t>(seen.begin(), seen.end()).size(), per_epoch * step_examples)
        << "no index twice in epoch " << epoch;
  }
}

TEST(ExampleLeases, WhenStepsDivideTheSetEachEpochCoversEveryIndexOnce) {
  const uint64_t n = 48, step_examples = 4;
  FakeCoordinator coordinator(100, n / step_examples);
  ExampleLeases leases(coordinator.Call(), n, step_examples, 11);
  MustBlock(leases, 0);
  for (uint64_t epoch = 0; epoch < 2; ++epoch) {
    std::multiset<int64_t> seen;
    for (uint64_t b = epoch * 12; b < (epoch + 1) * 12; ++b) {
      absl::Span<const int64_t> got = leases.Examples(b);
      seen.insert(got.begin(), got.end());
    }
    std::multiset<int64_t> every;
    for (int64_t i = 0; i < static_cast<int64_t>(n); ++i) every.insert(i);
    EXPECT_EQ(seen, every) << "epoch " << epoch;
  }
}

TEST(ExampleLeases, EpochsAreShuffledDifferently) {
  const uint64_t n = 64, step_examples = 8;
  FakeCoordinator coordinator(100, n / step_examples);
  ExampleLeases leases(coordinator.Call(), n, step_examples, 5);
  MustBlock(leases, 0);
  absl::Span<const int64_t> e0 = leases.Examples(0);
  const std::vector<int64_t> first(e0.begin(), e0.end());
  absl::Span<const int64_t> e1 = leases.Examples(8);  // epoch 1's first block
  EXPECT_NE(std::vector<int64_t>(e1.begin(), e1.end()), first);
  // And back: the same examples again.
  absl::Span<const int64_t> again = leases.Examples(0);
  EXPECT_EQ(std::vector<int64_t>(again.begin(), again.end()), first);
}

TEST(ExampleLeases, EpochOfIsTheBlockOverBlocksPerEpoch) {
  FakeCoordinator coordinator(100, 12);
  ExampleLeases leases(coordinator.Call(), 50, 4, 1);
  EXPECT_EQ(leases.EpochOf(30), 0u) << "0 before the first lease";
  MustBlock(leases, 0);
  EXPECT_EQ(leases.EpochOf(0), 0u);
  EXPECT_EQ(leases.EpochOf(11), 0u);
  EXPECT_EQ(leases.EpochOf(12), 1u);
  EXPECT_EQ(leases.EpochOf(30), 2u);
}

// --- SkipTo: a joiner that skips steps ------------------------------------

TEST(ExampleLeases, TheBlockOfASkippedStepIsTheNextStepsBlock) {
  FakeCoordinator coordinator(100);
  ExampleLeases leases(coordinator.Call(), 1000, 10, 7, /*per_lease=*/4);
  EXPECT_EQ(MustBlock(leases, 10), 0u);
  leases.Trained(10);
  EXPECT_EQ(MustBlock(leases, 11), 1u);  // the loader prepares step 11 ahead
  leases.SkipTo(12);                     // the rank joins the others at step 12
  EXPECT_EQ(MustBlock(leases, 12), 1u);
  EXPECT_EQ(MustBlock(leases, 13), 2u);
  EXPECT_EQ(coordinator.requests.size(), 1u);
}

TEST(ExampleLeases, SkippedBlocksAreTrainedFirstInTheirStepsOrder) {
  FakeCoordinator coordinator(100);
  ExampleLeases leases(coordinator.Call(), 1000, 10, 7, /*per_lease=*/4);
  EXPECT_EQ(MustBlock(leases, 5), 0u);
  EXPECT_EQ(MustBlock(leases, 6), 1u);
  EXPECT_EQ(MustBlock(leases, 9), 2u);  // kept: not skipped
  leases.SkipTo(8);
  EXPECT_EQ(MustBlock(leases, 8), 0u);
  EXPECT_EQ(MustBlock(leases, 9), 2u);
  EXPECT_EQ(MustBlock(leases, 10), 1u);
  EXPECT_EQ(MustBlock(leases, 11), 3u);
}

TEST(ExampleLeases, ABlockForASkippedStepAssignsNone) {
  // The loader may ask for a step the rank has just skipped.
  FakeCoordinator coordinator(100);
  ExampleLeases leases(coordinator.Call(), 1000, 10, 7, /*per_lease=*/4);
  EXPECT_EQ(MustBlock(leases, 0), 0u);
  leases.Trained(0);
  leases.SkipTo(3);
  EXPECT_TRUE(absl::IsFailedPrecondition(leases.BlockFor(1).status()));
  EXPECT_EQ(MustBlock(leases, 3), 1u);
  leases.Trained(3);
  leases.Trained(1);  // no block: nothing reported
  ASSERT_TRUE(leases.Flush().ok());
  EXPECT_THAT(Reports(coordinator.requests.back()),
              ElementsAre(std::make_pair(0u, 0u), std::make_pair(1u, 3u)));
  // A roll-back starts over: no step is skipped.
  leases.Reset();
  EXPECT_TRUE(leases.BlockFor(1).ok());
}

// --- Against the real ledger ----------------------------------------------

// rank's LeaseExamples answered by `ledger` of `shape`, shared by `sharing`
// workers.
ExampleLeases::LeaseCall LedgerCall(ExampleLedger* ledger, const LedgerShape& shape,
                                    uint32_t rank, uint32_t sharing) {
  return [ledger, shape, rank,
          sharing](v1::LeaseExamplesRequest r) -> absl::StatusOr<v1::LeaseExamplesResponse> {
    if (absl::Status s = ledger->Size(shape); !s.ok()) return s;
    bool exhausted = false;
    absl::StatusOr<std::vector<uint64_t>> blocks =
        ledger->Lease(rank, std::vector<v1::TrainedBlock>(r.trained().begin(), r.trained().end()),
                      r.want(), &exhausted, sharing);
    if (!blocks.ok()) return blocks.status();
    v1::LeaseExamplesResponse response;
    response.mutable_blocks()->Add(blocks->begin(), blocks->end());
    response.set_blocks_per_epoch(ledger->Progress().blocks_per_epoch());
    response.set_exhausted(exhausted);
    return response;
  };
}

// Worker w of two takes steps in turn, from (*steps)[w], until the ledger
// has no block left for it, then flushes its reports. `train(w, block,
// leases, step)` trains one block: it calls Trained and moves *step on.
void TrainInTurns(
    ExampleLeases* w0, ExampleLeases* w1, std::vector<uint64_t>* steps,
    const std::function<void(int, uint64_t, ExampleLeases&, uint64_t*)>& train) {
  bool done[2] = {false, false};
  while (!done[0] || !done[1]) {
    for (int w = 0; w < 2; ++w) {
      if (done[w]) continue;
      ExampleLeases& leases = w == 0 ? *w0 : *w1;
      absl::StatusOr<uint64_t> block = leases.BlockFor((*steps)[w]);
      if (absl::IsOutOfRange(block.status())) {
        ASSERT_TRUE(leases.Flush().ok());
        done[w] = true;
        continue;
      }
      ASSERT_TRUE(block.ok()) << block.status();
      train(w, *block, leases, &(*steps)[w]);
    }
  }
}

TEST(ExampleLeases, WorkersLeasingFromTheLedgerTrainEveryExampleOfEveryEpochOnce) {
  // Two workers on one ExampleLedger, taking steps in turn, each reporting
  // with its next lease and flushing at the end.
  v1::JobConfig config = DefaultJobConfig();
  config.set_num_workers(2);
  config.set_max_workers(3);
  config.set_batch_size(5);
  config.set_steps(0);
  config.set_epochs(3);
  const uint64_t n = 52;
  const uint64_t step_examples = StepExamples(config);
  const LedgerShape shape = ExampleLedgerShape(config, n);
  ASSERT_GT(shape.blocks_per_epoch, 1u);
  ExampleLedger ledger;
  ExampleLeases w0(LedgerCall(&ledger, shape, 0, 2), n, step_examples, config.seed(), 3);
  ExampleLeases w1(LedgerCall(&ledger, shape, 1, 2), n, step_examples, config.seed(), 3);
  std::vector<std::multiset<int64_t>> trained(shape.total_blocks / shape.blocks_per_epoch);
  std::vector<uint64_t> steps = {0, 0};
  TrainInTurns(&w0, &w1, &steps,
               [&](int, uint64_t block, ExampleLeases& leases, uint64_t* step) {
                 absl::Span<const int64_t> examples = leases.Examples(block);
                 trained[leases.EpochOf(block)].insert(examples.begin(), examples.end());
                 leases.Trained((*step)++);
               });
  const v1::DataProgress progress = ledger.Progress();
  EXPECT_EQ(progress.consumed(), shape.total_blocks);
  EXPECT_EQ(progress.leased(), 0u);
  EXPECT_EQ(progress.refused_reports(), 0u);
  for (size_t epoch = 0; epoch < trained.size(); ++epoch) {
    const std::vector<int64_t> order =
        EpochShuffler(config.seed(), PartitionRange{0, static_cast<int64_t>(n)}).Order(epoch);
    EXPECT_EQ(trained[epoch],
              std::multiset<int64_t>(order.begin(),
                                     order.begin() + shape.blocks_per_epoch * step_examples))
        << "epoch " << epoch;
  }
  EXPECT_LE(steps[0] > steps[1] ? steps[0] - steps[1] : steps[1] - steps[0], 1u)
      << "the workers ran out within a step of each other";
}

// The elastic drill's defect: a joiner prepared its next step's block
// ahead, then skipped that step to join the others. The block is trained
// at the step it goes on at; every block of every epoch is trained once.
TEST(ExampleLeases, AJoinerThatSkipsAPreparedStepStillTrainsEveryBlockOnce) {
  v1::JobConfig config = DefaultJobConfig();
  config.set_num_workers(2);
  config.set_max_workers(3);
  config.set_batch_size(5);
  config.set_steps(0);
  config.set_epochs(2);
  const uint64_t n = 60;
  const LedgerShape shape = ExampleLedgerShape(config, n);
  ExampleLedger ledger;
  ExampleLeases w0(LedgerCall(&ledger, shape, 0, 2), n, StepExamples(config), config.seed(), 2);
  ExampleLeases w1(LedgerCall(&ledger, shape, 1, 2), n, StepExamples(config), config.seed(), 2);
  std::multiset<uint64_t> trained;
  std::vector<uint64_t> steps = {0, 4};  // rank 1 joins at step 4
  bool skipped = false;
  TrainInTurns(&w0, &w1, &steps,
               [&](int w, uint64_t block, ExampleLeases& leases, uint64_t* step) {
                 trained.insert(block);
                 leases.Trained((*step)++);
                 if (w == 1 && !skipped) {
                   // Its gradient came late; the loader had the next step's
                   // block already; the rank goes on two steps further.
                   ASSERT_TRUE(leases.BlockFor(*step).ok());
                   leases.SkipTo(*step + 2);
                   *step += 2;
                   skipped = true;
                 }
               });
  const v1::DataProgress progress = ledger.Progress();
  EXPECT_EQ(progress.consumed(), shape.total_blocks);
  EXPECT_EQ(progress.leased(), 0u);
  EXPECT_EQ(trained.size(), shape.total_blocks);
  EXPECT_EQ(std::set<uint64_t>(trained.begin(), trained.end()).size(), shape.total_blocks)
      << "a block trained twice";
}

// After a coordinator take-over, the heartbeat asks for a claim while a
// lease call (retried since before the take-over) may still be in flight:
// the claim carries that call's reports too, and the blocks still held.
TEST(ExampleLeases, AClaimMadeWhileACallIsInFlightCarriesItsReportsAndTheHeldBlocks) {
  FakeCoordinator coordinator(100);
  ExampleLeases leases(coordinator.Call(), 1000, 10, 7, /*per_lease=*/2);
  MustBlock(leases, 0);  // leases 0 and 1
  MustBlock(leases, 1);
  leases.Trained(0);
  leases.Trained(1);
  coordinator.during_call = [&leases] { EXPECT_TRUE(leases.Claim().ok()); };
  MustBlock(leases, 2);  // a lease carrying 0 and 1; the claim comes inside it
  ASSERT_EQ(coordinator.requests.size(), 3u);
  const v1::LeaseExamplesRequest& claim = coordinator.requests[2];
  EXPECT_TRUE(claim.claim());
  EXPECT_EQ(claim.want(), 0u);
  EXPECT_THAT(Reports(claim), ElementsAre(std::make_pair(0u, 0u), std::make_pair(1u, 1u)));
  EXPECT_FALSE(coordinator.requests[1].claim());
  // Once answered, the reports are sent again only as the recent ones.
  leases.Trained(2);
  MustBlock(leases, 3);
  MustBlock(leases, 4);
  const v1::LeaseExamplesRequest& next = coordinator.requests.back();
  EXPECT_THAT(Reports(next), ElementsAre(std::make_pair(0u, 0u), std::make_pair(1u, 1u),
                                         std::make_pair(2u, 2u)));
  EXPECT_THAT(next.held(), ElementsAre(3u));
}

}  // namespace
}  // namespace grps
