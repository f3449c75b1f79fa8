// Generations as a specification: where a job starts, what a roll-back
// restores (the newest checkpoint on disk that verifies, never one a shard
// refused), how a newer member's generation is jumped past, which requests
// are of a generation the job left, and what a taken-over state keeps.
#include "coordinator/generations.h"

#include <filesystem>
#include <limits>
#include <string>
#include <vector>

#include "checkpoint/checkpoint.h"
#include "coordinator/testing/job_parts.h"
#include "coordinator/testing/test_job.h"
#include "gtest/gtest.h"

namespace grps {
namespace {

class GenerationsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    config_ = TestJobConfig(1, 2, v1::MODE_SYNC, folder_.path());
    config_.set_checkpoint_storage(v1::CHECKPOINT_STORAGE_PER_SHARD);
    absl::StatusOr<v1::ShardMap> map = TestShardMap(config_);
    ASSERT_TRUE(map.ok()) << map.status();
    map_ = *map;
  }

  // Checkpoint `id` at `step` (rank 0 at `rank0_step`), its manifest alone:
  // what a per-shard job's roll-back verifies.
  v1::CheckpointManifest Manifest(uint64_t id, uint64_t step, uint64_t rank0_step) {
    v1::CheckpointManifest manifest;
    manifest.set_job_id(config_.job_id());
    manifest.set_id(id);
    manifest.set_step(step);
    *manifest.mutable_shard_map() = map_;
    *manifest.mutable_config() = config_;
    manifest.add_shards()->set_shard(0);
    manifest.add_worker_steps(rank0_step);  // rank 1 reports none: the step
    return manifest;
  }
  void Write(const v1::CheckpointManifest& manifest) {
    ASSERT_TRUE(
        WriteManifest(Env::Default(), CheckpointFolder(folder_.path(), manifest.id()), manifest)
            .ok());
  }
  static v1::ShardCheckpoint Failed(uint64_t id) {
    v1::ShardCheckpoint failed;
    failed.set_id(id);
    failed.set_error("CRC-32 mismatch");
    return failed;
  }

  TestFolder folder_{"generations_test"};
  v1::JobConfig config_;
  v1::ShardMap map_;
};

TEST_F(GenerationsTest, AJobStartsAtGenerationOneWithTheInitialValues) {
  Generations generations(config_, Env::Default());
  EXPECT_EQ(generations.current(), 1u);
  EXPECT_EQ(generations.order().checkpoint_id(), 0u);
  EXPECT_EQ(generations.order().worker_steps_size(), 2);
  EXPECT_FALSE(generations.IsOlder(0));  // a client that does not say
  EXPECT_FALSE(generations.IsOlder(1));
}

TEST_F(GenerationsTest, AResumedJobStartsAtGenerationTwoAtTheCheckpointsSteps) {
  Generations generations(config_, Env::Default());
  generations.ResumeFrom(Manifest(4, 40, 38), CheckpointFolder(folder_.path(), 4));
  EXPECT_EQ(generations.current(), 2u);
  EXPECT_EQ(generations.order().checkpoint_id(), 4u);
  EXPECT_EQ(generations.order().dir(), CheckpointFolder(folder_.path(), 4));
  EXPECT_EQ(generations.order().step(), 40u);
  EXPECT_EQ(std::vector<uint64_t>(generations.order().worker_steps().begin(),
                                  generations.order().worker_steps().end()),
            (std::vector<uint64_t>{38, 40}));
  EXPECT_EQ(generations.order().manifest().id(), 4u);  // per-shard: the manifest travels
  EXPECT_TRUE(generations.IsOlder(1));
}

TEST_F(GenerationsTest, ARollBackRestoresTheNewestCheckpointOnDiskThatVerifies) {
  Write(Manifest(3, 30, 30));
  Write(Manifest(5, 50, 49));
  std::filesystem::create_directories(CheckpointFolder(folder_.path(), 7));  // no MANIFEST yet
  Generations generations(config_, Env::Default());

  const v1::RestoreOrder& order = generations.Next(generations.NewestVerified());
  EXPECT_EQ(order.generation(), 2u);
  EXPECT_EQ(order.checkpoint_id(), 5u);
  EXPECT_EQ(order.worker_steps(0), 49u);
  EXPECT_TRUE(generations.IsOlder(1));
  EXPECT_FALSE(generations.IsOlder(2));
}

TEST_F(GenerationsTest, ACheckpointAShardCannotRestoreIsNeverOrderedAgain) {
  Write(Manifest(3, 30, 30));
  Write(Manifest(5, 50, 50));
  Generations generations(config_, Env::Default());
  generations.Next(generations.NewestVerified());

  EXPECT_FALSE(generations.Refuse(0, Failed(3)));  // not the order's: a stale report
  ASSERT_TRUE(generations.Refuse(0, Failed(5)));
  EXPECT_EQ(generations.Next(generations.NewestVerified()).checkpoint_id(), 3u);
  ASSERT_TRUE(generations.Refuse(0, Failed(3)));
  const v1::RestoreOrder& initial = generations.Next(generations.NewestVerified());
  EXPECT_EQ(initial.checkpoint_id(), 0u);
  EXPECT_EQ(initial.generation(), 4u);
  EXPECT_EQ(initial.worker_steps_size(), 2);
}

TEST_F(GenerationsTest, WithoutACheckpointFolderARollBackRestoresTheInitialValues) {
  config_.clear_checkpoint_dir();
  Generations generations(config_, Env::Default());
  EXPECT_EQ(generations.NewestVerified().checkpoint_id(), 0u);
  EXPECT_FALSE(generations.Refuse(0, Failed(0)));
}

TEST_F(GenerationsTest, ANewerMembersGenerationIsJumpedToSoTheRollBackGoesPastIt) {
  Generations generations(config_, Env::Default());
  EXPECT_FALSE(generations.JumpTo(1));
  EXPECT_FALSE(generations.JumpTo(std::numeric_limits<uint64_t>::max()));
  EXPECT_EQ(generations.current(), 1u);
  ASSERT_TRUE(generations.JumpTo(6));
  EXPECT_EQ(generations.Next(generations.NewestVerified()).generation(), 7u);
}

TEST_F(GenerationsTest, AWorkerDoneFromBeforeTheNewestRollBackIsStale) {
  Generations generations(config_, Env::Default());
  v1::WorkerDoneRequest done;
  done.set_worker_rank(1);
  done.set_incarnation(9);
  generations.NoteWorker(1, 9, 1);
  EXPECT_FALSE(generations.StaleWorkerDone(done));
  generations.Next(generations.NewestVerified());

  // Named: by its generation.
  done.set_generation(1);
  EXPECT_TRUE(generations.StaleWorkerDone(done));
  done.set_generation(2);
  EXPECT_FALSE(generations.StaleWorkerDone(done));
  // Not named: by the incarnation's last heartbeat.
  done.clear_generation();
  EXPECT_TRUE(generations.StaleWorkerDone(done));
  done.set_incarnation(10);  // a newer incarnation has not heartbeated yet
  EXPECT_FALSE(generations.StaleWorkerDone(done));
  generations.NoteWorker(1, 9, 2);
  done.set_incarnation(9);
  EXPECT_FALSE(generations.StaleWorkerDone(done));
}

TEST_F(GenerationsTest, ATakenOverStateKeepsItsOrderAndItsRefusedCheckpoints) {
  Write(Manifest(3, 30, 30));
  Write(Manifest(5, 50, 50));
  Generations before(config_, Env::Default());
  before.Next(before.NewestVerified());
  ASSERT_TRUE(before.Refuse(0, Failed(5)));
  before.Next(before.NewestVerified());
  v1::CoordinatorState state;
  before.ExportTo(&state);

  Generations after(config_, Env::Default());
  after.TakeOver(state);
  EXPECT_EQ(after.current(), 3u);
  EXPECT_EQ(after.order().checkpoint_id(), 3u);
  EXPECT_EQ(after.NewestVerified().checkpoint_id(), 3u);  // 5 stays refused
}

}  // namespace
}  // namespace grps
