#include "server/shard_metrics.h"

#include <map>
#include <string>

#include "gtest/gtest.h"

namespace grps {
namespace {

// The families by name.
std::map<std::string, prometheus::MetricFamily> ByName(const v1::ShardStatus& status) {
  std::map<std::string, prometheus::MetricFamily> families;
  for (prometheus::MetricFamily& f : ShardMetricFamilies(status)) families[f.name] = f;
  return families;
}

TEST(ShardMetrics, CountersAreTheShardStatusFiguresLabelledWithTheShard) {
  v1::ShardStatus status;
  status.set_shard(3);
  status.set_version(17);
  status.set_updates_applied(40);
  status.set_rejected_pushes(2);
  status.set_bytes_in(1000);
  status.set_bytes_out(2000);
  status.set_late_gradients(5);
  auto families = ByName(status);
  const prometheus::ClientMetric& applied =
      families.at("grps_shard_updates_applied_total").metric.at(0);
  ASSERT_EQ(applied.label.size(), 1u);
  EXPECT_EQ(applied.label[0].name, "shard");
  EXPECT_EQ(applied.label[0].value, "3");
  EXPECT_EQ(applied.counter.value, 40);
  EXPECT_EQ(families.at("grps_shard_version").metric.at(0).gauge.value, 17);
  EXPECT_EQ(families.at("grps_shard_rejected_pushes_total").metric.at(0).counter.value, 2);
  EXPECT_EQ(families.at("grps_shard_received_bytes_total").metric.at(0).counter.value, 1000);
  EXPECT_EQ(families.at("grps_shard_sent_bytes_total").metric.at(0).counter.value, 2000);
  EXPECT_EQ(families.at("grps_shard_late_gradients_total").metric.at(0).counter.value, 5);
}

TEST(ShardMetrics, EachSparseTableHasItsSeriesLabelledWithShardAndTable) {
  v1::ShardStatus status;
  status.set_shard(1);
  EXPECT_EQ(ByName(status).count("grps_table_rows"), 0u);  // no tables, no families
  for (const char* name : {"embedding", "users"}) {
    v1::SparseTableStatus* t = status.add_tables();
    t->set_name(name);
    t->set_rows(name[0] == 'e' ? 700 : 30);
    t->set_bytes(119000);
    t->set_rows_pushed(5000);
    t->set_rows_pulled(9000);
    t->set_hottest_share(0.25);
    t->set_rows_evicted(11);
    t->set_rows_admitted(12);
    t->set_rows_dropped(13);
    t->set_pending(14);
  }
  auto families = ByName(status);
  const prometheus::MetricFamily& rows = families.at("grps_table_rows");
  ASSERT_EQ(rows.metric.size(), 2u);
  ASSERT_EQ(rows.metric[0].label.size(), 2u);
  EXPECT_EQ(rows.metric[0].label[0].value, "1");
  EXPECT_EQ(rows.metric[0].label[1].name, "table");
  EXPECT_EQ(rows.metric[0].label[1].value, "embedding");
  EXPECT_EQ(rows.metric[0].gauge.value, 700);
  EXPECT_EQ(rows.metric[1].label[1].value, "users");
  EXPECT_EQ(rows.metric[1].gauge.value, 30);
  EXPECT_EQ(families.at("grps_table_rows_pulled_total").metric.at(0).counter.value, 9000);
  EXPECT_EQ(families.at("grps_table_hottest_share").metric.at(1).gauge.value, 0.25);
  EXPECT_EQ(families.at("grps_table_bytes").metric.at(0).gauge.value, 119000);
  // A managed table's (docs/sparse.md).
  EXPECT_EQ(families.at("grps_table_rows_evicted_total").metric.at(1).counter.value, 11);
  EXPECT_EQ(families.at("grps_table_rows_admitted_total").metric.at(1).counter.value, 12);
  EXPECT_EQ(families.at("grps_table_rows_dropped_total").metric.at(1).counter.value, 13);
  EXPECT_EQ(families.at("grps_table_pending_ids").metric.at(1).gauge.value, 14);
}

TEST(ShardMetrics, TheStalenessHistogramHasTheShardsCountsAndTheirSum) {
  v1::ShardStatus status;
  // 5 updates of staleness 0, 3 of 1, 2 of 2 or more; mean 0.9 (sum 9).
  for (uint64_t c : {5, 3, 2}) status.add_staleness_histogram(c);
  status.set_staleness_mean(0.9);
  const auto families = ByName(status);
  const prometheus::ClientMetric::Histogram& h =
      families.at("grps_shard_staleness").metric.at(0).histogram;
  EXPECT_EQ(h.sample_count, 10u);
  EXPECT_DOUBLE_EQ(h.sample_sum, 9.0);
  ASSERT_EQ(h.bucket.size(), 3u);
  EXPECT_EQ(h.bucket[0].cumulative_count, 5u);  // le 0
  EXPECT_EQ(h.bucket[1].cumulative_count, 8u);  // le 1
  EXPECT_EQ(h.bucket[2].cumulative_count, 10u); // +Inf
}

}  // namespace
}  // namespace grps
