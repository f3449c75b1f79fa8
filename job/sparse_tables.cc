#include "job/sparse_tables.h"

#include <cmath>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "data/split_mix.h"

namespace grps {
namespace {

// FNV-1a of the table's name: a stream per table.
uint64_t NameHash(std::string_view name) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (unsigned char c : name) h = (h ^ c) * 0x100000001b3ull;
  return h;
}

bool ValidName(std::string_view name) {
  if (name.empty() || name.size() > 64) return false;
  for (char c : name)
    if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
          c == '_' || c == '.' || c == '-'))
      return false;
  return true;
}

}  // namespace

uint32_t SparseShardOf(int64_t id, uint32_t num_servers) {
  return static_cast<uint32_t>(SplitMix64(static_cast<uint64_t>(id)) % num_servers);
}

float SparseInitScale(const v1::SparseTableSpec& spec) {
  if (spec.init_scale() > 0) return spec.init_scale();
  return 0.5f / std::sqrt(static_cast<float>(spec.dim()));
}

void InitializeSparseRow(const v1::SparseTableSpec& spec, uint64_t seed,
                         int64_t id, float* out) {
  const double scale = SparseInitScale(spec);
  const uint64_t stream = SplitMix64(seed ^ SplitMix64(NameHash(spec.name()) ^ SplitMix64(static_cast<uint64_t>(id))));
  for (uint32_t i = 0; i < spec.dim(); ++i) {
    const uint64_t bits = SplitMix64(stream + i);
    const double u = (bits >> 11) * (1.0 / 9007199254740992.0);  // [0, 1)
    out[i] = static_cast<float>((2.0 * u - 1.0) * scale);
  }
}

bool SparseIdInRange(const v1::SparseTableSpec& spec, int64_t id) {
  return spec.rows() == 0 || (id >= 0 && static_cast<uint64_t>(id) < spec.rows());
}

uint32_t SparseStateWidth(const v1::SparseTableSpec& spec) {
  return spec.rowwise_adagrad() ? 1 : spec.dim();
}

uint32_t TableStateWidth(const v1::TableState& state) {
  return state.state_width() == 0 ? state.dim() : state.state_width();
}

absl::Status CheckTableState(const v1::TableState& state, uint32_t dim, int slots) {
  auto bad = [&](auto... why) {
    return absl::InvalidArgumentError(absl::StrCat(why...));
  };
  if (state.dim() != dim) return bad("rows of ", state.dim(), " values, the table's have ", dim);
  // Divided, not multiplied: the sizes come from a file.
  const size_t n = static_cast<size_t>(state.ids_size());
  const size_t row_bytes = static_cast<size_t>(dim) * sizeof(float);
  auto whole = [&](const std::string& part) {
    return row_bytes > 0 && part.size() % row_bytes == 0 && part.size() / row_bytes == n;
  };
  if (!whole(state.values()))
    return bad(state.values().size(), " bytes of values for ", n, " rows of ", dim);
  if (state.optimizer_state_size() != slots)
    return bad(state.optimizer_state_size(), " optimizer state slots, this optimizer keeps ",
               slots, " (the same --optimizer is needed)");
  if (state.state_width() != 0 && state.state_width() != 1 && state.state_width() != dim)
    return bad("optimizer state of ", state.state_width(), " floats a row, neither 1 nor ", dim);
  const size_t state_bytes = static_cast<size_t>(TableStateWidth(state)) * sizeof(float);
  for (const std::string& slot : state.optimizer_state())
    if (slot.size() % state_bytes != 0 || slot.size() / state_bytes != n)
      return bad("an optimizer state slot of ", slot.size(), " bytes for ", n, " rows of ",
                 TableStateWidth(state), " floats");
  if (state.updates_size() != 0 && static_cast<size_t>(state.updates_size()) != n)
    return bad(state.updates_size(), " update counts for ", n, " rows");
  // A managed table's ages: within its clock, which stays far from int64's end.
  if (state.clock() > (uint64_t{1} << 62)) return bad("a clock of ", state.clock());
  if (state.row_idle_size() != 0 && static_cast<size_t>(state.row_idle_size()) != n)
    return bad(state.row_idle_size(), " idle times for ", n, " rows");
  if (state.pending_counts_size() != state.pending_ids_size() ||
      state.pending_idle_size() != state.pending_ids_size())
    return bad(state.pending_ids_size(), " ids waiting for admission with ",
               state.pending_counts_size(), " counts and ", state.pending_idle_size(),
               " idle times");
  for (uint64_t idle : state.row_idle())
    if (idle > state.clock()) return bad("a row idle ", idle, " updates, past the clock");
  for (uint64_t idle : state.pending_idle())
    if (idle > state.clock()) return bad("an id waiting ", idle, " updates, past the clock");
  return absl::OkStatus();
}

// The most updates a managed table may wait for before admitting a row.
constexpr uint32_t kMaxAdmitAfter = 1000000;

bool IsManagedTable(const v1::SparseTableSpec& spec) {
  return spec.eviction() != v1::SparseTableSpec::EVICTION_NONE || spec.admit_after() > 1 ||
         spec.evict_after_updates() > 0;
}

absl::Status ValidateSparseTables(const v1::JobConfig& config) {
  absl::flat_hash_set<std::string> names;
  for (const v1::SparseTableSpec& t : config.sparse_tables()) {
    if (!ValidName(t.name()))
      return absl::InvalidArgumentError(
          "job config: a sparse table's name must be 1 to 64 characters of "
          "[A-Za-z0-9_.-]");
    auto bad = [&](auto... what) {
      return absl::InvalidArgumentError(
          absl::StrCat("job config: sparse table '", t.name(), "': ", what...));
    };
    if (!names.insert(t.name()).second) return bad("appears twice");
    if (t.dim() == 0 || t.dim() > 4096) return bad("dim must be in [1, 4096]");
    if (!(t.init_scale() >= 0 && t.init_scale() <= 1000))
      return bad("init_scale must be in [0, 1000] (0: 0.5 / sqrt(dim))");
    if (!v1::SparseTableSpec::Eviction_IsValid(t.eviction()))
      return bad("unknown eviction ", static_cast<int>(t.eviction()));
    if (t.eviction() != v1::SparseTableSpec::EVICTION_NONE && t.max_rows_per_shard() == 0)
      return bad("eviction needs max_rows_per_shard (the capacity past which rows leave)");
    if (t.admit_after() > kMaxAdmitAfter)
      return bad("admit_after must be at most ", kMaxAdmitAfter);
    if (t.evict_after_updates() > (uint64_t{1} << 40))
      return bad("evict_after_updates must be at most 2^40");
    if (t.rowwise_adagrad() && config.optimizer().kind() != v1::OPTIMIZER_ADAGRAD)
      return bad("rowwise_adagrad needs the adagrad optimizer (--optimizer=adagrad)");
  }
  if (config.sparse_tables_size() > 64)
    return absl::InvalidArgumentError("job config: at most 64 sparse tables");
  return absl::OkStatus();
}

const v1::SparseTableSpec* FindSparseTable(const v1::JobConfig& config,
                                           std::string_view name) {
  for (const v1::SparseTableSpec& t : config.sparse_tables())
    if (t.name() == name) return &t;
  return nullptr;
}

absl::StatusOr<std::vector<v1::SparseTableSpec>> ParseSparseTables(absl::string_view text) {
  std::vector<v1::SparseTableSpec> tables;
  for (absl::string_view entry : absl::StrSplit(text, ',', absl::SkipWhitespace())) {
    std::vector<absl::string_view> parts = absl::StrSplit(entry, ':');
    // The options after the positional fields: KEY=VALUE.
    size_t positional = 0;
    while (positional < parts.size() && parts[positional].find('=') == absl::string_view::npos)
      ++positional;
    v1::SparseTableSpec t;
    uint64_t rows = 0;
    uint32_t dim = 0;
    float scale = 0;
    if (positional < 3 || positional > 4 || !absl::SimpleAtoi(parts[1], &rows) ||
        !absl::SimpleAtoi(parts[2], &dim) ||
        (positional == 4 && !absl::SimpleAtof(parts[3], &scale)))
      return absl::InvalidArgumentError(absl::StrCat(
          "'", entry, "' is not NAME:ROWS:DIM[:INIT_SCALE][:KEY=VALUE...]"));
    t.set_name(std::string(parts[0]));
    t.set_rows(rows);
    t.set_dim(dim);
    t.set_init_scale(scale);
    for (size_t i = positional; i < parts.size(); ++i) {
      std::pair<absl::string_view, absl::string_view> kv = absl::StrSplit(parts[i], '=');
      if (absl::Status s = SetTableOption(kv.first, kv.second, &t); !s.ok())
        return absl::InvalidArgumentError(absl::StrCat("'", entry, "': ", s.message()));
    }
    tables.push_back(std::move(t));
  }
  return tables;
}

absl::Status SetTableOption(absl::string_view key, absl::string_view value,
                            v1::SparseTableSpec* t) {
  uint64_t n = 0;
  if (key == "eviction") {
    if (value == "none") {
      t->set_eviction(v1::SparseTableSpec::EVICTION_NONE);
    } else if (value == "lru") {
      t->set_eviction(v1::SparseTableSpec::EVICTION_LRU);
    } else if (value == "lfu") {
      t->set_eviction(v1::SparseTableSpec::EVICTION_LFU);
    } else {
      return absl::InvalidArgumentError(
          absl::StrCat("eviction '", value, "' is not one of none, lru, lfu"));
    }
    return absl::OkStatus();
  }
  if (!absl::SimpleAtoi(value, &n))
    return absl::InvalidArgumentError(absl::StrCat(key, "=", value, ": not a whole number"));
  if (key == "max_rows") {
    t->set_max_rows_per_shard(n);
  } else if (key == "admit_after") {
    // Checked before the narrowing: a larger number must not wrap to a small one.
    if (n > kMaxAdmitAfter)
      return absl::InvalidArgumentError(absl::StrCat("admit_after: at most ", kMaxAdmitAfter));
    t->set_admit_after(static_cast<uint32_t>(n));
  } else if (key == "evict_after") {
    t->set_evict_after_updates(n);
  } else if (key == "rowwise_adagrad") {
    if (n > 1) return absl::InvalidArgumentError("rowwise_adagrad: 0 or 1");
    t->set_rowwise_adagrad(n == 1);
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat("unknown option '", key,
                     "' (max_rows, eviction, admit_after, evict_after, rowwise_adagrad)"));
  }
  return absl::OkStatus();
}

}  // namespace grps
