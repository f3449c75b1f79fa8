// A shard's Prometheus metrics, from the ShardStatus it keeps for `grpsctl
// status` (daemon/metrics.h): built when Prometheus scrapes, so pushes and
// pulls pay nothing for them. Every family has the label shard="<index>".
//
//   grps_shard_version                    min chunk version (gauge)
//   grps_shard_updates_applied_total      optimizer updates (per chunk)
//   grps_shard_pushes_total, grps_shard_pulls_total
//   grps_shard_doorbells                  workers whose lane doorbell it
//                                         serves (gauge)
//   grps_shard_doorbell_pushes_total      pushes rung at doorbells
//   grps_shard_duplicate_pushes_total     retries answered from the record
//   grps_shard_rejected_pushes_total      refused gradients (too stale included)
//   grps_shard_received_bytes_total       gradient payload bytes in pushes
//   grps_shard_sent_bytes_total           weight payload bytes in pulls
//   grps_shard_late_gradients_total       sync: after their step completed
//   grps_shard_late_folded_total, grps_shard_late_dropped_total
//   grps_shard_too_stale_total            async/ssp: staler than max_staleness
//   grps_shard_waiting_pulls              pulls waiting right now (gauge)
//   grps_shard_held_gradients             ssp: held for slower workers (gauge)
//   grps_shard_staleness                  staleness of applied updates, in
//                                         versions (histogram, le = 0, 1, ...)
//   grps_shard_checkpoint_bytes           the shard's file of its newest
//                                         checkpoint (gauge)
//
// Per sparse table, labelled shard and table:
//   grps_table_rows, grps_table_bytes     rows created here and their memory
//   grps_table_version                    updates applied (gauge)
//   grps_table_rows_pushed_total, grps_table_rows_pulled_total
//   grps_table_hottest_share              the hottest 1% of rows' share of
//                                         the row traffic (gauge)
#ifndef GRPS_SERVER_SHARD_METRICS_H_
#define GRPS_SERVER_SHARD_METRICS_H_

#include <vector>

#include "prometheus/metric_family.h"
#include "proto/grps.pb.h"

namespace grps {

std::vector<prometheus::MetricFamily> ShardMetricFamilies(const v1::ShardStatus& status);

}  // namespace grps

#endif  // GRPS_SERVER_SHARD_METRICS_H_
