// Push admission (server/push_admission.h) on real chunks: incarnations,
// deduplication across incarnations, all-or-nothing, what a gradient became.
#include "server/push_admission.h"

#include <memory>
#include <utility>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/testing/policy_test_target.h"
#include "tensor/backend.h"

namespace grps {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

struct Admission {
  explicit Admission(v1::ConsistencyMode mode, uint32_t workers = 1, int chunks = 1)
      : config(PolicyTestConfig(mode, workers)), admission(workers, workers) {
    for (int i = 0; i < chunks; ++i)
      targets.push_back(std::make_unique<StoreChunk>(i, 1, CreateCpuBackend(), config));
  }
  // A job of `job` (one chunk), its ranks up to JobRanks, the first
  // `start_workers` live.
  Admission(v1::JobConfig job, uint32_t start_workers)
      : config(std::move(job)), admission(JobRanks(config), start_workers) {
    targets.push_back(std::make_unique<StoreChunk>(0, 1, CreateCpuBackend(), config));
  }
  // Rank `p`'s gradient {1} of every chunk named in `ids`, computed on `base`.
  absl::StatusOr<std::vector<PushAdmission::Outcome>> Push(PushAdmission::Pusher p,
                                                           std::vector<int> ids,
                                                           uint64_t base) {
    std::vector<StoreChunk*> named;
    std::vector<PushAdmission::TargetGradient> grads;
    for (int id : ids) {
      named.push_back(targets[id].get());
      grads.push_back({targets[id].get(), Grad(one), base, 4});
    }
    if (absl::Status s = admission.CheckIncarnation(p, grads.size()); !s.ok()) return s;
    std::vector<PushAdmission::Outcome> outcomes;
    {
      TargetLocks locks(named);
      std::vector<bool> duplicate;
      if (absl::Status s = admission.Decide(p, grads, &duplicate); !s.ok()) return s;
      outcomes = admission.Accept(p, grads, duplicate, *admission.live());
    }
    admission.RaiseIncarnation(p);
    return outcomes;
  }
  uint64_t Version(int id) {
    absl::MutexLock lock(&targets[id]->mu);
    return targets[id]->version();
  }

  const std::vector<float> one = {1};
  v1::JobConfig config;
  PushAdmission admission;
  std::vector<std::unique_ptr<StoreChunk>> targets;
};

TEST(PushAdmission, ARetriedStepIsAcknowledgedAsADuplicateAndNotAppliedAgain) {
  Admission a(v1::MODE_ASYNC);
  ASSERT_TRUE(a.Push({0, 1, 0}, {0}, 0).ok());
  absl::StatusOr<std::vector<PushAdmission::Outcome>> again = a.Push({0, 1, 0}, {0}, 0);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_TRUE((*again)[0].duplicate);
  EXPECT_EQ((*again)[0].version, 1u);
  EXPECT_EQ(a.Version(0), 1u);
  absl::MutexLock lock(&a.targets[0]->mu);
  EXPECT_EQ(a.targets[0]->counters.pushes, 2u);
  EXPECT_EQ(a.targets[0]->counters.duplicates, 1u);
  EXPECT_EQ(a.targets[0]->counters.bytes_in, 8u);
}

TEST(PushAdmission, AStepAnEarlierIncarnationPushedIsADuplicateForTheNewOne) {
  Admission a(v1::MODE_ASYNC);
  ASSERT_TRUE(a.Push({0, 1, 5}, {0}, 0).ok());
  absl::StatusOr<std::vector<PushAdmission::Outcome>> resumed = a.Push({0, 2, 4}, {0}, 1);
  ASSERT_TRUE(resumed.ok()) << resumed.status();
  EXPECT_TRUE((*resumed)[0].duplicate);
  ASSERT_TRUE(a.Push({0, 2, 6}, {0}, 1).ok());
  EXPECT_EQ(a.Version(0), 2u);
}

TEST(PushAdmission, APushFromAnIncarnationOlderThanATargetsMarkIsRefusedAndCounted) {
  Admission a(v1::MODE_ASYNC, 1, 2);
  ASSERT_TRUE(a.Push({0, 3, 0}, {1}, 0).ok());
  // Decided directly: the live set would refuse it before (see below).
  std::vector<PushAdmission::TargetGradient> grads = {
      {a.targets[0].get(), Grad(a.one), 0, 4}, {a.targets[1].get(), Grad(a.one), 0, 4}};
  std::vector<bool> duplicate;
  {
    TargetLocks locks(std::vector<StoreChunk*>{a.targets[0].get(), a.targets[1].get()});
    const absl::Status s = a.admission.Decide({0, 2, 1}, grads, &duplicate);
    EXPECT_TRUE(absl::IsFailedPrecondition(s)) << s;
    EXPECT_THAT(std::string(s.message()), HasSubstr("already pushed to chunk 1"));
  }
  EXPECT_EQ(a.admission.rejected(), 2u);
}

TEST(PushAdmission, AnIncarnationOlderThanTheLiveSetKnowsIsRefusedBeforeAnyLock) {
  Admission a(v1::MODE_ASYNC, 2);
  const uint32_t ranks[] = {0, 1};
  const uint64_t incarnations[] = {4, 0};
  a.admission.SetLiveWorkers(ranks, incarnations);
  const absl::Status s = a.admission.CheckIncarnation({0, 3, 0}, 5);
  EXPECT_TRUE(absl::IsFailedPrecondition(s)) << s;
  EXPECT_THAT(std::string(s.message()), HasSubstr("incarnation 4 is current"));
  EXPECT_EQ(a.admission.rejected(), 5u);
  EXPECT_TRUE(a.admission.CheckIncarnation({1, 1, 0}, 1).ok());
}

TEST(PushAdmission, AKnownIncarnationNeverGoesBack) {
  Admission a(v1::MODE_ASYNC, 1);
  const uint32_t ranks[] = {0};
  const uint64_t newer[] = {5};
  const uint64_t older[] = {3};
  a.admission.SetLiveWorkers(ranks, newer);
  a.admission.SetLiveWorkers(ranks, older);
  a.admission.RaiseIncarnation({0, 2, 0});
  EXPECT_EQ(a.admission.live()->incarnations[0], 5u);
  a.admission.RaiseIncarnation({0, 6, 0});
  EXPECT_EQ(a.admission.live()->incarnations[0], 6u);
}

TEST(PushAdmission, APushTheModeRefusesOnOneChunkChangesNoChunk) {
  Admission a(v1::MODE_ASYNC, 1, 2);
  ASSERT_TRUE(a.Push({0, 1, 0}, {0}, 0).ok());
  // Computed on version 1: chunk 0 has it, chunk 1 never had.
  absl::StatusOr<std::vector<PushAdmission::Outcome>> push = a.Push({0, 1, 1}, {0, 1}, 1);
  EXPECT_TRUE(absl::IsFailedPrecondition(push.status())) << push.status();
  EXPECT_THAT(std::string(push.status().message()), HasSubstr("chunk 1"));
  EXPECT_EQ(a.Version(0), 1u);
  absl::MutexLock lock(&a.targets[0]->mu);
  EXPECT_EQ(a.targets[0]->marks[0].step, 0u);
}

TEST(PushAdmission, ATooStaleGradientIsCountedAsRejectedAndReported) {
  Admission a(v1::MODE_ASYNC);
  a.config.set_max_staleness(1);
  a.targets[0] = std::make_unique<StoreChunk>(0, 1, CreateCpuBackend(), a.config);
  for (uint64_t step = 0; step < 3; ++step) ASSERT_TRUE(a.Push({0, 1, step}, {0}, step).ok());
  absl::StatusOr<std::vector<PushAdmission::Outcome>> stale = a.Push({0, 1, 3}, {0}, 0);
  ASSERT_TRUE(stale.ok()) << stale.status();
  EXPECT_TRUE((*stale)[0].too_stale);
  EXPECT_EQ(a.admission.rejected(), 1u);
  absl::MutexLock lock(&a.targets[0]->mu);
  EXPECT_EQ(a.targets[0]->counters.too_stale, 1u);
}

TEST(PushAdmission, ALateSyncGradientIsCountedForItsRank) {
  Admission a(v1::MODE_SYNC, 2);
  a.config.set_backup_workers(1);
  a.targets[0] = std::make_unique<StoreChunk>(0, 1, CreateCpuBackend(), a.config);
  absl::StatusOr<std::vector<PushAdmission::Outcome>> first = a.Push({0, 1, 0}, {0}, 0);
  ASSERT_TRUE(first.ok());
  EXPECT_EQ((*first)[0].version, 1u);
  absl::StatusOr<std::vector<PushAdmission::Outcome>> late = a.Push({1, 1, 0}, {0}, 0);
  ASSERT_TRUE(late.ok()) << late.status();
  EXPECT_TRUE((*late)[0].late);
  absl::MutexLock lock(&a.targets[0]->mu);
  EXPECT_EQ(a.targets[0]->counters.late_folded, 1u);
  EXPECT_EQ(a.targets[0]->counters.late_by_worker[1], 1u);
}

// --- The live set before the coordinator's first word ------------------------

TEST(PushAdmission, StartsWithOnlyTheFirstStartWorkersLive) {
  PushAdmission admission(/*num_workers=*/4, /*start_workers=*/2);
  const std::shared_ptr<const LiveSet> live = admission.live();
  EXPECT_EQ(live->count, 2u);
  EXPECT_THAT(live->live, ElementsAre(true, true, false, false));
  EXPECT_THAT(live->incarnations, ElementsAre(0, 0, 0, 0));
  EXPECT_TRUE(live->contains(0));
  EXPECT_TRUE(live->contains(1));
  EXPECT_FALSE(live->contains(2));
  EXPECT_FALSE(live->contains(3));
}

TEST(PushAdmission, ARankBeyondTheStartWorkersIsLiveOnceTheCoordinatorSaysSo) {
  PushAdmission admission(4, 2);
  const uint32_t ranks[] = {0, 1, 3};
  const uint64_t incarnations[] = {1, 1, 1};
  const std::shared_ptr<const LiveSet> live = admission.SetLiveWorkers(ranks, incarnations);
  EXPECT_EQ(live->count, 3u);
  EXPECT_THAT(live->live, ElementsAre(true, true, false, true));
}

TEST(PushAdmission, AnElasticSyncStepCompletesWithTheStartingWorkersAlone) {
  // Two workers start a job of up to four: ranks 2 and 3 are not waited for.
  v1::JobConfig config = PolicyTestConfig(v1::MODE_SYNC, 2);
  config.set_max_workers(4);
  Admission a(config, /*start_workers=*/2);
  ASSERT_TRUE(a.Push({0, 1, 0}, {0}, 0).ok());
  EXPECT_EQ(a.Version(0), 0u);
  ASSERT_TRUE(a.Push({1, 1, 0}, {0}, 0).ok());
  EXPECT_EQ(a.Version(0), 1u);
}

TEST(LiveSet, FirstMarksTheFirstRanksLiveAndClampsToNumWorkers) {
  const LiveSet none = LiveSet::First(3, 0);
  EXPECT_EQ(none.count, 0u);
  EXPECT_THAT(none.live, ElementsAre(false, false, false));
  const LiveSet over = LiveSet::First(3, 5);
  EXPECT_EQ(over.count, 3u);
  EXPECT_THAT(over.live, ElementsAre(true, true, true));
  EXPECT_EQ(over.incarnations.size(), 3u);
  const LiveSet all = LiveSet::All(3);
  EXPECT_EQ(all.count, 3u);
  EXPECT_EQ(all.live, over.live);
  EXPECT_EQ(all.incarnations, over.incarnations);
}

}  // namespace
}  // namespace grps
