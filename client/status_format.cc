#include "client/status_format.h"

#include <algorithm>
#include <cmath>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "google/protobuf/util/json_util.h"
#include "job/job_config.h"
#include "job/shard_map.h"

namespace grps {
namespace {

// Placement lists longer than this are cut, with the rest counted.
constexpr int kMaxPlacementShown = 16;

// A text table: a header row and data rows, columns padded to their widest
// cell. Columns marked numeric are right aligned.
class TextTable {
 public:
  struct Column {
    std::string title;
    bool numeric = false;
  };

  explicit TextTable(std::vector<Column> columns) : columns_(std::move(columns)) {}

  // `cells` has one entry per column.
  void AddRow(std::vector<std::string> cells) { rows_.push_back(std::move(cells)); }

  std::string Render() const {
    std::vector<size_t> width(columns_.size());
    for (size_t c = 0; c < columns_.size(); ++c) {
      width[c] = columns_[c].title.size();
      for (const auto& row : rows_) width[c] = std::max(width[c], row[c].size());
    }
    std::string out;
    auto append_row = [&](const std::vector<std::string>& cells) {
      std::string line;
      for (size_t c = 0; c < columns_.size(); ++c) {
        if (c > 0) line += "  ";
        const std::string& cell = cells[c];
        std::string pad(width[c] - cell.size(), ' ');
        line += columns_[c].numeric ? pad + cell : cell + pad;
      }
      line.erase(line.find_last_not_of(' ') + 1);
      absl::StrAppend(&out, line, "\n");
    };
    std::vector<std::string> titles;
    for (const Column& c : columns_) titles.push_back(c.title);
    append_row(titles);
    for (const auto& row : rows_) append_row(row);
    return out;
  }

 private:
  std::vector<Column> columns_;
  std::vector<std::vector<std::string>> rows_;
};

std::string Fixed(double value, int decimals) {
  return absl::StrFormat("%.*f", decimals, value);
}

// An accuracy or loss from an evaluation; negative means "none yet".
std::string Evaluation(float value) {
  return value < 0 ? std::string("-") : Fixed(value, 4);
}

std::string Mib(uint64_t bytes) { return Fixed(bytes / 1048576.0, 2); }

std::string Shape(const v1::TensorSpec& tensor) {
  if (tensor.shape_size() == 0) return "scalar";
  return absl::StrJoin(tensor.shape(), "x");
}

// "sync", "sync, 1 backup worker, late gradients folded", "ssp (s=3)".
std::string ModeWithBound(const v1::JobStatus& status) {
  std::string mode = ModeName(status.mode());
  if (status.mode() == v1::MODE_SSP)
    absl::StrAppend(&mode, " (s=", status.config().staleness_bound(), ")");
  const uint32_t backups = status.config().backup_workers();
  if (status.mode() == v1::MODE_SYNC && backups > 0)
    absl::StrAppend(&mode, ", ", backups, " backup worker", backups == 1 ? "" : "s",
                    ", late gradients ",
                    status.config().late_gradients() == v1::LATE_GRADIENTS_DROP
                        ? "dropped"
                        : "folded");
  return mode;
}

// "adam, on the servers", or where the program's optimizer runs on the
// workers what the servers do instead.
std::string OptimizerLine(const v1::JobStatus& status) {
  const v1::OptimizerKind kind = status.config().optimizer().kind();
  if (kind != v1::OPTIMIZER_WORKERS) return absl::StrCat(OptimizerName(kind), ", on the servers");
  return status.mode() == v1::MODE_SYNC
             ? "the program's, on the workers (the servers average the gradients)"
             : "the program's, on the workers (the servers add the weights' changes)";
}

// Which optional shard columns a table shows: those of the job's mode, and
// any whose figure is not zero somewhere (a counter from an earlier mode or
// a misconfigured server is still worth seeing).
struct ShardColumns {
  bool late = false;       // sync: late gradients, folded/dropped
  bool too_stale = false;  // async / ssp: refused as too stale
  bool waiting = false;    // sync with backup workers, ssp: pulls held back
  bool held = false;       // ssp: gradients held
};

ShardColumns ShardColumnsOf(const v1::JobStatus& status) {
  ShardColumns c;
  const v1::JobConfig& config = status.config();
  c.late = status.mode() == v1::MODE_SYNC && config.backup_workers() > 0;
  c.too_stale = status.mode() != v1::MODE_SYNC && config.max_staleness() > 0;
  c.waiting = c.late || status.mode() == v1::MODE_SSP;
  c.held = status.mode() == v1::MODE_SSP;
  for (const v1::ShardStatus& s : status.shards()) {
    c.late |= s.late_gradients() > 0;
    c.too_stale |= s.too_stale() > 0;
    c.waiting |= s.waiting_pulls() > 0;
    c.held |= s.held_gradients() > 0;
  }
  return c;
}

std::string StepOfTotal(uint64_t step, uint64_t total) {
  if (total == 0) return absl::StrCat(step);
  std::string s = absl::StrCat(step, " / ", total);
  if (step <= total)
    absl::StrAppend(&s, absl::StrFormat(" (%.1f%%)", 100.0 * step / total));
  return s;
}

// Sync: the global step counts completed steps, out of the steps per
// worker. Async / ssp: chunk versions count updates, and every worker's
// step is one, so the figure is not steps and is not set against the total.
std::string GlobalStep(const v1::JobStatus& status) {
  std::string s;
  if (status.mode() == v1::MODE_SYNC || status.total_steps() == 0) {
    s = StepOfTotal(status.global_step(), status.total_steps());
  } else {
    s = absl::StrCat(status.global_step(), " updates per chunk (",
                     status.total_steps(), " steps per worker)");
  }
  // A running job whose global step stands still: say so.
  if (status.state() == v1::JOB_STATE_RUNNING &&
      status.global_step_idle_seconds() >= 5)
    absl::StrAppend(&s, ", stalled ", HumanDuration(status.global_step_idle_seconds()));
  return s;
}

// "3 at step 400, 1.2 MiB, 12.0s ago" (age only when now_unix_ms is set).
std::string CheckpointText(const v1::CheckpointSummary& c, int64_t now_unix_ms) {
  std::string s = absl::StrCat(c.id(), " at step ", c.step());
  if (c.bytes() > 0) absl::StrAppend(&s, ", ", HumanBytes(c.bytes()));
  if (now_unix_ms > 0 && c.unix_time_ms() > 0)
    absl::StrAppend(
        &s, ", ",
        HumanDuration(std::max<int64_t>(0, now_unix_ms -
                                               static_cast<int64_t>(c.unix_time_ms())) /
                      1000.0),
        " ago");
  return s;
}

// A shard's part of the newest checkpoint asked of it: "4 written".
std::string ShardCheckpointText(const v1::ShardStatus& s) {
  if (!s.has_checkpoint() || s.checkpoint().id() == 0)
    return s.checkpoint_state().empty() ? "-" : s.checkpoint_state();
  switch (s.checkpoint().state()) {
    case v1::CHECKPOINT_STATE_WRITTEN: return absl::StrCat(s.checkpoint().id(), " written");
    case v1::CHECKPOINT_STATE_FAILED: return absl::StrCat(s.checkpoint().id(), " failed");
    default: return absl::StrCat(s.checkpoint().id(), " pending");
  }
}

}  // namespace

std::string HumanBytes(uint64_t bytes) {
  static const char* const kUnits[] = {"KiB", "MiB", "GiB", "TiB", "PiB"};
  if (bytes < 1024) return absl::StrCat(bytes, " B");
  double value = bytes / 1024.0;
  int unit = 0;
  while (value >= 1024.0 && unit < 4) {
    value /= 1024.0;
    ++unit;
  }
  return absl::StrFormat("%.1f %s", value, kUnits[unit]);
}

std::string HumanDuration(double seconds) {
  if (!(seconds >= 0)) seconds = 0;
  if (seconds < 60) return absl::StrFormat("%.1fs", seconds);
  uint64_t s = static_cast<uint64_t>(std::llround(seconds));
  if (s < 3600) return absl::StrFormat("%dm%02ds", s / 60, s % 60);
  return absl::StrFormat("%dh%02dm%02ds", s / 3600, s / 60 % 60, s % 60);
}

namespace {

using HeaderLines = std::vector<std::pair<std::string, std::string>>;

std::string LiveSetLine(const v1::JobStatus& status) {
  int live = 0;
  for (const v1::WorkerStatus& w : status.workers())
    if (w.state() == v1::MEMBER_STATE_ALIVE) ++live;
  return absl::StrCat(live, " of ", status.workers_size(), " ranks live; ",
                      status.worker_leaves(), " left, ", status.worker_joins(),
                      " joined (membership epoch ", status.membership_epoch(), ")");
}

std::string DataLine(const v1::DataProgress& d) {
  return absl::StrCat("epoch ", d.epoch(), "; ", d.consumed(), " of ", d.total_blocks(),
                      " blocks trained (", d.blocks_per_epoch(), " per epoch), ", d.leased(),
                      " leased, ", d.returned(), " came back",
                      d.refused_reports() > 0
                          ? absl::StrCat(", ", d.refused_reports(), " reports refused")
                          : std::string());
}

std::string ServersLine(const v1::JobStatus& status) {
  const v1::ReshardProgress& r = status.reshard();
  std::string servers =
      absl::StrCat(status.config().num_servers(), " shards (up to ",
                   status.config().max_servers(), "), shard map epoch ", status.map_epoch());
  if (r.target_servers() > 0)
    absl::StrAppend(&servers, "; re-sharding to ", r.target_servers(), ": ", r.phase());
  if (r.completed() > 0)
    absl::StrAppend(&servers, "; ", r.completed(), " re-sharding", r.completed() == 1 ? "" : "s",
                    ", the last ", r.last_from(), " -> ", r.last_to(), " at step ",
                    r.last_step(), " (", HumanDuration(r.last_seconds()), ")");
  return servers;
}

// "checkpoints" (how many, the last, the pending one) and, after a failed
// one, "checkpoint" with its error.
void AddCheckpointLines(const v1::JobStatus& status, int64_t now_unix_ms, HeaderLines& lines) {
  std::string c = absl::StrCat(status.checkpoints_completed(), " complete");
  if (status.last_checkpoint().id() > 0)
    absl::StrAppend(&c, "; last ", CheckpointText(status.last_checkpoint(), now_unix_ms));
  const v1::CheckpointSummary& p = status.pending_checkpoint();
  if (p.state() == v1::CHECKPOINT_STATE_PENDING)
    absl::StrAppend(&c, "; pending ", p.id(),
                    p.step() > 0 ? absl::StrCat(" at step ", p.step()) : "");
  lines.push_back({"checkpoints", c});
  if (p.state() == v1::CHECKPOINT_STATE_FAILED)
    lines.push_back({"checkpoint", absl::StrCat(p.id(), " failed: ", p.error().substr(0, 80))});
}

}  // namespace

std::string FormatJobHeader(const v1::JobStatus& status, int64_t now_unix_ms) {
  HeaderLines lines = {
      {"job", status.job_id().empty() ? "-" : status.job_id()},
      {"state", JobStateName(status.state())},
      {"mode", ModeWithBound(status)},
      {"optimizer", OptimizerLine(status)},
      {"global step", GlobalStep(status)},
      {"samples/s", Fixed(status.samples_per_sec(), 1)},
      {"loss", Fixed(status.loss(), 4)},
      {"test accuracy", status.test_accuracy() < 0
                            ? std::string("-")
                            : absl::StrCat(Evaluation(status.test_accuracy()),
                                           " (test loss ",
                                           Evaluation(status.test_loss()),
                                           status.has_test_auc()
                                               ? absl::StrCat(", AUC ",
                                                              Evaluation(status.test_auc()))
                                               : "",
                                           ")")},
  };
  if (status.late_gradients() > 0 || status.too_stale() > 0)
    lines.push_back({"gradients", absl::StrCat(status.late_gradients(), " late, ",
                                               status.too_stale(), " too stale")});
  if (status.has_final_eval())
    lines.push_back({"final", absl::StrCat(
                                  "test accuracy ",
                                  Fixed(status.final_test_accuracy(), 4),
                                  ", test loss ",
                                  Fixed(status.final_test_loss(), 4),
                                  status.has_final_test_auc()
                                      ? absl::StrCat(", AUC ", Fixed(status.final_test_auc(), 4))
                                      : "")});
  if (status.worker_leaves() > 0 || status.worker_joins() > 0 ||
      status.config().max_workers() > 0)
    lines.push_back({"live set", LiveSetLine(status)});
  if (status.data().total_blocks() > 0) lines.push_back({"data", DataLine(status.data())});
  if (status.config().max_servers() > 0) lines.push_back({"servers", ServersLine(status)});
  if (status.generation() > 1)  // a job starts at generation 1
    lines.push_back({"generation", absl::StrCat(status.generation(),
                                                " (resumed or rolled back from a "
                                                "checkpoint)")});
  if (status.last_checkpoint().id() > 0 || status.pending_checkpoint().id() > 0)
    AddCheckpointLines(status, now_unix_ms, lines);
  if (status.coordinator_restarted())
    lines.push_back({"coordinator", "restarted during this job"});
  lines.push_back({"elapsed", HumanDuration(status.elapsed_seconds())});
  if (!status.message().empty()) lines.push_back({"message", status.message()});
  for (const std::string& warning : status.warnings()) lines.push_back({"warning", warning});

  size_t width = 0;
  for (const auto& [label, value] : lines) width = std::max(width, label.size());
  std::string out;
  for (const auto& [label, value] : lines)
    absl::StrAppend(&out, label, std::string(width + 2 - label.size(), ' '),
                    value, "\n");
  return out;
}

std::string FormatWorkersTable(const v1::JobStatus& status) {
  // Late gradients where relevant: sync with backup workers, or any at all.
  bool show_late = status.mode() == v1::MODE_SYNC &&
                   status.config().backup_workers() > 0;
  for (const v1::WorkerStatus& w : status.workers())
    show_late |= w.late_gradients() > 0;
  std::vector<TextTable::Column> columns = {{"rank", true},
                                            {"state"},
                                            {"step", true},
                                            {"epoch", true},
                                            {"loss", true},
                                            {"samples/s", true}};
  if (show_late) columns.push_back({"late", true});
  columns.insert(columns.end(),
                 {{"heartbeat", true}, {"notes"}, {"backend"}, {"host"}});
  TextTable table(std::move(columns));
  for (const v1::WorkerStatus& w : status.workers()) {
    const v1::WorkerProgress& p = w.progress();
    std::vector<std::string> notes;
    if (status.has_evaluator_rank() && status.evaluator_rank() == w.rank())
      notes.push_back("eval");
    if (w.straggler()) notes.push_back("straggler");
    if (w.joining()) notes.push_back("joining");
    if (p.loss_scale() > 0)
      notes.push_back(absl::StrCat("f16 scale ", absl::StrFormat("%.9g", p.loss_scale()), ", ", p.overflow_steps(),
                                   " overflow", p.overflow_steps() == 1 ? "" : "s"));
    if (p.gradient_norm() > 0)
      notes.push_back(absl::StrCat("clipped ", p.clipped_steps(), " (norm ",
                                   Fixed(p.gradient_norm(), 2), ")"));
    std::vector<std::string> row = {
        absl::StrCat(w.rank()), MemberStateName(w.state()),
        p.total_steps() > 0 ? absl::StrCat(p.step(), "/", p.total_steps())
                            : absl::StrCat(p.step()),
        absl::StrCat(p.epoch()), Fixed(p.loss(), 4),
        // A dead or finished worker's last figure is not a rate now.
        w.state() == v1::MEMBER_STATE_ALIVE ? Fixed(p.samples_per_sec(), 1) : "-"};
    if (show_late) row.push_back(absl::StrCat(w.late_gradients()));
    row.insert(row.end(),
               {absl::StrCat(HumanDuration(w.last_heartbeat_ms_ago() / 1000.0),
                             " ago"),
                absl::StrJoin(notes, ", "), w.backend().empty() ? "-" : w.backend(),
                w.host().empty() ? "-" : w.host()});
    table.AddRow(std::move(row));
  }
  return table.Render();
}

std::string FormatShardsTable(const v1::JobStatus& status) {
  // "rung": of the pushes, those taken from shared-memory lane doorbells
  // (shown once a shard has taken one).
  const bool rung = std::any_of(status.shards().begin(), status.shards().end(),
                                [](const v1::ShardStatus& s) { return s.doorbell_pushes() > 0; });
  std::vector<TextTable::Column> traffic_columns = {
      {"shard", true}, {"address"},    {"version", true}, {"chunks", true},
      {"MiB", true},   {"in", true},   {"out", true},     {"pushes", true}};
  if (rung) traffic_columns.push_back({"rung", true});
  traffic_columns.push_back({"pulls", true});
  traffic_columns.push_back({"checkpoint"});
  TextTable traffic(std::move(traffic_columns));
  for (const v1::ShardStatus& s : status.shards()) {
    std::vector<std::string> row = {absl::StrCat(s.shard()),
                                    s.address().empty() ? "-" : s.address(),
                                    absl::StrCat(s.version()),
                                    absl::StrCat(s.num_chunks()),
                                    Mib(s.num_elements() * 4),
                                    HumanBytes(s.bytes_in()),
                                    HumanBytes(s.bytes_out()),
                                    absl::StrCat(s.pushes())};
    if (rung) row.push_back(absl::StrCat(s.doorbell_pushes()));
    row.push_back(absl::StrCat(s.pulls()));
    row.push_back(ShardCheckpointText(s));
    traffic.AddRow(std::move(row));
  }

  const ShardColumns optional = ShardColumnsOf(status);
  std::vector<TextTable::Column> columns = {
      {"shard", true}, {"updates", true}, {"dups", true}, {"rejected", true}};
  if (optional.late) columns.push_back({"late fold/drop", true});
  if (optional.too_stale) columns.push_back({"too stale", true});
  columns.push_back({"staleness mean/max", true});
  if (optional.waiting) columns.push_back({"waiting pulls", true});
  if (optional.held) columns.push_back({"held", true});
  TextTable consistency(std::move(columns));
  for (const v1::ShardStatus& s : status.shards()) {
    std::vector<std::string> row = {
        absl::StrCat(s.shard()), absl::StrCat(s.updates_applied()),
        absl::StrCat(s.duplicate_pushes()), absl::StrCat(s.rejected_pushes())};
    if (optional.late)
      row.push_back(absl::StrCat(s.late_gradients(), " ", s.late_folded(), "/",
                                 s.late_dropped()));
    if (optional.too_stale) row.push_back(absl::StrCat(s.too_stale()));
    row.push_back(
        absl::StrCat(Fixed(s.staleness_mean(), 2), "/", s.staleness_max()));
    if (optional.waiting) row.push_back(absl::StrCat(s.waiting_pulls()));
    if (optional.held) row.push_back(absl::StrCat(s.held_gradients()));
    consistency.AddRow(std::move(row));
  }
  std::string text = absl::StrCat(traffic.Render(), "\n", consistency.Render());
  if (std::string tables = FormatSparseTables(status); !tables.empty())
    absl::StrAppend(&text, "\n", tables);
  return text;
}

std::string FormatSparseTables(const v1::JobStatus& status) {
  TextTable rows({{"table"},
                  {"shard", true},
                  {"rows", true},
                  {"MiB", true},
                  {"B/row", true},
                  {"version", true},
                  {"rows pushed", true},
                  {"rows pulled", true},
                  {"hottest 1%", true},
                  {"evicted", true},
                  {"admitted", true},
                  {"dropped", true}});
  // Per table, in the order first seen: each shard's row traffic.
  std::vector<std::pair<std::string, std::vector<uint64_t>>> traffic;
  for (const v1::ShardStatus& s : status.shards()) {
    for (const v1::SparseTableStatus& t : s.tables()) {
      rows.AddRow({t.name(), absl::StrCat(s.shard()), absl::StrCat(t.rows()), Mib(t.bytes()),
                   Fixed(t.bytes_per_row(), 0), absl::StrCat(t.version()),
                   absl::StrCat(t.rows_pushed()), absl::StrCat(t.rows_pulled()),
                   absl::StrCat(Fixed(100 * t.hottest_share(), 1), "%"),
                   absl::StrCat(t.rows_evicted()), absl::StrCat(t.rows_admitted()),
                   absl::StrCat(t.rows_dropped())});
      auto it = std::find_if(traffic.begin(), traffic.end(),
                             [&](const auto& e) { return e.first == t.name(); });
      if (it == traffic.end()) it = traffic.insert(traffic.end(), {t.name(), {}});
      it->second.push_back(t.rows_pushed() + t.rows_pulled());
    }
  }
  if (traffic.empty()) return "";
  std::string text = rows.Render();
  for (const auto& [name, per_shard] : traffic) {
    uint64_t total = 0, busiest = 0;
    for (uint64_t t : per_shard) {
      total += t;
      busiest = std::max(busiest, t);
    }
    if (total == 0) {
      absl::StrAppend(&text, "table ", name, ": no row traffic yet\n");
      continue;
    }
    const double mean = static_cast<double>(total) / per_shard.size();
    absl::StrAppend(&text, "table ", name, ": row traffic skew over ", per_shard.size(),
                    " shards ", Fixed(busiest / mean, 2), " (busiest shard / mean)\n");
  }
  return text;
}

std::string FormatJobStatus(const v1::JobStatus& status, int64_t now_unix_ms) {
  return absl::StrCat(FormatJobHeader(status, now_unix_ms), "\nworkers (",
                      status.workers_size(), ")\n", FormatWorkersTable(status),
                      "\nshards (", status.shards_size(), ")\n",
                      FormatShardsTable(status));
}

std::string FormatStatusLine(const v1::JobStatus& status) {
  int alive = 0;
  for (const v1::WorkerStatus& w : status.workers())
    if (w.state() == v1::MEMBER_STATE_ALIVE) ++alive;
  std::string line = absl::StrCat(
      JobStateName(status.state()), "  step ", status.global_step());
  if (status.total_steps() > 0) absl::StrAppend(&line, "/", status.total_steps());
  absl::StrAppend(&line, "  loss ", Fixed(status.loss(), 4), "  test acc ",
                  Evaluation(status.test_accuracy()), "  ",
                  Fixed(status.samples_per_sec(), 1), " samples/s  workers ",
                  alive, "/", status.workers_size(), " alive  elapsed ",
                  HumanDuration(status.elapsed_seconds()));
  if (status.has_final_eval())
    absl::StrAppend(&line, "  final test acc ",
                    Fixed(status.final_test_accuracy(), 4));
  if (!status.message().empty()) absl::StrAppend(&line, "  (", status.message(), ")");
  if (status.warnings_size() > 0)
    absl::StrAppend(&line, "  ", status.warnings_size(), " warning",
                    status.warnings_size() == 1 ? "" : "s", ": ", status.warnings(0));
  return line;
}

std::string FormatShardMap(const v1::ShardMap& map) {
  // Chunks of each tensor in offset order, as shard numbers.
  std::vector<std::vector<std::pair<uint64_t, uint32_t>>> placement(
      map.tensors_size());
  for (const v1::ChunkSpec& c : map.chunks())
    if (c.tensor_index() < placement.size())
      placement[c.tensor_index()].push_back({c.offset(), c.shard()});

  TextTable tensors({{"tensor"},
                     {"shape"},
                     {"elements", true},
                     {"chunks", true},
                     {"shard of each chunk"}});
  for (int t = 0; t < map.tensors_size(); ++t) {
    auto& chunks = placement[t];
    std::sort(chunks.begin(), chunks.end());
    std::vector<std::string> shards;
    for (size_t i = 0; i < chunks.size() && i < kMaxPlacementShown; ++i)
      shards.push_back(absl::StrCat(chunks[i].second));
    std::string shown = absl::StrJoin(shards, " ");
    if (chunks.size() > kMaxPlacementShown)
      absl::StrAppend(&shown, " ... (+", chunks.size() - kMaxPlacementShown, ")");
    const v1::TensorSpec& spec = map.tensors(t);
    tensors.AddRow({spec.name(), Shape(spec), absl::StrCat(NumElements(spec)),
                    absl::StrCat(chunks.size()), shown});
  }

  // Per-shard totals over the shards the map names or its chunks use.
  uint32_t num_shards = map.shards_size();
  for (const v1::ChunkSpec& c : map.chunks())
    num_shards = std::max(num_shards, c.shard() + 1);
  std::vector<uint64_t> chunk_count(num_shards), elements(num_shards);
  for (const v1::ChunkSpec& c : map.chunks()) {
    ++chunk_count[c.shard()];
    elements[c.shard()] += c.num_elements();
  }
  std::vector<std::string> address(num_shards, "-");
  for (const v1::ShardEndpoint& e : map.shards())
    if (e.shard() < num_shards && !e.address().empty())
      address[e.shard()] = e.address();

  TextTable shards({{"shard", true},
                    {"address"},
                    {"chunks", true},
                    {"elements", true},
                    {"MiB", true}});
  uint64_t total_elements = 0;
  for (uint32_t s = 0; s < num_shards; ++s) {
    shards.AddRow({absl::StrCat(s), address[s], absl::StrCat(chunk_count[s]),
                   absl::StrCat(elements[s]), Mib(elements[s] * 4)});
    total_elements += elements[s];
  }
  shards.AddRow({"total", "", absl::StrCat(map.chunks_size()),
                 absl::StrCat(total_elements), Mib(total_elements * 4)});

  return absl::StrCat("shard map epoch ", map.epoch(), ": ", map.tensors_size(),
                      " tensors, ", map.chunks_size(), " chunks on ",
                      num_shards, " shards\n\n", tensors.Render(), "\n",
                      shards.Render());
}

absl::StatusOr<std::string> ToJson(const google::protobuf::Message& message) {
  google::protobuf::util::JsonPrintOptions options;
  options.preserve_proto_field_names = true;
  options.always_print_primitive_fields = true;
  std::string json;
  auto status = google::protobuf::util::MessageToJsonString(message, &json, options);
  if (!status.ok())
    return absl::InternalError(absl::StrCat("cannot render ",
                                            message.GetTypeName(), " as JSON: ",
                                            status.ToString()));
  return json;
}

}  // namespace grps
