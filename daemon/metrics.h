// Prometheus metrics (SPEC §6). Every daemon keeps its metrics in the
// process's registry (ProcessMetrics) and serves them, in Prometheus' text
// format, at http://<--metrics_listen>/metrics when that flag is set
// (GRPS_METRICS_LISTEN; off by default).
//
// Two kinds of metrics:
//   - Instruments updated where things happen: every gRPC server's calls
//     (StartGrpcServer installs MakeRpcMetricsInterceptorFactory), a
//     worker's steps, a server's checkpoint writes.
//   - Values a daemon already keeps for `grpsctl status` (a shard's
//     ShardStatus, the coordinator's JobStatus), turned into metric families
//     only when Prometheus scrapes (a CollectFunction): nothing is counted
//     twice and the hot path pays nothing for them.
//
// The endpoint is plain HTTP without authentication, as Prometheus expects:
// it says how the job is doing and nothing a caller could use to change it
// (no tokens, no weights). Bind it where only the scraper reaches it.
//
// It is served by a thread of its own with Boost.Beast, not by
// prometheus-cpp's Exposer: the Exposer's HTTP library (civetweb) runs its
// requests on threads of a fixed 100 KiB stack, of which glibc gives 60 KiB
// to OpenBLAS's thread-local storage in a worker, and any request it
// answered with an error (a wrong path, a malformed request, a scrape that
// came before its handler) overflowed the rest and crashed the daemon.
#ifndef GRPS_DAEMON_METRICS_H_
#define GRPS_DAEMON_METRICS_H_

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/flags/declare.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "grpcpp/support/server_interceptor.h"
#include "prometheus/collectable.h"
#include "prometheus/metric_family.h"
#include "prometheus/registry.h"

ABSL_DECLARE_FLAG(std::string, metrics_listen);

namespace grps {

// The registry every part of this process registers its instruments in.
std::shared_ptr<prometheus::Registry> ProcessMetrics();

// Bucket bounds in seconds for durations from a fraction of a millisecond
// (a loopback RPC, a small step) to minutes (a pull waiting for its clock,
// a checkpoint of a large shard).
const std::vector<double>& DurationBuckets();

// For every call a gRPC server answers, in ProcessMetrics():
//   grps_rpc_server_handled_total{method, code}    calls finished, by status
//   grps_rpc_server_handling_seconds{method}      from the call's start to
//                                                  its status (histogram)
//   grps_rpc_server_sent_bytes_total{method}      serialized reply bytes
std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>
MakeRpcMetricsInterceptorFactory();

// Families computed when Prometheus scrapes, from values the daemon keeps.
class CollectFunction final : public prometheus::Collectable {
 public:
  using Function = std::function<std::vector<prometheus::MetricFamily>()>;
  explicit CollectFunction(Function function) : function_(std::move(function)) {}
  std::vector<prometheus::MetricFamily> Collect() const override { return function_(); }

 private:
  const Function function_;
};

// Builders for a CollectFunction's families. `labels` are name/value pairs.
using Labels = std::vector<std::pair<std::string, std::string>>;
prometheus::MetricFamily CounterFamily(std::string name, std::string help);
prometheus::MetricFamily GaugeFamily(std::string name, std::string help);
prometheus::MetricFamily HistogramFamily(std::string name, std::string help);
void AddValue(prometheus::MetricFamily& family, const Labels& labels, double value);
// A histogram sample from per-value counts: counts[i] observations of the
// value i, except the last, which counts every value at or above its index.
// `sum` is the sum of all observed values.
void AddCountsHistogram(prometheus::MetricFamily& family, const Labels& labels,
                        const std::vector<uint64_t>& counts, double sum);

// Serves ProcessMetrics() and `collectables` at http://<address>/metrics:
// GET or HEAD of /metrics (any query) gets the text format; another path
// 404, another method 405, a malformed or oversized request (a request line
// and headers over 8 KiB, or a body) 400, and a client silent for 2 s is
// dropped. One request per connection, one connection at a time.
class MetricsEndpoint {
 public:
  // `address` is "host:port" (an IPv4 or IPv6 address, or a name that
  // resolves to one); port 0 picks a free one. Fails (with the reason) when
  // the address is malformed or cannot be bound.
  static absl::StatusOr<std::unique_ptr<MetricsEndpoint>> Start(
      const std::string& address,
      std::vector<std::shared_ptr<prometheus::Collectable>> collectables = {});
  ~MetricsEndpoint();  // stops serving (joins its thread)

  MetricsEndpoint(const MetricsEndpoint&) = delete;
  MetricsEndpoint& operator=(const MetricsEndpoint&) = delete;

  int port() const;

  // The text format of every family: ProcessMetrics(), then the collectables.
  std::string Scrape() const;

 private:
  struct Server;
  MetricsEndpoint(std::unique_ptr<Server> server,
                  std::vector<std::shared_ptr<prometheus::Collectable>> collectables);

  const std::vector<std::shared_ptr<prometheus::Collectable>> collectables_;
  std::unique_ptr<Server> server_;  // last: its thread reads the members above
};

// Starts the endpoint on --metrics_listen and logs where it listens; returns
// nullptr when the flag is empty. `process_name` is for the log line.
absl::StatusOr<std::unique_ptr<MetricsEndpoint>> StartMetricsFromFlags(
    absl::string_view process_name,
    std::vector<std::shared_ptr<prometheus::Collectable>> collectables = {});

}  // namespace grps

#endif  // GRPS_DAEMON_METRICS_H_
