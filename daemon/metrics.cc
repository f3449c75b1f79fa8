#include "daemon/metrics.h"

#include <chrono>
#include <cstdint>
#include <exception>
#include <limits>
#include <utility>

#include "absl/flags/flag.h"
#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "grpcpp/support/interceptor.h"
#include "prometheus/counter.h"
#include "prometheus/family.h"
#include "prometheus/histogram.h"
#include "spdlog/spdlog.h"

ABSL_FLAG(std::string, metrics_listen, "",
          "serve Prometheus metrics at http://<host:port>/metrics (port 0 picks one); "
          "empty: no metrics endpoint");

namespace grps {

std::shared_ptr<prometheus::Registry> ProcessMetrics() {
  static const auto* const registry =
      new std::shared_ptr<prometheus::Registry>(std::make_shared<prometheus::Registry>());
  return *registry;
}

const std::vector<double>& DurationBuckets() {
  static const auto* const buckets = new std::vector<double>{
      0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1, 2, 5, 10, 30, 60, 300};
  return *buckets;
}

namespace {

// The interceptor's families, registered once per process.
struct RpcFamilies {
  prometheus::Family<prometheus::Counter>& handled;
  prometheus::Family<prometheus::Histogram>& seconds;
  prometheus::Family<prometheus::Counter>& sent_bytes;

  static RpcFamilies& Get() {
    static RpcFamilies* const families = [] {
      prometheus::Registry& registry = *ProcessMetrics();
      return new RpcFamilies{
          prometheus::BuildCounter()
              .Name("grps_rpc_server_handled_total")
              .Help("gRPC calls this process's servers finished, by method and status code")
              .Register(registry),
          prometheus::BuildHistogram()
              .Name("grps_rpc_server_handling_seconds")
              .Help("time from a gRPC call's start to its status, by method")
              .Register(registry),
          prometheus::BuildCounter()
              .Name("grps_rpc_server_sent_bytes_total")
              .Help("serialized reply bytes this process's servers sent, by method")
              .Register(registry),
      };
    }();
    return *families;
  }
};

// gRPC's codes are Abseil's, number for number (refusal_log.cc names them
// the same way); a number outside them is kept as the number.
std::string CodeName(grpc::StatusCode code) {
  std::string name = absl::StatusCodeToString(static_cast<absl::StatusCode>(code));
  return name.empty() ? absl::StrCat(static_cast<int>(code)) : name;
}

// One per call; gRPC creates it when the call starts.
class RpcMetricsInterceptor : public grpc::experimental::Interceptor {
 public:
  explicit RpcMetricsInterceptor(grpc::experimental::ServerRpcInfo* info)
      : method_(info->method() != nullptr ? info->method() : "?"),
        start_(std::chrono::steady_clock::now()) {}

  void Intercept(grpc::experimental::InterceptorBatchMethods* methods) override {
    using grpc::experimental::InterceptionHookPoints;
    if (methods->QueryInterceptionHookPoint(InterceptionHookPoints::PRE_SEND_MESSAGE)) {
      // The reply as it goes on the wire (serialized here if it is not
      // already; gRPC then sends this serialization).
      if (grpc::ByteBuffer* bytes = methods->GetSerializedSendMessage(); bytes != nullptr)
        sent_bytes_ += bytes->Length();
    }
    if (methods->QueryInterceptionHookPoint(InterceptionHookPoints::PRE_SEND_STATUS)) {
      const std::chrono::duration<double> elapsed = std::chrono::steady_clock::now() - start_;
      RpcFamilies& f = RpcFamilies::Get();
      f.handled.Add({{"method", method_}, {"code", CodeName(methods->GetSendStatus().error_code())}})
          .Increment();
      f.seconds.Add({{"method", method_}}, DurationBuckets()).Observe(elapsed.count());
      if (sent_bytes_ > 0)
        f.sent_bytes.Add({{"method", method_}}).Increment(static_cast<double>(sent_bytes_));
    }
    methods->Proceed();
  }

 private:
  // gRPC's method names are the services' own ("/grps.v1.ParameterServer/
  // Push"), never a caller's string: an unknown method is not served.
  const std::string method_;
  const std::chrono::steady_clock::time_point start_;
  uint64_t sent_bytes_ = 0;
};

class RpcMetricsInterceptorFactory
    : public grpc::experimental::ServerInterceptorFactoryInterface {
 public:
  grpc::experimental::Interceptor* CreateServerInterceptor(
      grpc::experimental::ServerRpcInfo* info) override {
    return new RpcMetricsInterceptor(info);
  }
};

prometheus::MetricFamily Family(std::string name, std::string help,
                                prometheus::MetricType type) {
  prometheus::MetricFamily family;
  family.name = std::move(name);
  family.help = std::move(help);
  family.type = type;
  return family;
}

prometheus::ClientMetric Metric(const Labels& labels) {
  prometheus::ClientMetric metric;
  for (const auto& [name, value] : labels) metric.label.push_back({name, value});
  return metric;
}

// "host:port" with a port in [0, 65535] and a host without the characters
// civetweb would read as a list of ports or as options (",", "s", "r" after
// the port; whitespace).
absl::Status CheckAddress(const std::string& address) {
  const size_t colon = address.rfind(':');
  uint32_t port = 0;
  if (colon == std::string::npos || colon == 0 ||
      !absl::SimpleAtoi(absl::string_view(address).substr(colon + 1), &port) ||
      port > 65535 || address.find_first_of(", \t\n") != std::string::npos ||
      !absl::ascii_isdigit(static_cast<unsigned char>(address.back())))
    return absl::InvalidArgumentError(
        absl::StrCat("metrics address '", address, "' is not host:port"));
  return absl::OkStatus();
}

}  // namespace

std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>
MakeRpcMetricsInterceptorFactory() {
  RpcFamilies::Get();  // registered before the first scrape, even with no call yet
  return std::make_unique<RpcMetricsInterceptorFactory>();
}

prometheus::MetricFamily CounterFamily(std::string name, std::string help) {
  return Family(std::move(name), std::move(help), prometheus::MetricType::Counter);
}

prometheus::MetricFamily GaugeFamily(std::string name, std::string help) {
  return Family(std::move(name), std::move(help), prometheus::MetricType::Gauge);
}

prometheus::MetricFamily HistogramFamily(std::string name, std::string help) {
  return Family(std::move(name), std::move(help), prometheus::MetricType::Histogram);
}

void AddValue(prometheus::MetricFamily& family, const Labels& labels, double value) {
  prometheus::ClientMetric metric = Metric(labels);
  if (family.type == prometheus::MetricType::Counter)
    metric.counter.value = value;
  else
    metric.gauge.value = value;
  family.metric.push_back(std::move(metric));
}

void AddCountsHistogram(prometheus::MetricFamily& family, const Labels& labels,
                        const std::vector<uint64_t>& counts, double sum) {
  prometheus::ClientMetric metric = Metric(labels);
  uint64_t cumulative = 0;
  for (size_t i = 0; i < counts.size(); ++i) {
    cumulative += counts[i];
    // The last count is "at or above its index": it only fills +Inf.
    if (i + 1 < counts.size())
      metric.histogram.bucket.push_back({cumulative, static_cast<double>(i)});
  }
  metric.histogram.bucket.push_back({cumulative, std::numeric_limits<double>::infinity()});
  metric.histogram.sample_count = cumulative;
  metric.histogram.sample_sum = sum;
  family.metric.push_back(std::move(metric));
}

absl::StatusOr<std::unique_ptr<MetricsEndpoint>> MetricsEndpoint::Start(
    const std::string& address,
    std::vector<std::shared_ptr<prometheus::Collectable>> collectables) {
  if (absl::Status s = CheckAddress(address); !s.ok()) return s;
  std::unique_ptr<prometheus::Exposer> exposer;
  try {
    // Two HTTP threads: one scrape at a time is the usual load.
    exposer = std::make_unique<prometheus::Exposer>(address, /*num_threads=*/2);
  } catch (const std::exception& e) {
    return absl::UnavailableError(
        absl::StrCat("cannot serve metrics on ", address, ": ", e.what()));
  }
  const std::vector<int> ports = exposer->GetListeningPorts();
  if (ports.empty())
    return absl::UnavailableError(absl::StrCat("cannot serve metrics on ", address));
  exposer->RegisterCollectable(ProcessMetrics());
  for (const auto& c : collectables) exposer->RegisterCollectable(c);
  return std::unique_ptr<MetricsEndpoint>(
      new MetricsEndpoint(std::move(exposer), std::move(collectables), ports.front()));
}

absl::StatusOr<std::unique_ptr<MetricsEndpoint>> StartMetricsFromFlags(
    absl::string_view process_name,
    std::vector<std::shared_ptr<prometheus::Collectable>> collectables) {
  const std::string address = absl::GetFlag(FLAGS_metrics_listen);
  if (address.empty()) return std::unique_ptr<MetricsEndpoint>();
  absl::StatusOr<std::unique_ptr<MetricsEndpoint>> endpoint =
      MetricsEndpoint::Start(address, std::move(collectables));
  if (endpoint.ok())
    spdlog::info("{} serves Prometheus metrics at http://{}/metrics (port {})",
                 std::string(process_name),
                 address, (*endpoint)->port());
  return endpoint;
}

}  // namespace grps
