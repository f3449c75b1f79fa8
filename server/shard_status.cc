#include "server/shard_status.h"

#include <algorithm>
#include <limits>

#include "absl/synchronization/mutex.h"
#include "server/store_targets.h"

namespace grps {
namespace {

void AddCounters(const TargetCounters& total, v1::ShardStatus* s) {
  s->set_bytes_in(total.bytes_in);
  s->set_bytes_out(total.bytes_out);
  s->set_updates_applied(total.updates);
  s->set_pushes(total.pushes);
  s->set_pulls(total.pulls);
  s->set_duplicate_pushes(total.duplicates);
  s->set_staleness_mean(total.staleness_count == 0
                            ? 0.0
                            : static_cast<double>(total.staleness_sum) /
                                  static_cast<double>(total.staleness_count));
  s->set_staleness_max(total.staleness_max);
  for (int i = 0; i < kStalenessBuckets; ++i)
    s->add_staleness_histogram(total.staleness_histogram[i]);
  s->set_late_gradients(total.late_folded + total.late_dropped);
  s->set_late_folded(total.late_folded);
  s->set_late_dropped(total.late_dropped);
  s->set_too_stale(total.too_stale);
  for (uint64_t n : total.late_by_worker) s->add_late_by_worker(n);
}

void AddTableStatus(StoreTable& t, v1::ShardStatus* s) ABSL_EXCLUSIVE_LOCKS_REQUIRED(t.mu) {
  v1::SparseTableStatus* ts = s->add_tables();
  ts->set_name(t.spec.name());
  ts->set_dim(t.spec.dim());
  ts->set_version(t.version());
  ts->set_rows(t.rows->size());
  ts->set_bytes(t.rows->bytes());
  ts->set_bytes_per_row(t.rows->size() == 0 ? 0.0
                                           : static_cast<double>(t.rows->bytes()) /
                                                 static_cast<double>(t.rows->size()));
  ts->set_rows_pushed(t.rows_pushed);
  ts->set_rows_pulled(t.rows_pulled);
  ts->set_hottest_share(t.rows->hottest_share());
  ts->set_max_rows_per_shard(t.spec.max_rows_per_shard());
  const SparseRows::Managed& managed = t.rows->managed_counts();
  ts->set_rows_evicted(managed.evicted);
  ts->set_rows_admitted(managed.admitted);
  ts->set_rows_dropped(managed.dropped);
  ts->set_pending(t.rows->pending());
}

}  // namespace

void TargetCounters::CountStaleness(uint64_t staleness) {
  ++staleness_count;
  staleness_sum += staleness;
  staleness_max = std::max(staleness_max, staleness);
  ++staleness_histogram[std::min<uint64_t>(staleness, kStalenessBuckets - 1)];
}

void TargetCounters::Add(const TargetCounters& o) {
  pushes += o.pushes;
  duplicates += o.duplicates;
  updates += o.updates;
  pulls += o.pulls;
  bytes_in += o.bytes_in;
  bytes_out += o.bytes_out;
  late_folded += o.late_folded;
  late_dropped += o.late_dropped;
  too_stale += o.too_stale;
  staleness_count += o.staleness_count;
  staleness_sum += o.staleness_sum;
  staleness_max = std::max(staleness_max, o.staleness_max);
  for (int i = 0; i < kStalenessBuckets; ++i) staleness_histogram[i] += o.staleness_histogram[i];
  if (late_by_worker.size() < o.late_by_worker.size())
    late_by_worker.resize(o.late_by_worker.size(), 0);
  for (size_t r = 0; r < o.late_by_worker.size(); ++r) late_by_worker[r] += o.late_by_worker[r];
}

void TargetCounters::SaveState(v1::StateCounters* out) const {
  out->set_pushes(pushes);
  out->set_duplicates(duplicates);
  out->set_updates(updates);
  out->set_late_folded(late_folded);
  out->set_late_dropped(late_dropped);
  out->set_too_stale(too_stale);
  out->set_staleness_count(staleness_count);
  out->set_staleness_sum(staleness_sum);
  out->set_staleness_max(staleness_max);
  for (uint64_t n : staleness_histogram) out->add_staleness_histogram(n);
  for (uint64_t n : late_by_worker) out->add_late_by_worker(n);
}

void TargetCounters::LoadState(const v1::StateCounters* saved) {
  const v1::StateCounters none;
  const v1::StateCounters& s = saved != nullptr ? *saved : none;
  pushes = s.pushes();
  duplicates = s.duplicates();
  updates = s.updates();
  late_folded = s.late_folded();
  late_dropped = s.late_dropped();
  too_stale = s.too_stale();
  staleness_count = s.staleness_count();
  staleness_sum = s.staleness_sum();
  staleness_max = s.staleness_max();
  for (int i = 0; i < kStalenessBuckets; ++i)
    staleness_histogram[i] = i < s.staleness_histogram_size() ? s.staleness_histogram(i) : 0;
  // A saved histogram of more buckets: the rest are at or above the last.
  for (int i = kStalenessBuckets; i < s.staleness_histogram_size(); ++i)
    staleness_histogram[kStalenessBuckets - 1] += s.staleness_histogram(i);
  for (size_t r = 0; r < late_by_worker.size(); ++r)
    late_by_worker[r] = static_cast<int>(r) < s.late_by_worker_size() ? s.late_by_worker(r) : 0;
}

void AddTargetsStatus(const std::vector<std::unique_ptr<StoreChunk>>& chunks,
                      const std::vector<std::unique_ptr<StoreTable>>& tables,
                      v1::ShardStatus* s) {
  s->set_num_chunks(chunks.size());
  TargetCounters total;
  uint64_t elements = 0;
  uint64_t held = 0;
  uint64_t min_version = std::numeric_limits<uint64_t>::max();
  for (const std::unique_ptr<StoreChunk>& chunk : chunks) {
    StoreChunk& c = *chunk;
    absl::MutexLock lock(&c.mu);
    elements += c.num_elements();
    min_version = std::min(min_version, c.version());
    held += c.policy->held();
    total.Add(c.counters);
  }
  for (const std::unique_ptr<StoreTable>& table : tables) {
    StoreTable& t = *table;
    absl::MutexLock lock(&t.mu);
    held += t.policy->held();
    total.Add(t.counters);
    AddTableStatus(t, s);
  }
  // The chunks' version (each table reports its own).
  s->set_version(chunks.empty() ? 0 : min_version);
  s->set_num_elements(elements);
  AddCounters(total, s);
  s->set_held_gradients(held);
}

}  // namespace grps
