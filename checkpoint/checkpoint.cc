#include "checkpoint/checkpoint.h"

#include <zlib.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <set>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "job/shard_map.h"

namespace grps {
namespace {

constexpr char kMagic[] = "GRPSCKP1";
constexpr size_t kMagicLen = 8;
constexpr size_t kHeaderLen = kMagicLen + 8;
constexpr size_t kTrailerLen = 4;
constexpr char kFolderPrefix[] = "ckpt-";

uint32_t Crc32(absl::string_view bytes) {
  uLong crc = crc32(0L, Z_NULL, 0);
  // zlib takes uInt lengths; feed large buffers in pieces.
  while (!bytes.empty()) {
    const size_t n = std::min<size_t>(bytes.size(), 1u << 30);
    crc = crc32(crc, reinterpret_cast<const Bytef*>(bytes.data()), static_cast<uInt>(n));
    bytes.remove_prefix(n);
  }
  return static_cast<uint32_t>(crc);
}

void PutLE(std::string* out, uint64_t v, int bytes) {
  for (int i = 0; i < bytes; ++i) out->push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}
uint64_t GetLE(absl::string_view in, int bytes) {
  uint64_t v = 0;
  for (int i = 0; i < bytes; ++i)
    v |= static_cast<uint64_t>(static_cast<unsigned char>(in[i])) << (8 * i);
  return v;
}

std::string Frame(const google::protobuf::Message& message) {
  std::string payload;
  message.SerializeToString(&payload);
  std::string out(kMagic, kMagicLen);
  PutLE(&out, payload.size(), 8);
  out += payload;
  PutLE(&out, Crc32(payload), 4);
  return out;
}

// Checks the framing of `bytes` (the contents of `path`) and parses it.
absl::Status Unframe(absl::string_view bytes, const std::string& path,
                     google::protobuf::Message* message) {
  auto damaged = [&](auto... why) {
    return absl::DataLossError(absl::StrCat(path, ": ", why...));
  };
  if (bytes.size() < kHeaderLen + kTrailerLen)
    return damaged("too short (", bytes.size(), " bytes)");
  if (bytes.substr(0, kMagicLen) != absl::string_view(kMagic, kMagicLen))
    return damaged("not a grps checkpoint file (bad magic)");
  const uint64_t length = GetLE(bytes.substr(kMagicLen), 8);
  if (length != bytes.size() - kHeaderLen - kTrailerLen)
    return damaged("declares ", length, " payload bytes but holds ",
                   bytes.size() - kHeaderLen - kTrailerLen, " (truncated or torn)");
  const absl::string_view payload = bytes.substr(kHeaderLen, length);
  const uint32_t want = static_cast<uint32_t>(GetLE(bytes.substr(kHeaderLen + length), 4));
  const uint32_t got = Crc32(payload);
  if (want != got)
    return damaged(absl::StrFormat("CRC-32 mismatch (recorded %08x, computed %08x)", want, got));
  if (!message->ParseFromArray(payload.data(), static_cast<int>(payload.size())))
    return damaged("payload does not parse");
  return absl::OkStatus();
}

}  // namespace

std::string CheckpointFolder(absl::string_view root, uint64_t id) {
  return JoinPath(root, absl::StrFormat("%s%08u", kFolderPrefix, id));
}

std::string ShardFileName(uint32_t shard) { return absl::StrFormat("shard-%05u.ckpt", shard); }

absl::StatusOr<v1::ShardCheckpoint> WriteShardFile(Env* env, const std::string& dir,
                                                   const v1::ShardCheckpointFile& file) {
  if (absl::Status s = env->CreateDir(dir); !s.ok()) return s;
  const std::string bytes = Frame(file);
  const std::string name = ShardFileName(file.shard());
  if (absl::Status s = WriteFileAtomically(env, JoinPath(dir, name), bytes); !s.ok()) return s;
  v1::ShardCheckpoint out;
  out.set_id(file.checkpoint_id());
  out.set_shard(file.shard());
  out.set_state(v1::CHECKPOINT_STATE_WRITTEN);
  out.set_file(name);
  out.set_bytes(bytes.size());
  out.set_crc32(Crc32(bytes));
  out.set_num_chunks(file.chunks_size());
  uint64_t lo = UINT64_MAX, hi = 0;
  for (const v1::ChunkState& c : file.chunks()) {
    lo = std::min<uint64_t>(lo, c.version());
    hi = std::max<uint64_t>(hi, c.version());
  }
  out.set_min_version(file.chunks_size() > 0 ? lo : 0);
  out.set_max_version(hi);
  return out;
}

absl::StatusOr<v1::ShardCheckpointFile> ReadShardFile(Env* env, const std::string& dir,
                                                      const v1::ShardCheckpoint& expected,
                                                      absl::string_view job_id,
                                                      uint64_t checkpoint_id) {
  if (expected.file().empty() || expected.file() == "." || expected.file() == ".." ||
      absl::StrContains(expected.file(), "/"))
    return absl::DataLossError(absl::StrCat(dir, ": manifest names a bad file '",
                                            expected.file(), "'"));
  const std::string path = JoinPath(dir, expected.file());
  absl::StatusOr<std::string> bytes = env->ReadFile(path);
  if (!bytes.ok()) return bytes.status();
  if (bytes->size() != expected.bytes())
    return absl::DataLossError(absl::StrCat(path, ": ", bytes->size(),
                                            " bytes, the manifest recorded ", expected.bytes()));
  if (const uint32_t crc = Crc32(*bytes); crc != expected.crc32())
    return absl::DataLossError(absl::StrFormat(
        "%s: CRC-32 mismatch (manifest %08x, file %08x)", path, expected.crc32(), crc));
  v1::ShardCheckpointFile file;
  if (absl::Status s = Unframe(*bytes, path, &file); !s.ok()) return s;
  if ((!job_id.empty() && file.job_id() != job_id) || file.checkpoint_id() != checkpoint_id ||
      file.shard() != expected.shard())
    return absl::DataLossError(absl::StrCat(
        path, ": holds job '", file.job_id(), "' checkpoint ", file.checkpoint_id(), " shard ",
        file.shard(), ", the manifest expects checkpoint ", checkpoint_id, " shard ",
        expected.shard()));
  return file;
}

absl::Status WriteManifest(Env* env, const std::string& dir,
                           const v1::CheckpointManifest& manifest) {
  if (absl::Status s = env->CreateDir(dir); !s.ok()) return s;
  return WriteFileAtomically(env, JoinPath(dir, kManifestName), Frame(manifest));
}

absl::StatusOr<v1::CheckpointManifest> ReadManifest(Env* env, const std::string& dir) {
  const std::string path = JoinPath(dir, kManifestName);
  absl::StatusOr<std::string> bytes = env->ReadFile(path);
  if (!bytes.ok()) {
    if (absl::IsNotFound(bytes.status()))
      return absl::NotFoundError(absl::StrCat(dir, ": no ", kManifestName,
                                              " (an incomplete checkpoint)"));
    return bytes.status();
  }
  v1::CheckpointManifest manifest;
  if (absl::Status s = Unframe(*bytes, path, &manifest); !s.ok()) return s;
  return manifest;
}

absl::StatusOr<v1::CheckpointManifest> VerifyCheckpoint(Env* env, const std::string& dir,
                                                        absl::string_view job_id) {
  absl::StatusOr<v1::CheckpointManifest> manifest = ReadManifest(env, dir);
  if (!manifest.ok()) return manifest.status();
  if (!job_id.empty() && manifest->job_id() != job_id)
    return absl::NotFoundError(absl::StrCat(dir, ": a checkpoint of job '",
                                            manifest->job_id(), "', not '", job_id, "'"));
  auto damaged = [&](auto... why) { return absl::DataLossError(absl::StrCat(dir, ": ", why...)); };
  if (absl::Status s = ValidateShardMap(manifest->shard_map()); !s.ok())
    return damaged("the manifest's ", s.message());
  const v1::ShardMap& map = manifest->shard_map();
  if (manifest->shards_size() != map.shards_size())
    return damaged("the manifest names ", manifest->shards_size(), " shard files for ",
                   map.shards_size(), " shards");
  for (int k = 0; k < manifest->shards_size(); ++k) {
    const v1::ShardCheckpoint& shard = manifest->shards(k);
    if (shard.shard() != static_cast<uint32_t>(k))
      return damaged("the manifest's shard files are out of order");
    absl::StatusOr<v1::ShardCheckpointFile> file =
        ReadShardFile(env, dir, shard, manifest->job_id(), manifest->id());
    if (!file.ok()) return file.status();
    // The file holds exactly the chunks the layout put on its shard, each
    // of its size: a restore can trust what it loads.
    const std::vector<uint32_t> want = ChunksOfShard(map, shard.shard());
    if (file->chunks_size() != static_cast<int>(want.size()))
      return damaged(shard.file(), " holds ", file->chunks_size(), " chunks, the layout puts ",
                     want.size(), " on shard ", shard.shard());
    for (int i = 0; i < file->chunks_size(); ++i) {
      const v1::ChunkState& c = file->chunks(i);
      const uint64_t bytes = map.chunks(want[i]).num_elements() * sizeof(float);
      bool fits = c.chunk_id() == want[i] && c.num_elements() * sizeof(float) == bytes &&
                  c.values().size() == bytes;
      for (const std::string& slot : c.optimizer_state()) fits = fits && slot.size() == bytes;
      if (!fits)
        return damaged(shard.file(), ": chunk ", c.chunk_id(), " does not fit the layout's chunk ",
                       want[i]);
    }
  }
  return manifest;
}

absl::StatusOr<CheckpointChoice> FindNewestCheckpoint(Env* env, const std::string& root,
                                                      absl::string_view job_id) {
  CheckpointChoice choice;
  absl::StatusOr<std::vector<std::string>> names = env->ListDir(root);
  if (!names.ok()) {
    if (absl::IsNotFound(names.status())) return choice;
    return names.status();
  }
  std::map<uint64_t, std::string, std::greater<uint64_t>> folders;
  for (const std::string& name : *names) {
    uint64_t id = 0;
    const std::string digits = name.substr(std::min(name.size(), std::strlen(kFolderPrefix)));
    if (!absl::StartsWith(name, kFolderPrefix) || digits.empty() ||
        !std::all_of(digits.begin(), digits.end(), absl::ascii_isdigit) ||
        !absl::SimpleAtoi(digits, &id) || name != CheckpointFolder("", id).substr(0))
      continue;
    folders[id] = name;
  }
  for (const auto& [id, name] : folders) {
    const std::string dir = JoinPath(root, name);
    absl::StatusOr<v1::CheckpointManifest> manifest = VerifyCheckpoint(env, dir, job_id);
    if (manifest.ok() && manifest->id() != id)
      manifest = absl::DataLossError(absl::StrCat(dir, ": the manifest is for checkpoint ",
                                                  manifest->id()));
    if (!manifest.ok()) {
      choice.refused.push_back(absl::StrCat(name, ": ", manifest.status().message()));
      continue;
    }
    choice.manifest = std::move(*manifest);
    choice.dir = dir;
    break;
  }
  return choice;
}

absl::Status CheckSameChunks(const v1::ShardMap& saved, const v1::ShardMap& current) {
  auto differ = [](auto... why) {
    return absl::FailedPreconditionError(absl::StrCat(
        "the checkpoint's model is cut differently from this job's: ", why...,
        " (same --model, --hidden and --chunk_kb are needed)"));
  };
  if (saved.tensors_size() != current.tensors_size())
    return differ(saved.tensors_size(), " tensors against ", current.tensors_size());
  for (int t = 0; t < saved.tensors_size(); ++t) {
    const v1::TensorSpec& a = saved.tensors(t);
    const v1::TensorSpec& b = current.tensors(t);
    if (a.name() != b.name() || a.shape_size() != b.shape_size() ||
        !std::equal(a.shape().begin(), a.shape().end(), b.shape().begin()))
      return differ("tensor ", t, " is ", a.name(), " there and ", b.name(), " here, or its shape differs");
  }
  if (saved.chunks_size() != current.chunks_size())
    return differ(saved.chunks_size(), " chunks against ", current.chunks_size());
  for (int c = 0; c < saved.chunks_size(); ++c) {
    const v1::ChunkSpec& a = saved.chunks(c);
    const v1::ChunkSpec& b = current.chunks(c);
    if (a.chunk_id() != b.chunk_id() || a.tensor_index() != b.tensor_index() ||
        a.offset() != b.offset() || a.num_elements() != b.num_elements())
      return differ("chunk ", c, " differs");
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<v1::ChunkState>> LoadChunks(
    Env* env, const std::string& dir, const v1::CheckpointManifest& manifest,
    absl::Span<const uint32_t> chunk_ids) {
  const v1::ShardMap& map = manifest.shard_map();
  std::set<uint32_t> shards;
  for (uint32_t id : chunk_ids) {
    if (id >= static_cast<uint32_t>(map.chunks_size()))
      return absl::NotFoundError(absl::StrCat(dir, ": the checkpoint has no chunk ", id));
    shards.insert(map.chunks(id).shard());
  }
  std::map<uint32_t, v1::ChunkState> found;
  const std::set<uint32_t> wanted(chunk_ids.begin(), chunk_ids.end());
  for (uint32_t shard : shards) {
    const v1::ShardCheckpoint* entry = nullptr;
    for (const v1::ShardCheckpoint& s : manifest.shards())
      if (s.shard() == shard) entry = &s;
    if (entry == nullptr)
      return absl::DataLossError(absl::StrCat(dir, ": the manifest has no file for shard ", shard));
    absl::StatusOr<v1::ShardCheckpointFile> file =
        ReadShardFile(env, dir, *entry, manifest.job_id(), manifest.id());
    if (!file.ok()) return file.status();
    for (v1::ChunkState& c : *file->mutable_chunks())
      if (wanted.count(c.chunk_id())) found[c.chunk_id()] = std::move(c);
  }
  std::vector<v1::ChunkState> out;
  out.reserve(chunk_ids.size());
  for (uint32_t id : chunk_ids) {
    auto it = found.find(id);
    if (it == found.end())
      return absl::NotFoundError(absl::StrCat(dir, ": no shard file holds chunk ", id));
    out.push_back(it->second);
  }
  return out;
}

}  // namespace grps
