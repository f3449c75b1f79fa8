// Checkpoint files: how a consistent cut of a job's parameters is laid out
// on disk, written and checked. See docs/durability.md.
//
//   <checkpoint_dir>/ckpt-<id, 8 digits>/shard-<k, 5 digits>.ckpt
//                                       /MANIFEST
//
// Each shard writes its file (a ShardCheckpointFile: every chunk it holds
// with values, optimizer state and exactly-once marks, and every sparse
// table's rows on that shard with theirs), framed as
//   "GRPSCKP1" | u64 payload length (LE) | payload | u32 CRC-32 of payload (LE)
// and written atomically (daemon/env.h). The coordinator writes MANIFEST
// (a CheckpointManifest, framed the same way) last, once every shard's file
// is durable, recording each file's size and CRC-32 of the whole file. A
// folder without a valid MANIFEST, or whose files do not match it, is not a
// checkpoint: it is refused with a status that says what is wrong, and
// nothing in it or in any other checkpoint is changed.
//
// Chunks are cut independently of the shard count (job/shard_map.h), and a
// sparse row's shard is a hash of its id (job/sparse_tables.h), so a
// checkpoint restores into any number of shards: LoadShardState reads the
// chunks a shard now owns from whichever files hold them, and the rows that
// now hash to it from every file.
//
// Incremental checkpoints (JobConfig.checkpoint_full_every): a shard's file
// may hold only what changed since its file of an earlier checkpoint
// (ShardCheckpointFile.base_id: every chunk whole, each table's changed and
// removed rows), and the manifest records the chain of files it applies on
// top of (ShardCheckpoint.chain, the full one first), each with its size and
// CRC-32. Every reader here reads a shard's state through its chain
// (ReadShardState), so a restore, a re-sharding and grps-checkpoint-diff
// see full states. An incremental checkpoint needs the folders of its chain
// beside its own.
//
// A file is one protocol buffer message, so it holds at most 2 GiB. A
// shard's file past JobConfig.checkpoint_part_kib (1 GiB) holds its chunks
// and its tables' state but none of their rows: those are in part files
// beside it, shard-<k>.part-<n, 5 digits>, each one table's rows in order
// (ShardCheckpoint.parts, checked as the file is: size, CRC-32, framing,
// job, checkpoint, shard). Every reader here reads a file with its parts
// (ReadShardFile), so a shard's rows have no size ceiling; its dense chunks
// past 2 GiB still fail (RESOURCE_EXHAUSTED, the checkpoint is not taken:
// the job needs more shards).
//
// Thread safety: free functions, no shared state beyond the Env.
#ifndef GRPS_CHECKPOINT_CHECKPOINT_H_
#define GRPS_CHECKPOINT_CHECKPOINT_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "daemon/env.h"
#include "proto/grps.pb.h"

namespace grps {

// "<root>/ckpt-00000012".
std::string CheckpointFolder(absl::string_view root, uint64_t id);
// "shard-00003.ckpt".
std::string ShardFileName(uint32_t shard);
inline constexpr char kManifestName[] = "MANIFEST";

// "shard-00003.part-00001": part 1 of shard 3's file (the first is 0).
std::string ShardPartFileName(uint32_t shard, uint32_t part);

// The most a shard file holds before its rows go to parts: 1 GiB, or
// `config`.checkpoint_part_kib KiB.
inline constexpr uint64_t kDefaultCheckpointPartBytes = uint64_t{1} << 30;
uint64_t CheckpointPartBytes(const v1::JobConfig& config);

// Writes `file` as `dir`/ShardFileName(file.shard()) (creating `dir`), and
// returns what the manifest records of it: id, shard, state WRITTEN, file
// name, bytes, crc32, min/max version (over chunks and tables), the number
// of chunks, of tables and of rows. A file past `part_bytes` holds none of
// its tables' rows: each table's go to part files of at most about
// `part_bytes` each, written first (ShardCheckpoint.parts). RESOURCE_EXHAUSTED
// when the file without its rows would pass 2 GiB.
absl::StatusOr<v1::ShardCheckpoint> WriteShardFile(
    Env* env, const std::string& dir, const v1::ShardCheckpointFile& file,
    uint64_t part_bytes = kDefaultCheckpointPartBytes);

// The bytes of a shard file and its parts.
uint64_t ShardFileBytes(const v1::ShardCheckpoint& shard);

// Reads and checks one shard file against what the manifest recorded (size,
// CRC-32, framing, job id (unless empty), checkpoint id, shard), with the
// rows of its parts (ShardCheckpoint.parts) appended to their tables, each
// part checked so too. DATA_LOSS naming the file and the mismatch when one
// is damaged; NOT_FOUND when one is missing.
absl::StatusOr<v1::ShardCheckpointFile> ReadShardFile(
    Env* env, const std::string& dir, const v1::ShardCheckpoint& expected,
    absl::string_view job_id, uint64_t checkpoint_id);

// Shard file `expected` of checkpoint `checkpoint_id` in `dir` as a full
// file. An incremental one (ShardCheckpointFile.base_id) is read on top of
// the files of its chain (ShardCheckpoint.chain: the full one, then each
// increment, in the folders of their checkpoints beside `dir`), each checked
// as ReadShardFile checks it. DATA_LOSS naming the file when a link is
// damaged, out of order or not the file its successor applies on top of.
absl::StatusOr<v1::ShardCheckpointFile> ReadShardState(Env* env, const std::string& dir,
                                                       const v1::ShardCheckpoint& expected,
                                                       absl::string_view job_id,
                                                       uint64_t checkpoint_id);

// One file of a shard's chain: its checkpoint's folder, what the manifest
// records of it, and the checkpoint's id.
struct ShardChainLink {
  std::string dir;
  v1::ShardCheckpoint entry;
  uint64_t id = 0;
};

// The files shard file `expected` of checkpoint `checkpoint_id` in `dir`
// stands on: its chain's (ShardCheckpoint.chain, the full one first, each in
// its checkpoint's folder beside `dir`), then its own. DATA_LOSS when the
// chain is out of order.
absl::StatusOr<std::vector<ShardChainLink>> ShardChain(const std::string& dir,
                                                       const v1::ShardCheckpoint& expected,
                                                       uint64_t checkpoint_id);

// Link `i` of `chain`, read and checked as ReadShardFile checks it, and
// applying on the link before it (the first: a full file). DATA_LOSS naming
// the file when it does not.
absl::StatusOr<v1::ShardCheckpointFile> ReadChainLink(Env* env,
                                                      const std::vector<ShardChainLink>& chain,
                                                      size_t i, absl::string_view job_id);

// Applies incremental files `deltas` (read from `paths`), in order, on top
// of `base`, the full state of the same shard at the first one's base
// checkpoint (each next one's base is the one before): base becomes the full
// state at the last one's checkpoint. DATA_LOSS naming the file when one
// does not fit.
absl::Status ApplyShardDeltas(const std::vector<v1::ShardCheckpointFile>& deltas,
                              const std::vector<std::string>& paths,
                              v1::ShardCheckpointFile* base);

// The folder of checkpoint `id` beside `dir`, a checkpoint's folder
// (".../ckpt-00000012" -> ".../ckpt-<id>").
std::string CheckpointFolderBeside(const std::string& dir, uint64_t id);

// Lowers each rank's step in `into` to that of `from` where it is lower
// (or missing): the held steps (held_from) of several chunks or tables.
void LowerHeldFrom(const google::protobuf::Map<uint32_t, uint64_t>& from,
                   google::protobuf::Map<uint32_t, uint64_t>* into);

// Writes `dir`/MANIFEST atomically. Call only once every shard file it names
// is durable.
absl::Status WriteManifest(Env* env, const std::string& dir,
                           const v1::CheckpointManifest& manifest);

// Reads `dir`/MANIFEST and checks its framing. NOT_FOUND when missing (the
// message says whether `dir` is missing too, or is a checkpoint_dir, naming
// its newest checkpoint folder), DATA_LOSS when damaged.
absl::StatusOr<v1::CheckpointManifest> ReadManifest(Env* env,
                                                    const std::string& dir);

// What VerifyCheckpoint reads: the manifest and every file it names
// (shared storage), or the manifest alone (per-shard storage: the shards'
// files are on their own volumes, and each shard checks its own with
// VerifyShardFile before it restores).
enum class CheckpointFiles { kEveryFile, kManifestOnly };

// A manifest that parses and is consistent (a valid layout and tables, one
// file per shard, in order), the manifest's job id `job_id` unless that is
// empty, and with kEveryFile every file it names present with the recorded
// size and CRC-32 and holding what the layout puts on its shard (each file
// is read once). The first problem found, as DATA_LOSS or NOT_FOUND with
// the folder and file named.
absl::StatusOr<v1::CheckpointManifest> VerifyCheckpoint(
    Env* env, const std::string& dir, absl::string_view job_id,
    CheckpointFiles files = CheckpointFiles::kEveryFile);

// The manifest's own checks of VerifyCheckpoint (DATA_LOSS naming `dir`).
absl::Status CheckManifest(const v1::CheckpointManifest& manifest, const std::string& dir);

// Shard `k`'s file in `dir` as VerifyCheckpoint checks it: the size and
// CRC-32 that `manifest` records, the framing, and exactly the chunks and
// table rows the manifest's layout puts on shard k.
absl::Status VerifyShardFile(Env* env, const std::string& dir,
                             const v1::CheckpointManifest& manifest, uint32_t k);

// The newest complete checkpoint under `root` (of `job_id`, or of any job
// when `job_id` is empty: a job restarted from a folder may have a new id):
// folders
// ckpt-<id> are tried from the highest id down; each damaged or incomplete
// one is skipped and described in `refused` ("ckpt-00000007: shard-00001.ckpt:
// CRC-32 mismatch ..."). `found` is empty when none is complete (also when
// `root` does not exist). Errors only when `root` cannot be listed for
// another reason. `files` says what is verified (VerifyCheckpoint); the ids
// in `refused` (checkpoints a shard could not restore) are skipped.
struct CheckpointChoice {
  std::optional<v1::CheckpointManifest> manifest;
  std::string dir;  // the chosen folder
  std::vector<std::string> refused;
};
absl::StatusOr<CheckpointChoice> FindNewestCheckpoint(
    Env* env, const std::string& root, absl::string_view job_id,
    CheckpointFiles files = CheckpointFiles::kEveryFile,
    absl::Span<const uint64_t> refused = {});

// FAILED_PRECONDITION unless `saved` and `current` cut the same tensors into
// the same chunks (names, shapes, chunk ids, offsets, sizes); the shard
// assignment and endpoints may differ. The message says what differs, naming
// the sides `saved_name` and `current_name` ("tensor 2 dense_1/weight is
// 128x256 in the checkpoint and 64x256 in this job's model"); a caller that
// compares two checkpoints names them its own way.
absl::Status CheckSameChunks(const v1::ShardMap& saved, const v1::ShardMap& current,
                             absl::string_view saved_name = "the checkpoint",
                             absl::string_view current_name = "this job's model");

// Per-shard storage: FAILED_PRECONDITION unless `saved` and `current` have
// as many shards and put every chunk on the same shard (the shard's own
// file then holds every chunk it restores, and a table's rows hash to the
// same shard). Call after CheckSameChunks.
absl::Status CheckSameShards(const v1::ShardMap& saved, const v1::ShardMap& current);

// FAILED_PRECONDITION unless `saved` (the checkpoint's job) and `current`
// have the same sparse tables: names, dims and ranges (rows); their order,
// init scales and row limits may differ (a shard refuses a restore past its
// row limit itself).
absl::Status CheckSameTables(const v1::JobConfig& saved, const v1::JobConfig& current);

// The state of each chunk in `chunk_ids` (in that order) from the checkpoint
// in `dir` described by `manifest`, reading only the shard files that hold
// them (each checked as ReadShardFile does). NOT_FOUND for a chunk the
// checkpoint lacks.
absl::StatusOr<std::vector<v1::ChunkState>> LoadChunks(
    Env* env, const std::string& dir, const v1::CheckpointManifest& manifest,
    absl::Span<const uint32_t> chunk_ids);

// Adds the counts of `src` to `dst` (the maximum for staleness_max).
void AddStateCounters(const v1::StateCounters& src, v1::StateCounters* dst);

// What shard `shard` of `num_shards` restores from a checkpoint that
// VerifyCheckpoint accepted (its files' sizes are trusted): its chunks
// (`chunk_ids`, as LoadChunks) and, per sparse table of the checkpoint
// (the manifest's config order), the rows that hash to it now.
//
// With the checkpoint's own shard count a table's state is the shard's own
// file's, exactly. With another, the rows come from every file; the version
// is the highest of the files', each rank's dedup mark the lowest (invalid if
// any is) and each held_from the lowest. In sync mode every file has the
// same version and marks, so this is exact too; in async and ssp a step
// that one shard had applied and another had not is applied again to the
// rows of the first when the rank pushes it again. A table's counts
// (TableState.counters) are those of the files i with i mod num_shards ==
// shard, so that their sum over the shards is the checkpoint's.
struct ShardState {
  std::vector<v1::ChunkState> chunks;
  std::vector<v1::TableState> tables;
};
absl::StatusOr<ShardState> LoadShardState(Env* env, const std::string& dir,
                                          const v1::CheckpointManifest& manifest,
                                          absl::Span<const uint32_t> chunk_ids,
                                          uint32_t num_shards, uint32_t shard);

// The dense tensors of a checkpoint, by name, for reading outside a job
// (the grps Python package's gt.state_dict(checkpoint=...)). `path` is a
// checkpoint's folder (ckpt-<id>) or a checkpoint_dir, whose newest
// complete checkpoint is read. Every file is verified first.
struct NamedTensor {
  std::string name;
  std::vector<int64_t> shape;
  std::vector<float> values;
};
absl::StatusOr<std::vector<NamedTensor>> ReadCheckpointTensors(Env* env, const std::string& path);

}  // namespace grps

#endif  // GRPS_CHECKPOINT_CHECKPOINT_H_
