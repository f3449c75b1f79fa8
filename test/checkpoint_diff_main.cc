// grps-checkpoint-diff: compares the model in two checkpoints, chunk by
// chunk and sparse row by row.
//
//   grps-checkpoint-diff DIR_A DIR_B   exit 0 when both verify, every chunk
//                                      has bit-identical values, optimizer
//                                      state and version, and every sparse
//                                      table the same rows with bit-identical
//                                      values, optimizer state and update
//                                      counts; 1 with the first difference
//                                      otherwise
//   grps-checkpoint-diff --tolerance R DIR_A DIR_B
//                                      the same, but the values and
//                                      optimizer state of chunks and sparse
//                                      rows need only agree within R:
//                                      |a - b| <= R (1e-3 + |a|) element by
//                                      element (float rounding of the same
//                                      computation in another order); prints
//                                      the largest difference
//   grps-checkpoint-diff --step DIR    prints the checkpoint's step
//   grps-checkpoint-diff --newest ROOT prints the newest complete checkpoint
//                                      folder under ROOT (exit 1 if none)
//   grps-checkpoint-diff --counts DIR  prints, for the dense chunks together
//                                      and for each sparse table (every
//                                      shard's part), the versions and the
//                                      counts the state holds
//                                      (v1::StateCounters), as
//                                      "chunks count=N versions=V updates=U
//                                      pushes=P duplicates=D too_stale=T
//                                      late=L" (V: the sum of the versions)
//
// The checkpoints may come from jobs with different numbers of servers: the
// chunks are compared by id, the rows by table and id. For tests and drills
// (docs/durability.md).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/string_view.h"
#include "checkpoint/checkpoint.h"
#include "daemon/env.h"
#include "job/sparse_tables.h"

namespace grps {
namespace {

int Usage() {
  std::fprintf(stderr,
               "usage: grps-checkpoint-diff [--tolerance R] DIR_A DIR_B\n"
               "       grps-checkpoint-diff --step DIR\n"
               "       grps-checkpoint-diff --newest ROOT\n"
               "       grps-checkpoint-diff --counts DIR\n");
  return 2;
}

// Every chunk, and every row of every table (as one shard of one holds them).
absl::StatusOr<ShardState> Everything(const std::string& dir, v1::CheckpointManifest* manifest) {
  absl::StatusOr<v1::CheckpointManifest> m = VerifyCheckpoint(Env::Default(), dir, "");
  if (!m.ok()) return m.status();
  *manifest = *m;
  std::vector<uint32_t> ids;
  for (const v1::ChunkSpec& c : m->shard_map().chunks()) ids.push_back(c.chunk_id());
  return LoadShardState(Env::Default(), dir, *m, ids, 1, 0);
}

// Whether two f32 arrays differ (bit for bit, or beyond a tolerance).
using Differ = std::function<bool(absl::string_view, absl::string_view)>;

// The rows of `t` in the order of their ids: (id, index in t). 16 bytes a
// row, the rows themselves read in place: a table of tens of millions of
// rows is compared within about its own size.
std::vector<std::pair<int64_t, int>> ById(const v1::TableState& t) {
  std::vector<std::pair<int64_t, int>> rows(t.ids_size());
  for (int i = 0; i < t.ids_size(); ++i) rows[i] = {t.ids(i), i};
  std::sort(rows.begin(), rows.end());
  return rows;
}

// Whether row i of x and row j of y have the same values, optimizer state
// (`differ`) and update count.
bool SameRow(const v1::TableState& x, int i, const v1::TableState& y, int j,
             const Differ& differ) {
  auto row = [](absl::string_view all, size_t width, int k) {
    return all.substr(static_cast<size_t>(k) * width, width);
  };
  const size_t bytes = static_cast<size_t>(x.dim()) * sizeof(float);
  if (x.dim() != y.dim() || x.optimizer_state_size() != y.optimizer_state_size() ||
      TableStateWidth(x) != TableStateWidth(y) ||
      (x.updates_size() == 0 ? 0 : x.updates(i)) != (y.updates_size() == 0 ? 0 : y.updates(j)) ||
      differ(row(x.values(), bytes, i), row(y.values(), bytes, j)))
    return false;
  const size_t state_bytes = static_cast<size_t>(TableStateWidth(x)) * sizeof(float);
  for (int k = 0; k < x.optimizer_state_size(); ++k)
    if (differ(row(x.optimizer_state(k), state_bytes, i),
               row(y.optimizer_state(k), state_bytes, j)))
      return false;
  return true;
}

// The largest |a - b| / (1e-3 + |a|) over two f32 arrays of the same size.
double LargestDifference(absl::string_view a, absl::string_view b) {
  const size_t n = std::min(a.size(), b.size()) / sizeof(float);
  double worst = 0;
  for (size_t i = 0; i < n; ++i) {
    float x, y;
    std::memcpy(&x, a.data() + i * sizeof(float), sizeof(float));
    std::memcpy(&y, b.data() + i * sizeof(float), sizeof(float));
    if (x == y) continue;  // equal infinities too
    const double d = std::fabs(double(x) - y) / (1e-3 + std::fabs(double(x)));
    worst = std::isnan(d) ? INFINITY : std::max(worst, d);
  }
  return worst;
}

// The first difference between the tables of `a` and `b` (matched by name),
// or "".
std::string DiffTables(const std::vector<v1::TableState>& a, const std::vector<v1::TableState>& b,
                       const Differ& differ, uint64_t* rows) {
  if (a.size() != b.size()) return "the checkpoints hold different numbers of sparse tables";
  for (const v1::TableState& x : a) {
    auto y = std::find_if(b.begin(), b.end(), [&](const auto& t) { return t.name() == x.name(); });
    if (y == b.end()) return "sparse table '" + x.name() + "' is in one checkpoint only";
    if (x.version() != y->version())
      return "sparse table '" + x.name() + "' differs in its version (" +
             std::to_string(x.version()) + " and " + std::to_string(y->version()) + ")";
    if (x.ids_size() != y->ids_size())
      return "sparse table '" + x.name() + "' has " + std::to_string(x.ids_size()) +
             " rows and " + std::to_string(y->ids_size());
    const std::vector<std::pair<int64_t, int>> rx = ById(x), ry = ById(*y);
    for (size_t r = 0; r < rx.size(); ++r)
      if (rx[r].first != ry[r].first || !SameRow(x, rx[r].second, *y, ry[r].second, differ))
        return "sparse table '" + x.name() + "' differs in row " + std::to_string(rx[r].first);
    *rows += rx.size();
  }
  return "";
}

// "" if every chunk is the same (`differ`), else which differs and how;
// `bytes` counts the values compared.
std::string DiffChunks(const std::vector<v1::ChunkState>& a,
                       const std::vector<v1::ChunkState>& b, const Differ& differ,
                       uint64_t* bytes) {
  for (size_t i = 0; i < a.size(); ++i) {
    const v1::ChunkState& x = a[i];
    const v1::ChunkState& y = b[i];
    std::string what;
    if (x.version() != y.version()) what = "version";
    else if (differ(x.values(), y.values())) what = "values";
    else if (x.optimizer_state_size() != y.optimizer_state_size()) what = "optimizer state";
    for (int k = 0; what.empty() && k < x.optimizer_state_size(); ++k)
      if (differ(x.optimizer_state(k), y.optimizer_state(k))) what = "optimizer state";
    if (!what.empty())
      return "chunk " + std::to_string(x.chunk_id()) + " differs in its " + what +
             " (versions " + std::to_string(x.version()) + " and " +
             std::to_string(y.version()) + ")";
    *bytes += x.values().size();
  }
  return "";
}

// One line of --counts: `versions` and the counts `c`.
void PrintCounts(const std::string& what, size_t count, uint64_t versions,
                 const v1::StateCounters& c) {
  std::printf("%s count=%zu versions=%llu updates=%llu pushes=%llu duplicates=%llu "
              "too_stale=%llu late=%llu\n",
              what.c_str(), count, static_cast<unsigned long long>(versions),
              static_cast<unsigned long long>(c.updates()),
              static_cast<unsigned long long>(c.pushes()),
              static_cast<unsigned long long>(c.duplicates()),
              static_cast<unsigned long long>(c.too_stale()),
              static_cast<unsigned long long>(c.late_folded() + c.late_dropped()));
}

int PrintCheckpointCounts(const std::string& dir) {
  v1::CheckpointManifest manifest;
  absl::StatusOr<ShardState> state = Everything(dir, &manifest);
  if (!state.ok()) {
    std::fprintf(stderr, "grps-checkpoint-diff: %s\n",
                 std::string(state.status().message()).c_str());
    return 1;
  }
  v1::StateCounters chunks;
  uint64_t versions = 0;
  for (const v1::ChunkState& c : state->chunks) {
    versions += c.version();
    AddStateCounters(c.counters(), &chunks);
  }
  PrintCounts("chunks", state->chunks.size(), versions, chunks);
  // Read as one shard, each table has every file's counts.
  for (const v1::TableState& t : state->tables)
    PrintCounts("table " + t.name(), 1, t.version(), t.counters());
  return 0;
}

int Main(int argc, char** argv) {
  if (argc == 3 && std::strcmp(argv[1], "--step") == 0) {
    absl::StatusOr<v1::CheckpointManifest> m = VerifyCheckpoint(Env::Default(), argv[2], "");
    if (!m.ok()) {
      std::fprintf(stderr, "grps-checkpoint-diff: %s\n", std::string(m.status().message()).c_str());
      return 1;
    }
    std::printf("%llu\n", static_cast<unsigned long long>(m->step()));
    return 0;
  }
  if (argc == 3 && std::strcmp(argv[1], "--counts") == 0) return PrintCheckpointCounts(argv[2]);
  if (argc == 3 && std::strcmp(argv[1], "--newest") == 0) {
    absl::StatusOr<CheckpointChoice> choice = FindNewestCheckpoint(Env::Default(), argv[2], "");
    if (!choice.ok() || !choice->manifest.has_value()) {
      std::fprintf(stderr, "grps-checkpoint-diff: no complete checkpoint in %s\n", argv[2]);
      return 1;
    }
    std::printf("%s\n", choice->dir.c_str());
    return 0;
  }
  double tolerance = -1;  // bit-identical
  if (argc == 5 && std::strcmp(argv[1], "--tolerance") == 0) {
    char* end = nullptr;
    tolerance = std::strtod(argv[2], &end);
    if (end == argv[2] || *end != '\0' || !(tolerance >= 0)) return Usage();
    argv += 2;
    argc -= 2;
  }
  if (argc != 3 || argv[1][0] == '-') return Usage();
  v1::CheckpointManifest ma, mb;
  absl::StatusOr<ShardState> sa = Everything(argv[1], &ma);
  absl::StatusOr<ShardState> sb = Everything(argv[2], &mb);
  for (const auto* s : {&sa, &sb})
    if (!s->ok()) {
      std::fprintf(stderr, "grps-checkpoint-diff: %s\n", std::string(s->status().message()).c_str());
      return 1;
    }
  if (absl::Status s = CheckSameChunks(ma.shard_map(), mb.shard_map(), argv[1], argv[2]); !s.ok()) {
    std::fprintf(stderr, "grps-checkpoint-diff: %s\n", std::string(s.message()).c_str());
    return 1;
  }
  double largest = 0;
  // Equal, or within the tolerance when there is one.
  const Differ differ = [&](absl::string_view u, absl::string_view v) {
    if (tolerance < 0 || u.size() != v.size()) return u != v;
    const double d = LargestDifference(u, v);
    largest = std::max(largest, d);
    return d > tolerance;
  };
  uint64_t bytes = 0;
  if (const std::string what = DiffChunks(sa->chunks, sb->chunks, differ, &bytes);
      !what.empty()) {
    std::printf("%s\n", what.c_str());
    return 1;
  }
  const std::vector<v1::ChunkState>* a = &sa->chunks;
  uint64_t rows = 0;
  if (const std::string what = DiffTables(sa->tables, sb->tables, differ, &rows); !what.empty()) {
    std::printf("%s\n", what.c_str());
    return 1;
  }
  if (tolerance >= 0)
    std::printf("within %g (largest relative difference %.3g): ", tolerance, largest);
  std::printf("%s: %zu chunks, %llu bytes of values, %llu sparse rows, steps %llu and %llu\n",
              tolerance >= 0 ? "same" : "identical", a->size(), static_cast<unsigned long long>(bytes),
              static_cast<unsigned long long>(rows), static_cast<unsigned long long>(ma.step()),
              static_cast<unsigned long long>(mb.step()));
  return 0;
}

}  // namespace
}  // namespace grps

int main(int argc, char** argv) { return grps::Main(argc, argv); }
