#include "server/shard_store.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <functional>
#include <memory>
#include <limits>
#include <optional>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "job/initializer.h"
#include "job/job_config.h"
#include "job/shard_map.h"
#include "server/testing/shard_store_test_util.h"
#include "tensor/cpu_backend.h"

namespace grps {
namespace {

using ::testing::ElementsAre;
using ::testing::ElementsAreArray;
using ::testing::HasSubstr;

// ---- sync ------------------------------------------------------------------

TEST(ShardStoreSync, StepWaitsForAllLiveWorkersAndAppliesTheAverageOnce) {
  auto store = MakeStore(Config(v1::MODE_SYNC, 2), SmallTensors(1));
  const std::vector<float> init = InitialValues(*store, 0);

  auto first = Send(*store, {0, 0, 0, {1, 2, 3, 4}});
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_THAT(first->versions, ElementsAre(1));  // completes at version 1
  EXPECT_EQ(Version(*store, 0), 0u);
  EXPECT_EQ(Values(*store, 0), init);

  ASSERT_TRUE(Send(*store, {1, 0, 0, {3, 2, 1, 0}}).ok());
  EXPECT_EQ(Version(*store, 0), 1u);
  // Average {2, 2, 2, 2}, lr 0.5.
  EXPECT_EQ(Values(*store, 0), SgdStep(init, {2, 2, 2, 2}, 0.5f));
  const v1::ShardStatus status = store->ShardStatus();
  EXPECT_EQ(status.updates_applied(), 1u);
  EXPECT_EQ(status.pushes(), 2u);
  EXPECT_EQ(status.version(), 1u);
  EXPECT_EQ(status.bytes_in(), 32u);
}

TEST(ShardStoreSync, AStepSumsItsGradientsInRankOrderWhateverTheirArrivalOrder) {
  // Values where float addition is not associative: 1e8 + 1 rounds to 1e8.
  const std::vector<std::vector<float>> grads = {{1e8f, 1, 1, 0.1f},
                                                 {1, -1e8f, 1e8f, 0.2f},
                                                 {-1e8f, 1e8f, -1e8f, 0.3f}};
  std::vector<float> rank_order = grads[0];
  for (size_t r = 1; r < grads.size(); ++r)
    for (size_t i = 0; i < rank_order.size(); ++i) rank_order[i] += grads[r][i];
  for (float& v : rank_order) v *= 1.0f / 3.0f;
  std::vector<uint32_t> arrival = {0, 1, 2};
  do {
    SCOPED_TRACE(absl::StrCat("arrival ", arrival[0], arrival[1], arrival[2]));
    auto store = MakeStore(Config(v1::MODE_SYNC, 3), SmallTensors(1));
    const std::vector<float> init = InitialValues(*store, 0);
    for (uint32_t rank : arrival) ASSERT_TRUE(Send(*store, {rank, 0, 0, grads[rank]}).ok());
    ASSERT_EQ(Version(*store, 0), 1u);
    EXPECT_EQ(Values(*store, 0), SgdStep(init, rank_order, 0.5f));
  } while (std::next_permutation(arrival.begin(), arrival.end()));
}

TEST(ShardStoreSync, EachStepUsesItsScheduledLearningRate) {
  v1::JobConfig config = Config(v1::MODE_SYNC, 1);
  config.mutable_optimizer()->set_warmup_steps(2);  // lr 0.25, then 0.5
  auto store = MakeStore(config, SmallTensors(1));
  std::vector<float> expected = InitialValues(*store, 0);
  ASSERT_TRUE(Send(*store, {0, 0, 0, {1, 1, 1, 1}}).ok());
  expected = SgdStep(expected, {1, 1, 1, 1}, 0.25f);
  ASSERT_TRUE(Send(*store, {0, 1, 0, {1, 1, 1, 1}}).ok());
  expected = SgdStep(expected, {1, 1, 1, 1}, 0.5f);
  EXPECT_EQ(Values(*store, 0), expected);
  EXPECT_EQ(Version(*store, 0), 2u);
}

TEST(ShardStoreSync, MomentumVelocityCarriesAcrossSteps) {
  v1::JobConfig config = Config(v1::MODE_SYNC, 1);
  config.mutable_optimizer()->set_kind(v1::OPTIMIZER_MOMENTUM);
  config.mutable_optimizer()->set_momentum(0.5f);
  auto store = MakeStore(config, SmallTensors(1));
  std::vector<float> p = InitialValues(*store, 0);
  const std::vector<float> g = {1, -2, 4, 0.5f};
  ASSERT_TRUE(Send(*store, {0, 0, 0, g}).ok());
  ASSERT_TRUE(Send(*store, {0, 1, 0, g}).ok());
  // v1 = g, p1 = p0 - lr v1; v2 = 0.5 v1 + g, p2 = p1 - lr v2.
  for (size_t i = 0; i < p.size(); ++i) {
    const float v1 = g[i];
    p[i] -= 0.5f * v1;
    const float v2 = 0.5f * v1 + g[i];
    p[i] -= 0.5f * v2;
  }
  EXPECT_EQ(Values(*store, 0), p);
}

TEST(ShardStoreSync, AdamCountsStepsFromOne) {
  v1::JobConfig config = Config(v1::MODE_SYNC, 1);
  config.mutable_optimizer()->set_kind(v1::OPTIMIZER_ADAM);
  config.mutable_optimizer()->set_learning_rate(0.01f);
  auto store = MakeStore(config, SmallTensors(1));
  std::vector<float> p = InitialValues(*store, 0);
  std::vector<float> m(4, 0.0f), v(4, 0.0f);
  const std::vector<float> g = {0.1f, -0.2f, 0.3f, -0.4f};
  CpuBackend reference;
  for (int64_t t = 1; t <= 3; ++t) {
    ASSERT_TRUE(Send(*store, {0, static_cast<uint64_t>(t - 1), 0, g}).ok());
    AdamParams params;
    params.lr = 0.01f;
    params.beta1 = config.optimizer().beta1();
    params.beta2 = config.optimizer().beta2();
    params.epsilon = config.optimizer().epsilon();
    params.step = t;
    reference.AdamUpdate(params, p.data(), g.data(), m.data(), v.data(), 4);
  }
  EXPECT_EQ(Values(*store, 0), p);
}

// A user model's job whose program runs its optimizer on the workers.
v1::JobConfig OptimizerOnWorkers(v1::ConsistencyMode mode, uint32_t workers) {
  v1::JobConfig config = Config(mode, workers);
  config.set_model(v1::MODEL_USER);
  config.mutable_dataset()->set_path("");
  config.mutable_optimizer()->set_kind(v1::OPTIMIZER_WORKERS);
  return config;
}

TEST(ShardStoreSync, WithTheOptimizerOnTheWorkersAStepsValueIsItsAverageGradient) {
  // The workers apply the average with their optimizer: no lr, no state here.
  const v1::JobConfig config = OptimizerOnWorkers(v1::MODE_SYNC, 2);
  auto store = MakeStore(config, SmallTensors(1));
  ASSERT_TRUE(Send(*store, {0, 0, 0, {1, 2, 3, 4}}).ok());
  ASSERT_TRUE(Send(*store, {1, 0, 0, {3, 2, 1, -4}}).ok());
  EXPECT_EQ(Values(*store, 0), (std::vector<float>{2, 2, 2, 0}));
  ASSERT_TRUE(Send(*store, {0, 1, 0, {0.5f, 0, 0, 0}}).ok());
  ASSERT_TRUE(Send(*store, {1, 1, 0, {0.5f, 0, 0, 1}}).ok());
  EXPECT_EQ(Values(*store, 0), (std::vector<float>{0.5f, 0, 0, 0.5f}));
  EXPECT_EQ(Version(*store, 0), 2u);
}

TEST(ShardStoreSync, ShrinkingTheLiveSetCompletesAPendingStep) {
  auto store = MakeStore(Config(v1::MODE_SYNC, 3), SmallTensors(1));
  const std::vector<float> init = InitialValues(*store, 0);
  ASSERT_TRUE(Send(*store, {0, 0, 0, {1, 1, 1, 1}}).ok());
  ASSERT_TRUE(Send(*store, {2, 0, 0, {3, 3, 3, 3}}).ok());
  EXPECT_EQ(Version(*store, 0), 0u);  // waiting for rank 1

  const std::vector<uint32_t> live = {0, 2};
  const std::vector<uint64_t> incarnations = {1, 1};
  store->SetLiveWorkers(live, incarnations);
  EXPECT_EQ(Version(*store, 0), 1u);
  EXPECT_EQ(Values(*store, 0), SgdStep(init, {2, 2, 2, 2}, 0.5f));

  // The next step needs only the live ranks. Rank 1's gradient for step 0
  // is late: counted, not refused, and folded into step 1's average.
  auto late = Send(*store, {1, 0, 0, {9, 9, 9, 9}});
  ASSERT_TRUE(late.ok()) << late.status();
  EXPECT_EQ(late->late, 1u);
  const v1::ShardStatus status = store->ShardStatus();
  EXPECT_EQ(status.rejected_pushes(), 0u);
  EXPECT_EQ(status.late_gradients(), 1u);
  EXPECT_EQ(status.late_folded(), 1u);
  EXPECT_THAT(status.late_by_worker(), ElementsAre(0, 1, 0));
  ASSERT_TRUE(Send(*store, {0, 1, 0, {0, 0, 0, 0}}).ok());
  EXPECT_EQ(Version(*store, 0), 1u);
  ASSERT_TRUE(Send(*store, {2, 1, 0, {3, 3, 3, 3}}).ok());
  EXPECT_EQ(Version(*store, 0), 2u);
  // (9 + 0 + 3) / 3 = 4.
  EXPECT_EQ(Values(*store, 0),
            SgdStep(SgdStep(init, {2, 2, 2, 2}, 0.5f), {4, 4, 4, 4}, 0.5f));
}

TEST(ShardStoreSync, StepWithNoContributorsDoesNotCompleteWhenNobodyIsLive) {
  auto store = MakeStore(Config(v1::MODE_SYNC, 2), SmallTensors(1));
  store->SetLiveWorkers({}, {});
  EXPECT_EQ(Version(*store, 0), 0u);
  EXPECT_EQ(store->ShardStatus().updates_applied(), 0u);
}

TEST(ShardStoreSync, DuplicatePushIsAppliedOnce) {
  auto store = MakeStore(Config(v1::MODE_SYNC, 2), SmallTensors(1));
  const std::vector<float> init = InitialValues(*store, 0);
  ASSERT_TRUE(Send(*store, {0, 0, 0, {1, 1, 1, 1}}).ok());
  auto retry = Send(*store, {0, 0, 0, {1, 1, 1, 1}});
  ASSERT_TRUE(retry.ok()) << retry.status();
  EXPECT_EQ(retry->duplicates, 1u);
  EXPECT_EQ(Version(*store, 0), 0u);  // the retry did not stand in for rank 1

  ASSERT_TRUE(Send(*store, {1, 0, 0, {3, 3, 3, 3}}).ok());
  EXPECT_EQ(Values(*store, 0), SgdStep(init, {2, 2, 2, 2}, 0.5f));

  // A retry that arrives after its step completed is acknowledged too.
  auto after = Send(*store, {1, 0, 0, {3, 3, 3, 3}});
  ASSERT_TRUE(after.ok()) << after.status();
  EXPECT_EQ(after->duplicates, 1u);
  EXPECT_THAT(after->versions, ElementsAre(1));
  EXPECT_EQ(Version(*store, 0), 1u);
  EXPECT_EQ(Values(*store, 0), SgdStep(init, {2, 2, 2, 2}, 0.5f));
  const v1::ShardStatus status = store->ShardStatus();
  EXPECT_EQ(status.duplicate_pushes(), 2u);
  EXPECT_EQ(status.updates_applied(), 1u);
  EXPECT_EQ(status.rejected_pushes(), 0u);
}

TEST(ShardStoreSync, PushForAFutureStepIsRefused) {
  auto store = MakeStore(Config(v1::MODE_SYNC, 2), SmallTensors(1));
  auto result = Send(*store, {0, 1, 0, {1, 1, 1, 1}});
  EXPECT_EQ(result.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(result.status().message(),
              HasSubstr("computed on version 1 but the chunk is only at "
                        "version 0"));
  EXPECT_EQ(store->ShardStatus().rejected_pushes(), 1u);
  EXPECT_EQ(store->ShardStatus().pushes(), 0u);
}

TEST(ShardStoreSync, MultiChunkPushIsAllOrNothing) {
  auto store = MakeStore(Config(v1::MODE_SYNC, 2), SmallTensors(2));
  // Chunk 0 completes step 0; chunk 1 is still at step 0.
  ASSERT_TRUE(Send(*store, {0, 0, 0, {1, 1, 1, 1}}).ok());
  ASSERT_TRUE(Send(*store, {1, 0, 0, {1, 1, 1, 1}}).ok());
  ASSERT_EQ(Version(*store, 0), 1u);
  ASSERT_EQ(Version(*store, 1), 0u);

  // Step 1 is open for chunk 0 but chunk 1 never had version 1: nothing is
  // taken.
  ShardStore::GradientPush push;
  push.worker_rank = 0;
  push.incarnation = 1;
  push.step = 1;
  const std::vector<float> g = {5, 5, 5, 5};
  push.chunks.push_back({0, 1, g, 16});
  push.chunks.push_back({1, 1, g, 16});
  auto result = store->Push(push);
  EXPECT_EQ(result.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(store->ShardStatus().rejected_pushes(), 2u);

  // Had rank 0's step-1 gradient for chunk 0 been kept, rank 1 alone would
  // now complete step 1.
  ASSERT_TRUE(Send(*store, {1, 1, 0, {1, 1, 1, 1}}).ok());
  EXPECT_EQ(Version(*store, 0), 1u);
}

TEST(ShardStoreSync, StaleIncarnationIsRefused) {
  auto store = MakeStore(Config(v1::MODE_SYNC, 2), SmallTensors(1));
  store->SetLiveWorkers(std::vector<uint32_t>{0, 1},
                        std::vector<uint64_t>{5, 5});
  auto old = Send(*store, {0, 0, 0, {1, 1, 1, 1}, 0, /*incarnation=*/4});
  EXPECT_EQ(old.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(old.status().message(), HasSubstr("stale incarnation"));

  // A newer incarnation replaces the known one; the old one is then stale.
  ASSERT_TRUE(Send(*store, {0, 0, 0, {1, 1, 1, 1}, 0, 6}).ok());
  auto previous = Send(*store, {0, 0, 0, {1, 1, 1, 1}, 0, 5});
  EXPECT_EQ(previous.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(store->ShardStatus().rejected_pushes(), 2u);
  EXPECT_EQ(store->ShardStatus().pushes(), 1u);
}

TEST(ShardStoreSync, ARefusedPushDoesNotLockTheRanksIncarnationOut) {
  auto store = MakeStore(Config(v1::MODE_SYNC, 2), SmallTensors(1));
  store->SetLiveWorkers(std::vector<uint32_t>{0, 1},
                        std::vector<uint64_t>{1, 1});
  // A newer (even the largest) incarnation with a step the chunk never had:
  // refused, and the known incarnation stays.
  for (uint64_t forged : {uint64_t{2}, std::numeric_limits<uint64_t>::max()}) {
    auto refused = Send(*store, {0, 1'000'000, 0, {1, 1, 1, 1}, std::nullopt, forged});
    EXPECT_EQ(refused.status().code(), absl::StatusCode::kFailedPrecondition);
  }
  // The real incarnation still pushes, and the step completes.
  ASSERT_TRUE(Send(*store, {0, 0, 0, {1, 1, 1, 1}}).ok());
  ASSERT_TRUE(Send(*store, {1, 0, 0, {1, 1, 1, 1}}).ok());
  EXPECT_EQ(Version(*store, 0), 1u);
}

TEST(ShardStoreSync, ASecondGradientOnTheSameVersionIsRefusedNotFoldedAgain) {
  auto store = MakeStore(Config(v1::MODE_SYNC, 2), SmallTensors(1));  // folds late ones
  const std::vector<float> init = InitialValues(*store, 0);
  ASSERT_TRUE(Send(*store, {0, 0, 0, {1, 1, 1, 1}}).ok());
  // Rank 0 again, a new step but computed on the same version 0 (and on an
  // older one than it was served, were there one): a replay, not a
  // straggler. Refused, and nothing of it reaches the average.
  for (uint64_t step : {1, 2, 3}) {
    auto replay = Send(*store, {0, step, 0, {100, 100, 100, 100}, 0});
    EXPECT_EQ(replay.status().code(), absl::StatusCode::kFailedPrecondition)
        << replay.status();
  }
  ASSERT_TRUE(Send(*store, {1, 0, 0, {3, 3, 3, 3}}).ok());
  EXPECT_EQ(Version(*store, 0), 1u);
  EXPECT_EQ(Values(*store, 0), SgdStep(init, {2, 2, 2, 2}, 0.5f));
  EXPECT_EQ(store->ShardStatus().late_gradients(), 0u);
  // The next version is fine, and so is a new incarnation of the rank on
  // the version it is served (at the step the others are at: its step 0
  // is one its old incarnation pushed, a duplicate).
  EXPECT_TRUE(Send(*store, {0, 1, 0, {1, 1, 1, 1}, 1}).ok());
  store->SetLiveWorkers(std::vector<uint32_t>{0, 1}, std::vector<uint64_t>{1, 2});
  EXPECT_TRUE(Send(*store, {1, 1, 0, {1, 1, 1, 1}, 1, 2}).ok());
  EXPECT_EQ(Version(*store, 0), 2u);
}

// ---- pull ------------------------------------------------------------------

TEST(ShardStorePull, WaitsForItsVersionAndReturnsWhenTheStepCompletes) {
  auto store = MakeStore(Config(v1::MODE_SYNC, 2), SmallTensors(1));
  const std::vector<float> init = InitialValues(*store, 0);
  absl::Notification done;
  absl::StatusOr<std::vector<ShardStore::PulledChunk>> pulled;
  std::thread puller([&] {
    pulled = store->Pull({}, 1, absl::Now() + absl::Seconds(30), DType::kF32);
    done.Notify();
  });
  ASSERT_TRUE(Send(*store, {0, 0, 0, {2, 2, 2, 2}}).ok());
  EXPECT_FALSE(done.WaitForNotificationWithTimeout(absl::Milliseconds(100)));
  ASSERT_TRUE(Send(*store, {1, 0, 0, {2, 2, 2, 2}}).ok());
  EXPECT_TRUE(done.WaitForNotificationWithTimeout(absl::Seconds(10)));
  puller.join();
  ASSERT_TRUE(pulled.ok()) << pulled.status();
  ASSERT_EQ(pulled->size(), 1u);
  EXPECT_EQ((*pulled)[0].version, 1u);
  std::vector<float> got(4);
  ASSERT_EQ((*pulled)[0].data.size(), 16u);
  std::memcpy(got.data(), (*pulled)[0].data.data(), 16);
  EXPECT_EQ(got, SgdStep(init, {2, 2, 2, 2}, 0.5f));
  EXPECT_EQ(store->ShardStatus().pulls(), 1u);
  EXPECT_EQ(store->ShardStatus().bytes_out(), 16u);
}

TEST(ShardStorePull, TimesOutWithDeadlineExceeded) {
  auto store = MakeStore(Config(v1::MODE_SYNC, 2), SmallTensors(1));
  const absl::Time start = absl::Now();
  auto pulled =
      store->Pull({}, 1, start + absl::Milliseconds(100), DType::kF32);
  EXPECT_GE(absl::Now() - start, absl::Milliseconds(100));
  EXPECT_EQ(pulled.status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_THAT(pulled.status().message(),
              HasSubstr("chunk 0 is at version 0, wanted >= 1"));
  EXPECT_EQ(store->ShardStatus().pulls(), 0u);
}

TEST(ShardStorePull, PullThatTimesOutOnOneChunkServesAndCountsNothing) {
  auto store = MakeStore(Config(v1::MODE_SYNC, 1), SmallTensors(2));
  ASSERT_TRUE(Send(*store, {0, 0, 0, {1, 1, 1, 1}}).ok());  // chunk 0 only
  auto pulled = store->Pull({0, 1}, 1, absl::Now() + absl::Milliseconds(50),
                            DType::kF32);
  EXPECT_EQ(pulled.status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_THAT(pulled.status().message(), HasSubstr("chunk 1 is at version 0"));
  EXPECT_EQ(store->ShardStatus().pulls(), 0u);
  EXPECT_EQ(store->ShardStatus().bytes_out(), 0u);
}

TEST(ShardStorePull, ShutdownWakesWaitingPullsWithUnavailable) {
  auto store = MakeStore(Config(v1::MODE_SYNC, 2), SmallTensors(1));
  absl::StatusOr<std::vector<ShardStore::PulledChunk>> pulled;
  std::thread puller([&] {
    pulled = store->Pull({}, 1, absl::Now() + absl::Seconds(30), DType::kF32);
  });
  // Shut down only once the pull waits (a pull that came after the shutdown
  // would be refused on arrival, and the test would not test the wake-up).
  const absl::Time patience = absl::Now() + absl::Seconds(10);
  while (store->waiting_pulls() == 0 && absl::Now() < patience)
    absl::SleepFor(absl::Milliseconds(1));
  ASSERT_EQ(store->waiting_pulls(), 1u);
  const absl::Time start = absl::Now();
  store->Shutdown();
  puller.join();
  EXPECT_LT(absl::Now() - start, absl::Seconds(10));
  EXPECT_EQ(pulled.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(Send(*store, {0, 0, 0, {1, 1, 1, 1}}).status().code(),
            absl::StatusCode::kUnavailable);
}

TEST(ShardStorePull, WaitingPullsBeyondTheLimitAreRefusedAndCancelledOnesLeave) {
  auto store = MakeStore(Config(v1::MODE_SYNC, 2), SmallTensors(1), nullptr,
                         /*max_waiting_pulls=*/2);
  std::vector<std::shared_ptr<std::atomic<bool>>> cancel;
  std::vector<absl::Status> answers(3);
  absl::Notification answered[3];
  for (int i = 0; i < 3; ++i) {
    ShardStore::PullSpec spec;
    spec.min_version = 1;  // not before step 0 completes
    spec.deadline = absl::Now() + absl::Minutes(1);
    cancel.push_back(std::make_shared<std::atomic<bool>>(false));
    spec.cancelled = cancel.back();
    store->PullAsync(spec, [&, i](absl::StatusOr<std::vector<ShardStore::PulledChunk>> r) {
      answers[i] = r.status();
      answered[i].Notify();
    });
  }
  ASSERT_TRUE(answered[2].HasBeenNotified());
  EXPECT_EQ(answers[2].code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(store->ShardStatus().waiting_pulls(), 2u);
  cancel[0]->store(true);
  store->WakePulls();
  ASSERT_TRUE(answered[0].HasBeenNotified());
  EXPECT_EQ(answers[0].code(), absl::StatusCode::kCancelled);
  EXPECT_EQ(store->ShardStatus().waiting_pulls(), 1u);
  EXPECT_FALSE(answered[1].HasBeenNotified());
  store->Shutdown();
  ASSERT_TRUE(answered[1].WaitForNotificationWithTimeout(absl::Seconds(10)));
}

// A worker's pull of a large shard is a request per chunk (parts of about
// 256 KiB): a shard of 600 chunks lets one worker's 600 pulls of a step not
// yet complete wait, and twice that, before it refuses one.
TEST(ShardStorePull, AShardOfManyChunksLetsAWorkersPullOfEveryChunkWait) {
  EXPECT_EQ(ShardStore::MaxWaitingPulls(Config(v1::MODE_SYNC, 2), v1::ShardMap(), 0, 2),
            2 * ShardStore::kWaitingPullsPerWorker);
  auto store = MakeStore(Config(v1::MODE_SYNC, 1), SmallTensors(600));
  ASSERT_EQ(store->shard_map().chunks_size(), 600);
  std::atomic<int> refused{0};
  std::atomic<int> answered{0};
  for (int i = 0; i < 1201; ++i) {
    ShardStore::PullSpec spec;
    spec.chunk_ids = {static_cast<uint32_t>(i % 600)};
    spec.min_version = 1;  // not before step 0 completes
    spec.deadline = absl::Now() + absl::Minutes(1);
    store->PullAsync(spec, [&](absl::StatusOr<std::vector<ShardStore::PulledChunk>> r) {
      if (absl::IsResourceExhausted(r.status())) ++refused;
      ++answered;
    });
  }
  EXPECT_EQ(store->ShardStatus().waiting_pulls(), 1200u);
  EXPECT_EQ(refused.load(), 1);  // the 1,201st
  store->Shutdown();
  for (int i = 0; i < 1000 && answered.load() < 1201; ++i) absl::SleepFor(absl::Milliseconds(10));
  EXPECT_EQ(answered.load(), 1201);
}

TEST(ShardStorePull, ConvertsToTheRequestedDType) {
  v1::JobConfig config = Config(v1::MODE_SYNC, 1);
  auto store = MakeStore(config, {Tensor("b", {4}, "zeros")});
  ASSERT_TRUE(Send(*store, {0, 0, 0, {1, -2, 0.5f, 4}}).ok());
  auto pulled = store->Pull({0}, 1, absl::Now(), DType::kBF16);
  ASSERT_TRUE(pulled.ok()) << pulled.status();
  const std::string& data = (*pulled)[0].data;
  ASSERT_EQ(data.size(), 8u);
  std::vector<float> got(4);
  ConvertElements(data.data(), DType::kBF16, got.data(), DType::kF32, 4);
  EXPECT_THAT(got, ElementsAre(-0.5f, 1.0f, -0.25f, -2.0f));
}

// ---- async -----------------------------------------------------------------

TEST(ShardStoreAsync, AppliesEveryPushAndMeasuresStaleness) {
  auto store = MakeStore(Config(v1::MODE_ASYNC, 2), SmallTensors(1));
  std::vector<float> expected = InitialValues(*store, 0);
  // (rank, step, base version) -> staleness at apply: 0, 1, 1, 3.
  const std::vector<Push> pushes = {{0, 0, 0, {1, 1, 1, 1}, 0},
                                    {1, 0, 0, {2, 2, 2, 2}, 0},
                                    {0, 1, 0, {1, 0, 1, 0}, 1},
                                    {1, 1, 0, {0, 2, 0, 2}, 0}};
  for (size_t i = 0; i < pushes.size(); ++i) {
    auto result = Send(*store, pushes[i]);
    ASSERT_TRUE(result.ok()) << result.status();
    EXPECT_THAT(result->versions, ElementsAre(i + 1));
    // An async update uses the step lr / num_workers (AsyncLearningRate).
    expected = SgdStep(expected, pushes[i].grad, 0.5f / 2);
  }
  EXPECT_EQ(Values(*store, 0), expected);
  const v1::ShardStatus status = store->ShardStatus();
  EXPECT_EQ(status.updates_applied(), 4u);
  EXPECT_EQ(status.version(), 4u);
  EXPECT_EQ(status.staleness_max(), 3u);
  EXPECT_DOUBLE_EQ(status.staleness_mean(), 1.25);
  ASSERT_EQ(status.staleness_histogram_size(), ShardStore::kStalenessBuckets);
  std::vector<uint64_t> histogram(ShardStore::kStalenessBuckets, 0);
  histogram[0] = 1;
  histogram[1] = 2;
  histogram[3] = 1;
  EXPECT_THAT(status.staleness_histogram(), ElementsAreArray(histogram));
}

TEST(ShardStoreAsync, WithTheOptimizerOnTheWorkersEachPushedChangeIsAdded) {
  for (v1::ConsistencyMode mode : {v1::MODE_ASYNC, v1::MODE_SSP}) {
    SCOPED_TRACE(ModeName(mode));
    auto store = MakeStore(OptimizerOnWorkers(mode, 2), SmallTensors(1));
    std::vector<float> expected = InitialValues(*store, 0);
    const std::vector<Push> pushes = {{0, 0, 0, {1, -1, 0.25f, 0}, 0},
                                      {1, 0, 0, {2, 0, 0, -0.5f}, 0}};
    for (const Push& push : pushes) {
      ASSERT_TRUE(Send(*store, push).ok());
      for (size_t i = 0; i < expected.size(); ++i) expected[i] += push.grad[i];
    }
    // Neither lr / workers nor the schedule: the workers' optimizer made the change.
    EXPECT_EQ(Values(*store, 0), expected);
    EXPECT_EQ(Version(*store, 0), 2u);
  }
}

TEST(ShardStoreAsync, VeryStaleUpdatesLandInTheLastBucket) {
  auto store = MakeStore(Config(v1::MODE_ASYNC, 1), SmallTensors(1));
  const uint64_t n = ShardStore::kStalenessBuckets + 3;
  for (uint64_t s = 0; s < n; ++s)
    ASSERT_TRUE(Send(*store, {0, s, 0, {0, 0, 0, 0}, s}).ok());
  ASSERT_TRUE(Send(*store, {0, n, 0, {0, 0, 0, 0}, 0}).ok());  // staleness n
  const v1::ShardStatus status = store->ShardStatus();
  EXPECT_EQ(status.staleness_max(), n);
  EXPECT_EQ(status.staleness_histogram(ShardStore::kStalenessBuckets - 1), 1u);
  EXPECT_EQ(status.staleness_histogram(0), n);
}

TEST(ShardStoreAsync, StalenessAwareLearningRateDividesByOnePlusStaleness) {
  v1::JobConfig config = Config(v1::MODE_ASYNC, 2);
  config.set_staleness_aware_lr(true);
  auto store = MakeStore(config, SmallTensors(1));
  std::vector<float> expected = InitialValues(*store, 0);
  ASSERT_TRUE(Send(*store, {0, 0, 0, {1, 1, 1, 1}, 0}).ok());
  ASSERT_TRUE(Send(*store, {1, 0, 0, {1, 1, 1, 1}, 0}).ok());  // staleness 1
  // lr 0.5 over 2 workers, then halved again for staleness 1.
  expected = SgdStep(expected, {1, 1, 1, 1}, 0.25f);
  expected = SgdStep(expected, {1, 1, 1, 1}, 0.125f);
  EXPECT_EQ(Values(*store, 0), expected);
}

TEST(ShardStoreAsync, GradientStalerThanMaxStalenessIsRejectedAndCounted) {
  v1::JobConfig config = Config(v1::MODE_ASYNC, 2);
  config.set_max_staleness(1);
  auto store = MakeStore(config, SmallTensors(1));
  ASSERT_TRUE(Send(*store, {0, 0, 0, {1, 1, 1, 1}, 0}).ok());
  ASSERT_TRUE(Send(*store, {0, 1, 0, {1, 1, 1, 1}, 1}).ok());
  const std::vector<float> before = Values(*store, 0);

  // Staleness 2: counted and not applied; the push itself is answered OK.
  auto stale = Send(*store, {1, 0, 0, {1, 1, 1, 1}, 0});
  ASSERT_TRUE(stale.ok()) << stale.status();
  EXPECT_EQ(stale->too_stale, 1u);
  EXPECT_EQ(Values(*store, 0), before);
  EXPECT_EQ(Version(*store, 0), 2u);
  EXPECT_EQ(store->ShardStatus().rejected_pushes(), 1u);
  EXPECT_EQ(store->ShardStatus().too_stale(), 1u);

  EXPECT_TRUE(Send(*store, {1, 1, 0, {1, 1, 1, 1}, 1}).ok());  // staleness 1
  EXPECT_EQ(store->ShardStatus().staleness_max(), 1u);
}

TEST(ShardStoreAsync, GradientFromAFutureVersionIsRejected) {
  auto store = MakeStore(Config(v1::MODE_ASYNC, 1), SmallTensors(1));
  auto result = Send(*store, {0, 0, 0, {1, 1, 1, 1}, 3});
  EXPECT_EQ(result.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(Version(*store, 0), 0u);
}

TEST(ShardStoreAsync, AStepAnEarlierIncarnationOfTheRankPushedIsNotAppliedAgain) {
  auto store = MakeStore(Config(v1::MODE_ASYNC, 1), SmallTensors(1));
  ASSERT_TRUE(Send(*store, {0, 5, 0, {1, 1, 1, 1}, 0, /*incarnation=*/1}).ok());
  const std::vector<float> after_first = Values(*store, 0);
  // The worker restarts (incarnation 2) and resumes at step 4, behind its
  // last push: steps 4 and 5 are duplicates, step 6 is new.
  for (uint64_t step : {4, 5}) {
    auto again = Send(*store, {0, step, 0, {1, 1, 1, 1}, 1, 2});
    ASSERT_TRUE(again.ok()) << again.status();
    EXPECT_EQ(again->duplicates, 1u);
  }
  EXPECT_EQ(Values(*store, 0), after_first);
  EXPECT_EQ(Version(*store, 0), 1u);
  ASSERT_TRUE(Send(*store, {0, 6, 0, {1, 1, 1, 1}, 1, 2}).ok());
  EXPECT_EQ(Version(*store, 0), 2u);
  // The old incarnation is fenced off.
  EXPECT_EQ(Send(*store, {0, 7, 0, {1, 1, 1, 1}, 2, 1}).status().code(),
            absl::StatusCode::kFailedPrecondition);
}

TEST(ShardStoreAsync, DuplicatePushIsAppliedOnce) {
  auto store = MakeStore(Config(v1::MODE_ASYNC, 1), SmallTensors(1));
  ASSERT_TRUE(Send(*store, {0, 7, 0, {1, 1, 1, 1}, 0, 1}).ok());
  const std::vector<float> after_first = Values(*store, 0);
  auto retry = Send(*store, {0, 7, 0, {1, 1, 1, 1}, 0, 1});
  ASSERT_TRUE(retry.ok()) << retry.status();
  EXPECT_EQ(retry->duplicates, 1u);
  EXPECT_THAT(retry->versions, ElementsAre(1));
  auto older = Send(*store, {0, 6, 0, {1, 1, 1, 1}, 0, 1});
  ASSERT_TRUE(older.ok());
  EXPECT_EQ(older->duplicates, 1u);
  EXPECT_EQ(Values(*store, 0), after_first);
  EXPECT_EQ(Version(*store, 0), 1u);

  // A restarted worker goes on after its rank's steps under a new
  // incarnation.
  ASSERT_TRUE(Send(*store, {0, 8, 0, {1, 1, 1, 1}, 1, 2}).ok());
  EXPECT_EQ(Version(*store, 0), 2u);
  EXPECT_EQ(store->ShardStatus().duplicate_pushes(), 2u);
}

// ---- clocks: pulls the mode decides ------------------------------------------

TEST(ShardStoreSyncClock, PullWaitsForTheStepTheWorkerContributedTo) {
  auto store = MakeStore(Config(v1::MODE_SYNC, 2), SmallTensors(1));
  EXPECT_TRUE(Readable(*store, 0, 0));  // nothing pushed yet: read at once
  ASSERT_TRUE(Send(*store, {0, 0, 0, {1, 1, 1, 1}}).ok());
  EXPECT_FALSE(Readable(*store, 0, 1));  // step 0 waits for rank 1
  EXPECT_TRUE(Readable(*store, 1, 0));   // rank 1 has not pushed: reads
  ASSERT_TRUE(Send(*store, {1, 0, 0, {1, 1, 1, 1}}).ok());
  auto pulled = PullAt(*store, 0, 1);
  ASSERT_TRUE(pulled.ok()) << pulled.status();
  EXPECT_EQ((*pulled)[0].version, 1u);
}

TEST(ShardStoreSyncClock, WorkerThatComesBackReadsAtOnceAndJoinsTheOpenStep) {
  auto store = MakeStore(Config(v1::MODE_SYNC, 3), SmallTensors(1));
  ASSERT_TRUE(Send(*store, {1, 0, 0, {5, 5, 5, 5}}).ok());
  // Rank 1 is declared dead; ranks 0 and 2 complete steps 0 and 1.
  store->SetLiveWorkers(std::vector<uint32_t>{0, 2}, std::vector<uint64_t>{1, 1});
  for (uint64_t step = 0; step < 2; ++step) {
    ASSERT_TRUE(Send(*store, {0, step, 0, {1, 1, 1, 1}}).ok());
    ASSERT_TRUE(Send(*store, {2, step, 0, {1, 1, 1, 1}}).ok());
  }
  ASSERT_EQ(Version(*store, 0), 2u);
  // It comes back: its step-1 gradient (computed on version 1) is late,
  // folded and counted; its pull is answered at once with version 2.
  store->SetLiveWorkers(std::vector<uint32_t>{0, 1, 2},
                        std::vector<uint64_t>{1, 1, 1});
  auto late = Send(*store, {1, 1, 0, {2, 2, 2, 2}, 1});
  ASSERT_TRUE(late.ok()) << late.status();
  EXPECT_EQ(late->late, 1u);
  auto pulled = PullAt(*store, 1, 2);
  ASSERT_TRUE(pulled.ok()) << pulled.status();
  EXPECT_EQ((*pulled)[0].version, 2u);
  // Step 2 now needs all three again.
  ASSERT_TRUE(Send(*store, {0, 2, 0, {1, 1, 1, 1}}).ok());
  ASSERT_TRUE(Send(*store, {2, 2, 0, {1, 1, 1, 1}}).ok());
  EXPECT_EQ(Version(*store, 0), 2u);
  ASSERT_TRUE(Send(*store, {1, 2, 0, {1, 1, 1, 1}}).ok());
  EXPECT_EQ(Version(*store, 0), 3u);
  const v1::ShardStatus status = store->ShardStatus();
  EXPECT_EQ(status.late_gradients(), 1u);
  EXPECT_THAT(status.late_by_worker(), ElementsAre(0, 1, 0));
}

// ---- backup workers ------------------------------------------------------------

v1::JobConfig BackupConfig(uint32_t workers, uint32_t backups,
                           v1::LateGradientPolicy late) {
  v1::JobConfig c = Config(v1::MODE_SYNC, workers);
  c.set_backup_workers(backups);
  c.set_late_gradients(late);
  return c;
}

TEST(ShardStoreBackupWorkers, StepCompletesWithTheFirstNMinusBGradients) {
  auto store =
      MakeStore(BackupConfig(3, 1, v1::LATE_GRADIENTS_FOLD), SmallTensors(1));
  const std::vector<float> init = InitialValues(*store, 0);
  ASSERT_TRUE(Send(*store, {0, 0, 0, {1, 1, 1, 1}}).ok());
  EXPECT_EQ(Version(*store, 0), 0u);
  ASSERT_TRUE(Send(*store, {2, 0, 0, {3, 3, 3, 3}}).ok());
  EXPECT_EQ(Version(*store, 0), 1u);
  EXPECT_EQ(Values(*store, 0), SgdStep(init, {2, 2, 2, 2}, 0.5f));
  // Ranks 0 and 2 read step 1 without waiting for rank 1.
  EXPECT_TRUE(Readable(*store, 0, 1));
  EXPECT_TRUE(Readable(*store, 2, 1));
}

TEST(ShardStoreBackupWorkers, LateGradientIsFoldedIntoTheNextStepAndCounted) {
  auto store =
      MakeStore(BackupConfig(3, 1, v1::LATE_GRADIENTS_FOLD), SmallTensors(1));
  const std::vector<float> init = InitialValues(*store, 0);
  ASSERT_TRUE(Send(*store, {0, 0, 0, {1, 1, 1, 1}}).ok());
  ASSERT_TRUE(Send(*store, {2, 0, 0, {3, 3, 3, 3}}).ok());
  auto late = Send(*store, {1, 0, 0, {8, 8, 8, 8}});  // step 0 is done
  ASSERT_TRUE(late.ok()) << late.status();
  EXPECT_EQ(late->late, 1u);
  EXPECT_EQ(Version(*store, 0), 1u);  // a folded gradient is no quorum
  // The straggler reads at once: it joins the open step.
  EXPECT_TRUE(Readable(*store, 1, 1));
  ASSERT_TRUE(Send(*store, {0, 1, 0, {2, 2, 2, 2}}).ok());
  ASSERT_TRUE(Send(*store, {2, 1, 0, {2, 2, 2, 2}}).ok());
  EXPECT_EQ(Version(*store, 0), 2u);
  // Step 1 averages its two gradients and the folded one: (2 + 2 + 8) / 3.
  EXPECT_EQ(Values(*store, 0),
            SgdStep(SgdStep(init, {2, 2, 2, 2}, 0.5f), {4, 4, 4, 4}, 0.5f));
  const v1::ShardStatus status = store->ShardStatus();
  EXPECT_EQ(status.late_gradients(), 1u);
  EXPECT_EQ(status.late_folded(), 1u);
  EXPECT_EQ(status.late_dropped(), 0u);
  EXPECT_THAT(status.late_by_worker(), ElementsAre(0, 1, 0));
  EXPECT_EQ(status.rejected_pushes(), 0u);
  EXPECT_EQ(status.pushes(), 5u);
  EXPECT_EQ(status.updates_applied(), 2u);
}

TEST(ShardStoreBackupWorkers, LateGradientDroppedIsCountedNotApplied) {
  auto store =
      MakeStore(BackupConfig(3, 1, v1::LATE_GRADIENTS_DROP), SmallTensors(1));
  const std::vector<float> init = InitialValues(*store, 0);
  ASSERT_TRUE(Send(*store, {0, 0, 0, {1, 1, 1, 1}}).ok());
  ASSERT_TRUE(Send(*store, {2, 0, 0, {3, 3, 3, 3}}).ok());
  auto late = Send(*store, {1, 0, 0, {8, 8, 8, 8}});  // step 0 is done
  ASSERT_TRUE(late.ok()) << late.status();
  EXPECT_EQ(late->late, 1u);
  ASSERT_TRUE(Send(*store, {0, 1, 0, {2, 2, 2, 2}}).ok());
  ASSERT_TRUE(Send(*store, {2, 1, 0, {2, 2, 2, 2}}).ok());
  late = Send(*store, {1, 1, 0, {8, 8, 8, 8}});  // and so is step 1
  ASSERT_TRUE(late.ok()) << late.status();
  EXPECT_EQ(late->late, 1u);
  EXPECT_EQ(Values(*store, 0),
            SgdStep(SgdStep(init, {2, 2, 2, 2}, 0.5f), {2, 2, 2, 2}, 0.5f));
  const v1::ShardStatus status = store->ShardStatus();
  EXPECT_EQ(status.late_gradients(), 2u);
  EXPECT_EQ(status.late_dropped(), 2u);
  EXPECT_EQ(status.late_folded(), 0u);
  EXPECT_THAT(status.late_by_worker(), ElementsAre(0, 2, 0));
}

TEST(ShardStoreBackupWorkers, QuorumShrinksWithTheLiveSet) {
  auto store =
      MakeStore(BackupConfig(3, 1, v1::LATE_GRADIENTS_FOLD), SmallTensors(1));
  // Two live workers and one backup: one gradient completes a step.
  store->SetLiveWorkers(std::vector<uint32_t>{0, 1}, std::vector<uint64_t>{1, 1});
  ASSERT_TRUE(Send(*store, {1, 0, 0, {1, 1, 1, 1}}).ok());
  EXPECT_EQ(Version(*store, 0), 1u);
}

// A late gradient is folded into the next step somebody takes. When the
// workers have finished there is none: it is counted late (the push's reply
// says so) and makes no step of its own. (It did: the shards it was late on
// ended a version past the job's end and the others, and the job's final
// checkpoint could not be cut.)
TEST(ShardStoreBackupWorkers, AFoldedGradientMakesNoStepOfItsOwnWhenNoWorkerIsLeft) {
  auto store =
      MakeStore(BackupConfig(2, 1, v1::LATE_GRADIENTS_FOLD), SmallTensors(1));
  const std::vector<float> init = InitialValues(*store, 0);
  ASSERT_TRUE(Send(*store, {0, 0, 0, {1, 1, 1, 1}}).ok());
  ASSERT_EQ(Version(*store, 0), 1u);
  ASSERT_TRUE(Send(*store, {1, 0, 0, {4, 4, 4, 4}}).ok());  // late, folded
  store->SetLiveWorkers({}, {});  // both finished
  EXPECT_EQ(Version(*store, 0), 1u);
  EXPECT_EQ(Values(*store, 0), SgdStep(init, {1, 1, 1, 1}, 0.5f));
  // A worker that comes back takes the next step, and the fold goes in it.
  store->SetLiveWorkers({0, 1}, {});
  ASSERT_TRUE(Send(*store, {0, 1, 0, {2, 2, 2, 2}}).ok());
  EXPECT_EQ(Version(*store, 0), 2u);
  EXPECT_EQ(Values(*store, 0),
            SgdStep(SgdStep(init, {1, 1, 1, 1}, 0.5f), {3, 3, 3, 3}, 0.5f));
}

// ---- ssp -----------------------------------------------------------------------

TEST(ShardStoreSsp, HoldsAWorkerUntilTheSlowestIsWithinSClocks) {
  auto store = MakeStore(SspConfig(2, 2), SmallTensors(1));
  Step(*store, 1, 0);  // rank 1 is now at clock 1
  for (uint64_t c = 0; c < 3; ++c) Step(*store, 0, c);
  // Rank 0 may be 2 clocks ahead of rank 1, not 3.
  EXPECT_TRUE(Readable(*store, 0, 3));
  EXPECT_FALSE(Readable(*store, 0, 4));
  Step(*store, 1, 1);  // the slowest reaches clock 2
  EXPECT_TRUE(Readable(*store, 0, 4));
  EXPECT_FALSE(Readable(*store, 0, 5));
}

TEST(ShardStoreSsp, WaitingWorkerIsReleasedWhenTheSlowestAdvances) {
  auto store = MakeStore(SspConfig(2, 1), SmallTensors(1));
  Step(*store, 0, 0);
  Step(*store, 0, 1);
  absl::Notification released;
  std::thread waiter([&] {
    EXPECT_TRUE(PullAt(*store, 0, 2).ok());
    released.Notify();
  });
  EXPECT_FALSE(released.WaitForNotificationWithTimeout(absl::Milliseconds(50)));
  Step(*store, 1, 0);
  EXPECT_TRUE(released.WaitForNotificationWithTimeout(absl::Seconds(10)));
  waiter.join();
}

TEST(ShardStoreSsp, WaitingWorkerIsReleasedWhenTheSlowestDies) {
  auto store = MakeStore(SspConfig(3, 0), SmallTensors(1));
  Step(*store, 0, 0);
  Step(*store, 1, 0);
  EXPECT_FALSE(Readable(*store, 0, 1));  // rank 2 has not pushed clock 0
  store->SetLiveWorkers(std::vector<uint32_t>{0, 1}, std::vector<uint64_t>{1, 1});
  EXPECT_TRUE(Readable(*store, 0, 1));
}

TEST(ShardStoreSsp, ZeroBoundHoldsAGradientUntilEveryWorkerPushedItsClock) {
  auto store = MakeStore(SspConfig(2, 0), SmallTensors(1));
  const std::vector<float> init = InitialValues(*store, 0);
  ASSERT_TRUE(PullAt(*store, 0, 0).ok());
  auto pushed = Send(*store, {0, 0, 0, {1, 1, 1, 1}, 0});
  ASSERT_TRUE(pushed.ok());
  EXPECT_EQ(store->ShardStatus().held_gradients(), 1u);
  EXPECT_EQ(Version(*store, 0), 0u);
  // Rank 1 reads clock 0 before rank 0's clock-0 gradient is applied, as in
  // a sync step, and reads it again (its first reply lost on the way): the
  // same values both times. Only its own push of clock 0 lets rank 0's in.
  for (int read = 0; read < 2; ++read) {
    auto pulled = PullAt(*store, 1, 0);
    ASSERT_TRUE(pulled.ok()) << pulled.status();
    EXPECT_EQ(FloatsOf((*pulled)[0]), init) << "read " << read;
    EXPECT_EQ(Version(*store, 0), 0u);
  }
  ASSERT_TRUE(Send(*store, {1, 0, 0, {2, 2, 2, 2}, 0}).ok());
  EXPECT_EQ(Version(*store, 0), 2u);
  EXPECT_EQ(store->ShardStatus().held_gradients(), 0u);
  // Each applied as async: lr / workers.
  EXPECT_EQ(Values(*store, 0), SgdStep(SgdStep(init, {1, 1, 1, 1}, 0.25f), {2, 2, 2, 2}, 0.25f));
}

TEST(ShardStoreSsp, ClientWithoutClocksIsNotHeldForever) {
  auto store = MakeStore(SspConfig(1, 0), SmallTensors(1));
  for (uint64_t step = 0; step < 3; ++step) {
    auto pulled = store->Pull({}, 0, absl::Now() + absl::Seconds(10), DType::kF32);
    ASSERT_TRUE(pulled.ok()) << pulled.status();
    ASSERT_TRUE(Send(*store, {0, step, 0, {1, 1, 1, 1}, (*pulled)[0].version}).ok());
  }
  // Each push finishes its worker's reading of its clock, so none of its
  // gradients waits for a clocked read that never comes.
  EXPECT_EQ(Version(*store, 0), 3u);
  EXPECT_EQ(store->ShardStatus().held_gradients(), 0u);
}

TEST(ShardStoreSsp, MeasuresStalenessOfEveryUpdate) {
  auto store = MakeStore(SspConfig(2, 4), SmallTensors(1));
  Step(*store, 0, 0);  // staleness 0
  Step(*store, 0, 1);  // staleness 0
  ASSERT_TRUE(Send(*store, {1, 0, 0, {0, 0, 0, 0}, 0}).ok());  // staleness 2
  const v1::ShardStatus status = store->ShardStatus();
  EXPECT_EQ(status.updates_applied(), 3u);
  EXPECT_EQ(status.staleness_max(), 2u);
  EXPECT_EQ(status.staleness_histogram(0), 2u);
  EXPECT_EQ(status.staleness_histogram(2), 1u);
}

TEST(ShardStoreSsp, MaxStalenessRefusesAndCounts) {
  v1::JobConfig config = SspConfig(2, 8);
  config.set_max_staleness(1);
  auto store = MakeStore(config, SmallTensors(1));
  Step(*store, 0, 0);
  Step(*store, 0, 1);
  auto stale = Send(*store, {1, 0, 0, {1, 1, 1, 1}, 0});
  ASSERT_TRUE(stale.ok());
  EXPECT_EQ(stale->too_stale, 1u);
  EXPECT_EQ(Version(*store, 0), 2u);
  EXPECT_EQ(store->ShardStatus().too_stale(), 1u);
}

TEST(ShardStoreSsp, WorkerBackFromTheDeadRejoinsAtTheSlowestClock) {
  auto store = MakeStore(SspConfig(2, 1), SmallTensors(1));
  Step(*store, 1, 0);
  store->SetLiveWorkers(std::vector<uint32_t>{0}, std::vector<uint64_t>{1});
  for (uint64_t c = 0; c < 10; ++c) Step(*store, 0, c);  // rank 1 is dead
  store->SetLiveWorkers(std::vector<uint32_t>{0, 1}, std::vector<uint64_t>{1, 1});
  // Rank 1 resumes at its own clock 1 and counts as at rank 0's clock 10: it
  // reads at once, and rank 0 is not held back to let it catch up 9 clocks.
  EXPECT_TRUE(Readable(*store, 1, 1));
  EXPECT_TRUE(Readable(*store, 0, 10));
  Step(*store, 0, 10);
  EXPECT_FALSE(Readable(*store, 0, 11 + 1));
  ASSERT_TRUE(Send(*store, {1, 1, 0, {0, 0, 0, 0}, Version(*store, 0)}).ok());
  EXPECT_TRUE(Readable(*store, 0, 12));
}

// ---- concurrency -----------------------------------------------------------

// A CPU backend whose SGD update, when gated, announces that it started and
// then blocks until released, while the store holds that chunk's lock.
class GatedBackend : public CpuBackend {
 public:
  struct Gate {
    absl::Notification entered;
    absl::Notification release;
  };
  explicit GatedBackend(Gate* gate) : gate_(gate) {}
  void SgdUpdate(const SgdParams& p, float* param, const float* grad,
                 size_t n) override {
    if (gate_ != nullptr) {
      gate_->entered.Notify();
      gate_->release.WaitForNotification();
    }
    CpuBackend::SgdUpdate(p, param, grad, n);
  }

 private:
  Gate* gate_;
};

TEST(ShardStoreConcurrency, PushesToDifferentChunksProceedInParallel) {
  // Chunks 1 and 2 block inside their updates; chunk 0 does not.
  GatedBackend::Gate gates[2];
  int created = 0;
  auto store = MakeStore(Config(v1::MODE_ASYNC, 3), SmallTensors(3), [&] {
    const int index = created++;
    return std::make_unique<GatedBackend>(index == 0 ? nullptr
                                                     : &gates[index - 1]);
  });
  ASSERT_EQ(created, 3);

  std::thread push1([&] { EXPECT_TRUE(Send(*store, {1, 0, 1, {1, 1, 1, 1}}).ok()); });
  std::thread push2([&] { EXPECT_TRUE(Send(*store, {2, 0, 2, {1, 1, 1, 1}}).ok()); });
  // Both updates run at the same time, each holding its own chunk's lock:
  // with one lock for the shard the second could not start.
  const bool both_entered =
      gates[0].entered.WaitForNotificationWithTimeout(absl::Seconds(10)) &&
      gates[1].entered.WaitForNotificationWithTimeout(absl::Seconds(10));
  EXPECT_TRUE(both_entered);

  // Meanwhile a third chunk can be pushed and pulled.
  absl::Notification third_done;
  std::thread push0([&] {
    EXPECT_TRUE(Send(*store, {0, 0, 0, {1, 1, 1, 1}}).ok());
    EXPECT_TRUE(
        store->Pull({0}, 1, absl::Now() + absl::Seconds(10), DType::kF32).ok());
    third_done.Notify();
  });
  EXPECT_TRUE(third_done.WaitForNotificationWithTimeout(absl::Seconds(10)));

  gates[0].release.Notify();
  gates[1].release.Notify();
  push0.join();
  push1.join();
  push2.join();
  EXPECT_EQ(store->ShardStatus().updates_applied(), 3u);
  EXPECT_EQ(store->ShardStatus().version(), 1u);
}

TEST(ShardStoreConcurrency, ManyConcurrentSyncPushersCompleteEveryStep) {
  constexpr uint32_t kWorkers = 4;
  constexpr uint64_t kSteps = 50;
  auto store = MakeStore(Config(v1::MODE_SYNC, kWorkers), SmallTensors(3));
  std::vector<std::thread> workers;
  for (uint32_t r = 0; r < kWorkers; ++r) {
    workers.emplace_back([&, r] {
      for (uint64_t step = 0; step < kSteps; ++step) {
        ShardStore::GradientPush push;
        push.worker_rank = r;
        push.incarnation = 1;
        push.step = step;
        const std::vector<float> g(4, 0.0f);
        for (uint32_t c = 0; c < 3; ++c)
          push.chunks.push_back({c, step, g, 16});
        ASSERT_TRUE(store->Push(push).ok());
        ASSERT_TRUE(store
                        ->Pull({}, step + 1, absl::Now() + absl::Seconds(30),
                               DType::kF32)
                        .ok());
      }
    });
  }
  for (std::thread& t : workers) t.join();
  const v1::ShardStatus status = store->ShardStatus();
  EXPECT_EQ(status.version(), kSteps);
  EXPECT_EQ(status.updates_applied(), 3 * kSteps);
  EXPECT_EQ(status.pushes(), 3 * kSteps * kWorkers);
  EXPECT_EQ(status.duplicate_pushes(), 0u);
}

// ---- construction ----------------------------------------------------------

TEST(ShardStoreCreate, RefusesAShardOutsideTheJob) {
  v1::JobConfig config = Config(v1::MODE_SYNC, 1);
  ShardStore::Options options;
  options.config = config;
  options.shard_map = *BuildShardMap(SmallTensors(1), 1, 1024);
  options.shard = 1;
  auto store = ShardStore::Create(std::move(options));
  EXPECT_EQ(store.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(store.status().message(), HasSubstr("shard 1"));
}

TEST(ShardStoreCreate, RefusesAMapThatDisagreesWithTheConfig) {
  v1::JobConfig config = Config(v1::MODE_SYNC, 1);
  ShardStore::Options options;
  options.config = config;
  options.shard_map = *BuildShardMap(SmallTensors(2), 2, 1024);
  auto store = ShardStore::Create(std::move(options));
  EXPECT_EQ(store.status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(ShardStoreCreate, HoldsOnlyItsOwnChunks) {
  v1::JobConfig config = Config(v1::MODE_SYNC, 1);
  config.set_num_servers(2);
  absl::StatusOr<v1::ShardMap> map = BuildShardMap(SmallTensors(4), 2, 1024);
  ASSERT_TRUE(map.ok());
  ShardStore::Options options;
  options.config = config;
  options.shard_map = *map;
  options.shard = 1;
  auto store = ShardStore::Create(std::move(options));
  ASSERT_TRUE(store.ok()) << store.status();
  EXPECT_EQ((*store)->chunk_ids(), ChunksOfShard(*map, 1));
  for (uint32_t id : ChunksOfShard(*map, 0))
    EXPECT_EQ((*store)->TEST_ReadChunk(id).status().code(),
              absl::StatusCode::kNotFound);
  EXPECT_EQ((*store)->ShardStatus().num_chunks(), ChunksOfShard(*map, 1).size());
}

}  // namespace
}  // namespace grps

namespace grps {
namespace {

absl::StatusOr<uint32_t> Give(ShardStore& store, uint32_t rank, std::vector<float> values) {
  ShardStore::GradientPush push;
  push.worker_rank = rank;
  push.incarnation = 1;
  ShardStore::ChunkGradient& g = push.chunks.emplace_back();
  g.chunk_id = 0;
  g.values = values;
  return store.GiveInitialValues(push);
}

// A user model's tensor ("given"): rank 0's values, not an initializer's.
TEST(ShardStoreGivenValues, NothingIsServedOrTakenUntilRankZeroGivesTheValues) {
  auto store = MakeStore(Config(v1::MODE_SYNC, 2), {Tensor("w", {2, 2}, "given")});
  EXPECT_FALSE(Readable(*store, 1, 0));
  absl::StatusOr<ShardStore::PushResult> early = Send(*store, {1, 0, 0, {1, 1, 1, 1}});
  EXPECT_EQ(early.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(std::string(early.status().message()), HasSubstr("has no values yet"));
  // A pull that waits is answered once the values come.
  absl::Notification answered;
  absl::StatusOr<std::vector<ShardStore::PulledChunk>> waited;
  ShardStore::PullSpec spec;
  spec.worker_rank = 1;
  spec.clock = 0;
  spec.deadline = absl::Now() + absl::Seconds(30);
  store->PullAsync(std::move(spec), [&](absl::StatusOr<std::vector<ShardStore::PulledChunk>> r) {
    waited = std::move(r);
    answered.Notify();
  });
  EXPECT_FALSE(answered.HasBeenNotified());

  EXPECT_EQ(Give(*store, 1, {1, 2, 3, 4}).status().code(), absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(Give(*store, 0, {1, 2, NAN, 4}).status().code(),
            absl::StatusCode::kInvalidArgument);
  absl::StatusOr<uint32_t> taken = Give(*store, 0, {1, 2, 3, 4});
  ASSERT_TRUE(taken.ok()) << taken.status();
  EXPECT_EQ(*taken, 1u);
  ASSERT_TRUE(answered.WaitForNotificationWithTimeout(absl::Seconds(10)));
  ASSERT_TRUE(waited.ok()) << waited.status();
  EXPECT_EQ(FloatsOf((*waited)[0]), (std::vector<float>{1, 2, 3, 4}));
  EXPECT_EQ(Version(*store, 0), 0u);  // values, not an update

  // Given once: a second offer (another incarnation of rank 0) changes nothing.
  EXPECT_EQ(*Give(*store, 0, {9, 9, 9, 9}), 0u);
  EXPECT_EQ(Values(*store, 0), (std::vector<float>{1, 2, 3, 4}));
  ASSERT_TRUE(Send(*store, {0, 0, 0, {2, 2, 2, 2}}).ok());
  ASSERT_TRUE(Send(*store, {1, 0, 0, {2, 2, 2, 2}}).ok());
  EXPECT_EQ(Values(*store, 0), SgdStep({1, 2, 3, 4}, {2, 2, 2, 2}, 0.5f));

  // A roll-back to the start goes back to the given values.
  ASSERT_TRUE(store->Restore(2, 0, {}, {0, 0}).ok());
  EXPECT_EQ(Values(*store, 0), (std::vector<float>{1, 2, 3, 4}));
  EXPECT_TRUE(Readable(*store, 0, 0));
}

TEST(ShardStoreGivenValues, AShardThatStartsAgainWaitsForTheValuesOrItsCheckpoint) {
  auto store = MakeStore(Config(v1::MODE_SYNC, 2), {Tensor("w", {2, 2}, "given")});
  ASSERT_TRUE(store->Restore(2, 0, {}, {0, 0}).ok());
  EXPECT_FALSE(Readable(*store, 0, 0)) << "no values were ever given to this process";
  v1::ChunkState state;
  state.set_chunk_id(0);
  state.set_version(7);
  state.set_num_elements(4);
  const std::vector<float> saved{5, 6, 7, 8};
  state.set_values(std::string(reinterpret_cast<const char*>(saved.data()), 16));
  ASSERT_TRUE(store->Restore(3, 1, {state}, {7, 7}).ok());
  EXPECT_EQ(Values(*store, 0), saved);
  EXPECT_TRUE(Readable(*store, 0, 7));
  EXPECT_EQ(*Give(*store, 0, {1, 1, 1, 1}), 0u) << "the checkpoint's values stay";
}

}  // namespace
}  // namespace grps
