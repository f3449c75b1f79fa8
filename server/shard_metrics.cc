#include "server/shard_metrics.h"

#include <cstdint>
#include <string>

#include "absl/strings/str_cat.h"
#include "checkpoint/checkpoint.h"
#include "daemon/metrics.h"

namespace grps {

namespace {

using Families = std::vector<prometheus::MetricFamily>;

void AddGauge(Families* families, const Labels& labels, const char* name, const char* help,
              double value) {
  families->push_back(GaugeFamily(name, help));
  AddValue(families->back(), labels, value);
}

void AddCounter(Families* families, const Labels& labels, const char* name, const char* help,
                uint64_t value) {
  families->push_back(CounterFamily(name, help));
  AddValue(families->back(), labels, static_cast<double>(value));
}

// Versions, updates, and the traffic of pushes and pulls.
void AddTrafficFamilies(const v1::ShardStatus& s, const Labels& labels, Families* families) {
  AddGauge(families, labels, "grps_shard_version",
           "the shard's version: the lowest over its chunks", static_cast<double>(s.version()));
  AddCounter(families, labels, "grps_shard_updates_applied_total",
             "optimizer updates applied, one per chunk", s.updates_applied());
  AddGauge(families, labels, "grps_shard_doorbells",
           "workers whose shared-memory lane doorbell the shard serves", s.doorbells());
  AddCounter(families, labels, "grps_shard_doorbell_pushes_total",
             "push requests taken from lane doorbells instead of gRPC calls (their chunks are "
             "in pushes_total)",
             s.doorbell_pushes());
  AddCounter(families, labels, "grps_shard_pushes_total",
             "chunk gradients pushed: a push counts once per chunk or table of the shard it "
             "carries",
             s.pushes());
  AddCounter(families, labels, "grps_shard_pulls_total",
             "chunks read by pulls: a pull counts once per chunk or table of the shard it reads",
             s.pulls());
  AddCounter(families, labels, "grps_shard_duplicate_pushes_total",
             "chunk gradients of retried pushes answered from the record, not applied again",
             s.duplicate_pushes());
  AddCounter(families, labels, "grps_shard_rejected_pushes_total",
             "chunk gradients refused (invalid, or staler than max_staleness)",
             s.rejected_pushes());
  AddCounter(families, labels, "grps_shard_received_bytes_total",
             "gradient payload bytes received in pushes", s.bytes_in());
  AddCounter(families, labels, "grps_shard_sent_bytes_total",
             "weight payload bytes sent in pulls", s.bytes_out());
}

// What the consistency mode made of the gradients and pulls.
void AddConsistencyFamilies(const v1::ShardStatus& s, const Labels& labels, Families* families) {
  AddCounter(families, labels, "grps_shard_late_gradients_total",
             "sync: chunk gradients that arrived after their step completed", s.late_gradients());
  AddCounter(families, labels, "grps_shard_late_folded_total",
             "sync: late gradients folded into the next step", s.late_folded());
  AddCounter(families, labels, "grps_shard_late_dropped_total", "sync: late gradients dropped",
             s.late_dropped());
  AddCounter(families, labels, "grps_shard_too_stale_total",
             "async and ssp: chunk gradients refused as staler than max_staleness",
             s.too_stale());
  AddGauge(families, labels, "grps_shard_waiting_pulls",
           "pulls waiting for the consistency mode to release them",
           static_cast<double>(s.waiting_pulls()));
  AddGauge(families, labels, "grps_shard_held_gradients",
           "ssp: gradients accepted and held until the slowest worker reads their clock",
           static_cast<double>(s.held_gradients()));
  families->push_back(HistogramFamily(
      "grps_shard_staleness",
      "staleness of applied updates: the chunk's version at apply minus the version the "
      "gradient was computed on"));
  const std::vector<uint64_t> counts(s.staleness_histogram().begin(),
                                     s.staleness_histogram().end());
  uint64_t applied = 0;
  for (uint64_t c : counts) applied += c;
  AddCountsHistogram(families->back(), labels, counts,
                     s.staleness_mean() * static_cast<double>(applied));
}

// Sparse tables: one series per table, labelled shard and table (no family
// when the job has none).
void AddTableFamilies(const v1::ShardStatus& s, const Labels& labels, Families* families) {
  if (s.tables_size() == 0) return;
  auto per_table = [&](prometheus::MetricFamily family, auto value) {
    for (const v1::SparseTableStatus& t : s.tables()) {
      Labels with_table = labels;
      with_table.push_back({"table", t.name()});
      AddValue(family, with_table, static_cast<double>(value(t)));
    }
    families->push_back(std::move(family));
  };
  using T = v1::SparseTableStatus;
  per_table(GaugeFamily("grps_table_rows", "rows of the sparse table created on this shard"),
            [](const T& t) { return t.rows(); });
  per_table(GaugeFamily("grps_table_bytes",
                        "memory of those rows: values, optimizer state and index"),
            [](const T& t) { return t.bytes(); });
  per_table(GaugeFamily("grps_table_version", "updates applied to the table on this shard"),
            [](const T& t) { return t.version(); });
  per_table(CounterFamily("grps_table_rows_pushed_total",
                          "row gradients received (one per id per push)"),
            [](const T& t) { return t.rows_pushed(); });
  per_table(CounterFamily("grps_table_rows_pulled_total", "rows served by pulls"),
            [](const T& t) { return t.rows_pulled(); });
  per_table(GaugeFamily("grps_table_hottest_share",
                        "share of the row traffic that went to the hottest 1% of rows"),
            [](const T& t) { return t.hottest_share(); });
  per_table(CounterFamily("grps_table_rows_evicted_total",
                          "rows that left a managed table (past its capacity, or idle)"),
            [](const T& t) { return t.rows_evicted(); });
  per_table(CounterFamily("grps_table_rows_admitted_total",
                          "rows a managed table created at their admit_after-th update"),
            [](const T& t) { return t.rows_admitted(); });
  per_table(CounterFamily("grps_table_rows_dropped_total",
                          "row gradients a managed table dropped before admission"),
            [](const T& t) { return t.rows_dropped(); });
  per_table(GaugeFamily("grps_table_pending_ids", "ids counted towards admission"),
            [](const T& t) { return t.pending(); });
}

}  // namespace

std::vector<prometheus::MetricFamily> ShardMetricFamilies(const v1::ShardStatus& s) {
  const Labels labels = {{"shard", absl::StrCat(s.shard())}};
  Families families;
  AddTrafficFamilies(s, labels, &families);
  AddConsistencyFamilies(s, labels, &families);
  AddGauge(&families, labels, "grps_shard_checkpoint_bytes",
           "size of the shard's file of its newest checkpoint (with its parts)",
           static_cast<double>(ShardFileBytes(s.checkpoint())));
  AddTableFamilies(s, labels, &families);
  return families;
}

}  // namespace grps
