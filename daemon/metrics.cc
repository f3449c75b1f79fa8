#include "daemon/metrics.h"

#include <poll.h>
#include <sys/socket.h>
#include <sys/time.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <iterator>
#include <limits>
#include <sstream>
#include <thread>
#include <utility>

#include "absl/flags/flag.h"
#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "boost/asio/ip/tcp.hpp"
#include "boost/beast/http.hpp"
#include "grpcpp/support/interceptor.h"
#include "prometheus/counter.h"
#include "prometheus/family.h"
#include "prometheus/histogram.h"
#include "prometheus/text_serializer.h"
#include "spdlog/spdlog.h"

ABSL_FLAG(std::string, metrics_listen, "",
          "serve Prometheus metrics at http://<host:port>/metrics (port 0 picks one); "
          "empty: no metrics endpoint");

namespace grps {

namespace http = boost::beast::http;
using tcp = boost::asio::ip::tcp;

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

// "host:port" with a port in [0, 65535] and a host without list separators
// or whitespace.
absl::Status CheckAddress(const std::string& address) {
  const size_t colon = address.rfind(':');
  uint32_t port = 0;
  if (colon == std::string::npos || colon == 0 ||
      !absl::SimpleAtoi(absl::string_view(address).substr(colon + 1), &port) ||
      port > 65535 || address.find_first_of(", \t\n") != std::string::npos ||
      !absl::ascii_isdigit(static_cast<unsigned char>(address.back())))
    return absl::InvalidArgumentError(
        absl::StrCat("metrics address '", address, "' is not host:port"));
  // "::1:0" would be served, and printed as the URL http://::1:0/metrics.
  const std::string host = address.substr(0, colon);
  if (host.find(':') != std::string::npos && !(host.front() == '[' && host.back() == ']'))
    return absl::InvalidArgumentError(absl::StrCat("metrics address '", address,
                                                   "': an IPv6 host goes in brackets ([", host,
                                                   "]:", address.substr(colon + 1), ")"));
  return absl::OkStatus();
}

// An HTTP exchange of the metrics endpoint: one request (its line and
// headers at most kRequestLimit bytes, no body), one reply, then the
// connection closes. A client silent for kIoTimeout is dropped.
constexpr size_t kRequestLimit = 8192;
constexpr absl::Duration kIoTimeout = absl::Seconds(2);
constexpr absl::Duration kPoll = absl::Milliseconds(100);

void SetIoTimeouts(tcp::socket& socket) {
  const timeval tv = absl::ToTimeval(kIoTimeout);
  setsockopt(socket.native_handle(), SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  setsockopt(socket.native_handle(), SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
}

// Reads one request into `parser` (kRequestLimit bytes at most). The
// socket's own timeouts bound each wait: Asio's synchronous reads would
// wait forever on a silent client.
boost::system::error_code ReadRequest(int fd, http::request_parser<http::empty_body>& parser) {
  std::string pending;
  char chunk[2048];
  while (!parser.is_done()) {
    if (!pending.empty()) {
      boost::system::error_code ec;
      const size_t used = parser.put(boost::asio::buffer(pending), ec);
      pending.erase(0, used);
      if (ec && ec != http::error::need_more) return ec;
      if (parser.is_done()) break;
      if (!ec && used > 0) continue;  // more of what arrived to parse
    }
    const ssize_t n = ::recv(fd, chunk, sizeof(chunk), 0);
    if (n <= 0)  // closed, silent past the timeout, or reset
      return pending.empty() ? http::error::end_of_stream : http::error::partial_message;
    pending.append(chunk, static_cast<size_t>(n));
    if (pending.size() > kRequestLimit) return http::error::header_limit;
  }
  return {};
}

void Answer(const MetricsEndpoint& owner, tcp::socket& socket) {
  boost::system::error_code ec;
  socket.non_blocking(false, ec);
  SetIoTimeouts(socket);
  const int fd = socket.native_handle();
  http::request_parser<http::empty_body> parser;
  parser.header_limit(kRequestLimit);
  ec = ReadRequest(fd, parser);
  http::response<http::string_body> reply;
  reply.version(11);
  reply.keep_alive(false);
  reply.set(http::field::content_type, "text/plain; charset=utf-8");
  if (ec) {
    // A client that left or stayed silent gets nothing; one that sent what
    // is not an HTTP request without a body, or too much of it, gets 400.
    if (ec == http::error::end_of_stream || ec == http::error::partial_message) return;
    reply.result(http::status::bad_request);
    reply.body() = absl::StrCat("bad request: ", ec.message(), "\n");
  } else {
    const http::request<http::empty_body>& request = parser.get();
    const absl::string_view target(request.target().data(), request.target().size());
    const absl::string_view path = target.substr(0, target.find('?'));
    if (request.method() != http::verb::get) {
      reply.result(http::status::method_not_allowed);
      reply.set(http::field::allow, "GET");
      reply.body() = "method not allowed: GET /metrics\n";
    } else if (path != "/metrics") {
      reply.result(http::status::not_found);
      reply.body() = "not found: the metrics are at /metrics\n";
    } else {
      reply.result(http::status::ok);
      reply.set(http::field::content_type, "text/plain; version=0.0.4; charset=utf-8");
      reply.body() = owner.Scrape();
    }
  }
  reply.prepare_payload();
  std::ostringstream out;
  out << reply;
  const std::string bytes = out.str();
  for (size_t sent = 0; sent < bytes.size();) {
    const ssize_t n = ::send(fd, bytes.data() + sent, bytes.size() - sent, MSG_NOSIGNAL);
    if (n <= 0) return;  // gone, or not reading past the timeout
    sent += static_cast<size_t>(n);
  }
  ::shutdown(fd, SHUT_WR);
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

// The endpoint's HTTP server: a listening socket, polled by a thread of its
// own (with the default stack), which answers one connection at a time.
struct MetricsEndpoint::Server {
  boost::asio::io_context io;
  tcp::acceptor acceptor{io};
  std::atomic<bool> stopping{false};
  int port = 0;  // set before the thread starts
  std::thread thread;

  // Accepts and answers until `stopping`, looking at it every kPoll.
  void Run(const MetricsEndpoint& owner) {
    while (!stopping.load()) {
      pollfd listening{acceptor.native_handle(), POLLIN, 0};
      if (::poll(&listening, 1, static_cast<int>(absl::ToInt64Milliseconds(kPoll))) <= 0)
        continue;
      tcp::socket socket(io);
      boost::system::error_code ec;
      acceptor.accept(socket, ec);  // non-blocking: a connection gone already is skipped
      if (!ec) Answer(owner, socket);
    }
  }
};

absl::StatusOr<std::unique_ptr<MetricsEndpoint>> MetricsEndpoint::Start(
    const std::string& address,
    std::vector<std::shared_ptr<prometheus::Collectable>> collectables) {
  if (absl::Status s = CheckAddress(address); !s.ok()) return s;
  const size_t colon = address.rfind(':');
  std::string host = address.substr(0, colon);
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']')
    host = host.substr(1, host.size() - 2);
  auto server = std::make_unique<Server>();
  boost::system::error_code ec;
  tcp::resolver resolver(server->io);
  const tcp::resolver::results_type found =
      resolver.resolve(host, address.substr(colon + 1),
                       tcp::resolver::passive | tcp::resolver::numeric_service, ec);
  if (!ec && found.empty()) ec = boost::asio::error::host_not_found;
  if (!ec) {
    const tcp::endpoint at = found.begin()->endpoint();
    server->acceptor.open(at.protocol(), ec);
    if (!ec) server->acceptor.set_option(tcp::acceptor::reuse_address(true), ec);
    if (!ec) server->acceptor.bind(at, ec);
    if (!ec) server->acceptor.listen(16, ec);
    if (!ec) server->acceptor.non_blocking(true, ec);
    if (!ec) server->port = server->acceptor.local_endpoint(ec).port();
  }
  if (ec)
    return absl::UnavailableError(
        absl::StrCat("cannot serve metrics on ", address, ": ", ec.message()));
  std::unique_ptr<MetricsEndpoint> endpoint(
      new MetricsEndpoint(std::move(server), std::move(collectables)));
  MetricsEndpoint* self = endpoint.get();
  self->server_->thread = std::thread([self] { self->server_->Run(*self); });
  return endpoint;
}

MetricsEndpoint::MetricsEndpoint(std::unique_ptr<Server> server,
                                 std::vector<std::shared_ptr<prometheus::Collectable>> collectables)
    : collectables_(std::move(collectables)), server_(std::move(server)) {}

MetricsEndpoint::~MetricsEndpoint() {
  server_->stopping.store(true);
  if (server_->thread.joinable()) server_->thread.join();
}

int MetricsEndpoint::port() const { return server_->port; }

std::string MetricsEndpoint::Scrape() const {
  std::vector<prometheus::MetricFamily> families = ProcessMetrics()->Collect();
  for (const auto& c : collectables_) {
    std::vector<prometheus::MetricFamily> more = c->Collect();
    families.insert(families.end(), std::make_move_iterator(more.begin()),
                    std::make_move_iterator(more.end()));
  }
  return prometheus::TextSerializer().Serialize(families);
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
