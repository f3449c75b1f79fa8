// ElasticData as a specification: a lease is checked whole before anything
// changes; a checkpoint's ledger of another shape starts the epochs over
// (any other ledger of another shape is refused); after a take-over the
// limbo is held until every live rank claimed what it holds, or the grace
// is over; a checkpoint's manifest gets the ledger at its cut.
#include "coordinator/elastic_data.h"

#include <vector>

#include "coordinator/testing/test_job.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace grps {
namespace {

using ::testing::ElementsAre;
using ::testing::IsEmpty;

// Ten blocks of one step's examples (batch 64) an epoch; three epochs.
constexpr uint64_t kTrainExamples = 64 * 10;

class ElasticDataTest : public ::testing::Test {
 protected:
  void SetUp() override {
    config_ = TestJobConfig(1, 2, v1::MODE_SYNC, "");
    config_.set_max_workers(4);
  }
  static v1::LeaseExamplesRequest Request(uint32_t rank, uint32_t want,
                                          uint64_t train_examples = kTrainExamples) {
    v1::LeaseExamplesRequest request;
    request.set_worker_rank(rank);
    request.set_want(want);
    request.set_train_examples(train_examples);
    return request;
  }
  // Admits and grants `request` to one of `live` ranks; the blocks leased.
  std::vector<uint64_t> Lease(const v1::LeaseExamplesRequest& request,
                              const std::vector<uint32_t>& live = {0, 1},
                              bool grace_over = false) {
    absl::Status admitted = data_.Admit(config_, request);
    EXPECT_TRUE(admitted.ok()) << admitted;
    if (!admitted.ok()) return {};
    absl::StatusOr<v1::LeaseExamplesResponse> granted = data_.Grant(request, live, grace_over);
    EXPECT_TRUE(granted.ok()) << granted.status();
    if (!granted.ok()) return {};
    return {granted->blocks().begin(), granted->blocks().end()};
  }
  v1::DataProgress Progress() const {
    v1::JobStatus status;
    data_.AddTo(&status);
    return status.data();
  }

  v1::JobConfig config_;
  ElasticData data_;
};

TEST_F(ElasticDataTest, AFirstLeaseSizesTheLedgerAndARefusedOneChangesNothing) {
  EXPECT_FALSE(data_.Admit(config_, Request(0, 2, 0)).ok());  // no training set
  EXPECT_EQ(Progress().blocks_per_epoch(), 0u);
  EXPECT_THAT(Lease(Request(0, 2)), ElementsAre(0u, 1u));
  EXPECT_EQ(Progress().blocks_per_epoch(), 10u);
  // Another worker's training set of another size is refused.
  EXPECT_FALSE(data_.Admit(config_, Request(1, 2, 64 * 20)).ok());
  EXPECT_EQ(Progress().blocks_per_epoch(), 10u);
  EXPECT_THAT(Lease(Request(1, 2)), ElementsAre(2u, 3u));
}

TEST_F(ElasticDataTest, ACheckpointsLedgerOfAnotherShapeStartsTheEpochsOver) {
  ElasticData before;
  v1::JobConfig other = config_;
  ASSERT_TRUE(before.Admit(other, Request(0, 3, 64 * 20)).ok());
  ASSERT_TRUE(before.Grant(Request(0, 3, 64 * 20), {0}, false).ok());
  v1::CheckpointManifest manifest;
  manifest.set_id(4);
  manifest.add_worker_steps(5);
  before.CutInto(&manifest);
  ASSERT_GT(manifest.example_ledger().total_blocks(), 0u);

  data_.ResumeFrom(manifest);
  EXPECT_THAT(Lease(Request(0, 2)), ElementsAre(0u, 1u));  // a job of 640 examples
  EXPECT_EQ(Progress().blocks_per_epoch(), 10u);
}

TEST_F(ElasticDataTest, ACutHoldsWhatEachRankTrainedBeforeItsStep) {
  EXPECT_THAT(Lease(Request(0, 3)), ElementsAre(0u, 1u, 2u));
  v1::LeaseExamplesRequest report = Request(0, 0);
  for (const auto& [block, step] : std::vector<std::pair<uint64_t, uint64_t>>{{0, 1}, {1, 5}}) {
    v1::TrainedBlock* t = report.add_trained();
    t->set_block(block);
    t->set_step(step);
  }
  Lease(report);
  v1::CheckpointManifest manifest;
  manifest.add_worker_steps(3);  // rank 0 at step 3: block 1 (step 5) not yet
  manifest.add_worker_steps(0);
  data_.CutInto(&manifest);
  std::vector<uint64_t> trained;
  for (const v1::TrainedBlock& t : manifest.example_ledger().trained()) trained.push_back(t.block());
  EXPECT_THAT(trained, ElementsAre(0u));
}

TEST_F(ElasticDataTest, AfterATakeOverTheLimboWaitsForEveryLiveRanksClaim) {
  EXPECT_THAT(Lease(Request(0, 2)), ElementsAre(0u, 1u));
  EXPECT_THAT(Lease(Request(1, 2)), ElementsAre(2u, 3u));
  v1::CoordinatorState state;
  data_.ExportTo(&state);
  absl::StatusOr<ExampleLedger> ledger = ElasticData::Read(state);
  ASSERT_TRUE(ledger.ok()) << ledger.status();

  ElasticData after;
  after.TakeOver(*std::move(ledger), {0, 1});
  EXPECT_TRUE(after.ClaimAwaited(0));
  EXPECT_TRUE(after.ClaimAwaited(1));
  v1::LeaseExamplesRequest claim = Request(0, 2);
  claim.set_claim(true);
  claim.add_held(0);
  claim.add_held(1);
  ASSERT_TRUE(after.Admit(config_, claim).ok());
  absl::StatusOr<v1::LeaseExamplesResponse> first = after.Grant(claim, {0, 1}, false);
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_THAT(first->blocks(), IsEmpty());  // the rest is in limbo until rank 1 claims
  EXPECT_FALSE(after.ClaimAwaited(0));
  EXPECT_TRUE(after.ClaimAwaited(1));
  // The grace over, the limbo goes without rank 1's claim.
  after.ReleaseLimbo({0, 1}, /*grace_over=*/true);
  EXPECT_FALSE(after.ClaimAwaited(1));
  absl::StatusOr<v1::LeaseExamplesResponse> more = after.Grant(Request(0, 2), {0, 1}, false);
  ASSERT_TRUE(more.ok()) << more.status();
  EXPECT_FALSE(more->blocks().empty());
}

TEST_F(ElasticDataTest, AStateWhoseLedgerIsDamagedIsRefusedBeforeAnythingChanges) {
  v1::CoordinatorState state;
  state.mutable_example_ledger()->set_blocks_per_epoch(10);
  state.mutable_example_ledger()->set_total_blocks(30);
  state.mutable_example_ledger()->set_next_new(2);  // two handed out, none listed
  EXPECT_TRUE(absl::IsInvalidArgument(ElasticData::Read(state).status()));
}

}  // namespace
}  // namespace grps
