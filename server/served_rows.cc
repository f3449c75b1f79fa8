#include "server/served_rows.h"

#include <algorithm>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "checkpoint/checkpoint.h"
#include "job/sparse_tables.h"

namespace grps {
namespace {

uint64_t UnixMillis(absl::Time t) {
  return static_cast<uint64_t>(std::max<int64_t>(0, absl::ToUnixMillis(t)));
}

// Whether `config` has the tables (names and dims, in order) of `served`.
bool SameTables(const v1::JobConfig& served, const v1::JobConfig& config) {
  if (served.sparse_tables_size() != config.sparse_tables_size()) return false;
  for (int t = 0; t < config.sparse_tables_size(); ++t)
    if (served.sparse_tables(t).name() != config.sparse_tables(t).name() ||
        served.sparse_tables(t).dim() != config.sparse_tables(t).dim())
      return false;
  return true;
}

// A table of a shard file as the job's config says it is: its name and dim,
// and whole rows (CheckTableState).
absl::Status CheckTable(const v1::TableState& table, const v1::SparseTableSpec& spec,
                        const std::string& where) {
  if (table.name() != spec.name() || table.dim() != spec.dim())
    return absl::DataLossError(absl::StrCat(where, ": table '", table.name(), "' (dim ",
                                            table.dim(), ") where the job has '", spec.name(),
                                            "' (dim ", spec.dim(), ")"));
  if (absl::Status s = CheckTableState(table, spec.dim(), table.optimizer_state_size()); !s.ok())
    return absl::DataLossError(absl::StrCat(where, ": table '", table.name(), "': ", s.message()));
  return absl::OkStatus();
}

// The tables of a shard file as the job's config says they are: as many,
// each with its name and dim and a value row per id.
absl::Status CheckTables(const v1::ShardCheckpointFile& file, const v1::JobConfig& config) {
  const std::string where =
      absl::StrCat("shard ", file.shard(), " at checkpoint ", file.checkpoint_id());
  if (file.tables_size() != config.sparse_tables_size())
    return absl::DataLossError(absl::StrCat(where, ": ", file.tables_size(),
                                            " tables where the job has ",
                                            config.sparse_tables_size()));
  for (int t = 0; t < file.tables_size(); ++t)
    if (absl::Status s = CheckTable(file.tables(t), config.sparse_tables(t), where); !s.ok())
      return s;
  return absl::OkStatus();
}

}  // namespace

ServedRows::ServedRows(Env* env, std::string root) : env_(env), root_(std::move(root)) {}

void ServedRows::Put(int64_t id, const float* values, uint32_t dim, Table* table) {
  auto id_of = [table](uint32_t slot) { return table->ids[slot]; };
  std::optional<uint32_t> slot = table->index.Find(id, id_of);
  if (!slot.has_value()) {
    if (!table->free.empty()) {
      slot = table->free.back();
      table->free.pop_back();
      table->ids[*slot] = id;
    } else {
      slot = static_cast<uint32_t>(table->ids.size());
      table->ids.push_back(id);
      table->values.resize(table->values.size() + dim);
    }
    table->index.Insert(id, *slot, id_of);
  }
  std::memcpy(&table->values[static_cast<size_t>(*slot) * dim], values, dim * sizeof(float));
}

absl::StatusOr<std::unique_ptr<ServedRows::Shard>> ServedRows::ShardOf(
    const v1::ShardCheckpointFile& file, const v1::JobConfig& config) {
  if (absl::Status s = CheckTables(file, config); !s.ok()) return s;
  auto shard = std::make_unique<Shard>();
  shard->tables.resize(static_cast<size_t>(file.tables_size()));
  for (int t = 0; t < file.tables_size(); ++t) {
    const v1::TableState& state = file.tables(t);
    Table& table = shard->tables[static_cast<size_t>(t)];
    auto id_of = [&table](uint32_t slot) { return table.ids[slot]; };
    table.index.Reserve(static_cast<uint64_t>(state.ids_size()), id_of);
    table.ids.reserve(static_cast<size_t>(state.ids_size()));
    table.values.resize(static_cast<size_t>(state.ids_size()) * state.dim());
    if (!state.values().empty())  // memcpy takes no null pointer, even for no bytes
      std::memcpy(table.values.data(), state.values().data(), state.values().size());
    for (int i = 0; i < state.ids_size(); ++i) {
      if (table.index.Find(state.ids(i), id_of).has_value())
        return absl::DataLossError(absl::StrCat("shard ", file.shard(), " at checkpoint ",
                                                file.checkpoint_id(), ": table '", state.name(),
                                                "' holds row ", state.ids(i), " twice"));
      table.ids.push_back(state.ids(i));
      table.index.Insert(state.ids(i), static_cast<uint32_t>(i), id_of);
    }
  }
  return shard;
}

void ServedRows::Apply(const v1::ShardCheckpointFile& increment, Shard* shard) {
  for (int t = 0; t < increment.tables_size(); ++t) {
    const v1::TableState& delta = increment.tables(t);
    Table& table = shard->tables[static_cast<size_t>(t)];
    auto id_of = [&table](uint32_t slot) { return table.ids[slot]; };
    for (int64_t id : delta.removed_ids()) {
      std::optional<uint32_t> slot = table.index.Find(id, id_of);
      if (!slot.has_value()) continue;
      table.index.Erase(id, id_of);
      table.free.push_back(*slot);
    }
    const auto* values = reinterpret_cast<const float*>(delta.values().data());
    for (int i = 0; i < delta.ids_size(); ++i)
      Put(delta.ids(i), values + static_cast<size_t>(i) * delta.dim(), delta.dim(), &table);
  }
}

absl::StatusOr<ServedRows::ShardUpdate> ServedRows::ReadShard(
    const v1::CheckpointManifest& manifest, const std::string& dir, uint32_t k,
    const std::vector<uint64_t>& applied) {
  const v1::ShardCheckpoint& entry = manifest.shards(static_cast<int>(k));
  absl::StatusOr<std::vector<ShardChainLink>> chain = ShardChain(dir, entry, manifest.id());
  if (!chain.ok()) return chain.status();
  ShardUpdate update;
  for (const ShardChainLink& link : *chain) update.applied.push_back(link.id);
  // The files applied are the start of this chain: read only the rest.
  if (!applied.empty() && applied.size() < update.applied.size() &&
      std::equal(applied.begin(), applied.end(), update.applied.begin())) {
    for (size_t i = applied.size(); i < chain->size(); ++i) {
      absl::StatusOr<v1::ShardCheckpointFile> file =
          ReadChainLink(env_, *chain, i, manifest.job_id());
      if (!file.ok()) return file.status();
      if (absl::Status s = CheckTables(*file, manifest.config()); !s.ok()) return s;
      update.increments.push_back(*std::move(file));
    }
    return update;
  }
  absl::StatusOr<v1::ShardCheckpointFile> whole =
      ReadShardState(env_, dir, entry, manifest.job_id(), manifest.id());
  if (!whole.ok()) return whole.status();
  absl::StatusOr<std::unique_ptr<Shard>> shard = ShardOf(*whole, manifest.config());
  if (!shard.ok()) return shard.status();
  update.whole = *std::move(shard);
  return update;
}

absl::StatusOr<bool> ServedRows::Refresh(absl::Time now) {
  // What is served now: only this thread changes it.
  uint64_t served_id = 0;
  v1::JobConfig served_config;
  std::vector<std::vector<uint64_t>> applied;
  {
    absl::ReaderMutexLock lock(&mu_);
    served_id = served_.id();
    served_config = served_.config();
    for (const auto& shard : shards_) applied.push_back(shard->applied);
  }
  absl::StatusOr<CheckpointChoice> choice =
      FindNewestCheckpoint(env_, root_, /*job_id=*/"", CheckpointFiles::kManifestOnly);
  if (!choice.ok()) return choice.status();
  if (!choice->manifest.has_value() || choice->manifest->id() <= served_id) return false;
  const v1::CheckpointManifest& manifest = *choice->manifest;

  // Another shard count or other tables: every shard is read whole.
  if (static_cast<size_t>(manifest.shards_size()) != applied.size() ||
      !SameTables(served_config, manifest.config()))
    applied.assign(static_cast<size_t>(manifest.shards_size()), {});
  std::vector<ShardUpdate> updates;
  absl::Status failed;
  for (uint32_t k = 0; k < static_cast<uint32_t>(manifest.shards_size()) && failed.ok(); ++k) {
    absl::StatusOr<ShardUpdate> update = ReadShard(manifest, choice->dir, k, applied[k]);
    if (update.ok()) {
      updates.push_back(*std::move(update));
    } else {
      failed = absl::Status(update.status().code(),
                            absl::StrCat("checkpoint ", manifest.id(), " (", choice->dir,
                                         "): ", update.status().message()));
    }
  }

  absl::MutexLock lock(&mu_);
  if (!failed.ok()) {
    last_error_ = std::string(failed.message());
    return failed;
  }
  shards_.resize(updates.size());
  for (size_t k = 0; k < updates.size(); ++k) {
    ShardUpdate& update = updates[k];
    if (update.whole != nullptr) {
      shards_[k] = std::move(update.whole);
      ++full_reads_;
    }
    for (const v1::ShardCheckpointFile& increment : update.increments) {
      Apply(increment, shards_[k].get());
      ++increments_applied_;
    }
    shards_[k]->applied = std::move(update.applied);
  }
  served_ = manifest;
  served_.clear_shards();  // the chains are in shards_; only what Status says is kept
  table_of_.clear();
  for (int t = 0; t < manifest.config().sparse_tables_size(); ++t)
    table_of_[manifest.config().sparse_tables(t).name()] = static_cast<uint32_t>(t);
  served_unix_ms_ = UnixMillis(now);
  ++checkpoints_served_;
  return true;
}

absl::Status ServedRows::Lookup(const v1::LookupRequest& request,
                                v1::LookupResponse* response) const {
  absl::ReaderMutexLock lock(&mu_);
  if (served_.id() == 0)
    return absl::UnavailableError(absl::StrCat("no checkpoint served yet from ", root_));
  auto found = table_of_.find(request.table());
  if (found == table_of_.end()) {
    std::vector<std::string> names;
    for (const v1::SparseTableSpec& spec : served_.config().sparse_tables())
      names.push_back(spec.name());
    return absl::NotFoundError(
        absl::StrCat("no sparse table '", request.table(), "' in job ", served_.job_id(),
                     " (tables: ", names.empty() ? "none" : absl::StrJoin(names, ", "), ")"));
  }
  const uint32_t t = found->second;
  const uint32_t dim = served_.config().sparse_tables(static_cast<int>(t)).dim();
  const uint64_t bytes = static_cast<uint64_t>(request.ids_size()) * dim * sizeof(float);
  if (bytes > kMaxLookupReplyBytes)
    return absl::InvalidArgumentError(absl::StrCat(
        request.ids_size(), " ids of table '", request.table(), "' (dim ", dim, ") are ", bytes,
        " bytes of rows, over the ", kMaxLookupReplyBytes, " a lookup may return: ask for fewer"));
  response->set_dim(dim);
  response->set_checkpoint_id(served_.id());
  response->set_step(served_.step());
  std::string* values = response->mutable_values();
  values->assign(bytes, '\0');
  auto* out = reinterpret_cast<float*>(values->data());
  const auto num_shards = static_cast<uint32_t>(shards_.size());
  uint64_t missing = 0;
  for (int i = 0; i < request.ids_size(); ++i) {
    const int64_t id = request.ids(i);
    const Table& table = shards_[SparseShardOf(id, num_shards)]->tables[t];
    std::optional<uint32_t> slot =
        table.index.Find(id, [&table](uint32_t s) { return table.ids[s]; });
    if (!slot.has_value()) {
      response->add_missing(static_cast<uint32_t>(i));
      ++missing;
      continue;
    }
    std::memcpy(out + static_cast<size_t>(i) * dim, &table.values[static_cast<size_t>(*slot) * dim],
                dim * sizeof(float));
  }
  lookups_.fetch_add(1, std::memory_order_relaxed);
  ids_.fetch_add(static_cast<uint64_t>(request.ids_size()), std::memory_order_relaxed);
  missing_.fetch_add(missing, std::memory_order_relaxed);
  return absl::OkStatus();
}

v1::LookupStatusResponse ServedRows::Status() const {
  absl::ReaderMutexLock lock(&mu_);
  v1::LookupStatusResponse status;
  status.set_job_id(served_.job_id());
  status.set_checkpoint_id(served_.id());
  status.set_step(served_.step());
  status.set_written_unix_time_ms(served_.unix_time_ms());
  const auto took_ms = static_cast<uint64_t>(std::max(0.0, served_.seconds() * 1000));
  status.set_asked_unix_time_ms(served_.unix_time_ms() - std::min(took_ms, served_.unix_time_ms()));
  status.set_served_unix_time_ms(served_unix_ms_);
  for (int t = 0; t < served_.config().sparse_tables_size(); ++t) {
    v1::ServedTable* table = status.add_tables();
    table->set_name(served_.config().sparse_tables(t).name());
    table->set_dim(served_.config().sparse_tables(t).dim());
    uint64_t rows = 0;
    for (const auto& shard : shards_) rows += shard->tables[static_cast<size_t>(t)].index.size();
    table->set_rows(rows);
  }
  status.set_checkpoints_served(checkpoints_served_);
  status.set_increments_applied(increments_applied_);
  status.set_full_reads(full_reads_);
  status.set_last_error(last_error_);
  return status;
}

ServedRows::Counts ServedRows::counts() const {
  return {lookups_.load(std::memory_order_relaxed), ids_.load(std::memory_order_relaxed),
          missing_.load(std::memory_order_relaxed)};
}

}  // namespace grps
