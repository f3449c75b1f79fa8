// Checkpoint files: how a consistent cut of a job's parameters is laid out
// on disk, written and checked. See docs/durability.md.
//
//   <checkpoint_dir>/ckpt-<id, 8 digits>/shard-<k, 5 digits>.ckpt
//                                       /MANIFEST
//
// Each shard writes its file (a ShardCheckpointFile: every chunk it holds
// with values, optimizer state and exactly-once marks), framed as
//   "GRPSCKP1" | u64 payload length (LE) | payload | u32 CRC-32 of payload (LE)
// and written atomically (daemon/env.h). The coordinator writes MANIFEST
// (a CheckpointManifest, framed the same way) last, once every shard's file
// is durable, recording each file's size and CRC-32 of the whole file. A
// folder without a valid MANIFEST, or whose files do not match it, is not a
// checkpoint: it is refused with a status that says what is wrong, and
// nothing in it or in any other checkpoint is changed.
//
// Chunks are cut independently of the shard count (job/shard_map.h), so a
// checkpoint restores into any number of shards: LoadChunks reads the chunks
// a shard now owns from whichever files hold them.
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

// Writes `file` as `dir`/ShardFileName(file.shard()) (creating `dir`), and
// returns what the manifest records of it: id, shard, state WRITTEN, file
// name, bytes, crc32, min/max version and number of chunks.
absl::StatusOr<v1::ShardCheckpoint> WriteShardFile(
    Env* env, const std::string& dir, const v1::ShardCheckpointFile& file);

// Reads and checks one shard file against what the manifest recorded (size,
// CRC-32, framing, job id (unless empty), checkpoint id, shard). DATA_LOSS naming the file
// and the mismatch when it is damaged; NOT_FOUND when it is missing.
absl::StatusOr<v1::ShardCheckpointFile> ReadShardFile(
    Env* env, const std::string& dir, const v1::ShardCheckpoint& expected,
    absl::string_view job_id, uint64_t checkpoint_id);

// Writes `dir`/MANIFEST atomically. Call only once every shard file it names
// is durable.
absl::Status WriteManifest(Env* env, const std::string& dir,
                           const v1::CheckpointManifest& manifest);

// Reads `dir`/MANIFEST and checks its framing. NOT_FOUND when missing,
// DATA_LOSS when damaged.
absl::StatusOr<v1::CheckpointManifest> ReadManifest(Env* env,
                                                    const std::string& dir);

// A manifest, and every file it names present with the recorded size and
// CRC-32 (each file is read once), and the manifest's job id `job_id`
// unless that is empty. The first problem found, as DATA_LOSS or NOT_FOUND
// with the folder and file named.
absl::StatusOr<v1::CheckpointManifest> VerifyCheckpoint(
    Env* env, const std::string& dir, absl::string_view job_id);

// The newest complete checkpoint under `root` (of `job_id`, or of any job
// when `job_id` is empty: a job restarted from a folder may have a new id):
// folders
// ckpt-<id> are tried from the highest id down; each damaged or incomplete
// one is skipped and described in `refused` ("ckpt-00000007: shard-00001.ckpt:
// CRC-32 mismatch ..."). `found` is empty when none is complete (also when
// `root` does not exist). Errors only when `root` cannot be listed for
// another reason.
struct CheckpointChoice {
  std::optional<v1::CheckpointManifest> manifest;
  std::string dir;  // the chosen folder
  std::vector<std::string> refused;
};
absl::StatusOr<CheckpointChoice> FindNewestCheckpoint(Env* env,
                                                      const std::string& root,
                                                      absl::string_view job_id);

// FAILED_PRECONDITION unless `saved` and `current` cut the same tensors into
// the same chunks (names, shapes, chunk ids, offsets, sizes); the shard
// assignment and endpoints may differ.
absl::Status CheckSameChunks(const v1::ShardMap& saved,
                             const v1::ShardMap& current);

// The state of each chunk in `chunk_ids` (in that order) from the checkpoint
// in `dir` described by `manifest`, reading only the shard files that hold
// them (each checked as ReadShardFile does). NOT_FOUND for a chunk the
// checkpoint lacks.
absl::StatusOr<std::vector<v1::ChunkState>> LoadChunks(
    Env* env, const std::string& dir, const v1::CheckpointManifest& manifest,
    absl::Span<const uint32_t> chunk_ids);

}  // namespace grps

#endif  // GRPS_CHECKPOINT_CHECKPOINT_H_
