#include "coordinator/example_ledger.h"

#include <algorithm>
#include <cstdint>
#include <deque>
#include <map>
#include <set>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "gmock/gmock.h"
#include "google/protobuf/util/message_differencer.h"
#include "gtest/gtest.h"
#include "job/job_config.h"
#include "proto/grps.pb.h"

namespace grps {
namespace {

using ::google::protobuf::util::MessageDifferencer;
using ::testing::ElementsAre;
using ::testing::IsEmpty;

LedgerShape Shape(uint64_t blocks_per_epoch, uint64_t total_blocks) {
  LedgerShape shape;
  shape.blocks_per_epoch = blocks_per_epoch;
  shape.total_blocks = total_blocks;
  return shape;
}

v1::TrainedBlock Trained(uint64_t block, uint64_t step) {
  v1::TrainedBlock t;
  t.set_block(block);
  t.set_step(step);
  return t;
}

v1::ExampleLedgerState Export(const ExampleLedger& ledger) {
  v1::ExampleLedgerState state;
  ledger.ExportTo(&state);
  return state;
}

// Reports `trained` for `rank` and leases up to `want` blocks; the call must
// succeed.
std::vector<uint64_t> MustLease(ExampleLedger& ledger, uint32_t rank,
                                const std::vector<v1::TrainedBlock>& trained, uint32_t want,
                                bool* exhausted = nullptr) {
  bool ignored = false;
  absl::StatusOr<std::vector<uint64_t>> leased =
      ledger.Lease(rank, trained, want, exhausted != nullptr ? exhausted : &ignored);
  EXPECT_TRUE(leased.ok()) << leased.status();
  return leased.ok() ? *leased : std::vector<uint64_t>{};
}

ExampleLedger SizedLedger(uint64_t blocks_per_epoch, uint64_t total_blocks) {
  ExampleLedger ledger;
  EXPECT_TRUE(ledger.Size(Shape(blocks_per_epoch, total_blocks)).ok());
  return ledger;
}

// The trained blocks of an exported state, ascending (duplicates kept).
std::vector<uint64_t> TrainedBlocks(const v1::ExampleLedgerState& state) {
  std::vector<uint64_t> blocks;
  for (const v1::TrainedBlock& t : state.trained()) blocks.push_back(t.block());
  std::sort(blocks.begin(), blocks.end());
  return blocks;
}

std::vector<uint64_t> Range(uint64_t begin, uint64_t end) {
  std::vector<uint64_t> v;
  for (uint64_t b = begin; b < end; ++b) v.push_back(b);
  return v;
}

// --- Size ---------------------------------------------------------------

TEST(ExampleLedger, LeaseBeforeSizeIsFailedPreconditionAndLeasesNothing) {
  ExampleLedger ledger;
  EXPECT_FALSE(ledger.sized());
  bool exhausted = true;
  absl::StatusOr<std::vector<uint64_t>> leased = ledger.Lease(0, {}, 4, &exhausted);
  EXPECT_EQ(leased.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_FALSE(exhausted);
  EXPECT_FALSE(ledger.sized());
  EXPECT_EQ(ledger.LeasedBy(0), 0u);
  EXPECT_EQ(ledger.Progress().leased(), 0u);
}

TEST(ExampleLedger, SizeWithAnEqualShapeIsOkAndWithAnotherShapeFailedPrecondition) {
  ExampleLedger ledger;
  ASSERT_TRUE(ledger.Size(Shape(4, 12)).ok());
  EXPECT_TRUE(ledger.sized());
  EXPECT_TRUE(ledger.Size(Shape(4, 12)).ok());
  EXPECT_EQ(ledger.Size(Shape(5, 12)).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(ledger.Size(Shape(4, 13)).code(), absl::StatusCode::kFailedPrecondition);
  // The first shape stays.
  const v1::DataProgress p = ledger.Progress();
  EXPECT_EQ(p.blocks_per_epoch(), 4u);
  EXPECT_EQ(p.total_blocks(), 12u);
}

TEST(ExampleLedger, AnEmptyShapeIsInvalidArgumentAndLeavesTheLedgerUnsized) {
  ExampleLedger ledger;
  EXPECT_EQ(ledger.Size(Shape(0, 12)).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ledger.Size(Shape(4, 0)).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_FALSE(ledger.sized());
  ASSERT_TRUE(ledger.Size(Shape(4, 12)).ok());
  EXPECT_EQ(ledger.Size(Shape(0, 0)).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ledger.Progress().total_blocks(), 12u);
}

// --- Leasing ------------------------------------------------------------

TEST(ExampleLedger, LeasesAreHandedOutInOrderAcrossRanks) {
  ExampleLedger ledger = SizedLedger(3, 9);
  EXPECT_THAT(MustLease(ledger, 0, {}, 2), ElementsAre(0, 1));
  EXPECT_THAT(MustLease(ledger, 1, {}, 3), ElementsAre(2, 3, 4));
  EXPECT_THAT(MustLease(ledger, 0, {}, 1), ElementsAre(5));
  EXPECT_EQ(ledger.LeasedBy(0), 3u);
  EXPECT_EQ(ledger.LeasedBy(1), 3u);
  EXPECT_EQ(ledger.LeasedBy(2), 0u);
  EXPECT_EQ(ledger.Progress().leased(), 6u);
  EXPECT_EQ(ledger.Progress().consumed(), 0u);
}

TEST(ExampleLedger, ExhaustedOnlyWhenItWantedSomeAndNoneIsLeft) {
  ExampleLedger ledger = SizedLedger(3, 6);
  bool exhausted = true;
  EXPECT_THAT(MustLease(ledger, 0, {}, 0, &exhausted), IsEmpty());
  EXPECT_FALSE(exhausted) << "want 0 only reports";
  EXPECT_THAT(MustLease(ledger, 0, {}, 4, &exhausted), ElementsAre(0, 1, 2, 3));
  EXPECT_FALSE(exhausted);
  // Fewer left than wanted: what is left, not exhausted.
  EXPECT_THAT(MustLease(ledger, 1, {}, 4, &exhausted), ElementsAre(4, 5));
  EXPECT_FALSE(exhausted);
  EXPECT_THAT(MustLease(ledger, 1, {}, 1, &exhausted), IsEmpty());
  EXPECT_TRUE(exhausted);
  EXPECT_THAT(MustLease(ledger, 1, {}, 0, &exhausted), IsEmpty());
  EXPECT_FALSE(exhausted) << "want 0 is never exhausted";
  // A block that comes back makes it leasable again.
  ledger.ReturnLeases(1);
  EXPECT_THAT(MustLease(ledger, 2, {}, 1, &exhausted), ElementsAre(4));
  EXPECT_FALSE(exhausted);
}

TEST(ExampleLedger, WantUpToKMaxWantIsAccepted) {
  ExampleLedger ledger = SizedLedger(100, 200);
  EXPECT_EQ(MustLease(ledger, 0, {}, ExampleLedger::kMaxWant).size(), ExampleLedger::kMaxWant);
}

// --- Reports ------------------------------------------------------------

TEST(ExampleLedger, AReportOfABlockTrainedMovesItFromLeasedToConsumed) {
  ExampleLedger ledger = SizedLedger(4, 8);
  ASSERT_THAT(MustLease(ledger, 0, {}, 3), ElementsAre(0, 1, 2));
  EXPECT_EQ(ledger.Progress().leased(), 3u);
  EXPECT_EQ(ledger.Progress().consumed(), 0u);

  EXPECT_THAT(MustLease(ledger, 0, {Trained(0, 10), Trained(1, 11)}, 0), IsEmpty());
  const v1::DataProgress p = ledger.Progress();
  EXPECT_EQ(p.consumed(), 2u);
  EXPECT_EQ(p.leased(), 1u);
  EXPECT_EQ(p.refused_reports(), 0u);
  EXPECT_EQ(ledger.LeasedBy(0), 1u);

  const v1::ExampleLedgerState state = Export(ledger);
  ASSERT_EQ(state.trained_size(), 2);
  EXPECT_EQ(state.trained(0).block(), 0u);
  EXPECT_EQ(state.trained(0).step(), 10u);
  EXPECT_EQ(state.trained(1).block(), 1u);
  EXPECT_EQ(state.trained(1).step(), 11u);
  EXPECT_THAT(state.trained_ranks(), ElementsAre(0u, 0u));
  EXPECT_THAT(state.leased_blocks(), ElementsAre(2u));
}

TEST(ExampleLedger, AReportIsRecordedBeforeTheNewLeasesInTheSameRequest) {
  ExampleLedger ledger = SizedLedger(2, 2);
  ASSERT_THAT(MustLease(ledger, 0, {}, 2), ElementsAre(0, 1));
  bool exhausted = false;
  EXPECT_THAT(MustLease(ledger, 0, {Trained(0, 0), Trained(1, 1)}, 1, &exhausted), IsEmpty());
  EXPECT_TRUE(exhausted);
  EXPECT_EQ(ledger.Progress().consumed(), 2u);
  EXPECT_EQ(ledger.Progress().leased(), 0u);
}

TEST(ExampleLedger, ARetriedReportIsIgnoredNotRefused) {
  ExampleLedger ledger = SizedLedger(4, 8);
  ASSERT_THAT(MustLease(ledger, 0, {}, 2), ElementsAre(0, 1));
  MustLease(ledger, 0, {Trained(0, 5)}, 0);
  const v1::ExampleLedgerState before = Export(ledger);

  // The same report again (its response was lost), and once more within one
  // request.
  MustLease(ledger, 0, {Trained(0, 5)}, 0);
  MustLease(ledger, 0, {Trained(0, 5), Trained(0, 5)}, 0);
  EXPECT_TRUE(MessageDifferencer::Equals(Export(ledger), before))
      << Export(ledger).ShortDebugString() << "\nbefore: " << before.ShortDebugString();
  EXPECT_EQ(ledger.Progress().refused_reports(), 0u);
  EXPECT_EQ(ledger.Progress().consumed(), 1u);
  EXPECT_EQ(ledger.Progress().leased(), 1u);
}

TEST(ExampleLedger, AReportForABlockTheRankDoesNotHoldIsCountedAndChangesNothingElse) {
  ExampleLedger ledger = SizedLedger(4, 12);
  ASSERT_THAT(MustLease(ledger, 0, {}, 2), ElementsAre(0, 1));
  ASSERT_THAT(MustLease(ledger, 1, {}, 3), ElementsAre(2, 3, 4));
  MustLease(ledger, 1, {Trained(2, 0)}, 0);
  ledger.ReturnLeases(1);  // 3 and 4 are free now
  v1::ExampleLedgerState before = Export(ledger);
  const v1::DataProgress progress_before = ledger.Progress();

  struct Case {
    const char* what;
    v1::TrainedBlock report;
  };
  const Case cases[] = {
      {"leased by another rank", Trained(0, 1)},
      {"trained by another rank", Trained(2, 1)},
      {"came back and is free", Trained(3, 1)},
      {"never handed out", Trained(9, 1)},
  };
  uint64_t refused = 0;
  for (const Case& c : cases) {
    SCOPED_TRACE(c.what);
    EXPECT_THAT(MustLease(ledger, 2, {c.report}, 0), IsEmpty());
    ++refused;
    v1::ExampleLedgerState after = Export(ledger);
    EXPECT_EQ(after.refused_reports(), before.refused_reports() + refused);
    after.set_refused_reports(before.refused_reports());
    EXPECT_TRUE(MessageDifferencer::Equals(after, before))
        << after.ShortDebugString() << "\nbefore: " << before.ShortDebugString();
    v1::DataProgress p = ledger.Progress();
    EXPECT_EQ(p.refused_reports(), progress_before.refused_reports() + refused);
    p.set_refused_reports(progress_before.refused_reports());
    EXPECT_TRUE(MessageDifferencer::Equals(p, progress_before)) << p.ShortDebugString();
  }
  EXPECT_EQ(ledger.LeasedBy(0), 2u);
  EXPECT_EQ(ledger.LeasedBy(2), 0u);
}

TEST(ExampleLedger, ARefusedReportDoesNotStopTheOthersInTheSameRequest) {
  ExampleLedger ledger = SizedLedger(4, 8);
  ASSERT_THAT(MustLease(ledger, 0, {}, 2), ElementsAre(0, 1));
  ASSERT_THAT(MustLease(ledger, 1, {}, 1), ElementsAre(2));
  EXPECT_THAT(MustLease(ledger, 0, {Trained(2, 0), Trained(0, 0), Trained(1, 1)}, 1),
              ElementsAre(3));
  const v1::DataProgress p = ledger.Progress();
  EXPECT_EQ(p.refused_reports(), 1u);
  EXPECT_EQ(p.consumed(), 2u);
  EXPECT_EQ(p.leased(), 2u);  // 2 (rank 1) and 3 (rank 0)
  EXPECT_EQ(ledger.LeasedBy(1), 1u);
}

// --- Returned leases ----------------------------------------------------

TEST(ExampleLedger, ABlockOfALeavingWorkerIsLeasedAgainBeforeAnyNewBlock) {
  ExampleLedger ledger = SizedLedger(10, 20);
  ASSERT_THAT(MustLease(ledger, 0, {}, 3), ElementsAre(0, 1, 2));
  ASSERT_THAT(MustLease(ledger, 1, {}, 3), ElementsAre(3, 4, 5));
  ASSERT_THAT(MustLease(ledger, 2, {}, 3), ElementsAre(6, 7, 8));
  MustLease(ledger, 1, {Trained(3, 0)}, 0);
  ledger.ReturnLeases(2);  // 6, 7, 8 come back
  ledger.ReturnLeases(1);  // 4, 5 come back; 3 stays trained
  EXPECT_EQ(ledger.LeasedBy(1), 0u);
  EXPECT_EQ(ledger.LeasedBy(2), 0u);
  v1::DataProgress p = ledger.Progress();
  EXPECT_EQ(p.returned(), 5u);
  EXPECT_EQ(p.leased(), 3u);
  EXPECT_EQ(p.consumed(), 1u);

  // Lowest first, then new blocks; ascending in one response.
  EXPECT_THAT(MustLease(ledger, 0, {}, 2), ElementsAre(4, 5));
  EXPECT_THAT(MustLease(ledger, 3, {}, 5), ElementsAre(6, 7, 8, 9, 10));
  p = ledger.Progress();
  EXPECT_EQ(p.returned(), 5u);
  EXPECT_EQ(p.leased(), 10u);
  EXPECT_EQ(ledger.LeasedBy(0), 5u);
  EXPECT_EQ(ledger.LeasedBy(3), 5u);
}

TEST(ExampleLedger, ReturningTheLeasesOfARankThatHoldsNoneChangesNothing) {
  ExampleLedger ledger = SizedLedger(4, 8);
  ASSERT_THAT(MustLease(ledger, 0, {}, 2), ElementsAre(0, 1));
  const v1::ExampleLedgerState before = Export(ledger);
  ledger.ReturnLeases(7);
  MustLease(ledger, 0, {Trained(0, 0), Trained(1, 1)}, 0);
  const v1::ExampleLedgerState trained = Export(ledger);
  ledger.ReturnLeases(0);  // its blocks are all trained
  EXPECT_TRUE(MessageDifferencer::Equals(Export(ledger), trained));
  EXPECT_EQ(ledger.Progress().returned(), 0u);
  EXPECT_EQ(before.returned(), 0u);
}

TEST(ExampleLedger, AReportAfterTheRanksLeasesCameBackIsRefused) {
  ExampleLedger ledger = SizedLedger(4, 8);
  ASSERT_THAT(MustLease(ledger, 0, {}, 2), ElementsAre(0, 1));
  ledger.ReturnLeases(0);  // declared dead, but it was training block 0
  ASSERT_THAT(MustLease(ledger, 1, {}, 1), ElementsAre(0));
  MustLease(ledger, 0, {Trained(0, 0)}, 0);
  const v1::DataProgress p = ledger.Progress();
  EXPECT_EQ(p.refused_reports(), 1u);
  EXPECT_EQ(p.consumed(), 0u);
  EXPECT_EQ(ledger.LeasedBy(1), 1u);
  // Rank 1, which holds it, can report it.
  MustLease(ledger, 1, {Trained(0, 0)}, 0);
  EXPECT_EQ(ledger.Progress().consumed(), 1u);
}

// --- An elastic run -----------------------------------------------------

// Workers that lease a few blocks at a time, train one per step and report
// what they trained when they lease again.
class ElasticRun {
 public:
  explicit ElasticRun(ExampleLedger* ledger) : ledger_(ledger) {}

  void Join(uint32_t rank) { workers_[rank]; }

  // The worker reports what it trained and leaves with the leases it did
  // not train yet; returns how many it gave back.
  uint64_t Leave(uint32_t rank) {
    Worker& w = workers_.at(rank);
    MustLease(*ledger_, rank, w.unreported, 0);
    const uint64_t held = ledger_->LeasedBy(rank);
    EXPECT_EQ(held, w.held.size());
    ledger_->ReturnLeases(rank);
    workers_.erase(rank);
    return held;
  }

  // One step of every live worker; false when none trained.
  bool Step() {
    bool any = false;
    for (auto& [rank, w] : workers_) {
      if (w.held.empty()) {
        bool exhausted = false;
        std::vector<uint64_t> leased = MustLease(*ledger_, rank, w.unreported, kWant, &exhausted);
        w.unreported.clear();
        EXPECT_TRUE(std::is_sorted(leased.begin(), leased.end()));
        EXPECT_EQ(exhausted, leased.empty());
        w.held.insert(w.held.end(), leased.begin(), leased.end());
      }
      if (w.held.empty()) continue;
      w.unreported.push_back(Trained(w.held.front(), w.step++));
      trained_[w.held.front()]++;
      w.held.pop_front();
      any = true;
    }
    return any;
  }

  // Blocks trained (their gradient pushed), each as often as it was.
  const std::map<uint64_t, int>& trained() const { return trained_; }

 private:
  static constexpr uint32_t kWant = 3;
  struct Worker {
    std::deque<uint64_t> held;
    std::vector<v1::TrainedBlock> unreported;
    uint64_t step = 0;
  };

  ExampleLedger* ledger_;
  std::map<uint32_t, Worker> workers_;
  std::map<uint64_t, int> trained_;
};

TEST(ExampleLedger, AnElasticRunTrainsEveryBlockOfEveryEpochExactlyOnce) {
  constexpr uint64_t kPerEpoch = 10;
  constexpr uint64_t kTotal = 3 * kPerEpoch;
  ExampleLedger ledger = SizedLedger(kPerEpoch, kTotal);
  ElasticRun run(&ledger);

  run.Join(0);
  run.Join(1);
  for (int s = 0; s < 2; ++s) ASSERT_TRUE(run.Step());
  run.Join(2);
  run.Join(3);
  for (int s = 0; s < 4; ++s) ASSERT_TRUE(run.Step());
  // Two workers leave with leases they did not train.
  ASSERT_GT(ledger.LeasedBy(1), 0u);
  ASSERT_GT(ledger.LeasedBy(3), 0u);
  uint64_t returned = run.Leave(1);
  returned += run.Leave(3);
  EXPECT_EQ(ledger.Progress().returned(), returned);
  int steps = 0;
  while (run.Step()) ASSERT_LT(++steps, 1000);
  // Leave the last two too, so that their final reports are recorded.
  EXPECT_EQ(run.Leave(0), 0u);
  EXPECT_EQ(run.Leave(2), 0u);

  for (const auto& [block, times] : run.trained())
    EXPECT_EQ(times, 1) << "block " << block << " was trained " << times << " times";
  EXPECT_EQ(run.trained().size(), kTotal);

  const v1::ExampleLedgerState state = Export(ledger);
  EXPECT_EQ(TrainedBlocks(state), Range(0, kTotal));
  EXPECT_EQ(state.leased_blocks_size(), 0);
  EXPECT_EQ(state.free_size(), 0);
  const v1::DataProgress p = ledger.Progress();
  EXPECT_EQ(p.consumed(), kTotal);
  EXPECT_EQ(p.leased(), 0u);
  EXPECT_EQ(p.returned(), returned);
  EXPECT_EQ(p.refused_reports(), 0u);
  EXPECT_EQ(p.epoch(), 2u);
  bool exhausted = false;
  EXPECT_THAT(MustLease(ledger, 5, {}, 1, &exhausted), IsEmpty());
  EXPECT_TRUE(exhausted);
}

// --- Roll-back ----------------------------------------------------------

TEST(ExampleLedger, RollBackFreesBlocksTrainedAtOrAfterTheRanksResumeStepAndEveryLease) {
  ExampleLedger ledger = SizedLedger(10, 10);
  ASSERT_THAT(MustLease(ledger, 0, {}, 4), ElementsAre(0, 1, 2, 3));
  ASSERT_THAT(MustLease(ledger, 1, {}, 3), ElementsAre(4, 5, 6));
  ASSERT_THAT(MustLease(ledger, 2, {}, 1), ElementsAre(7));
  MustLease(ledger, 0, {Trained(0, 0), Trained(1, 1), Trained(2, 2)}, 0);
  MustLease(ledger, 1, {Trained(4, 0), Trained(5, 1)}, 0);
  MustLease(ledger, 2, {Trained(7, 5)}, 0);
  ASSERT_THAT(MustLease(ledger, 0, {}, 1), ElementsAre(8));
  ASSERT_EQ(ledger.Progress().consumed(), 6u);
  ASSERT_EQ(ledger.Progress().leased(), 3u);  // 3, 6, 8

  // Rank 0 resumes at step 2, rank 1 at step 1, rank 2 (past the vector's
  // end) at step 0.
  ledger.RollBack({2, 1});
  v1::DataProgress p = ledger.Progress();
  EXPECT_EQ(p.consumed(), 3u);  // 0, 1 (rank 0) and 4 (rank 1)
  EXPECT_EQ(p.leased(), 0u);
  EXPECT_EQ(ledger.LeasedBy(0), 0u);
  EXPECT_EQ(ledger.LeasedBy(1), 0u);
  EXPECT_EQ(ledger.LeasedBy(2), 0u);
  const v1::ExampleLedgerState state = Export(ledger);
  EXPECT_EQ(TrainedBlocks(state), (std::vector<uint64_t>{0, 1, 4}));
  EXPECT_THAT(state.free(), ElementsAre(2u, 3u, 5u, 6u, 7u, 8u));
  EXPECT_EQ(state.next_new(), 9u);

  // The freed blocks are leased again first.
  bool exhausted = false;
  EXPECT_THAT(MustLease(ledger, 3, {}, 10, &exhausted), ElementsAre(2, 3, 5, 6, 7, 8, 9));
  EXPECT_FALSE(exhausted);
  // A block trained before the resume step stays trained: its report again
  // is a retry; a report of a block whose lease the roll-back took is refused.
  MustLease(ledger, 0, {Trained(0, 0)}, 0);
  EXPECT_EQ(ledger.Progress().refused_reports(), 0u);
  MustLease(ledger, 0, {Trained(3, 2)}, 0);
  p = ledger.Progress();
  EXPECT_EQ(p.refused_reports(), 1u);
  EXPECT_EQ(p.consumed(), 3u);
  EXPECT_EQ(p.leased(), 7u);
}

TEST(ExampleLedger, RollBackToStepZeroFreesEverything) {
  ExampleLedger ledger = SizedLedger(2, 4);
  ASSERT_THAT(MustLease(ledger, 0, {}, 2), ElementsAre(0, 1));
  ASSERT_THAT(MustLease(ledger, 1, {}, 2), ElementsAre(2, 3));
  MustLease(ledger, 0, {Trained(0, 0), Trained(1, 1)}, 0);
  MustLease(ledger, 1, {Trained(2, 0)}, 0);
  ASSERT_EQ(ledger.Progress().epoch(), 1u);
  ledger.RollBack({});
  const v1::DataProgress p = ledger.Progress();
  EXPECT_EQ(p.consumed(), 0u);
  EXPECT_EQ(p.leased(), 0u);
  EXPECT_EQ(p.epoch(), 0u);
  EXPECT_THAT(MustLease(ledger, 1, {}, 4), ElementsAre(0, 1, 2, 3));
}

// --- Invalid input ------------------------------------------------------

TEST(ExampleLedger, InvalidLeaseRequestsAreInvalidArgumentAndChangeNothing) {
  ExampleLedger ledger = SizedLedger(4, 8);
  ASSERT_THAT(MustLease(ledger, 0, {}, 3), ElementsAre(0, 1, 2));
  MustLease(ledger, 0, {Trained(0, 0)}, 0);
  const v1::ExampleLedgerState before = Export(ledger);
  const v1::DataProgress progress_before = ledger.Progress();

  // Each holds a valid report of a block rank 0 holds (block 1), which must
  // not be recorded either.
  struct Case {
    const char* what;
    std::vector<v1::TrainedBlock> trained;
    uint32_t want;
  };
  std::vector<Case> cases = {
      {"want > kMaxWant", {Trained(1, 1)}, ExampleLedger::kMaxWant + 1},
      {"a block past the last", {Trained(1, 1), Trained(8, 2)}, 1},
      {"a block far past the last", {Trained(1, 1), Trained(~uint64_t{0}, 2)}, 1},
      {"more than kMaxReports reports",
       std::vector<v1::TrainedBlock>(ExampleLedger::kMaxReports + 1, Trained(1, 1)),
       1},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.what);
    bool exhausted = true;
    absl::StatusOr<std::vector<uint64_t>> leased = ledger.Lease(0, c.trained, c.want, &exhausted);
    EXPECT_EQ(leased.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_FALSE(exhausted);
    EXPECT_TRUE(MessageDifferencer::Equals(Export(ledger), before))
        << Export(ledger).ShortDebugString() << "\nbefore: " << before.ShortDebugString();
    EXPECT_TRUE(MessageDifferencer::Equals(ledger.Progress(), progress_before))
        << ledger.Progress().ShortDebugString();
  }
  EXPECT_EQ(ledger.LeasedBy(0), 2u);
}

TEST(ExampleLedger, ExactlyKMaxReportsReportsAreAccepted) {
  ExampleLedger ledger = SizedLedger(4, 8);
  ASSERT_THAT(MustLease(ledger, 0, {}, 1), ElementsAre(0));
  // The first records the block; the others are retries.
  std::vector<v1::TrainedBlock> reports(ExampleLedger::kMaxReports, Trained(0, 0));
  EXPECT_THAT(MustLease(ledger, 0, reports, 1), ElementsAre(1));
  const v1::DataProgress p = ledger.Progress();
  EXPECT_EQ(p.consumed(), 1u);
  EXPECT_EQ(p.refused_reports(), 0u);
}

// --- What a rank may hold, and what a request may be ---------------------

TEST(ExampleLedger, ARankHoldsAtMostKMaxHeldUnreportedBlocksAndIsLeasedMoreOnceItReports) {
  ExampleLedger ledger = SizedLedger(1000, 100000);
  std::vector<uint64_t> held;
  for (int i = 0; i < 10; ++i) {
    bool exhausted = true;
    for (uint64_t b : MustLease(ledger, 0, {}, ExampleLedger::kMaxWant, &exhausted))
      held.push_back(b);
    EXPECT_FALSE(exhausted) << "blocks are left: the rank holds too many";
  }
  EXPECT_EQ(held.size(), ExampleLedger::kMaxHeld);
  EXPECT_EQ(ledger.LeasedBy(0), ExampleLedger::kMaxHeld);
  // Another rank is not held back by rank 0's.
  EXPECT_EQ(MustLease(ledger, 1, {}, ExampleLedger::kMaxWant).size(), ExampleLedger::kMaxWant);
  // Eight reported make room for eight.
  std::vector<v1::TrainedBlock> reports;
  for (int i = 0; i < 8; ++i) reports.push_back(Trained(held[i], i));
  EXPECT_EQ(MustLease(ledger, 0, reports, ExampleLedger::kMaxWant).size(), 8u);
}

// The bounded form of issue 39's 30 s lease loop (want 64, never a report),
// which grew a ledger of 5.8e17 blocks by 4.6 M blocks: a few thousand calls
// leave it and its export where the first two did.
TEST(ExampleLedger, ALeaseLoopThatNeverReportsLeavesTheLedgerAsItWas) {
  ExampleLedger ledger = SizedLedger(uint64_t{1} << 30, uint64_t{1} << 32);
  MustLease(ledger, 0, {}, ExampleLedger::kMaxWant);
  MustLease(ledger, 0, {}, ExampleLedger::kMaxWant);
  const v1::ExampleLedgerState full = Export(ledger);
  for (int i = 0; i < 5000; ++i) ASSERT_THAT(MustLease(ledger, 0, {}, 64), IsEmpty()) << i;
  EXPECT_TRUE(MessageDifferencer::Equals(Export(ledger), full));
  EXPECT_EQ(ledger.Progress().leased(), ExampleLedger::kMaxHeld);
}

TEST(ExampleLedger, ShapeForRefusesNoOrAnAbsurdTrainingSetAndOneOverTheJobsLimit) {
  v1::JobConfig config = DefaultJobConfig();  // batch 64, 3 epochs
  absl::StatusOr<LedgerShape> shape = ExampleLedger::ShapeFor(config, 2000);
  ASSERT_TRUE(shape.ok()) << shape.status();
  EXPECT_EQ(shape->blocks_per_epoch, 31u);
  EXPECT_EQ(shape->total_blocks, 93u);
  auto refused = [&](uint64_t train_examples) {
    absl::StatusOr<LedgerShape> s = ExampleLedger::ShapeFor(config, train_examples);
    EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument) << train_examples;
    return std::string(s.status().message());
  };
  EXPECT_THAT(refused(0), ::testing::HasSubstr("train_examples must be"));
  EXPECT_THAT(refused(~uint64_t{0}),
              ::testing::HasSubstr("is more than 1099511627776 (2^40)"));
  EXPECT_THAT(refused(ExampleLedger::kMaxTrainExamples),
              ::testing::HasSubstr("more than 4294967296 blocks"))
      << "2^34 blocks an epoch";
  config.set_batch_size(1024);
  EXPECT_TRUE(ExampleLedger::ShapeFor(config, ExampleLedger::kMaxTrainExamples).ok())
      << "2^30 blocks an epoch";
  config = DefaultJobConfig();
  config.mutable_dataset()->set_train_limit(1000);
  EXPECT_THAT(refused(2000), ::testing::HasSubstr("more than the job's train_limit 1000"));
  EXPECT_TRUE(ExampleLedger::ShapeFor(config, 1000).ok());
  // Blocks per epoch x epochs, and steps x workers, past 2^32 or 2^64.
  config = DefaultJobConfig();
  config.set_epochs(~uint32_t{0});
  EXPECT_THAT(refused(ExampleLedger::kMaxTrainExamples),
              ::testing::HasSubstr("more than 4294967296 blocks"));
  config.set_steps(uint64_t{1} << 63);
  config.set_num_workers(4);
  EXPECT_THAT(refused(2000), ::testing::HasSubstr("more than 4294967296 blocks"));
}

TEST(ExampleLedger, CheckRequestRefusesWhatLeaseAndClaimWouldAgainstTheShapeGiven) {
  const LedgerShape shape = Shape(31, 93);
  auto request = [] {
    v1::LeaseExamplesRequest r;
    r.set_want(ExampleLedger::kMaxWant);
    r.add_trained()->set_block(92);
    r.add_held(92);
    return r;
  };
  EXPECT_TRUE(ExampleLedger::CheckRequest(shape, request()).ok());
  std::vector<v1::LeaseExamplesRequest> refused(5, request());
  refused[0].set_want(ExampleLedger::kMaxWant + 1);
  refused[1].add_trained()->set_block(~uint64_t{0});
  refused[2].add_held(93);
  for (int i = 0; i < ExampleLedger::kMaxReports; ++i) refused[3].add_trained()->set_block(0);
  for (int i = 0; i < ExampleLedger::kMaxReports; ++i) refused[4].add_held(0);
  for (const v1::LeaseExamplesRequest& r : refused)
    EXPECT_EQ(ExampleLedger::CheckRequest(shape, r).code(), absl::StatusCode::kInvalidArgument)
        << r.ShortDebugString().substr(0, 80);
  // An unsized ledger checks nothing against its own (empty) shape.
  ExampleLedger ledger;
  EXPECT_EQ(ledger.CheckSize(Shape(0, 0)).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(ledger.CheckSize(shape).ok());
  EXPECT_FALSE(ledger.sized()) << "CheckSize sizes nothing";
}

// --- Export and import --------------------------------------------------

// A ledger with trained, leased and free blocks and both counters set.
ExampleLedger BusyLedger() {
  ExampleLedger ledger = SizedLedger(4, 16);
  EXPECT_THAT(MustLease(ledger, 0, {}, 3), ElementsAre(0, 1, 2));
  EXPECT_THAT(MustLease(ledger, 1, {}, 3), ElementsAre(3, 4, 5));
  EXPECT_THAT(MustLease(ledger, 2, {}, 3), ElementsAre(6, 7, 8));
  MustLease(ledger, 0, {Trained(0, 0), Trained(1, 1)}, 0);
  MustLease(ledger, 1, {Trained(3, 0)}, 0);
  MustLease(ledger, 2, {Trained(6, 4), Trained(0, 3)}, 0);  // 0 is refused
  ledger.ReturnLeases(1);                                  // 4, 5 free
  return ledger;
}

// The same requests, to compare two ledgers.
std::vector<std::vector<uint64_t>> Continue(ExampleLedger& ledger) {
  std::vector<std::vector<uint64_t>> leased;
  leased.push_back(MustLease(ledger, 3, {}, 3));
  leased.push_back(MustLease(ledger, 0, {Trained(2, 2)}, 2));
  ledger.ReturnLeases(2);
  leased.push_back(MustLease(ledger, 2, {Trained(7, 5)}, 4));  // refused
  leased.push_back(MustLease(ledger, 1, {}, 64));
  leased.push_back({ledger.LeasedBy(0), ledger.LeasedBy(1), ledger.LeasedBy(2),
                    ledger.LeasedBy(3)});
  return leased;
}

TEST(ExampleLedger, AnExportedLedgerImportsToOneThatLeasesTheSame) {
  ExampleLedger ledger = BusyLedger();
  const v1::ExampleLedgerState state = Export(ledger);
  ASSERT_GT(state.trained_size(), 0);
  ASSERT_GT(state.leased_blocks_size(), 0);
  ASSERT_GT(state.free_size(), 0);
  ASSERT_GT(state.returned(), 0u);
  ASSERT_GT(state.refused_reports(), 0u);

  ExampleLedger imported;
  ASSERT_TRUE(imported.ImportFrom(state).ok());
  EXPECT_TRUE(imported.sized());
  EXPECT_TRUE(MessageDifferencer::Equals(imported.Progress(), ledger.Progress()))
      << imported.Progress().ShortDebugString() << "\nwant: "
      << ledger.Progress().ShortDebugString();
  EXPECT_TRUE(MessageDifferencer::Equals(Export(imported), state))
      << Export(imported).ShortDebugString() << "\nwant: " << state.ShortDebugString();
  for (uint32_t rank = 0; rank < 4; ++rank)
    EXPECT_EQ(imported.LeasedBy(rank), ledger.LeasedBy(rank)) << "rank " << rank;
  EXPECT_TRUE(imported.Size(Shape(4, 16)).ok());
  EXPECT_EQ(imported.Size(Shape(4, 12)).code(), absl::StatusCode::kFailedPrecondition);

  EXPECT_EQ(Continue(imported), Continue(ledger));
  EXPECT_TRUE(MessageDifferencer::Equals(imported.Progress(), ledger.Progress()))
      << imported.Progress().ShortDebugString() << "\nwant: "
      << ledger.Progress().ShortDebugString();
  EXPECT_TRUE(MessageDifferencer::Equals(Export(imported), Export(ledger)));
}

TEST(ExampleLedger, ImportReplacesWhatTheLedgerHeld) {
  ExampleLedger ledger = SizedLedger(3, 3);
  MustLease(ledger, 9, {}, 3);
  const ExampleLedger busy = BusyLedger();
  ASSERT_TRUE(ledger.ImportFrom(Export(busy)).ok());
  EXPECT_EQ(ledger.LeasedBy(9), 0u);
  EXPECT_TRUE(MessageDifferencer::Equals(Export(ledger), Export(busy)));

  // A never-sized state leaves a ledger that is not sized.
  ASSERT_TRUE(ledger.ImportFrom(Export(ExampleLedger())).ok());
  EXPECT_FALSE(ledger.sized());
  bool exhausted = false;
  EXPECT_EQ(ledger.Lease(0, {}, 1, &exhausted).status().code(),
            absl::StatusCode::kFailedPrecondition);
}

TEST(ExampleLedger, ImportRejectsAStateThatIsNotALedgersAndChangesNothing) {
  const v1::ExampleLedgerState good = Export(BusyLedger());
  ASSERT_GE(good.free_size(), 1);
  ASSERT_GE(good.trained_size(), 1);

  struct Case {
    const char* what;
    v1::ExampleLedgerState state;
  };
  std::vector<Case> cases;
  auto add = [&](const char* what, auto change) {
    v1::ExampleLedgerState s = good;
    change(&s);
    cases.push_back({what, s});
  };
  add("a block both trained and free",
      [&](v1::ExampleLedgerState* s) { s->add_free(good.trained(0).block()); });
  add("a trained block listed twice", [&](v1::ExampleLedgerState* s) {
    *s->add_trained() = good.trained(0);
    s->add_trained_ranks(good.trained_ranks(0));
  });
  add("a block both leased and free",
      [&](v1::ExampleLedgerState* s) { s->add_leased_blocks(good.free(0)); s->add_leased_ranks(3); });
  add("leased lists of different length",
      [](v1::ExampleLedgerState* s) { s->add_leased_ranks(0); });
  add("trained lists of different length",
      [](v1::ExampleLedgerState* s) { s->add_trained_ranks(0); });
  add("a handed-out block missing",
      [](v1::ExampleLedgerState* s) { s->mutable_free()->RemoveLast(); });
  add("a handed-out block missing at next_new",
      [](v1::ExampleLedgerState* s) { s->set_next_new(s->next_new() + 1); });
  add("a block at or past next_new",
      [](v1::ExampleLedgerState* s) { s->add_free(s->next_new()); });
  add("more handed out than there are blocks",
      [](v1::ExampleLedgerState* s) { s->set_next_new(s->total_blocks() + 1); });
  add("no blocks per epoch", [](v1::ExampleLedgerState* s) { s->set_blocks_per_epoch(0); });
  add("an enormous next_new with nothing listed", [](v1::ExampleLedgerState* s) {
    s->Clear();
    s->set_blocks_per_epoch(1);
    s->set_total_blocks(uint64_t{1} << 62);
    s->set_next_new(uint64_t{1} << 62);
  });

  for (const Case& c : cases) {
    SCOPED_TRACE(c.what);
    ExampleLedger ledger = BusyLedger();
    const v1::ExampleLedgerState before = Export(ledger);
    const absl::Status status = ledger.ImportFrom(c.state);
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
    EXPECT_TRUE(MessageDifferencer::Equals(Export(ledger), before))
        << Export(ledger).ShortDebugString() << "\nbefore: " << before.ShortDebugString();
  }
}

// --- Progress -----------------------------------------------------------

TEST(ExampleLedger, ProgressEpochIsTheEpochOfTheLowestUntrainedBlock) {
  ExampleLedger ledger = SizedLedger(2, 6);
  EXPECT_EQ(ledger.Progress().epoch(), 0u);
  ASSERT_THAT(MustLease(ledger, 0, {}, 4), ElementsAre(0, 1, 2, 3));
  EXPECT_EQ(ledger.Progress().epoch(), 0u) << "leased is not trained";
  MustLease(ledger, 0, {Trained(1, 1)}, 0);
  EXPECT_EQ(ledger.Progress().epoch(), 0u) << "block 0 is not trained";
  MustLease(ledger, 0, {Trained(0, 2)}, 0);
  EXPECT_EQ(ledger.Progress().epoch(), 1u);
  MustLease(ledger, 0, {Trained(3, 3)}, 0);
  EXPECT_EQ(ledger.Progress().epoch(), 1u) << "block 2 is not trained";
  MustLease(ledger, 0, {Trained(2, 4)}, 0);
  EXPECT_EQ(ledger.Progress().epoch(), 2u) << "blocks 4 and 5 were never handed out";
  ASSERT_THAT(MustLease(ledger, 0, {}, 2), ElementsAre(4, 5));
  MustLease(ledger, 0, {Trained(4, 5), Trained(5, 6)}, 0);
  EXPECT_EQ(ledger.Progress().epoch(), 2u) << "all trained: the last epoch";
  EXPECT_EQ(ledger.Progress().consumed(), 6u);

  // A roll-back that frees block 0 takes the epoch back to 0.
  ledger.RollBack({2});
  EXPECT_EQ(ledger.Progress().epoch(), 0u);
  EXPECT_EQ(ledger.Progress().consumed(), 1u);  // block 1, trained at step 1
}

TEST(ExampleLedger, ProgressEpochOfAnImportedLedgerIsTheSame) {
  ExampleLedger ledger = SizedLedger(2, 6);
  ASSERT_THAT(MustLease(ledger, 0, {}, 3), ElementsAre(0, 1, 2));
  MustLease(ledger, 0, {Trained(0, 0), Trained(1, 1), Trained(2, 2)}, 0);
  ASSERT_EQ(ledger.Progress().epoch(), 1u);
  ExampleLedger imported;
  ASSERT_TRUE(imported.ImportFrom(Export(ledger)).ok());
  EXPECT_EQ(imported.Progress().epoch(), 1u);
}

// --- Sharing what is left ---------------------------------------------------

std::vector<uint64_t> MustLeaseShared(ExampleLedger& ledger, uint32_t rank, uint32_t want,
                                      uint32_t sharing, bool* exhausted = nullptr) {
  bool ignored = false;
  absl::StatusOr<std::vector<uint64_t>> leased =
      ledger.Lease(rank, {}, want, exhausted != nullptr ? exhausted : &ignored, sharing);
  EXPECT_TRUE(leased.ok()) << leased.status();
  return leased.ok() ? *leased : std::vector<uint64_t>{};
}

TEST(ExampleLedger, ASharedLeaseIsAtMostTheRanksShareOfWhatIsLeftRoundedUp) {
  ExampleLedger ledger = SizedLedger(10, 10);
  // 10 left, 4 workers: ceil(10 / 4) = 3 of the 8 wanted.
  EXPECT_THAT(MustLeaseShared(ledger, 0, 8, 4), ElementsAre(0, 1, 2));
  // 7 left: ceil(7 / 4) = 2.
  EXPECT_THAT(MustLeaseShared(ledger, 1, 8, 4), ElementsAre(3, 4));
  EXPECT_EQ(ledger.Progress().leased(), 5u);
}

TEST(ExampleLedger, TheShareIsOfWhatIsLeftNotOfTheWholeLedger) {
  ExampleLedger ledger = SizedLedger(10, 20);
  ASSERT_EQ(MustLeaseShared(ledger, 1, 10, 1).size(), 10u);
  // 10 left (leased blocks are not), 4 workers: 3.
  EXPECT_THAT(MustLeaseShared(ledger, 0, 8, 4), ElementsAre(10, 11, 12));
}

TEST(ExampleLedger, BlocksThatCameBackCountAsLeftToShare) {
  ExampleLedger ledger = SizedLedger(10, 10);
  ASSERT_EQ(MustLease(ledger, 1, {}, 10).size(), 10u);
  ledger.ReturnLeases(1);  // all 10 free again
  EXPECT_THAT(MustLeaseShared(ledger, 0, 8, 4), ElementsAre(0, 1, 2));
}

TEST(ExampleLedger, SharingZeroOrOneLeasesTheWant) {
  ExampleLedger ledger = SizedLedger(10, 20);
  EXPECT_EQ(MustLeaseShared(ledger, 0, 8, 0).size(), 8u);
  EXPECT_EQ(MustLeaseShared(ledger, 1, 8, 1).size(), 8u);
  // With fewer left than wanted: all that is left.
  EXPECT_EQ(MustLeaseShared(ledger, 2, 8, 1).size(), 4u);
}

TEST(ExampleLedger, TheWantCapsASharedLease) {
  ExampleLedger ledger = SizedLedger(100, 100);
  // Share ceil(100 / 2) = 50; 8 wanted.
  EXPECT_EQ(MustLeaseShared(ledger, 0, 8, 2).size(), 8u);
}

TEST(ExampleLedger, AShareOfTheLastBlockIsThatBlockAndNotExhausted) {
  ExampleLedger ledger = SizedLedger(5, 5);
  ASSERT_EQ(MustLeaseShared(ledger, 1, 4, 1).size(), 4u);
  bool exhausted = true;
  // 1 left among 4 workers: ceil(1 / 4) = 1.
  EXPECT_THAT(MustLeaseShared(ledger, 0, 8, 4, &exhausted), ElementsAre(4));
  EXPECT_FALSE(exhausted);
  EXPECT_THAT(MustLeaseShared(ledger, 2, 8, 4, &exhausted), IsEmpty());
  EXPECT_TRUE(exhausted);
}

// Two workers that each train one block a step, in turn, leasing up to
// `want` (sharing `sharing`) whenever they hold none and reporting what they
// trained since their last lease. The steps each trained before the ledger
// said exhausted.
std::vector<uint64_t> StepsUntilExhausted(uint64_t total, uint32_t want, uint32_t sharing) {
  ExampleLedger ledger = SizedLedger(total, total);
  std::vector<std::deque<uint64_t>> held(2);
  std::vector<std::vector<v1::TrainedBlock>> unreported(2);
  std::vector<uint64_t> steps(2, 0);
  std::vector<bool> done(2, false);
  while (!done[0] || !done[1]) {
    for (uint32_t rank = 0; rank < 2; ++rank) {
      if (done[rank]) continue;
      if (held[rank].empty()) {
        bool exhausted = false;
        absl::StatusOr<std::vector<uint64_t>> leased =
            ledger.Lease(rank, unreported[rank], want, &exhausted, sharing);
        EXPECT_TRUE(leased.ok()) << leased.status();
        if (!leased.ok()) return steps;
        unreported[rank].clear();
        if (exhausted) {
          done[rank] = true;
          continue;
        }
        held[rank].assign(leased->begin(), leased->end());
      }
      unreported[rank].push_back(Trained(held[rank].front(), steps[rank]++));
      held[rank].pop_front();
    }
  }
  EXPECT_EQ(ledger.Progress().consumed(), total);
  EXPECT_EQ(steps[0] + steps[1], total);
  return steps;
}

uint64_t Gap(const std::vector<uint64_t>& steps) {
  return steps[0] > steps[1] ? steps[0] - steps[1] : steps[1] - steps[0];
}

TEST(ExampleLedger, TwoWorkersSharingTheLedgerRunOutWithinOneBlockOfEachOther) {
  for (uint64_t total : {2u, 7u, 16u, 20u, 21u, 37u, 64u, 100u, 129u}) {
    const std::vector<uint64_t> steps = StepsUntilExhausted(total, 8, 2);
    EXPECT_LE(Gap(steps), 1u) << total << " blocks: rank 0 trained " << steps[0]
                              << ", rank 1 " << steps[1];
  }
}

TEST(ExampleLedger, WithoutSharingTheLastLeaseLeavesOneWorkerIdle) {
  // 20 blocks, 8 a lease: rank 1's second lease finds none left while rank
  // 0 trains 4 more.
  const std::vector<uint64_t> steps = StepsUntilExhausted(20, 8, 1);
  EXPECT_EQ(steps[0], 12u);
  EXPECT_EQ(steps[1], 8u);
}

// A coordinator that took the job over from a state file written before
// its predecessor's last leases: the blocks past the state's last lease are
// in limbo. The workers' re-sent reports and held blocks take them out of
// it; what no worker claims is leased last; every block is trained once.
TEST(ExampleLedger, ATakenOverLedgerLeasesTheBlocksItMayHaveLostLast) {
  ExampleLedger before = SizedLedger(10, 30);
  EXPECT_THAT(MustLease(before, 0, {}, 4), ElementsAre(0, 1, 2, 3));
  const v1::ExampleLedgerState saved = Export(before);
  // Unsaved: rank 0 trains 0..3, leases 4..7, and trains 4 and 5.
  MustLease(before, 0, {Trained(0, 0), Trained(1, 1), Trained(2, 2), Trained(3, 3)}, 4);

  ExampleLedger after;
  ASSERT_TRUE(after.ImportFrom(saved).ok());
  after.LimboAfterTakeOver();
  // Rank 0 says what it holds and re-sends its recent reports (those of 4
  // and 5 the new coordinator never saw).
  ASSERT_TRUE(after.Claim(0, std::vector<uint64_t>{6, 7}).ok());
  EXPECT_THAT(MustLease(after, 0,
                        {Trained(0, 0), Trained(1, 1), Trained(2, 2), Trained(3, 3),
                         Trained(4, 4), Trained(5, 5)},
                        0),
              IsEmpty());
  EXPECT_EQ(after.Progress().consumed(), 6u);
  EXPECT_EQ(after.LeasedBy(0), 2u);  // 6 and 7
  EXPECT_EQ(after.Progress().refused_reports(), 0u);
  // The rest is leased from the limbo's lowest block, and 6 and 7 never.
  std::vector<uint64_t> rest;
  while (true) {
    std::vector<uint64_t> got = MustLease(after, 1, {}, 8);
    if (got.empty()) break;
    rest.insert(rest.end(), got.begin(), got.end());
  }
  std::vector<uint64_t> expected;
  for (uint64_t b = 8; b < 30; ++b) expected.push_back(b);
  EXPECT_EQ(rest, expected);
}

TEST(ExampleLedger, NewBlocksComeBeforeTheLimbo) {
  ExampleLedger before = SizedLedger(10, 1 << 16);
  MustLease(before, 0, {}, 2);
  ExampleLedger after;
  ASSERT_TRUE(after.ImportFrom(Export(before)).ok());
  after.LimboAfterTakeOver();
  EXPECT_THAT(MustLease(after, 1, {}, 2),
              ElementsAre(2 + ExampleLedger::kLimboBlocks, 3 + ExampleLedger::kLimboBlocks));
  // The limbo survives another export and import.
  ExampleLedger again;
  ASSERT_TRUE(again.ImportFrom(Export(after)).ok());
  EXPECT_TRUE(MessageDifferencer::Equals(Export(again), Export(after)));
  ASSERT_TRUE(again.Claim(0, std::vector<uint64_t>{5}).ok());
  EXPECT_EQ(again.LeasedBy(0), 3u);  // 0, 1 and the claimed 5
}

TEST(ExampleLedger, AClaimOfABlockOutsideTheLimboChangesNothing) {
  ExampleLedger ledger = SizedLedger(10, 30);
  MustLease(ledger, 0, {}, 2);
  const v1::ExampleLedgerState was = Export(ledger);
  ASSERT_TRUE(ledger.Claim(1, std::vector<uint64_t>{0, 1, 5}).ok());
  EXPECT_TRUE(MessageDifferencer::Equals(Export(ledger), was));
  EXPECT_EQ(ledger.Claim(1, std::vector<uint64_t>{30}).code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace grps
