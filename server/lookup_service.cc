#include "server/lookup_service.h"

#include <string>

#include "daemon/daemon.h"
#include "daemon/metrics.h"
#include "daemon/security.h"

namespace grps {

grpc::Status LookupService::Lookup(grpc::ServerContext* context, const v1::LookupRequest* request,
                                   v1::LookupResponse* response) {
  if (grpc::Status s = RequireRole(*context, Role::kWorker); !s.ok()) return s;
  return ToGrpc(rows_.Lookup(*request, response));
}

grpc::Status LookupService::LookupStatus(grpc::ServerContext* context,
                                         const v1::LookupStatusRequest* /*request*/,
                                         v1::LookupStatusResponse* response) {
  if (grpc::Status s = RequireRole(*context, Role::kWorker); !s.ok()) return s;
  *response = rows_.Status();
  return grpc::Status::OK;
}

std::vector<prometheus::MetricFamily> LookupMetricFamilies(const ServedRows& rows, absl::Time now) {
  const v1::LookupStatusResponse status = rows.Status();
  const ServedRows::Counts counts = rows.counts();
  std::vector<prometheus::MetricFamily> families;
  auto gauge = [&](const char* name, const char* help, double value) {
    families.push_back(GaugeFamily(name, help));
    AddValue(families.back(), {}, value);
  };
  auto counter = [&](const char* name, const char* help, double value) {
    families.push_back(CounterFamily(name, help));
    AddValue(families.back(), {}, value);
  };
  gauge("grps_lookup_checkpoint_id", "The checkpoint served (0: none yet)",
        static_cast<double>(status.checkpoint_id()));
  gauge("grps_lookup_step", "The step of the checkpoint served",
        static_cast<double>(status.step()));
  if (status.checkpoint_id() != 0)
    gauge("grps_lookup_checkpoint_age_seconds",
          "Seconds since the checkpoint served was asked for (how old its rows may be)",
          absl::ToDoubleSeconds(
              now - absl::FromUnixMillis(static_cast<int64_t>(status.asked_unix_time_ms()))));
  families.push_back(GaugeFamily("grps_lookup_rows", "Rows served, by table"));
  for (const v1::ServedTable& table : status.tables())
    AddValue(families.back(), {{"table", table.name()}}, static_cast<double>(table.rows()));
  counter("grps_lookup_checkpoints_served_total", "Checkpoints served since the start",
          static_cast<double>(status.checkpoints_served()));
  families.push_back(CounterFamily("grps_lookup_shard_reads_total",
                                   "Shard files served, by how: increments applied on top of "
                                   "the rows served, or shard states read whole"));
  AddValue(families.back(), {{"how", "increment"}},
           static_cast<double>(status.increments_applied()));
  AddValue(families.back(), {{"how", "whole"}}, static_cast<double>(status.full_reads()));
  counter("grps_lookup_lookups_total", "Lookups answered", static_cast<double>(counts.lookups));
  counter("grps_lookup_ids_total", "Ids looked up", static_cast<double>(counts.ids));
  counter("grps_lookup_missing_ids_total",
          "Ids looked up that the table had no row for (answered with zeros)",
          static_cast<double>(counts.missing));
  return families;
}

}  // namespace grps
