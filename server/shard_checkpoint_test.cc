// Checkpoint capture and the checks of a restore (server/shard_checkpoint.h),
// on chunks and tables built directly.
#include "server/shard_checkpoint.h"

#include <atomic>
#include <cstring>
#include <memory>
#include <thread>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "job/sparse_tables.h"
#include "server/policy_test_target.h"
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
    c.Apply(Grad(g), 1.0f, -1);
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

}  // namespace
}  // namespace grps
