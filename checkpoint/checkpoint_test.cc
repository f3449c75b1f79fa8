#include "checkpoint/checkpoint.h"

#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "daemon/testing/fault_injection_env.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "job/shard_map.h"
#include "test/temp_folders.h"

namespace grps {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

// A model of two tensors cut into 5 chunks, placed on `shards` shards.
v1::ShardMap Layout(uint32_t shards, uint64_t chunk_bytes = 64) {
  v1::TensorSpec a, b;
  a.set_name("w");
  a.add_shape(8);
  a.add_shape(6);
  b.set_name("b");
  b.add_shape(6);
  return *BuildShardMap({a, b}, shards, chunk_bytes);
}

// Chunk `id` at version `version`: values id*100 + i + version/10, one
// optimizer slot, a dedup mark for rank 1.
v1::ChunkState State(const v1::ChunkSpec& spec, uint64_t version) {
  v1::ChunkState c;
  c.set_chunk_id(spec.chunk_id());
  c.set_version(version);
  c.set_num_elements(spec.num_elements());
  std::vector<float> values(spec.num_elements());
  for (size_t i = 0; i < values.size(); ++i)
    values[i] = spec.chunk_id() * 100.0f + i + version / 10.0f;
  c.set_values(values.data(), values.size() * sizeof(float));
  c.add_optimizer_state(c.values());
  c.add_marks();
  v1::DedupMark* m = c.add_marks();
  m->set_valid(true);
  m->set_incarnation(7);
  m->set_step(version - 1);
  return c;
}

class CheckpointTest : public ::testing::Test {
 protected:
  // Writes checkpoint `id` of `map` at `version` through `env`: every shard
  // file, then the manifest. Returns the first failure.
  absl::Status Write(Env* env, uint64_t id, const v1::ShardMap& map, uint64_t version) {
    const std::string dir = CheckpointFolder(root_, id);
    v1::CheckpointManifest manifest;
    manifest.set_job_id("job");
    manifest.set_id(id);
    manifest.set_step(version);
    *manifest.mutable_shard_map() = map;
    for (int s = 0; s < map.shards_size(); ++s) {
      v1::ShardCheckpointFile file;
      file.set_job_id("job");
      file.set_checkpoint_id(id);
      file.set_shard(s);
      for (uint32_t c : ChunksOfShard(map, s)) *file.add_chunks() = State(map.chunks(c), version);
      absl::StatusOr<v1::ShardCheckpoint> written = WriteShardFile(env, dir, file);
      if (!written.ok()) return written.status();
      *manifest.add_shards() = *written;
    }
    return WriteManifest(env, dir, manifest);
  }

  // Every file of checkpoint `id`, by name, with its bytes.
  std::map<std::string, std::string> Files(uint64_t id) {
    std::map<std::string, std::string> out;
    const std::string dir = CheckpointFolder(root_, id);
    const std::vector<std::string> names = *Env::Default()->ListDir(dir);
    for (const std::string& name : names)
      out[name] = *Env::Default()->ReadFile(JoinPath(dir, name));
    return out;
  }

  std::string ShardPath(uint64_t id, uint32_t shard) {
    return JoinPath(CheckpointFolder(root_, id), ShardFileName(shard));
  }

  // Checkpoint 1 is complete; checkpoint 2 gets damaged by the test.
  void WriteTwo() {
    ASSERT_TRUE(Write(Env::Default(), 1, Layout(2), 10).ok());
    ASSERT_TRUE(Write(Env::Default(), 2, Layout(2), 20).ok());
    previous_ = Files(1);
  }

  // The newest usable checkpoint is 1, its files unchanged, and checkpoint
  // 2 was refused with a message containing `why`.
  void ExpectFallsBackToTheFirst(const std::string& why) {
    absl::StatusOr<CheckpointChoice> choice = FindNewestCheckpoint(Env::Default(), root_, "job");
    ASSERT_TRUE(choice.ok()) << choice.status();
    ASSERT_TRUE(choice->manifest.has_value());
    EXPECT_EQ(choice->manifest->id(), 1u);
    EXPECT_EQ(choice->dir, CheckpointFolder(root_, 1));
    ASSERT_EQ(choice->refused.size(), 1u);
    EXPECT_THAT(choice->refused[0], HasSubstr("ckpt-00000002"));
    EXPECT_THAT(choice->refused[0], HasSubstr(why));
    EXPECT_EQ(Files(1), previous_);
  }

  TempFolders temp_;
  const std::string root_ = temp_.Make("checkpoint_test");
  std::map<std::string, std::string> previous_;
};

TEST_F(CheckpointTest, WrittenCheckpointReadsBackAsWritten) {
  const v1::ShardMap map = Layout(2);
  ASSERT_TRUE(Write(Env::Default(), 3, map, 30).ok());
  absl::StatusOr<CheckpointChoice> choice = FindNewestCheckpoint(Env::Default(), root_, "job");
  ASSERT_TRUE(choice.ok()) << choice.status();
  ASSERT_TRUE(choice->manifest.has_value());
  EXPECT_EQ(choice->manifest->step(), 30u);
  EXPECT_TRUE(choice->refused.empty());
  std::vector<uint32_t> all;
  for (const v1::ChunkSpec& c : map.chunks()) all.push_back(c.chunk_id());
  absl::StatusOr<std::vector<v1::ChunkState>> chunks =
      LoadChunks(Env::Default(), choice->dir, *choice->manifest, all);
  ASSERT_TRUE(chunks.ok()) << chunks.status();
  for (const v1::ChunkState& c : *chunks)
    EXPECT_EQ(c.SerializeAsString(), State(map.chunks(c.chunk_id()), 30).SerializeAsString());
}

TEST_F(CheckpointTest, ChunksOfATwoShardCheckpointLoadIntoThreeShardsOrOne) {
  ASSERT_TRUE(Write(Env::Default(), 1, Layout(2), 10).ok());
  const CheckpointChoice choice = *FindNewestCheckpoint(Env::Default(), root_, "");
  for (uint32_t shards : {3u, 1u}) {
    const v1::ShardMap now = Layout(shards);
    ASSERT_TRUE(CheckSameChunks(choice.manifest->shard_map(), now).ok());
    for (uint32_t s = 0; s < shards; ++s) {
      const std::vector<uint32_t> ids = ChunksOfShard(now, s);
      absl::StatusOr<std::vector<v1::ChunkState>> chunks =
          LoadChunks(Env::Default(), choice.dir, *choice.manifest, ids);
      ASSERT_TRUE(chunks.ok()) << chunks.status();
      ASSERT_EQ(chunks->size(), ids.size());
      for (size_t i = 0; i < ids.size(); ++i)
        EXPECT_EQ((*chunks)[i].SerializeAsString(),
                  State(now.chunks(ids[i]), 10).SerializeAsString());
    }
  }
}

TEST_F(CheckpointTest, TornShardFileIsRefusedAndThePreviousCheckpointIsUsed) {
  WriteTwo();
  const std::string path = ShardPath(2, 1);
  const uint64_t size = Env::Default()->ReadFile(path)->size();
  ASSERT_TRUE(FaultInjectionEnv::Truncate(path, size / 2).ok());
  ExpectFallsBackToTheFirst("shard-00001.ckpt");
}

TEST_F(CheckpointTest, UnsyncedShardFileLostInACrashLeavesNoCheckpoint) {
  // A shard file written without the atomic writer's fsync (a crash before
  // it synced) is cut back; the manifest, written after, names its size.
  ASSERT_TRUE(Write(Env::Default(), 1, Layout(2), 10).ok());
  previous_ = Files(1);
  FaultInjectionEnv env(Env::Default());
  ASSERT_TRUE(Write(&env, 2, Layout(2), 20).ok());
  auto file = env.NewWritableFile(ShardPath(2, 0));
  ASSERT_TRUE(file.ok());
  ASSERT_TRUE((*file)->Append("half of a rewrite").ok());
  ASSERT_TRUE((*file)->Close().ok());
  ASSERT_TRUE(env.DropUnsyncedData().ok());
  ExpectFallsBackToTheFirst("shard-00000.ckpt");
}

TEST_F(CheckpointTest, FailedFsyncOfAShardFileWritesNoManifest) {
  ASSERT_TRUE(Write(Env::Default(), 1, Layout(2), 10).ok());
  previous_ = Files(1);
  FaultInjectionEnv env(Env::Default());
  env.FailSyncs(true);
  absl::Status s = Write(&env, 2, Layout(2), 20);
  EXPECT_TRUE(absl::IsUnavailable(s)) << s;
  EXPECT_THAT(std::string(s.message()), HasSubstr("fsync"));
  EXPECT_FALSE(Env::Default()->FileExists(JoinPath(CheckpointFolder(root_, 2), kManifestName)));
  ExpectFallsBackToTheFirst("no MANIFEST");
}

TEST_F(CheckpointTest, FailedWriteOfTheManifestLeavesTheCheckpointIncomplete) {
  ASSERT_TRUE(Write(Env::Default(), 1, Layout(2), 10).ok());
  previous_ = Files(1);
  // Budget enough for both shard files, not for the manifest.
  FaultInjectionEnv probe(Env::Default());
  ASSERT_TRUE(Write(&probe, 9, Layout(2), 20).ok());
  const int64_t shard_bytes = Env::Default()->ReadFile(ShardPath(9, 0))->size() +
                              Env::Default()->ReadFile(ShardPath(9, 1))->size();
  std::filesystem::remove_all(CheckpointFolder(root_, 9));
  FaultInjectionEnv env(Env::Default());
  env.FailWritesAfter(shard_bytes);
  absl::Status s = Write(&env, 2, Layout(2), 20);
  EXPECT_TRUE(absl::IsUnavailable(s)) << s;
  EXPECT_THAT(std::string(s.message()), HasSubstr("MANIFEST"));
  ExpectFallsBackToTheFirst("no MANIFEST");
}

TEST_F(CheckpointTest, FlippedByteInAShardFileIsRefused) {
  WriteTwo();
  ASSERT_TRUE(FaultInjectionEnv::CorruptByte(ShardPath(2, 0), 40).ok());
  ExpectFallsBackToTheFirst("CRC-32 mismatch");
}

TEST_F(CheckpointTest, FlippedByteInTheManifestIsRefused) {
  WriteTwo();
  ASSERT_TRUE(FaultInjectionEnv::CorruptByte(
                  JoinPath(CheckpointFolder(root_, 2), kManifestName), -6)
                  .ok());
  ExpectFallsBackToTheFirst("MANIFEST");
}

TEST_F(CheckpointTest, MissingManifestMeansIncomplete) {
  WriteTwo();
  ASSERT_TRUE(Env::Default()->RemoveFile(JoinPath(CheckpointFolder(root_, 2), kManifestName)).ok());
  ExpectFallsBackToTheFirst("no MANIFEST (an incomplete checkpoint)");
}

TEST_F(CheckpointTest, AFolderThatDoesNotExistIsSaidToBeMissingNotIncomplete) {
  const std::string missing = JoinPath(root_, "nothing-here");
  absl::StatusOr<v1::CheckpointManifest> m = VerifyCheckpoint(Env::Default(), missing, "");
  EXPECT_TRUE(absl::IsNotFound(m.status())) << m.status();
  EXPECT_EQ(m.status().message(), missing + ": no such folder");
}

TEST_F(CheckpointTest, ACheckpointDirGivenForACheckpointIsSaidToBeOneAndNamesItsNewest) {
  WriteTwo();
  absl::StatusOr<v1::CheckpointManifest> m = VerifyCheckpoint(Env::Default(), root_, "");
  EXPECT_TRUE(absl::IsNotFound(m.status())) << m.status();
  EXPECT_THAT(std::string(m.status().message()), HasSubstr("a checkpoint_dir"));
  EXPECT_THAT(std::string(m.status().message()),
              HasSubstr("its newest is " + CheckpointFolder(root_, 2)));
  EXPECT_THAT(std::string(m.status().message()), Not(HasSubstr("incomplete")));
}

TEST_F(CheckpointTest, MissingShardFileIsRefused) {
  WriteTwo();
  ASSERT_TRUE(Env::Default()->RemoveFile(ShardPath(2, 1)).ok());
  ExpectFallsBackToTheFirst("shard-00001.ckpt");
}

TEST_F(CheckpointTest, HugeDeclaredLengthIsRefusedWithoutReadingPastTheFile) {
  ASSERT_TRUE(Write(Env::Default(), 1, Layout(2), 10).ok());
  const std::string path = JoinPath(CheckpointFolder(root_, 1), kManifestName);
  std::string bytes = *Env::Default()->ReadFile(path);
  for (int i = 8; i < 16; ++i) bytes[i] = '\xff';
  ASSERT_TRUE(WriteFileAtomically(Env::Default(), path, bytes).ok());
  absl::StatusOr<v1::CheckpointManifest> m = ReadManifest(Env::Default(), path.substr(0, path.rfind('/')));
  EXPECT_TRUE(absl::IsDataLoss(m.status())) << m.status();
  EXPECT_THAT(std::string(m.status().message()), HasSubstr("truncated or torn"));
}

TEST_F(CheckpointTest, NoCheckpointInAMissingOrEmptyFolder) {
  absl::StatusOr<CheckpointChoice> none =
      FindNewestCheckpoint(Env::Default(), JoinPath(root_, "nothing-here"), "job");
  ASSERT_TRUE(none.ok()) << none.status();
  EXPECT_FALSE(none->manifest.has_value());
  EXPECT_TRUE(FindNewestCheckpoint(Env::Default(), root_, "job")->refused.empty());
}

TEST_F(CheckpointTest, CheckpointOfAnotherJobIsNotTakenForThisOne) {
  ASSERT_TRUE(Write(Env::Default(), 1, Layout(2), 10).ok());
  absl::StatusOr<CheckpointChoice> other = FindNewestCheckpoint(Env::Default(), root_, "other");
  ASSERT_TRUE(other.ok());
  EXPECT_FALSE(other->manifest.has_value());
  EXPECT_TRUE(FindNewestCheckpoint(Env::Default(), root_, "")->manifest.has_value());
}

TEST_F(CheckpointTest, ADifferentChunkLayoutIsRefused) {
  absl::Status s = CheckSameChunks(Layout(2, 64), Layout(2, 128));
  EXPECT_TRUE(absl::IsFailedPrecondition(s)) << s;
  EXPECT_THAT(std::string(s.message()), HasSubstr("--chunk_kb"));
  EXPECT_TRUE(CheckSameChunks(Layout(2), Layout(5)).ok());
}

// A model of two tensors, "dense_0/weight" 4x8 and `name` of `shape`, on
// one shard.
v1::ShardMap TwoTensors(const std::string& name, std::vector<int64_t> shape) {
  v1::TensorSpec a, b;
  a.set_name("dense_0/weight");
  a.add_shape(4);
  a.add_shape(8);
  b.set_name(name);
  for (int64_t d : shape) b.add_shape(d);
  return *BuildShardMap({a, b}, 1, 1 << 20);
}

TEST_F(CheckpointTest, ATensorOfAnotherShapeIsRefusedNamingBothShapes) {
  absl::Status s = CheckSameChunks(TwoTensors("dense_1/weight", {128, 256}),
                                   TwoTensors("dense_1/weight", {64, 256}));
  EXPECT_TRUE(absl::IsFailedPrecondition(s)) << s;
  EXPECT_THAT(std::string(s.message()),
              HasSubstr("tensor 1 dense_1/weight is 128x256 in the checkpoint and 64x256 in "
                        "this job's model"));
  // A caller comparing two checkpoints names the sides itself.
  s = CheckSameChunks(TwoTensors("dense_1/weight", {128, 256}),
                      TwoTensors("dense_1/weight", {128, 256, 2}), "DIR_A", "DIR_B");
  EXPECT_THAT(std::string(s.message()),
              HasSubstr("tensor 1 dense_1/weight is 128x256 in DIR_A and 128x256x2 in DIR_B"));
}

TEST_F(CheckpointTest, ATensorOfAnotherNameIsRefusedNamingBothNames) {
  absl::Status s =
      CheckSameChunks(TwoTensors("dense_1/weight", {8, 8}), TwoTensors("embedding/weight", {8, 8}));
  EXPECT_TRUE(absl::IsFailedPrecondition(s)) << s;
  EXPECT_THAT(std::string(s.message()),
              HasSubstr("tensor 1 is dense_1/weight in the checkpoint and embedding/weight in "
                        "this job's model"));
  EXPECT_THAT(std::string(s.message()), Not(HasSubstr("x8")));
}

TEST_F(CheckpointTest, PerShardStorageChecksTheManifestAloneThenEachShardItsOwnFile) {
  WriteTwo();
  // Per-shard storage: the coordinator's folder holds the manifests only.
  const std::string shard0 = ShardPath(2, 0);
  ASSERT_TRUE(Env::Default()->RemoveFile(shard0).ok());
  ASSERT_TRUE(Env::Default()->RemoveFile(ShardPath(2, 1)).ok());
  ExpectFallsBackToTheFirst("shard-00000.ckpt");  // every file is needed
  absl::StatusOr<CheckpointChoice> manifests =
      FindNewestCheckpoint(Env::Default(), root_, "job", CheckpointFiles::kManifestOnly);
  ASSERT_TRUE(manifests.ok() && manifests->manifest.has_value());
  EXPECT_EQ(manifests->manifest->id(), 2u);
  // A checkpoint a shard could not restore is skipped, and said so.
  const uint64_t refused[] = {2};
  manifests = FindNewestCheckpoint(Env::Default(), root_, "job", CheckpointFiles::kManifestOnly,
                                   refused);
  ASSERT_TRUE(manifests.ok() && manifests->manifest.has_value());
  EXPECT_EQ(manifests->manifest->id(), 1u);
  ASSERT_EQ(manifests->refused.size(), 1u);
  EXPECT_THAT(manifests->refused[0], HasSubstr("a shard could not restore it"));
  // A damaged manifest is still refused without the files.
  ASSERT_TRUE(FaultInjectionEnv::CorruptByte(
                  JoinPath(CheckpointFolder(root_, 2), kManifestName), -6)
                  .ok());
  manifests = FindNewestCheckpoint(Env::Default(), root_, "job", CheckpointFiles::kManifestOnly);
  ASSERT_TRUE(manifests.ok() && manifests->manifest.has_value());
  EXPECT_EQ(manifests->manifest->id(), 1u);

  // A shard checks its own file against the manifest: intact, damaged,
  // missing, and another shard's file under its name.
  const v1::CheckpointManifest m1 = *ReadManifest(Env::Default(), CheckpointFolder(root_, 1));
  const std::string dir1 = CheckpointFolder(root_, 1);
  EXPECT_TRUE(VerifyShardFile(Env::Default(), dir1, m1, 0).ok());
  EXPECT_TRUE(VerifyShardFile(Env::Default(), dir1, m1, 1).ok());
  absl::Status other = VerifyShardFile(Env::Default(), dir1, m1, 2);
  EXPECT_TRUE(absl::IsDataLoss(other)) << other;
  const std::string path1 = ShardPath(1, 1);
  const std::string good = *Env::Default()->ReadFile(path1);
  ASSERT_TRUE(FaultInjectionEnv::CorruptByte(path1, 40).ok());
  absl::Status flipped = VerifyShardFile(Env::Default(), dir1, m1, 1);
  EXPECT_TRUE(absl::IsDataLoss(flipped)) << flipped;
  EXPECT_THAT(std::string(flipped.message()), HasSubstr("shard-00001.ckpt"));
  EXPECT_TRUE(VerifyShardFile(Env::Default(), dir1, m1, 0).ok());  // the other is fine
  ASSERT_TRUE(WriteFileAtomically(Env::Default(), path1, *Env::Default()->ReadFile(ShardPath(1, 0)))
                  .ok());
  EXPECT_FALSE(VerifyShardFile(Env::Default(), dir1, m1, 1).ok());
  ASSERT_TRUE(Env::Default()->RemoveFile(path1).ok());
  EXPECT_TRUE(absl::IsNotFound(VerifyShardFile(Env::Default(), dir1, m1, 1)));
  ASSERT_TRUE(WriteFileAtomically(Env::Default(), path1, good).ok());
  EXPECT_TRUE(VerifyShardFile(Env::Default(), dir1, m1, 1).ok());
}

TEST_F(CheckpointTest, PerShardStorageNeedsTheSameShardsAndPlacement) {
  EXPECT_TRUE(CheckSameShards(Layout(2), Layout(2)).ok());
  absl::Status more = CheckSameShards(Layout(2), Layout(3));
  EXPECT_TRUE(absl::IsFailedPrecondition(more)) << more;
  EXPECT_THAT(std::string(more.message()), HasSubstr("--servers=2"));
  v1::ShardMap moved = Layout(2);
  moved.mutable_chunks(0)->set_shard(1 - moved.chunks(0).shard());
  EXPECT_TRUE(absl::IsFailedPrecondition(CheckSameShards(Layout(2), moved)));
}

}  // namespace
}  // namespace grps
