// The lookup service's gRPC edge (proto/lookup.proto): batched, read-only
// lookups of sparse rows from ServedRows (served_rows.h), for inference.
// grps-server --serve runs it (server_main.cc). Each call needs the worker
// role at least (daemon/security.h): a reader of the weights, as workers
// are. Its metrics: LookupMetricFamilies.
//
// Thread safety: as ServedRows; gRPC calls it from its threads.
#ifndef GRPS_SERVER_LOOKUP_SERVICE_H_
#define GRPS_SERVER_LOOKUP_SERVICE_H_

#include <vector>

#include "absl/time/time.h"
#include "grpcpp/grpcpp.h"
#include "prometheus/metric_family.h"
#include "proto/lookup.grpc.pb.h"
#include "server/served_rows.h"

namespace grps {

class LookupService final : public v1::Lookup::Service {
 public:
  explicit LookupService(const ServedRows& rows) : rows_(rows) {}

  grpc::Status Lookup(grpc::ServerContext* context, const v1::LookupRequest* request,
                      v1::LookupResponse* response) override;
  grpc::Status LookupStatus(grpc::ServerContext* context, const v1::LookupStatusRequest* request,
                            v1::LookupStatusResponse* response) override;

 private:
  const ServedRows& rows_;
};

// What a lookup service says to Prometheus: the checkpoint served, its age
// and step, the rows of each table, how checkpoints were read, and the
// lookups, ids and missing ids answered.
std::vector<prometheus::MetricFamily> LookupMetricFamilies(const ServedRows& rows,
                                                           absl::Time now = absl::Now());

}  // namespace grps

#endif  // GRPS_SERVER_LOOKUP_SERVICE_H_
