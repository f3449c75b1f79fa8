#include "checkpoint/checkpoint.h"

#include <zlib.h>

#include <algorithm>
#include <cstring>
#include <limits>
#include <map>
#include <optional>
#include <set>
#include <tuple>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "google/protobuf/field_mask.pb.h"
#include "google/protobuf/util/field_mask_util.h"
#include "job/shard_map.h"
#include "job/sparse_tables.h"

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

// Serialized in place, after the header: a shard's part of a checkpoint may
// be a gigabyte, and is held once.
std::string Frame(const google::protobuf::Message& message) {
  const size_t size = message.ByteSizeLong();
  std::string out(kMagic, kMagicLen);
  PutLE(&out, size, 8);
  out.resize(kHeaderLen + size);
  message.SerializeWithCachedSizesToArray(reinterpret_cast<uint8_t*>(out.data() + kHeaderLen));
  PutLE(&out, Crc32(absl::string_view(out).substr(kHeaderLen, size)), 4);
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

void AddStateCounters(const v1::StateCounters& src, v1::StateCounters* dst) {
  dst->set_pushes(dst->pushes() + src.pushes());
  dst->set_duplicates(dst->duplicates() + src.duplicates());
  dst->set_updates(dst->updates() + src.updates());
  dst->set_late_folded(dst->late_folded() + src.late_folded());
  dst->set_late_dropped(dst->late_dropped() + src.late_dropped());
  dst->set_too_stale(dst->too_stale() + src.too_stale());
  dst->set_staleness_count(dst->staleness_count() + src.staleness_count());
  dst->set_staleness_sum(dst->staleness_sum() + src.staleness_sum());
  dst->set_staleness_max(std::max(dst->staleness_max(), src.staleness_max()));
  auto add = [](const google::protobuf::RepeatedField<uint64_t>& from,
                google::protobuf::RepeatedField<uint64_t>* to) {
    while (to->size() < from.size()) to->Add(0);
    for (int i = 0; i < from.size(); ++i) to->Set(i, to->Get(i) + from.Get(i));
  };
  add(src.staleness_histogram(), dst->mutable_staleness_histogram());
  add(src.late_by_worker(), dst->mutable_late_by_worker());
}

namespace {

// Appends to `dst` the rows of `src` that hash to shard `shard` of
// `num_shards`, and merges the table's version, marks and held steps
// (LoadShardState). `first`: `dst` is empty and takes them as they are.
// `counts`: `dst` takes the counts of `src` too (each file's counts go to
// one shard: TableState.counters).
absl::Status MergeTable(const v1::TableState& src, uint32_t num_shards, uint32_t shard,
                        bool first, bool counts, const std::string& path, v1::TableState* dst) {
  // Its own sizes first: the rows below are read by index.
  if (absl::Status s = CheckTableState(src, src.dim(), src.optimizer_state_size()); !s.ok())
    return absl::DataLossError(
        absl::StrCat(path, ": sparse table '", src.name(), "': ", s.message()));
  if (first) {
    dst->set_name(src.name());
    dst->set_dim(src.dim());
    dst->set_state_width(src.state_width());
    dst->set_version(src.version());
    dst->set_clock(src.clock());
    *dst->mutable_marks() = src.marks();
    *dst->mutable_held_from() = src.held_from();
    for (int k = 0; k < src.optimizer_state_size(); ++k) dst->add_optimizer_state();
  } else {
    if (src.name() != dst->name() || src.dim() != dst->dim() ||
        src.optimizer_state_size() != dst->optimizer_state_size() ||
        TableStateWidth(src) != TableStateWidth(*dst))
      return absl::DataLossError(absl::StrCat(path, ": sparse table '", src.name(),
                                              "' differs in dim or optimizer state from "
                                              "another shard's file"));
    dst->set_version(std::max(dst->version(), src.version()));
    dst->set_clock(std::max(dst->clock(), src.clock()));  // rows keep their idle times
    // Each rank's mark: the lowest, so that nothing a file had not applied
    // is taken for a duplicate; none (invalid) where a file has none.
    while (dst->marks_size() < src.marks_size()) dst->add_marks();
    for (int r = 0; r < dst->marks_size(); ++r) {
      v1::DedupMark* d = dst->mutable_marks(r);
      if (r >= src.marks_size() || !src.marks(r).valid() || !d->valid()) {
        d->set_valid(false);
      } else if (std::make_pair(src.marks(r).incarnation(), src.marks(r).step()) <
                 std::make_pair(d->incarnation(), d->step())) {
        *d = src.marks(r);
      }
    }
    LowerHeldFrom(src.held_from(), dst->mutable_held_from());
  }
  if (counts) AddStateCounters(src.counters(), dst->mutable_counters());
  const size_t row_bytes = static_cast<size_t>(src.dim()) * sizeof(float);
  const size_t state_bytes = static_cast<size_t>(TableStateWidth(src)) * sizeof(float);
  for (int i = 0; i < src.ids_size(); ++i) {
    const int64_t id = src.ids(i);
    if (SparseShardOf(id, num_shards) != shard) continue;
    dst->add_ids(id);
    dst->mutable_values()->append(src.values(), static_cast<size_t>(i) * row_bytes, row_bytes);
    for (int k = 0; k < src.optimizer_state_size(); ++k)
      dst->mutable_optimizer_state(k)->append(src.optimizer_state(k),
                                              static_cast<size_t>(i) * state_bytes, state_bytes);
    dst->add_updates(src.updates_size() == 0 ? 0 : src.updates(i));
    if (src.row_idle_size() != 0) dst->add_row_idle(src.row_idle(i));
  }
  for (int i = 0; i < src.pending_ids_size(); ++i) {
    if (SparseShardOf(src.pending_ids(i), num_shards) != shard) continue;
    dst->add_pending_ids(src.pending_ids(i));
    dst->add_pending_counts(src.pending_counts(i));
    dst->add_pending_idle(src.pending_idle(i));
  }
  return absl::OkStatus();
}

// `deltas` (a table of successive incremental files, read from `paths`)
// on top of `base` (the same table's state at the first one's base file),
// in order: the rows that left go, the rows changed replace theirs or come
// in, every other row's idle time grows by the clock's advance, and the
// table-wide fields are the last one's. The rows are found through one
// index and moved once, at the end, whatever the number of increments.
absl::Status ApplyTableDeltas(const std::vector<const v1::TableState*>& deltas,
                              const std::vector<std::string>& paths, v1::TableState* base) {
  if (absl::Status s = CheckTableState(*base, base->dim(), base->optimizer_state_size()); !s.ok())
    return absl::DataLossError(absl::StrCat(paths.front(), ": sparse table '", base->name(),
                                            "': its base: ", s.message()));
  const size_t row_bytes = static_cast<size_t>(base->dim()) * sizeof(float);
  const size_t state_bytes = static_cast<size_t>(TableStateWidth(*base)) * sizeof(float);
  const int slots = base->optimizer_state_size();
  const int n = base->ids_size();
  absl::flat_hash_map<int64_t, uint32_t> position;
  position.reserve(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i)
    if (!position.try_emplace(base->ids(i), static_cast<uint32_t>(i)).second)
      return absl::DataLossError(absl::StrCat(paths.front(), ": sparse table '", base->name(),
                                              "': its base holds row ", base->ids(i), " twice"));
  std::vector<bool> gone(static_cast<size_t>(n), false);
  // Every row's update count and idle time, one per row from here on.
  std::vector<uint32_t> updates(static_cast<size_t>(n), 0);
  for (int i = 0; i < base->updates_size(); ++i) updates[i] = base->updates(i);
  std::vector<uint64_t> idles(base->row_idle().begin(), base->row_idle().end());
  bool idle = base->row_idle_size() != 0;
  uint64_t clock = base->clock();
  std::string* values = base->mutable_values();
  for (size_t d = 0; d < deltas.size(); ++d) {
    const v1::TableState& delta = *deltas[d];
    auto damaged = [&](auto... why) {
      return absl::DataLossError(
          absl::StrCat(paths[d], ": sparse table '", delta.name(), "': ", why...));
    };
    if (absl::Status s = CheckTableState(delta, delta.dim(), delta.optimizer_state_size());
        !s.ok())
      return damaged(s.message());
    if (delta.name() != base->name() || delta.dim() != base->dim() ||
        delta.optimizer_state_size() != slots || TableStateWidth(delta) != TableStateWidth(*base))
      return damaged("does not fit the table of its base file (name, dim or optimizer state)");
    if (delta.clock() < clock)
      return damaged("its clock ", delta.clock(), " is behind its base's ", clock);
    // Idle times: in both or in neither (a table with no rows has none).
    const bool has_idle = delta.row_idle_size() != 0;
    if (delta.ids_size() != 0 && gone.size() != 0 && has_idle != idle)
      return damaged("idle times in one of the table and its base only");
    if (has_idle && !idle) idles.assign(gone.size(), 0);
    idle = idle || has_idle;
    for (uint64_t& t : idles) t += delta.clock() - clock;
    clock = delta.clock();
    for (int64_t id : delta.removed_ids())
      if (auto it = position.find(id); it != position.end()) gone[it->second] = true;
    for (int i = 0; i < delta.ids_size(); ++i) {
      auto [it, added] = position.try_emplace(delta.ids(i), static_cast<uint32_t>(gone.size()));
      const size_t at = it->second;
      if (added) {
        base->add_ids(delta.ids(i));
        gone.push_back(false);
        updates.push_back(0);
        if (idle) idles.push_back(0);
        values->resize(values->size() + row_bytes);
        for (int k = 0; k < slots; ++k)
          base->mutable_optimizer_state(k)->resize(base->optimizer_state(k).size() + state_bytes);
      }
      gone[at] = false;  // a row that left and came back is the new one
      values->replace(at * row_bytes, row_bytes, delta.values(),
                      static_cast<size_t>(i) * row_bytes, row_bytes);
      for (int k = 0; k < slots; ++k)
        base->mutable_optimizer_state(k)->replace(at * state_bytes, state_bytes,
                                                  delta.optimizer_state(k),
                                                  static_cast<size_t>(i) * state_bytes,
                                                  state_bytes);
      updates[at] = delta.updates_size() == 0 ? 0 : delta.updates(i);
      if (idle) idles[at] = has_idle ? delta.row_idle(i) : 0;
    }
  }
  // The rows kept, in order, and the last increment's table-wide fields.
  const v1::TableState& last = *deltas.back();
  v1::TableState merged;
  merged.set_name(last.name());
  merged.set_dim(last.dim());
  merged.set_state_width(last.state_width());
  merged.set_version(last.version());
  *merged.mutable_marks() = last.marks();
  *merged.mutable_held_from() = last.held_from();
  *merged.mutable_counters() = last.counters();
  merged.set_clock(last.clock());
  *merged.mutable_pending_ids() = last.pending_ids();
  *merged.mutable_pending_counts() = last.pending_counts();
  *merged.mutable_pending_idle() = last.pending_idle();
  size_t kept = 0;
  for (bool g : gone) kept += g ? 0 : 1;
  std::string* out_values = merged.mutable_values();
  out_values->reserve(kept * row_bytes);
  std::vector<std::string*> out_states;
  for (int k = 0; k < slots; ++k) {
    out_states.push_back(merged.add_optimizer_state());
    out_states.back()->reserve(kept * state_bytes);
  }
  merged.mutable_ids()->Reserve(static_cast<int>(kept));
  merged.mutable_updates()->Reserve(static_cast<int>(kept));
  for (size_t i = 0; i < gone.size(); ++i) {
    if (gone[i]) continue;
    merged.add_ids(base->ids(static_cast<int>(i)));
    out_values->append(*values, i * row_bytes, row_bytes);
    for (int k = 0; k < slots; ++k)
      out_states[k]->append(base->optimizer_state(k), i * state_bytes, state_bytes);
    merged.add_updates(updates[i]);
    if (idle) merged.add_row_idle(idles[i]);
  }
  *base = std::move(merged);
  return absl::OkStatus();
}

// LoadChunks and LoadShardState: the chunks `chunk_ids` and, when
// `tables_for` is (num_shards, shard), the tables' rows of that shard.
absl::StatusOr<ShardState> LoadState(Env* env, const std::string& dir,
                                     const v1::CheckpointManifest& manifest,
                                     absl::Span<const uint32_t> chunk_ids,
                                     std::optional<std::pair<uint32_t, uint32_t>> tables_for) {
  const v1::ShardMap& map = manifest.shard_map();
  const uint32_t saved_shards = static_cast<uint32_t>(map.shards_size());
  const int num_tables = tables_for.has_value() ? manifest.config().sparse_tables_size() : 0;
  std::set<uint32_t> shards;
  for (uint32_t id : chunk_ids) {
    if (id >= static_cast<uint32_t>(map.chunks_size()))
      return absl::NotFoundError(absl::StrCat(dir, ": the checkpoint has no chunk ", id));
    shards.insert(map.chunks(id).shard());
  }
  // A table's rows: the shard's own file when the count is the same, else
  // every file.
  const bool same_count = tables_for.has_value() && tables_for->first == saved_shards;
  if (num_tables > 0) {
    for (uint32_t k = 0; k < saved_shards; ++k)
      if (!same_count || k == tables_for->second) shards.insert(k);
  }
  std::map<uint32_t, v1::ChunkState> found;
  const std::set<uint32_t> wanted(chunk_ids.begin(), chunk_ids.end());
  ShardState out;
  out.tables.resize(num_tables);
  bool first = true;
  for (uint32_t shard : shards) {
    const v1::ShardCheckpoint* entry = nullptr;
    for (const v1::ShardCheckpoint& s : manifest.shards())
      if (s.shard() == shard) entry = &s;
    if (entry == nullptr)
      return absl::DataLossError(absl::StrCat(dir, ": the manifest has no file for shard ", shard));
    absl::StatusOr<v1::ShardCheckpointFile> file =
        ReadShardState(env, dir, *entry, manifest.job_id(), manifest.id());
    if (!file.ok()) return file.status();
    for (v1::ChunkState& c : *file->mutable_chunks())
      if (wanted.count(c.chunk_id())) found[c.chunk_id()] = std::move(c);
    if (num_tables == 0 || (same_count && shard != tables_for->second)) continue;
    const std::string path = JoinPath(dir, entry->file());
    if (file->tables_size() != num_tables)
      return absl::DataLossError(absl::StrCat(path, ": holds ", file->tables_size(),
                                              " sparse tables, the job has ", num_tables));
    for (int t = 0; t < num_tables; ++t) {
      if (file->tables(t).name() != manifest.config().sparse_tables(t).name())
        return absl::DataLossError(absl::StrCat(path, ": sparse table ", t, " is '",
                                                file->tables(t).name(), "', the job's is '",
                                                manifest.config().sparse_tables(t).name(), "'"));
      const bool counts = shard % tables_for->first == tables_for->second;
      if (absl::Status s = MergeTable(file->tables(t), tables_for->first, tables_for->second,
                                      first, counts, path, &out.tables[t]);
          !s.ok())
        return s;
    }
    first = false;
  }
  out.chunks.reserve(chunk_ids.size());
  for (uint32_t id : chunk_ids) {
    auto it = found.find(id);
    if (it == found.end())
      return absl::NotFoundError(absl::StrCat(dir, ": no shard file holds chunk ", id));
    out.chunks.push_back(it->second);
  }
  return out;
}

}  // namespace

void LowerHeldFrom(const google::protobuf::Map<uint32_t, uint64_t>& from,
                   google::protobuf::Map<uint32_t, uint64_t>* into) {
  for (const auto& [rank, step] : from) {
    auto it = into->find(rank);
    if (it == into->end() || step < it->second) (*into)[rank] = step;
  }
}

std::string CheckpointFolder(absl::string_view root, uint64_t id) {
  return JoinPath(root, absl::StrFormat("%s%08u", kFolderPrefix, id));
}

namespace {

// The id of a checkpoint folder's name ("ckpt-00000007": 7); nullopt for any
// other name.
std::optional<uint64_t> CheckpointIdOfFolder(const std::string& name) {
  uint64_t id = 0;
  const std::string digits = name.substr(std::min(name.size(), std::strlen(kFolderPrefix)));
  if (!absl::StartsWith(name, kFolderPrefix) || digits.empty() ||
      !std::all_of(digits.begin(), digits.end(), absl::ascii_isdigit) ||
      !absl::SimpleAtoi(digits, &id) || name != CheckpointFolder("", id))
    return std::nullopt;
  return id;
}

// The highest id of the checkpoint folders in `root`, complete or not;
// nullopt when it has none (or cannot be listed).
std::optional<uint64_t> NewestCheckpointFolder(Env* env, const std::string& root) {
  absl::StatusOr<std::vector<std::string>> names = env->ListDir(root);
  if (!names.ok()) return std::nullopt;
  std::optional<uint64_t> newest;
  for (const std::string& name : *names)
    if (const std::optional<uint64_t> id = CheckpointIdOfFolder(name))
      newest = std::max(newest.value_or(0), *id);
  return newest;
}

}  // namespace

std::string ShardFileName(uint32_t shard) { return absl::StrFormat("shard-%05u.ckpt", shard); }

std::string ShardPartFileName(uint32_t shard, uint32_t part) {
  return absl::StrFormat("shard-%05u.part-%05u", shard, part);
}

uint64_t CheckpointPartBytes(const v1::JobConfig& config) {
  return config.checkpoint_part_kib() == 0 ? kDefaultCheckpointPartBytes
                                           : uint64_t{config.checkpoint_part_kib()} << 10;
}

uint64_t ShardFileBytes(const v1::ShardCheckpoint& shard) {
  uint64_t bytes = shard.bytes();
  for (const v1::ShardFilePart& part : shard.parts()) bytes += part.bytes();
  return bytes;
}

namespace {

// A copy of `message` without the fields `drop` names (by number): every
// other field, whichever the message has, so that one added later is kept.
template <typename Message, typename Drop>
Message CopyWithout(const Message& message, Drop drop) {
  google::protobuf::FieldMask mask;
  const google::protobuf::Descriptor* d = Message::descriptor();
  for (int i = 0; i < d->field_count(); ++i)
    if (!drop(d->field(i)->number())) mask.add_paths(d->field(i)->name());
  Message out;
  google::protobuf::util::FieldMaskUtil::MergeMessageTo(message, mask, {}, &out);
  return out;
}

// The fields of a table's rows: a shard file with parts holds none of them,
// a part file nothing else (but the table's name, dim and width).
bool IsRowField(int number) {
  using T = v1::TableState;
  return number == T::kIdsFieldNumber || number == T::kValuesFieldNumber ||
         number == T::kOptimizerStateFieldNumber || number == T::kUpdatesFieldNumber ||
         number == T::kRowIdleFieldNumber;
}

// Rows [begin, end) of `table` (a shard's own, consistent) as a part holds them.
v1::TableState RowsOf(const v1::TableState& table, int begin, int end) {
  v1::TableState out;
  out.set_name(table.name());
  out.set_dim(table.dim());
  out.set_state_width(table.state_width());
  out.mutable_ids()->Add(table.ids().begin() + begin, table.ids().begin() + end);
  const size_t row = static_cast<size_t>(table.dim()) * sizeof(float);
  out.set_values(table.values().substr(begin * row, (end - begin) * row));
  const size_t width = static_cast<size_t>(TableStateWidth(table)) * sizeof(float);
  for (const std::string& slot : table.optimizer_state())
    out.add_optimizer_state(slot.substr(begin * width, (end - begin) * width));
  if (table.updates_size() > 0)
    out.mutable_updates()->Add(table.updates().begin() + begin, table.updates().begin() + end);
  if (table.row_idle_size() > 0)
    out.mutable_row_idle()->Add(table.row_idle().begin() + begin, table.row_idle().begin() + end);
  return out;
}

// The most bytes a row of `table` takes in a part file.
uint64_t RowBytesBound(const v1::TableState& table) {
  return 10 + uint64_t{4} * table.dim() +
         uint64_t{4} * TableStateWidth(table) * table.optimizer_state_size() +
         (table.updates_size() > 0 ? 5 : 0) + (table.row_idle_size() > 0 ? 10 : 0);
}

struct Written {
  uint64_t bytes = 0;
  uint32_t crc32 = 0;
};

// `message` framed, written atomically as `dir`/`name`.
absl::StatusOr<Written> WriteFramedFile(Env* env, const std::string& dir, const std::string& name,
                                        const google::protobuf::Message& message) {
  const std::string bytes = Frame(message);
  if (absl::Status s = WriteFileAtomically(env, JoinPath(dir, name), bytes); !s.ok()) return s;
  return Written{bytes.size(), Crc32(bytes)};
}

// `dir`/`name`, checked against the size and CRC-32 recorded, unframed into
// `message`.
absl::Status ReadFramedFile(Env* env, const std::string& dir, const std::string& name,
                            uint64_t size, uint32_t crc32, google::protobuf::Message* message) {
  if (name.empty() || name == "." || name == ".." || absl::StrContains(name, "/"))
    return absl::DataLossError(absl::StrCat(dir, ": manifest names a bad file '", name, "'"));
  const std::string path = JoinPath(dir, name);
  absl::StatusOr<std::string> bytes = env->ReadFile(path);
  if (!bytes.ok()) return bytes.status();
  if (bytes->size() != size)
    return absl::DataLossError(
        absl::StrCat(path, ": ", bytes->size(), " bytes, the manifest recorded ", size));
  if (const uint32_t crc = Crc32(*bytes); crc != crc32)
    return absl::DataLossError(
        absl::StrFormat("%s: CRC-32 mismatch (manifest %08x, file %08x)", path, crc32, crc));
  return Unframe(*bytes, path, message);
}

// Appends the rows of `expected`'s parts to the tables of `file` (its
// shard file, read and checked).
absl::Status AppendParts(Env* env, const std::string& dir, const v1::ShardCheckpoint& expected,
                         v1::ShardCheckpointFile* file) {
  auto damaged = [&](const std::string& name, auto... why) {
    return absl::DataLossError(absl::StrCat(JoinPath(dir, name), ": ", why...));
  };
  // Each table's rows reserved first (they may be gigabytes), as many as
  // the parts' recorded sizes can hold.
  std::vector<uint64_t> rows(file->tables_size(), 0);
  for (const v1::ShardFilePart& part : expected.parts()) {
    if (part.table() >= rows.size())
      return damaged(part.file(), "a part of sparse table ", part.table(), ", ", expected.file(),
                     " has ", rows.size());
    const v1::TableState& table = file->tables(static_cast<int>(part.table()));
    if (part.rows() > part.bytes() / (uint64_t{4} * std::max<uint32_t>(table.dim(), 1) + 1))
      return damaged(part.file(), part.rows(), " rows recorded in ", part.bytes(), " bytes");
    rows[part.table()] += part.rows();
  }
  for (int t = 0; t < file->tables_size(); ++t) {
    v1::TableState* table = file->mutable_tables(t);
    if (rows[t] == 0) continue;
    const uint64_t n = rows[t] + table->ids_size();
    table->mutable_ids()->Reserve(static_cast<int>(std::min<uint64_t>(n, INT32_MAX)));
    table->mutable_values()->reserve(n * table->dim() * sizeof(float));
    for (std::string& slot : *table->mutable_optimizer_state())
      slot.reserve(n * TableStateWidth(*table) * sizeof(float));
  }
  for (const v1::ShardFilePart& part : expected.parts()) {
    v1::ShardCheckpointFile rows_file;
    if (absl::Status s =
            ReadFramedFile(env, dir, part.file(), part.bytes(), part.crc32(), &rows_file);
        !s.ok())
      return s;
    if (rows_file.job_id() != file->job_id() ||
        rows_file.checkpoint_id() != file->checkpoint_id() || rows_file.shard() != file->shard() ||
        rows_file.base_id() != file->base_id() || rows_file.tables_size() != 1 ||
        rows_file.chunks_size() != 0)
      return damaged(part.file(), "holds job '", rows_file.job_id(), "' checkpoint ",
                     rows_file.checkpoint_id(), " shard ", rows_file.shard(), " (",
                     rows_file.chunks_size(), " chunks, ", rows_file.tables_size(),
                     " tables), not one table's rows of ", expected.file());
    v1::TableState* into = file->mutable_tables(static_cast<int>(part.table()));
    v1::TableState* from = rows_file.mutable_tables(0);
    // Its sizes as its table's (and its ages within the table's clock).
    from->set_clock(into->clock());
    if (absl::Status s = CheckTableState(*from, into->dim(), into->optimizer_state_size());
        !s.ok() || from->name() != into->name() || from->state_width() != into->state_width() ||
        static_cast<uint64_t>(from->ids_size()) != part.rows())
      return damaged(part.file(), "rows of sparse table '", from->name(), "' (", from->ids_size(),
                     "; ", s.message(), ") do not fit table '", into->name(), "' of ",
                     expected.file(), " (", part.rows(), " recorded)");
    into->mutable_ids()->Add(from->ids().begin(), from->ids().end());
    into->mutable_values()->append(from->values());
    for (int k = 0; k < from->optimizer_state_size(); ++k)
      into->mutable_optimizer_state(k)->append(from->optimizer_state(k));
    into->mutable_updates()->Add(from->updates().begin(), from->updates().end());
    into->mutable_row_idle()->Add(from->row_idle().begin(), from->row_idle().end());
  }
  // Every part's counts and ages, or none.
  for (int t = 0; t < file->tables_size(); ++t) {
    const v1::TableState& table = file->tables(t);
    if (rows[t] == 0) continue;
    if (absl::Status s = CheckTableState(table, table.dim(), table.optimizer_state_size()); !s.ok())
      return damaged(expected.file(), "sparse table '", table.name(),
                     "' with its parts: ", s.message());
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<v1::ShardCheckpoint> WriteShardFile(Env* env, const std::string& dir,
                                                   const v1::ShardCheckpointFile& file,
                                                   uint64_t part_bytes) {
  v1::ShardCheckpoint out;
  const size_t size = file.ByteSizeLong();
  // Past its part size, the file without its tables' rows, which go to
  // parts.
  std::optional<v1::ShardCheckpointFile> head;
  if (size > part_bytes) {
    head =
        CopyWithout(file, [](int n) { return n == v1::ShardCheckpointFile::kTablesFieldNumber; });
    for (const v1::TableState& table : file.tables()) {
      v1::TableState* state = head->add_tables();
      *state = CopyWithout(table, IsRowField);
      for (int k = 0; k < table.optimizer_state_size(); ++k) state->add_optimizer_state();
    }
  }
  // A message past 2 GiB does not serialize.
  if (const size_t framed = head.has_value() ? head->ByteSizeLong() : size;
      framed > static_cast<size_t>(std::numeric_limits<int32_t>::max()))
    return absl::ResourceExhaustedError(absl::StrCat(
        "shard ", file.shard(), "'s part of the checkpoint is ", framed >> 20,
        " MiB without its sparse rows, past the 2 GiB a checkpoint file may hold: spread the "
        "job over more shards"));
  if (absl::Status s = env->CreateDir(dir); !s.ok()) return s;
  if (head.has_value()) {
    // What every part says of itself: the job, checkpoint, shard and base.
    const v1::ShardCheckpointFile part_header = CopyWithout(file, [](int n) {
      return n != v1::ShardCheckpointFile::kJobIdFieldNumber &&
             n != v1::ShardCheckpointFile::kCheckpointIdFieldNumber &&
             n != v1::ShardCheckpointFile::kShardFieldNumber &&
             n != v1::ShardCheckpointFile::kBaseIdFieldNumber;
    });
    for (int t = 0; t < file.tables_size(); ++t) {
      const v1::TableState& table = file.tables(t);
      const int per_part = static_cast<int>(std::clamp<uint64_t>(
          part_bytes / RowBytesBound(table), 1, std::numeric_limits<int32_t>::max()));
      for (int begin = 0; begin < table.ids_size(); begin += per_part) {
        const int end = begin + std::min(per_part, table.ids_size() - begin);
        v1::ShardCheckpointFile rows = part_header;
        *rows.add_tables() = RowsOf(table, begin, end);
        v1::ShardFilePart& part = *out.add_parts();
        part.set_file(ShardPartFileName(file.shard(), static_cast<uint32_t>(out.parts_size() - 1)));
        part.set_table(static_cast<uint32_t>(t));
        part.set_rows(static_cast<uint64_t>(end - begin));
        absl::StatusOr<Written> written = WriteFramedFile(env, dir, part.file(), rows);
        if (!written.ok()) return written.status();
        part.set_bytes(written->bytes);
        part.set_crc32(written->crc32);
      }
    }
  }
  const std::string name = ShardFileName(file.shard());
  absl::StatusOr<Written> written =
      WriteFramedFile(env, dir, name, head.has_value() ? *head : file);
  if (!written.ok()) return written.status();
  out.set_id(file.checkpoint_id());
  out.set_shard(file.shard());
  out.set_state(v1::CHECKPOINT_STATE_WRITTEN);
  out.set_file(name);
  out.set_bytes(written->bytes);
  out.set_crc32(written->crc32);
  out.set_num_chunks(file.chunks_size());
  out.set_num_tables(file.tables_size());
  uint64_t lo = UINT64_MAX, hi = 0, rows = 0;
  auto span = [&](uint64_t version) {
    lo = std::min(lo, version);
    hi = std::max(hi, version);
  };
  for (const v1::ChunkState& c : file.chunks()) span(c.version());
  for (const v1::TableState& t : file.tables()) {
    span(t.version());
    rows += t.ids_size();
  }
  out.set_num_rows(rows);
  out.set_min_version(lo == UINT64_MAX ? 0 : lo);
  out.set_max_version(hi);
  return out;
}

absl::StatusOr<v1::ShardCheckpointFile> ReadShardFile(Env* env, const std::string& dir,
                                                      const v1::ShardCheckpoint& expected,
                                                      absl::string_view job_id,
                                                      uint64_t checkpoint_id) {
  v1::ShardCheckpointFile file;
  if (absl::Status s =
          ReadFramedFile(env, dir, expected.file(), expected.bytes(), expected.crc32(), &file);
      !s.ok())
    return s;
  if ((!job_id.empty() && file.job_id() != job_id) || file.checkpoint_id() != checkpoint_id ||
      file.shard() != expected.shard())
    return absl::DataLossError(absl::StrCat(
        JoinPath(dir, expected.file()), ": holds job '", file.job_id(), "' checkpoint ",
        file.checkpoint_id(), " shard ", file.shard(), ", the manifest expects checkpoint ",
        checkpoint_id, " shard ", expected.shard()));
  if (absl::Status s = AppendParts(env, dir, expected, &file); !s.ok()) return s;
  return file;
}

absl::Status ApplyShardDeltas(const std::vector<v1::ShardCheckpointFile>& deltas,
                              const std::vector<std::string>& paths,
                              v1::ShardCheckpointFile* base) {
  if (deltas.empty()) return absl::OkStatus();
  uint64_t on = base->checkpoint_id();
  for (size_t d = 0; d < deltas.size(); ++d) {
    const v1::ShardCheckpointFile& delta = deltas[d];
    if (delta.base_id() == 0 || delta.base_id() != on || delta.shard() != base->shard() ||
        delta.job_id() != base->job_id())
      return absl::DataLossError(absl::StrCat(
          paths[d], ": an increment of job '", delta.job_id(), "' shard ", delta.shard(),
          " on checkpoint ", delta.base_id(), ", read on top of job '", base->job_id(),
          "' shard ", base->shard(), " checkpoint ", on));
    if (delta.tables_size() != base->tables_size())
      return absl::DataLossError(absl::StrCat(paths[d], ": holds ", delta.tables_size(),
                                              " sparse tables, its base file ",
                                              base->tables_size()));
    on = delta.checkpoint_id();
  }
  for (int t = 0; t < base->tables_size(); ++t) {
    std::vector<const v1::TableState*> tables;
    for (const v1::ShardCheckpointFile& delta : deltas) tables.push_back(&delta.tables(t));
    if (absl::Status s = ApplyTableDeltas(tables, paths, base->mutable_tables(t)); !s.ok())
      return s;
  }
  *base->mutable_chunks() = deltas.back().chunks();  // whole in every file
  base->set_checkpoint_id(deltas.back().checkpoint_id());
  return absl::OkStatus();
}

std::string CheckpointFolderBeside(const std::string& dir, uint64_t id) {
  std::string root = dir;
  while (root.size() > 1 && root.back() == '/') root.pop_back();
  const size_t slash = root.rfind('/');
  root = slash == std::string::npos ? "." : slash == 0 ? "/" : root.substr(0, slash);
  return CheckpointFolder(root, id);
}

absl::StatusOr<std::vector<ShardChainLink>> ShardChain(const std::string& dir,
                                                       const v1::ShardCheckpoint& expected,
                                                       uint64_t checkpoint_id) {
  std::vector<ShardChainLink> links;
  uint64_t previous = 0;
  for (const v1::ShardFileRef& ref : expected.chain()) {
    if (ref.id() <= previous || ref.id() >= checkpoint_id)
      return absl::DataLossError(absl::StrCat(
          dir, ": the manifest's chain of shard ", expected.shard(), " names checkpoint ",
          ref.id(), " out of order"));
    previous = ref.id();
    v1::ShardCheckpoint entry;
    entry.set_shard(expected.shard());
    entry.set_file(ref.file());
    entry.set_bytes(ref.bytes());
    entry.set_crc32(ref.crc32());
    *entry.mutable_parts() = ref.parts();
    links.push_back(
        ShardChainLink{CheckpointFolderBeside(dir, ref.id()), std::move(entry), ref.id()});
  }
  links.push_back(ShardChainLink{dir, expected, checkpoint_id});
  return links;
}

absl::StatusOr<v1::ShardCheckpointFile> ReadChainLink(Env* env,
                                                      const std::vector<ShardChainLink>& chain,
                                                      size_t i, absl::string_view job_id) {
  const ShardChainLink& link = chain[i];
  absl::StatusOr<v1::ShardCheckpointFile> file =
      ReadShardFile(env, link.dir, link.entry, job_id, link.id);
  if (!file.ok()) return file.status();
  const uint64_t base = i == 0 ? 0 : chain[i - 1].id;
  if (file->base_id() != base)
    return absl::DataLossError(
        absl::StrCat(JoinPath(link.dir, link.entry.file()), ": ",
                     file->base_id() == 0
                         ? "a full file"
                         : absl::StrCat("an increment on checkpoint ", file->base_id()),
                     ", the manifest's chain puts it ",
                     base == 0 ? "first" : absl::StrCat("on checkpoint ", base)));
  return file;
}

absl::StatusOr<v1::ShardCheckpointFile> ReadShardState(Env* env, const std::string& dir,
                                                       const v1::ShardCheckpoint& expected,
                                                       absl::string_view job_id,
                                                       uint64_t checkpoint_id) {
  absl::StatusOr<std::vector<ShardChainLink>> links = ShardChain(dir, expected, checkpoint_id);
  if (!links.ok()) return links.status();
  v1::ShardCheckpointFile state;
  std::vector<v1::ShardCheckpointFile> increments;
  std::vector<std::string> paths;
  for (size_t i = 0; i < links->size(); ++i) {
    absl::StatusOr<v1::ShardCheckpointFile> file = ReadChainLink(env, *links, i, job_id);
    if (!file.ok()) return file.status();
    if (i == 0) {
      state = *std::move(file);
    } else {
      increments.push_back(*std::move(file));
      paths.push_back(JoinPath((*links)[i].dir, (*links)[i].entry.file()));
    }
  }
  if (absl::Status s = ApplyShardDeltas(increments, paths, &state); !s.ok()) return s;
  state.set_base_id(0);
  return state;
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
    if (!absl::IsNotFound(bytes.status())) return bytes.status();
    if (!env->FileExists(dir)) return absl::NotFoundError(absl::StrCat(dir, ": no such folder"));
    // A checkpoint_dir given where one of its checkpoints was meant.
    if (const std::optional<uint64_t> newest = NewestCheckpointFolder(env, dir))
      return absl::NotFoundError(
          absl::StrCat(dir,
                       ": a folder of checkpoints (a checkpoint_dir), not a checkpoint; its "
                       "newest is ",
                       CheckpointFolder(dir, *newest)));
    return absl::NotFoundError(
        absl::StrCat(dir, ": no ", kManifestName, " (an incomplete checkpoint)"));
  }
  v1::CheckpointManifest manifest;
  if (absl::Status s = Unframe(*bytes, path, &manifest); !s.ok()) return s;
  return manifest;
}

absl::Status CheckManifest(const v1::CheckpointManifest& manifest, const std::string& dir) {
  auto damaged = [&](auto... why) { return absl::DataLossError(absl::StrCat(dir, ": ", why...)); };
  if (absl::Status s = ValidateShardMap(manifest.shard_map()); !s.ok())
    return damaged("the manifest's ", s.message());
  if (absl::Status s = ValidateSparseTables(manifest.config()); !s.ok())
    return damaged("the manifest's ", s.message());
  if (manifest.shards_size() != manifest.shard_map().shards_size())
    return damaged("the manifest names ", manifest.shards_size(), " shard files for ",
                   manifest.shard_map().shards_size(), " shards");
  for (int k = 0; k < manifest.shards_size(); ++k)
    if (manifest.shards(k).shard() != static_cast<uint32_t>(k))
      return damaged("the manifest's shard files are out of order");
  return absl::OkStatus();
}

absl::Status VerifyShardFile(Env* env, const std::string& dir,
                             const v1::CheckpointManifest& manifest, uint32_t k) {
  auto damaged = [&](auto... why) { return absl::DataLossError(absl::StrCat(dir, ": ", why...)); };
  if (k >= static_cast<uint32_t>(manifest.shards_size()))
    return damaged("the manifest has no file for shard ", k);
  const v1::ShardMap& map = manifest.shard_map();
  const v1::ShardCheckpoint& shard = manifest.shards(static_cast<int>(k));
  absl::StatusOr<v1::ShardCheckpointFile> file =
      ReadShardState(env, dir, shard, manifest.job_id(), manifest.id());
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
  // And every table of the job, each row of its width and of this shard.
  const auto& specs = manifest.config().sparse_tables();
  if (file->tables_size() != specs.size())
    return damaged(shard.file(), " holds ", file->tables_size(), " sparse tables, the job has ",
                   specs.size());
  for (int t = 0; t < specs.size(); ++t) {
    const v1::TableState& table = file->tables(t);
    if (table.name() != specs[t].name())
      return damaged(shard.file(), ": sparse table '", table.name(),
                     "' does not fit the job's table '", specs[t].name(), "'");
    // Any number of optimizer slots here (a shard checks its optimizer's).
    if (absl::Status s = CheckTableState(table, specs[t].dim(), table.optimizer_state_size());
        !s.ok())
      return damaged(shard.file(), ": sparse table '", table.name(),
                     "' does not fit the job's table '", specs[t].name(), "': ", s.message());
    for (int64_t id : table.ids())
      if (SparseShardOf(id, static_cast<uint32_t>(map.shards_size())) != shard.shard())
        return damaged(shard.file(), ": row ", id, " of sparse table '", table.name(),
                       "' belongs to another shard");
  }
  return absl::OkStatus();
}

absl::StatusOr<v1::CheckpointManifest> VerifyCheckpoint(Env* env, const std::string& dir,
                                                        absl::string_view job_id,
                                                        CheckpointFiles files) {
  absl::StatusOr<v1::CheckpointManifest> manifest = ReadManifest(env, dir);
  if (!manifest.ok()) return manifest.status();
  if (!job_id.empty() && manifest->job_id() != job_id)
    return absl::NotFoundError(absl::StrCat(dir, ": a checkpoint of job '",
                                            manifest->job_id(), "', not '", job_id, "'"));
  if (absl::Status s = CheckManifest(*manifest, dir); !s.ok()) return s;
  if (files == CheckpointFiles::kManifestOnly) return manifest;
  for (int k = 0; k < manifest->shards_size(); ++k)
    if (absl::Status s = VerifyShardFile(env, dir, *manifest, static_cast<uint32_t>(k)); !s.ok())
      return s;
  return manifest;
}

absl::StatusOr<CheckpointChoice> FindNewestCheckpoint(Env* env, const std::string& root,
                                                      absl::string_view job_id,
                                                      CheckpointFiles files,
                                                      absl::Span<const uint64_t> refused) {
  CheckpointChoice choice;
  absl::StatusOr<std::vector<std::string>> names = env->ListDir(root);
  if (!names.ok()) {
    if (absl::IsNotFound(names.status())) return choice;
    return names.status();
  }
  std::map<uint64_t, std::string, std::greater<uint64_t>> folders;
  for (const std::string& name : *names)
    if (const std::optional<uint64_t> id = CheckpointIdOfFolder(name)) folders[*id] = name;
  for (const auto& [id, name] : folders) {
    const std::string dir = JoinPath(root, name);
    if (std::find(refused.begin(), refused.end(), id) != refused.end()) {
      choice.refused.push_back(absl::StrCat(name, ": a shard could not restore it"));
      continue;
    }
    absl::StatusOr<v1::CheckpointManifest> manifest = VerifyCheckpoint(env, dir, job_id, files);
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

absl::Status CheckSameChunks(const v1::ShardMap& saved, const v1::ShardMap& current,
                             absl::string_view saved_name, absl::string_view current_name) {
  auto differ = [&](auto... why) {
    return absl::FailedPreconditionError(
        absl::StrCat("the model is cut differently: ", why...,
                     " (the same --model, --hidden and --chunk_kb are needed)"));
  };
  auto shape = [](const v1::TensorSpec& t) {
    return t.shape().empty() ? std::string("a scalar") : absl::StrJoin(t.shape(), "x");
  };
  if (saved.tensors_size() != current.tensors_size())
    return differ(saved.tensors_size(), " tensors in ", saved_name, " and ", current.tensors_size(),
                  " in ", current_name);
  for (int t = 0; t < saved.tensors_size(); ++t) {
    const v1::TensorSpec& a = saved.tensors(t);
    const v1::TensorSpec& b = current.tensors(t);
    if (a.name() != b.name())
      return differ("tensor ", t, " is ", a.name(), " in ", saved_name, " and ", b.name(), " in ",
                    current_name);
    if (shape(a) != shape(b))
      return differ("tensor ", t, " ", a.name(), " is ", shape(a), " in ", saved_name, " and ",
                    shape(b), " in ", current_name);
  }
  if (saved.chunks_size() != current.chunks_size())
    return differ(saved.chunks_size(), " chunks in ", saved_name, " and ", current.chunks_size(),
                  " in ", current_name);
  for (int c = 0; c < saved.chunks_size(); ++c) {
    const v1::ChunkSpec& a = saved.chunks(c);
    const v1::ChunkSpec& b = current.chunks(c);
    if (a.chunk_id() != b.chunk_id() || a.tensor_index() != b.tensor_index() ||
        a.offset() != b.offset() || a.num_elements() != b.num_elements())
      return differ("chunk ", c, " holds other elements in ", saved_name, " than in ",
                    current_name);
  }
  return absl::OkStatus();
}

absl::Status CheckSameShards(const v1::ShardMap& saved, const v1::ShardMap& current) {
  if (saved.shards_size() != current.shards_size())
    return absl::FailedPreconditionError(absl::StrCat(
        "the checkpoint has ", saved.shards_size(), " shards and this job ",
        current.shards_size(), "; with per-shard checkpoint storage each shard's file is on "
        "its own volume, so a checkpoint restores only into its own number of shards (use "
        "--servers=", saved.shards_size(), ", or shared storage to change the count)"));
  for (int c = 0; c < saved.chunks_size() && c < current.chunks_size(); ++c)
    if (saved.chunks(c).shard() != current.chunks(c).shard())
      return absl::FailedPreconditionError(
          absl::StrCat("chunk ", c, " was on shard ", saved.chunks(c).shard(), " and is on shard ",
                       current.chunks(c).shard(), " now; per-shard checkpoint storage needs the "
                       "same placement"));
  return absl::OkStatus();
}

absl::Status CheckSameTables(const v1::JobConfig& saved, const v1::JobConfig& current) {
  auto differ = [](auto... why) {
    return absl::FailedPreconditionError(absl::StrCat(
        "the checkpoint's sparse tables differ from this job's: ", why...,
        " (the same --model, --embedding_dim and --embedding_rows are needed)"));
  };
  if (saved.sparse_tables_size() != current.sparse_tables_size())
    return differ(saved.sparse_tables_size(), " tables there, ", current.sparse_tables_size(),
                  " here");
  for (const v1::SparseTableSpec& t : saved.sparse_tables()) {
    const v1::SparseTableSpec* here = FindSparseTable(current, t.name());
    if (here == nullptr) return differ("this job has no table '", t.name(), "'");
    if (here->dim() != t.dim())
      return differ("table '", t.name(), "' has rows of ", t.dim(), " there, ", here->dim(),
                    " here");
    // A row's id means another feature in another range (and a row past
    // this job's range would be refused by the servers one by one).
    if (here->rows() != t.rows())
      return differ("table '", t.name(), "' has ", t.rows(), " rows there, ", here->rows(),
                    " here");
  }
  return absl::OkStatus();
}

absl::StatusOr<ShardState> LoadShardState(Env* env, const std::string& dir,
                                          const v1::CheckpointManifest& manifest,
                                          absl::Span<const uint32_t> chunk_ids,
                                          uint32_t num_shards, uint32_t shard) {
  if (num_shards == 0 || shard >= num_shards)
    return absl::InvalidArgumentError(
        absl::StrCat("shard ", shard, " of ", num_shards, " is not a shard"));
  return LoadState(env, dir, manifest, chunk_ids, std::make_pair(num_shards, shard));
}

absl::StatusOr<std::vector<v1::ChunkState>> LoadChunks(
    Env* env, const std::string& dir, const v1::CheckpointManifest& manifest,
    absl::Span<const uint32_t> chunk_ids) {
  absl::StatusOr<ShardState> state = LoadState(env, dir, manifest, chunk_ids, std::nullopt);
  if (!state.ok()) return state.status();
  return std::move(state->chunks);
}

absl::StatusOr<std::vector<NamedTensor>> ReadCheckpointTensors(Env* env,
                                                               const std::string& path) {
  absl::StatusOr<v1::CheckpointManifest> manifest = VerifyCheckpoint(env, path, "");
  std::string dir = path;
  if (absl::IsNotFound(manifest.status())) {
    absl::StatusOr<CheckpointChoice> newest = FindNewestCheckpoint(env, path, "");
    if (!newest.ok()) return newest.status();
    if (!newest->manifest.has_value())
      return absl::NotFoundError(absl::StrCat("no complete checkpoint in ", path));
    manifest = *newest->manifest;
    dir = newest->dir;
  }
  if (!manifest.ok()) return manifest.status();
  const v1::ShardMap& map = manifest->shard_map();
  std::vector<uint32_t> ids;
  for (const v1::ChunkSpec& c : map.chunks()) ids.push_back(c.chunk_id());
  absl::StatusOr<std::vector<v1::ChunkState>> chunks = LoadChunks(env, dir, *manifest, ids);
  if (!chunks.ok()) return chunks.status();
  std::vector<NamedTensor> tensors;
  for (const v1::TensorSpec& t : map.tensors()) {
    NamedTensor& n = tensors.emplace_back();
    n.name = t.name();
    n.shape.assign(t.shape().begin(), t.shape().end());
    n.values.resize(static_cast<size_t>(NumElements(t)));
  }
  for (size_t i = 0; i < ids.size(); ++i) {
    const v1::ChunkSpec& c = map.chunks(static_cast<int>(i));
    const std::string& bytes = (*chunks)[i].values();
    std::vector<float>& into = tensors[c.tensor_index()].values;
    if (bytes.size() != c.num_elements() * sizeof(float) ||
        c.offset() + c.num_elements() > into.size())
      return absl::DataLossError(absl::StrCat(dir, ": chunk ", c.chunk_id(), " has ",
                                              bytes.size(), " bytes"));
    std::memcpy(into.data() + c.offset(), bytes.data(), bytes.size());
  }
  return tensors;
}

}  // namespace grps
