// Checkpoint capture and the checks of a restore (server/shard_checkpoint.h),
// on chunks and tables built directly.
#include "server/shard_checkpoint.h"

#include <atomic>
#include <cstring>
#include <memory>
#include <thread>
#include <vector>

#include "absl/synchronization/notification.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "job/sparse_tables.h"
#include "server/testing/policy_test_target.h"
#include "server/testing/shard_store_test_util.h"
#include "tensor/backend.h"

namespace grps {
namespace {

using ::testing::HasSubstr;

v1::CheckpointRequest CheckpointAt(uint64_t id, uint64_t version) {
  v1::CheckpointRequest r;
  r.set_id(id);
  r.set_version(version);
  return r;
}

// Two one-element chunks at 0 in `mode`, and a capture over them.
struct Shard {
  explicit Shard(v1::ConsistencyMode mode) : config(PolicyTestConfig(mode, 1)) {
    for (uint32_t id = 0; id < 2; ++id) {
      chunks.push_back(std::make_unique<StoreChunk>(id, 1, CreateCpuBackend(), config));
      targets.push_back(chunks.back().get());
      absl::MutexLock lock(&chunks.back()->mu);
      chunks.back()->values.f32()[0] = 0;
    }
    capture = std::make_unique<CheckpointCapture>(
        CheckpointCapture::Shard{"job", 3, targets, &generation, &shutdown});
  }
  // One update of chunk `id` by gradient -1 (SGD at lr 1: value + 1).
  void Update(uint32_t id) {
    StoreChunk& c = *chunks[id];
    absl::MutexLock lock(&c.mu);
    const std::vector<float> g = {-1};
    c.Apply(Grad(g), UpdateStep{1.0f}, -1);
  }

  v1::JobConfig config;
  std::vector<std::unique_ptr<StoreChunk>> chunks;
  std::vector<StoreTarget*> targets;
  std::atomic<uint64_t> generation{0};
  std::atomic<bool> shutdown{false};
  std::unique_ptr<CheckpointCapture> capture;
};

float ValueOf(const v1::ChunkState& c) {
  float v;
  std::memcpy(&v, c.values().data(), sizeof v);
  return v;
}

TEST(CheckpointCapture, SyncTakesEveryChunkAtTheVersionWhileUpdatesGoPast) {
  Shard shard(v1::MODE_SYNC);
  shard.Update(0);
  ASSERT_TRUE(shard.capture->Arm(CheckpointAt(7, 2)).ok());
  for (int i = 0; i < 3; ++i) {
    shard.Update(0);
    shard.Update(1);
  }
  absl::StatusOr<v1::ShardCheckpointFile> file =
      shard.capture->Collect(7, absl::Now() + absl::Seconds(30));
  ASSERT_TRUE(file.ok()) << file.status();
  EXPECT_EQ(file->job_id(), "job");
  EXPECT_EQ(file->shard(), 3u);
  EXPECT_EQ(file->checkpoint_id(), 7u);
  ASSERT_EQ(file->chunks_size(), 2);
  for (const v1::ChunkState& c : file->chunks()) {
    EXPECT_EQ(c.version(), 2u);
    EXPECT_EQ(ValueOf(c), 2.0f);
  }
}

TEST(CheckpointCapture, AChunkPastTheVersionFailsTheArmAndLeavesNothingArmed) {
  Shard shard(v1::MODE_SYNC);
  shard.Update(1);
  shard.Update(1);
  const absl::Status s = shard.capture->Arm(CheckpointAt(1, 1));
  EXPECT_TRUE(absl::IsFailedPrecondition(s)) << s;
  EXPECT_THAT(std::string(s.message()), HasSubstr("chunk 1 is already at version 2"));
  absl::MutexLock lock(&shard.chunks[0]->mu);
  EXPECT_EQ(shard.chunks[0]->capture_at, 0u);
  EXPECT_FALSE(shard.chunks[0]->captured.has_value());
}

TEST(CheckpointCapture, AsyncTakesEachChunkAsItIsWhateverTheVersionAsked) {
  Shard shard(v1::MODE_ASYNC);
  shard.Update(0);
  ASSERT_TRUE(shard.capture->Arm(CheckpointAt(1, 5)).ok());
  absl::StatusOr<v1::ShardCheckpointFile> file = shard.capture->Collect(1, absl::Now());
  ASSERT_TRUE(file.ok()) << file.status();
  EXPECT_EQ(file->chunks(0).version(), 1u);
  EXPECT_EQ(file->chunks(1).version(), 0u);
}

TEST(CheckpointCapture, ANewerArmSupersedesACollectionStillWaiting) {
  Shard shard(v1::MODE_SYNC);
  ASSERT_TRUE(shard.capture->Arm(CheckpointAt(1, 5)).ok());
  absl::StatusOr<v1::ShardCheckpointFile> first;
  std::thread waiting([&] { first = shard.capture->Collect(1, absl::Now() + absl::Seconds(60)); });
  ASSERT_TRUE(shard.capture->Arm(CheckpointAt(2, 0)).ok());
  waiting.join();
  EXPECT_TRUE(absl::IsAborted(first.status())) << first.status();
  EXPECT_TRUE(shard.capture->Collect(2, absl::Now()).ok());
  EXPECT_TRUE(absl::IsAborted(shard.capture->Collect(2, absl::Now()).status())) << "collected once";
}

TEST(CheckpointCapture, ARestoreOrAShutdownOrTheDeadlineEndsACollection) {
  Shard shard(v1::MODE_SYNC);
  ASSERT_TRUE(shard.capture->Arm(CheckpointAt(1, 5)).ok());
  shard.generation = 1;
  EXPECT_TRUE(absl::IsAborted(shard.capture->Collect(1, absl::InfiniteFuture()).status()));
  ASSERT_TRUE(shard.capture->Arm(CheckpointAt(2, 5)).ok());
  EXPECT_TRUE(
      absl::IsDeadlineExceeded(shard.capture->Collect(2, absl::Now() + absl::Milliseconds(20)).status()));
  ASSERT_TRUE(shard.capture->Arm(CheckpointAt(3, 5)).ok());
  shard.shutdown = true;
  EXPECT_TRUE(absl::IsUnavailable(shard.capture->Collect(3, absl::InfiniteFuture()).status()));
  absl::MutexLock lock(&shard.chunks[0]->mu);
  EXPECT_EQ(shard.chunks[0]->capture_at, 0u) << "disarmed";
}

v1::ChunkState StateOf(uint32_t id, size_t elements) {
  v1::ChunkState s;
  s.set_chunk_id(id);
  s.set_num_elements(elements);
  s.set_values(std::string(elements * sizeof(float), '\0'));
  return s;
}

TEST(MatchChunkStates, EveryChunkGetsItsStateAndOtherShardsChunksAreSkipped) {
  Shard shard(v1::MODE_SYNC);
  const std::vector<v1::ChunkState> states = {StateOf(9, 1), StateOf(1, 1), StateOf(0, 1)};
  absl::StatusOr<std::vector<const v1::ChunkState*>> matched =
      MatchChunkStates(shard.chunks, states);
  ASSERT_TRUE(matched.ok()) << matched.status();
  EXPECT_EQ((*matched)[0], &states[2]);
  EXPECT_EQ((*matched)[1], &states[1]);
  absl::StatusOr<std::vector<const v1::ChunkState*>> none = MatchChunkStates(shard.chunks, {});
  ASSERT_TRUE(none.ok());
  EXPECT_EQ((*none)[0], nullptr);
}

TEST(MatchChunkStates, AMissingTwiceOrMisfitStateIsRefused) {
  Shard shard(v1::MODE_SYNC);
  EXPECT_THAT(std::string(MatchChunkStates(shard.chunks, {StateOf(0, 1)}).status().message()),
              HasSubstr("no state for chunk 1"));
  EXPECT_THAT(std::string(MatchChunkStates(shard.chunks, {StateOf(0, 1), StateOf(0, 1)})
                              .status()
                              .message()),
              HasSubstr("twice"));
  EXPECT_TRUE(absl::IsInvalidArgument(
      MatchChunkStates(shard.chunks, {StateOf(0, 2), StateOf(1, 1)}).status()));
}

TEST(LoadTableStates, RowsOfAnotherShardOrAnUnknownTableAreRefused) {
  v1::JobConfig config = PolicyTestConfig(v1::MODE_SYNC, 1);
  config.set_num_servers(2);
  v1::SparseTableSpec* spec = config.add_sparse_tables();
  spec->set_name("emb");
  spec->set_dim(1);
  std::vector<std::unique_ptr<StoreTable>> tables;
  tables.push_back(std::make_unique<StoreTable>(0, *spec, CreateCpuBackend(), config));
  v1::TableState unknown;
  unknown.set_name("other");
  EXPECT_THAT(std::string(LoadTableStates(tables, 0, 2, {unknown}, false).status().message()),
              HasSubstr("'other' this job has not"));
  EXPECT_THAT(std::string(LoadTableStates(tables, 0, 2, {}, true).status().message()),
              HasSubstr("no state for table 'emb'"));
  absl::StatusOr<std::vector<LoadedTable>> none = LoadTableStates(tables, 0, 2, {}, false);
  ASSERT_TRUE(none.ok());
  EXPECT_EQ((*none)[0].state, nullptr);
  int64_t other_shards = 0;
  while (SparseShardOf(other_shards, 2) == 0) ++other_shards;
  v1::TableState foreign;
  foreign.set_name("emb");
  foreign.add_ids(other_shards);
  EXPECT_THAT(std::string(LoadTableStates(tables, 0, 2, {foreign}, true).status().message()),
              HasSubstr("another shard's"));
}

// ---- through the store: capture, restore and generations ----


std::vector<float> FloatsOf(const std::string& bytes) {
  std::vector<float> out(bytes.size() / sizeof(float));
  std::memcpy(out.data(), bytes.data(), bytes.size());
  return out;
}

TEST(ShardStoreCheckpoint, SyncCaptureTakesEveryChunkAtTheVersionWhilePushesGoPast) {
  auto store = MakeStore(Config(v1::MODE_SYNC, 1), SmallTensors(2));
  ASSERT_TRUE(Send(*store, {0, 0, 0, {1, 1, 1, 1}}).ok());
  ASSERT_TRUE(Send(*store, {0, 0, 1, {1, 1, 1, 1}}).ok());
  // Both chunks at version 1; ask for version 2 and push on to version 4.
  ASSERT_TRUE(store->ArmCheckpoint(CheckpointAt(7, 2)).ok());
  std::vector<std::vector<float>> at_two(2);
  for (uint64_t step = 1; step < 4; ++step)
    for (uint32_t chunk = 0; chunk < 2; ++chunk) {
      ASSERT_TRUE(Send(*store, {0, step, chunk, {0.5f * step, 1, 2, 3}}).ok());
      if (step == 1) at_two[chunk] = Values(*store, chunk);
    }
  absl::StatusOr<v1::ShardCheckpointFile> file =
      store->CollectCheckpoint(7, absl::Now() + absl::Seconds(30));
  ASSERT_TRUE(file.ok()) << file.status();
  EXPECT_EQ(file->checkpoint_id(), 7u);
  ASSERT_EQ(file->chunks_size(), 2);
  for (uint32_t chunk = 0; chunk < 2; ++chunk) {
    EXPECT_EQ(file->chunks(chunk).chunk_id(), chunk);
    EXPECT_EQ(file->chunks(chunk).version(), 2u);
    EXPECT_EQ(FloatsOf(file->chunks(chunk).values()), at_two[chunk]);
    EXPECT_EQ(Version(*store, chunk), 4u);
    ASSERT_EQ(file->chunks(chunk).marks_size(), 1);
    EXPECT_EQ(file->chunks(chunk).marks(0).step(), 1u);  // the push that made version 2
    // Captured inside the update: the push that completed the step counts.
    EXPECT_EQ(file->chunks(chunk).counters().pushes(), 2u);
    EXPECT_EQ(file->chunks(chunk).counters().updates(), 2u);
  }
}

// Sync, 2 workers, one chunk: step 0 applied (version 1), worker 0's push
// of step 1 in the open step; then checkpoint 1 of it.
absl::StatusOr<v1::ShardCheckpointFile> OpenStepCheckpoint(ShardStore& store) {
  for (const Push& p : {Push{0, 0, 0, {1, 1, 1, 1}}, Push{1, 0, 0, {1, 1, 1, 1}},
                        Push{0, 1, 0, {2, 2, 2, 2}}})
    if (absl::Status s = Send(store, p).status(); !s.ok()) return s;
  return store.CaptureCheckpoint(CheckpointAt(1, 1), absl::Now());
}

TEST(ShardStoreCheckpoint, PushForTheOpenStepIsNotInTheCheckpointAndIsAcceptedAfterRestore) {
  auto store = MakeStore(Config(v1::MODE_SYNC, 2), SmallTensors(1));
  absl::StatusOr<v1::ShardCheckpointFile> file = OpenStepCheckpoint(*store);
  ASSERT_TRUE(file.ok()) << file.status();
  EXPECT_EQ(file->chunks(0).marks(0).step(), 0u);
  ASSERT_TRUE(store->Restore(1, 1, {file->chunks().begin(), file->chunks().end()}, {}).ok());
  auto again = Send(*store, {0, 1, 0, {2, 2, 2, 2}});
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(again->duplicates, 0u);
  ASSERT_TRUE(Send(*store, {1, 1, 0, {2, 2, 2, 2}}).ok());
  EXPECT_EQ(Version(*store, 0), 2u);
}

TEST(ShardStoreCheckpoint, CountsFollowTheStateBackAndAPushItDoesNotHoldIsCountedOnce) {
  // The checkpoint counts the two pushes of step 0 and its update, not the
  // open step's push, which comes again after the roll-back.
  auto store = MakeStore(Config(v1::MODE_SYNC, 2), SmallTensors(1));
  absl::StatusOr<v1::ShardCheckpointFile> file = OpenStepCheckpoint(*store);
  ASSERT_TRUE(file.ok()) << file.status();
  const v1::StateCounters& saved = file->chunks(0).counters();
  EXPECT_EQ(saved.pushes(), 2u);
  EXPECT_EQ(saved.updates(), 1u);
  // Past the checkpoint, then back to it: the counts are the checkpoint's.
  ASSERT_TRUE(Send(*store, {1, 1, 0, {2, 2, 2, 2}}).ok());
  ASSERT_TRUE(Send(*store, {1, 1, 0, {2, 2, 2, 2}}).ok());  // a duplicate
  ASSERT_EQ(store->ShardStatus().updates_applied(), 2u);
  ASSERT_TRUE(store->Restore(1, 1, {file->chunks().begin(), file->chunks().end()}, {1, 1}).ok());
  v1::ShardStatus status = store->ShardStatus();
  EXPECT_EQ(status.pushes(), 2u);
  EXPECT_EQ(status.duplicate_pushes(), 0u);
  EXPECT_EQ(status.updates_applied(), 1u);
  // Steps 1 and 2 again: every push counted once, each update once.
  for (uint64_t step : {1u, 2u})
    for (uint32_t rank : {0u, 1u}) ASSERT_TRUE(Send(*store, {rank, step, 0, {1, 1, 1, 1}}).ok());
  status = store->ShardStatus();
  EXPECT_EQ(status.pushes(), 6u);
  EXPECT_EQ(status.duplicate_pushes(), 0u);
  EXPECT_EQ(status.updates_applied(), 3u);
  EXPECT_EQ(status.updates_applied(), Version(*store, 0));
  // The traffic is the process's: it goes on.
  EXPECT_EQ(status.bytes_in(), 9u * 4 * sizeof(float));
}

TEST(ShardStoreCheckpoint, CaptureFailsWhenAChunkIsPastTheVersion) {
  auto store = MakeStore(Config(v1::MODE_SYNC, 1), SmallTensors(2));
  ASSERT_TRUE(Send(*store, {0, 0, 1, {1, 1, 1, 1}}).ok());
  ASSERT_TRUE(Send(*store, {0, 1, 1, {1, 1, 1, 1}}).ok());
  absl::StatusOr<v1::ShardCheckpointFile> file =
      store->CaptureCheckpoint(CheckpointAt(1, 1), absl::Now() + absl::Seconds(5));
  EXPECT_TRUE(absl::IsFailedPrecondition(file.status())) << file.status();
  EXPECT_THAT(std::string(file.status().message()), HasSubstr("chunk 1 is already at version 2"));
  // Nothing stays armed: a later update of chunk 0 to version 1 is plain.
  ASSERT_TRUE(Send(*store, {0, 0, 0, {1, 1, 1, 1}}).ok());
  EXPECT_TRUE(store->CaptureCheckpoint(CheckpointAt(2, 0), absl::Now()).ok());
}

TEST(ShardStoreCheckpoint, ANewerCheckpointSupersedesOneStillWaiting) {
  auto store = MakeStore(Config(v1::MODE_SYNC, 1), SmallTensors(1));
  ASSERT_TRUE(store->ArmCheckpoint(CheckpointAt(1, 5)).ok());
  absl::StatusOr<v1::ShardCheckpointFile> first;
  std::thread waiting([&] { first = store->CollectCheckpoint(1, absl::Now() + absl::Seconds(60)); });
  ASSERT_TRUE(store->ArmCheckpoint(CheckpointAt(2, 0)).ok());
  waiting.join();
  EXPECT_TRUE(absl::IsAborted(first.status())) << first.status();
  absl::StatusOr<v1::ShardCheckpointFile> second = store->CollectCheckpoint(2, absl::Now());
  ASSERT_TRUE(second.ok()) << second.status();
  EXPECT_EQ(second->checkpoint_id(), 2u);
}

TEST(ShardStoreCheckpoint, CaptureOfAVersionNeverReachedTimesOut) {
  auto store = MakeStore(Config(v1::MODE_SYNC, 1), SmallTensors(1));
  absl::StatusOr<v1::ShardCheckpointFile> file =
      store->CaptureCheckpoint(CheckpointAt(1, 3), absl::Now() + absl::Milliseconds(50));
  EXPECT_TRUE(absl::IsDeadlineExceeded(file.status())) << file.status();
}

TEST(ShardStoreCheckpoint, AsyncCaptureTakesEachChunkAsItIs) {
  auto store = MakeStore(Config(v1::MODE_ASYNC, 1), SmallTensors(2));
  ASSERT_TRUE(Send(*store, {0, 0, 0, {1, 1, 1, 1}}).ok());
  ASSERT_TRUE(Send(*store, {0, 1, 0, {1, 1, 1, 1}, 1}).ok());
  ASSERT_TRUE(Send(*store, {0, 0, 1, {1, 1, 1, 1}}).ok());
  absl::StatusOr<v1::ShardCheckpointFile> file =
      store->CaptureCheckpoint(CheckpointAt(1, 0), absl::Now());
  ASSERT_TRUE(file.ok()) << file.status();
  EXPECT_EQ(file->chunks(0).version(), 2u);
  EXPECT_EQ(file->chunks(1).version(), 1u);
  EXPECT_EQ(FloatsOf(file->chunks(0).values()), Values(*store, 0));
}

// A store that ran `steps` Adam steps on chunk 0 (values, moments, step
// count all moved).
std::unique_ptr<ShardStore> AdamStore(int steps) {
  v1::JobConfig config = Config(v1::MODE_SYNC, 1);
  config.mutable_optimizer()->set_kind(v1::OPTIMIZER_ADAM);
  config.mutable_optimizer()->set_learning_rate(0.01f);
  auto store = MakeStore(config, SmallTensors(1));
  for (int s = 0; s < steps; ++s)
    EXPECT_TRUE(Send(*store, {0, static_cast<uint64_t>(s), 0, {0.3f * s, -1, 2, 0.1f}}).ok());
  return store;
}

TEST(ShardStoreRestore, RestoredAdamStoreContinuesBitForBitLikeOneNeverStopped) {
  auto original = AdamStore(3);
  absl::StatusOr<v1::ShardCheckpointFile> file =
      original->CaptureCheckpoint(CheckpointAt(1, 0), absl::Now());
  ASSERT_TRUE(file.ok()) << file.status();
  ASSERT_EQ(file->chunks(0).optimizer_state_size(), 2);  // both moments

  auto restored = AdamStore(0);
  ASSERT_TRUE(restored->Restore(1, 1, {file->chunks().begin(), file->chunks().end()}, {}).ok());
  EXPECT_EQ(Version(*restored, 0), 3u);
  EXPECT_EQ(restored->generation(), 1u);
  for (uint64_t s = 3; s < 6; ++s) {
    const Push p{0, s, 0, {0.3f * s, -1, 2, 0.1f}};
    ASSERT_TRUE(Send(*original, p).ok());
    ASSERT_TRUE(Send(*restored, p).ok());
  }
  const std::vector<float> a = Values(*original, 0), b = Values(*restored, 0);
  ASSERT_EQ(a.size(), b.size());
  EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)), 0);
  // A retry of a push from before the checkpoint is still recognised.
  auto retry = Send(*restored, {0, 2, 0, {9, 9, 9, 9}});
  ASSERT_TRUE(retry.ok()) << retry.status();
  EXPECT_EQ(retry->duplicates, 1u);
}

TEST(ShardStoreRestore, SspPullsAtTheRestoredStepAreServed) {
  // ssp(1), 2 workers, 5 clocks each, a checkpoint, 2 more; the roll-back
  // to the checkpoint: both workers resume at clock 5 and read at once
  // (clocks start again from where each resumes), and the bound holds again.
  auto store = MakeStore(SspConfig(2, 1), SmallTensors(1));
  for (uint64_t c = 0; c < 5; ++c) {
    Step(*store, 0, c);
    Step(*store, 1, c);
  }
  absl::StatusOr<v1::ShardCheckpointFile> file =
      store->CaptureCheckpoint(CheckpointAt(1, 0), absl::Now());
  ASSERT_TRUE(file.ok()) << file.status();
  Step(*store, 0, 5);
  Step(*store, 1, 5);
  ASSERT_TRUE(store->Restore(2, 1, {file->chunks().begin(), file->chunks().end()}, {5, 5}).ok());
  EXPECT_TRUE(Readable(*store, 0, 5));
  EXPECT_TRUE(Readable(*store, 1, 5));
  Step(*store, 0, 5);
  Step(*store, 0, 6);
  EXPECT_FALSE(Readable(*store, 0, 7));  // rank 1 is at clock 5: 2 behind
  Step(*store, 1, 5);
  EXPECT_TRUE(Readable(*store, 0, 7));
}

TEST(ShardStoreRestore, SspHeldGradientIsNotInTheCheckpointAndIsAppliedAfterRestore) {
  // ssp(0), 2 workers: rank 0's step-0 gradient is held until rank 1 has
  // pushed its own. A checkpoint now has neither the gradient nor a mark
  // that says it was applied; after the restore the recomputed push is
  // applied.
  auto store = MakeStore(SspConfig(2, 0), SmallTensors(1));
  const std::vector<float> init = Values(*store, 0);
  ASSERT_TRUE(PullAt(*store, 0, 0).ok());
  ASSERT_TRUE(Send(*store, {0, 0, 0, {1, 1, 1, 1}}).ok());
  ASSERT_EQ(Values(*store, 0), init);  // held
  absl::StatusOr<v1::ShardCheckpointFile> file =
      store->CaptureCheckpoint(CheckpointAt(1, 0), absl::Now());
  ASSERT_TRUE(file.ok()) << file.status();
  const v1::ChunkState& chunk = file->chunks(0);
  EXPECT_FALSE(chunk.marks(0).valid());
  ASSERT_EQ(chunk.held_from().count(0), 1u);
  EXPECT_EQ(chunk.held_from().at(0), 0u);
  EXPECT_EQ(chunk.held_from().count(1), 0u);

  ASSERT_TRUE(store->Restore(2, 1, {file->chunks().begin(), file->chunks().end()}, {0, 0}).ok());
  ASSERT_TRUE(PullAt(*store, 0, 0).ok());
  auto again = Send(*store, {0, 0, 0, {1, 1, 1, 1}});
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(again->duplicates, 0u);
  EXPECT_EQ(Values(*store, 0), init);  // held again, until rank 1 pushes clock 0
  ASSERT_TRUE(PullAt(*store, 1, 0).ok());
  EXPECT_EQ(Values(*store, 0), init);  // a read lets nothing in
  ASSERT_TRUE(Send(*store, {1, 0, 0, {0, 0, 0, 0}}).ok());
  EXPECT_NE(Values(*store, 0), init);  // applied
}

TEST(ShardStoreRestore, SspHeldGradientsPushIsNotInTheCheckpointsCountsAndIsCountedOnceAfter) {
  auto store = MakeStore(SspConfig(2, 0), SmallTensors(1));
  ASSERT_TRUE(PullAt(*store, 0, 0).ok());
  ASSERT_TRUE(Send(*store, {0, 0, 0, {1, 1, 1, 1}}).ok());  // held
  ASSERT_EQ(store->ShardStatus().pushes(), 1u);
  absl::StatusOr<v1::ShardCheckpointFile> file =
      store->CaptureCheckpoint(CheckpointAt(1, 0), absl::Now());
  ASSERT_TRUE(file.ok()) << file.status();
  EXPECT_EQ(file->chunks(0).counters().pushes(), 0u);
  ASSERT_TRUE(store->Restore(2, 1, {file->chunks().begin(), file->chunks().end()}, {0, 0}).ok());
  EXPECT_EQ(store->ShardStatus().pushes(), 0u);
  Step(*store, 0, 0);
  Step(*store, 1, 0);
  ASSERT_TRUE(PullAt(*store, 0, 1).ok());
  const v1::ShardStatus status = store->ShardStatus();
  EXPECT_EQ(status.pushes(), 2u);
  EXPECT_EQ(status.updates_applied(), 2u);
  EXPECT_EQ(status.updates_applied(), Version(*store, 0));
}

TEST(ShardStoreRestore, SspClocksStartAtTheResumeStepsWhoeverPullsFirst) {
  // Every shard is told the same resume steps, so the bound holds from the
  // first pull on, whatever order pulls reach a shard in: rank 0 cannot run
  // ahead of rank 1 because rank 1 has not pulled yet. (Clocks fixed by
  // each shard's first pulls made two shards disagree, each waiting on the
  // other for good.)
  auto store = MakeStore(SspConfig(2, 1), SmallTensors(1));
  ASSERT_TRUE(store->Restore(1, 0, {}, {3, 5}).ok());
  EXPECT_FALSE(Readable(*store, 1, 5));  // rank 0 resumes 2 clocks behind
  Step(*store, 0, 3);
  EXPECT_TRUE(Readable(*store, 1, 5));
  Step(*store, 0, 4);
  Step(*store, 0, 5);
  EXPECT_FALSE(Readable(*store, 0, 7));  // rank 1 has applied nothing past 4
  Step(*store, 1, 5);
  Step(*store, 1, 6);
  EXPECT_TRUE(Readable(*store, 0, 7));
}

TEST(ShardStoreRestore, SspStepsTheCheckpointAlreadyHoldsAdvanceTheClocks) {
  // An async/ssp cut may hold steps past where the manifest resumes the
  // workers: their recomputed pushes are duplicates, and still count as
  // the workers' clocks, or the fence would wait for them for good.
  auto store = MakeStore(SspConfig(2, 1), SmallTensors(1));
  for (uint64_t c = 0; c < 5; ++c) {
    Step(*store, 0, c);
    Step(*store, 1, c);
  }
  absl::StatusOr<v1::ShardCheckpointFile> file =
      store->CaptureCheckpoint(CheckpointAt(1, 0), absl::Now());
  ASSERT_TRUE(file.ok()) << file.status();
  ASSERT_TRUE(store->Restore(2, 1, {file->chunks().begin(), file->chunks().end()}, {2, 2}).ok());
  for (uint64_t c = 2; c < 8; ++c) {
    Step(*store, 0, c);
    Step(*store, 1, c);
  }
  EXPECT_EQ(store->ShardStatus().duplicate_pushes(), 6u);  // steps 2..4, twice
  EXPECT_EQ(Version(*store, 0), 10u + 6u);
}

TEST(ShardStoreRestore, MismatchedStateChangesNothing) {
  auto store = AdamStore(2);
  absl::StatusOr<v1::ShardCheckpointFile> file =
      store->CaptureCheckpoint(CheckpointAt(1, 0), absl::Now());
  ASSERT_TRUE(file.ok());
  const std::vector<float> before = Values(*store, 0);
  std::vector<v1::ChunkState> states(file->chunks().begin(), file->chunks().end());
  states[0].mutable_values()->resize(3 * sizeof(float));
  absl::Status s = store->Restore(1, 1, states, {});
  EXPECT_TRUE(absl::IsInvalidArgument(s)) << s;
  states[0] = file->chunks(0);
  states[0].mutable_optimizer_state()->RemoveLast();
  EXPECT_TRUE(absl::IsInvalidArgument(store->Restore(1, 1, states, {})));
  EXPECT_TRUE(absl::IsInvalidArgument(store->Restore(1, 1, {v1::ChunkState()}, {})));
  EXPECT_EQ(Values(*store, 0), before);
  EXPECT_EQ(Version(*store, 0), 2u);
  EXPECT_EQ(store->generation(), 0u);
}

TEST(ShardStoreRestore, RestoreWithoutACheckpointGoesBackToTheInitialValues) {
  auto store = MakeStore(Config(v1::MODE_SYNC, 1), SmallTensors(1));
  const std::vector<float> init = InitialValues(*store, 0);
  ASSERT_TRUE(Send(*store, {0, 0, 0, {1, 1, 1, 1}}).ok());
  ASSERT_NE(Values(*store, 0), init);
  ASSERT_TRUE(store->Restore(1, 0, {}, {}).ok());
  EXPECT_EQ(Values(*store, 0), init);
  EXPECT_EQ(Version(*store, 0), 0u);
  // Step 0 is computed again and applied again.
  auto again = Send(*store, {0, 0, 0, {1, 1, 1, 1}});
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(again->duplicates, 0u);
  EXPECT_EQ(Version(*store, 0), 1u);
}

TEST(ShardStoreRestore, OldGenerationIsAbortedNewerIsUnavailableZeroIsUnchecked) {
  auto store = MakeStore(Config(v1::MODE_SYNC, 1), SmallTensors(1));
  ASSERT_TRUE(store->Restore(2, 0, {}, {}).ok());
  ShardStore::GradientPush push;
  push.worker_rank = 0;
  push.incarnation = 1;
  ShardStore::ChunkGradient& g = push.chunks.emplace_back();
  const std::vector<float> grad = {1, 1, 1, 1};
  g.values = grad;
  push.generation = 1;
  EXPECT_TRUE(absl::IsAborted(store->Push(push).status()));
  push.generation = 3;
  EXPECT_TRUE(absl::IsUnavailable(store->Push(push).status()));
  EXPECT_EQ(Version(*store, 0), 0u);
  push.generation = 2;
  EXPECT_TRUE(store->Push(push).ok());
  push.generation = 0;
  push.step = 1;
  push.chunks[0].base_version = 1;
  EXPECT_TRUE(store->Push(push).ok());
  ShardStore::PullSpec pull;
  pull.generation = 1;
  pull.deadline = absl::Now() + absl::Seconds(5);
  EXPECT_TRUE(absl::IsAborted(store->Pull(pull).status()));
  pull.generation = 2;
  EXPECT_TRUE(store->Pull(pull).ok());
}

TEST(ShardStoreRestore, PullWaitingAcrossARestoreFailsAborted) {
  auto store = MakeStore(Config(v1::MODE_SYNC, 1), SmallTensors(1));
  absl::Notification answered;
  absl::Status status;
  ShardStore::PullSpec pull;
  pull.min_version = 5;
  pull.generation = 0 + 1;
  ASSERT_TRUE(store->Restore(1, 0, {}, {}).ok());
  pull.deadline = absl::Now() + absl::Seconds(30);
  store->PullAsync(pull, [&](absl::StatusOr<std::vector<ShardStore::PulledChunk>> r) {
    status = r.status();
    answered.Notify();
  });
  EXPECT_FALSE(answered.HasBeenNotified());
  ASSERT_TRUE(store->Restore(2, 0, {}, {}).ok());
  ASSERT_TRUE(answered.WaitForNotificationWithTimeout(absl::Seconds(5)));
  EXPECT_TRUE(absl::IsAborted(status)) << status;
  EXPECT_THAT(std::string(status.message()), HasSubstr("rolled back"));
}

TEST(ShardStoreRestore, StatusReportsGenerationRestoredCheckpointAndTheCheckpointReport) {
  auto store = MakeStore(Config(v1::MODE_SYNC, 1), SmallTensors(1));
  ASSERT_TRUE(store->Restore(3, 9, {}, {}).ok());
  v1::ShardCheckpoint report;
  report.set_id(4);
  report.set_state(v1::CHECKPOINT_STATE_WRITTEN);
  store->SetCheckpointReport(report);
  const v1::ShardStatus s = store->ShardStatus();
  EXPECT_EQ(s.generation(), 3u);
  EXPECT_EQ(s.restored_checkpoint(), 9u);
  EXPECT_EQ(s.checkpoint().id(), 4u);
  EXPECT_EQ(s.checkpoint().state(), v1::CHECKPOINT_STATE_WRITTEN);
}

}  // namespace
}  // namespace grps
