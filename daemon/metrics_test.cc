#include "daemon/metrics.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "daemon/daemon.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "prometheus/counter.h"

namespace grps {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

// What 127.0.0.1:<port> replies to `request` (sent whole), until it closes
// the connection; "" when nothing answers.
std::string Exchange(int port, const std::string& request) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return "";
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  std::string reply;
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0) {
    if (write(fd, request.data(), request.size()) == static_cast<ssize_t>(request.size())) {
      char buf[4096];
      for (ssize_t n; (n = read(fd, buf, sizeof(buf))) > 0;) reply.append(buf, n);
    }
  }
  close(fd);
  return reply;
}

// The body of GET http://127.0.0.1:<port><path> (HTTP/1.0).
std::string HttpGet(int port, const std::string& path) {
  const std::string reply = Exchange(port, absl::StrCat("GET ", path, " HTTP/1.0\r\n\r\n"));
  const size_t body = reply.find("\r\n\r\n");
  return body == std::string::npos ? "" : reply.substr(body + 4);
}

// The status line of the reply to `request`.
std::string StatusLine(int port, const std::string& request) {
  const std::string reply = Exchange(port, request);
  return reply.substr(0, reply.find("\r\n"));
}

TEST(MetricsEndpoint, ServesTheProcessRegistryAndItsCollectablesOnAPickedPort) {
  prometheus::BuildCounter()
      .Name("grps_metrics_test_events_total")
      .Help("events of the test")
      .Register(*ProcessMetrics())
      .Add({{"kind", "a"}})
      .Increment(3);
  auto shard = std::make_shared<CollectFunction>([] {
    prometheus::MetricFamily applied = CounterFamily("grps_test_applied_total", "applied");
    AddValue(applied, {{"shard", "1"}}, 42);
    return std::vector<prometheus::MetricFamily>{applied};
  });
  absl::StatusOr<std::unique_ptr<MetricsEndpoint>> endpoint =
      MetricsEndpoint::Start("127.0.0.1:0", {shard});
  ASSERT_TRUE(endpoint.ok()) << endpoint.status();
  ASSERT_GT((*endpoint)->port(), 0);

  const std::string body = HttpGet((*endpoint)->port(), "/metrics");
  EXPECT_THAT(body, HasSubstr("# TYPE grps_metrics_test_events_total counter"));
  EXPECT_THAT(body, HasSubstr("grps_metrics_test_events_total{kind=\"a\"} 3"));
  EXPECT_THAT(body, HasSubstr("grps_test_applied_total{shard=\"1\"} 42"));
  // The endpoint serves /metrics only.
  EXPECT_THAT(HttpGet((*endpoint)->port(), "/"), Not(HasSubstr("grps_test_applied_total")));
}

TEST(MetricsEndpoint, AnswersWhatIsNotAScrapeWithAnErrorAndGoesOnServing) {
  absl::StatusOr<std::unique_ptr<MetricsEndpoint>> endpoint =
      MetricsEndpoint::Start("127.0.0.1:0");
  ASSERT_TRUE(endpoint.ok()) << endpoint.status();
  const int port = (*endpoint)->port();
  EXPECT_EQ(StatusLine(port, "GET / HTTP/1.1\r\nHost: x\r\n\r\n"), "HTTP/1.1 404 Not Found");
  EXPECT_EQ(StatusLine(port, "DELETE /metrics HTTP/1.1\r\nHost: x\r\n\r\n"),
            "HTTP/1.1 405 Method Not Allowed");
  EXPECT_EQ(StatusLine(port, "\x16\x03\x01\x02 not http\r\n\r\n"),
            "HTTP/1.1 400 Bad Request");
  EXPECT_EQ(StatusLine(port, absl::StrCat("GET /metrics HTTP/1.1\r\nX-Big: ",
                                          std::string(20000, 'a'), "\r\n\r\n")),
            "HTTP/1.1 400 Bad Request");
  EXPECT_EQ(StatusLine(port, "POST /metrics HTTP/1.1\r\nContent-Length: 5\r\n\r\nhello"),
            "HTTP/1.1 400 Bad Request")
      << "a request with a body";
  // A client that connects and says nothing is dropped, and the next scrape
  // is answered.
  const int silent = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(connect(silent, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  EXPECT_EQ(StatusLine(port, "GET /metrics?x=1 HTTP/1.1\r\nHost: x\r\n\r\n"),
            "HTTP/1.1 200 OK");
  close(silent);
}

TEST(MetricsEndpoint, RefusesWhatIsNotHostAndPortAndAPortInUse) {
  for (const std::string bad :
       {"", "9464", ":9464", "127.0.0.1:", "127.0.0.1:70000", "127.0.0.1:9464,9465",
        "127.0.0.1:9464s", "127.0.0.1:x", "127.0.0.1: 9464", "::1:0"}) {
    absl::StatusOr<std::unique_ptr<MetricsEndpoint>> endpoint = MetricsEndpoint::Start(bad);
    EXPECT_EQ(endpoint.status().code(), absl::StatusCode::kInvalidArgument) << bad;
  }
  EXPECT_EQ(MetricsEndpoint::Start("::1:0").status().message(),
            "metrics address '::1:0': an IPv6 host goes in brackets ([::1]:0)");
  absl::StatusOr<std::unique_ptr<MetricsEndpoint>> first =
      MetricsEndpoint::Start("127.0.0.1:0");
  ASSERT_TRUE(first.ok()) << first.status();
  absl::StatusOr<std::unique_ptr<MetricsEndpoint>> second =
      MetricsEndpoint::Start(absl::StrCat("127.0.0.1:", (*first)->port()));
  EXPECT_EQ(second.status().code(), absl::StatusCode::kUnavailable);
}

TEST(CountsHistogram, PerValueCountsBecomeCumulativeBucketsWithTheLastInInf) {
  // 3 x staleness 0, 2 x staleness 1, 1 x staleness 2 or more (here 4).
  prometheus::MetricFamily family = HistogramFamily("grps_test_staleness", "staleness");
  AddCountsHistogram(family, {{"shard", "0"}}, {3, 2, 1}, /*sum=*/2 + 4);
  ASSERT_EQ(family.metric.size(), 1u);
  const prometheus::ClientMetric::Histogram& h = family.metric[0].histogram;
  EXPECT_EQ(h.sample_count, 6u);
  EXPECT_EQ(h.sample_sum, 6.0);
  ASSERT_EQ(h.bucket.size(), 3u);
  EXPECT_EQ(h.bucket[0].upper_bound, 0.0);
  EXPECT_EQ(h.bucket[0].cumulative_count, 3u);
  EXPECT_EQ(h.bucket[1].upper_bound, 1.0);
  EXPECT_EQ(h.bucket[1].cumulative_count, 5u);
  EXPECT_TRUE(std::isinf(h.bucket[2].upper_bound));
  EXPECT_EQ(h.bucket[2].cumulative_count, 6u);
}

TEST(RpcMetrics, EveryServerCountsItsCallsByMethodAndCodeAndTimesThem) {
  absl::StatusOr<GrpcServer> server = StartGrpcServer("127.0.0.1:0", {}, SecurityConfig());
  ASSERT_TRUE(server.ok()) << server.status();
  absl::StatusOr<std::unique_ptr<MetricsEndpoint>> endpoint =
      MetricsEndpoint::Start("127.0.0.1:0");
  ASSERT_TRUE(endpoint.ok()) << endpoint.status();
  auto channel = grpc::CreateChannel(absl::StrCat("127.0.0.1:", server->port),
                                     grpc::InsecureChannelCredentials());
  // Three health checks of the whole server (OK), two of a service it does
  // not have (NOT_FOUND: grpc.health.v1.HealthCheckRequest{service: "x"}).
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(IsServing(channel, absl::Seconds(5)).ok());
  for (int i = 0; i < 2; ++i)
    EXPECT_EQ(UnaryCallBytes(channel, "/grpc.health.v1.Health/Check", std::string("\x0a\x01x", 3),
                             absl::Seconds(5))
                  .status()
                  .code(),
              absl::StatusCode::kNotFound);
  server->server->Shutdown();

  const std::string body = HttpGet((*endpoint)->port(), "/metrics");
  EXPECT_THAT(body, HasSubstr("grps_rpc_server_handled_total{code=\"OK\",method=\"/"
                              "grpc.health.v1.Health/Check\"} 3"));
  EXPECT_THAT(body, HasSubstr("grps_rpc_server_handled_total{code=\"NOT_FOUND\",method=\"/"
                              "grpc.health.v1.Health/Check\"} 2"));
  EXPECT_THAT(body, HasSubstr("grps_rpc_server_handling_seconds_count{method=\"/"
                              "grpc.health.v1.Health/Check\"} 5"));
  // Three replies of two bytes each (HealthCheckResponse{status: SERVING}).
  EXPECT_THAT(body, HasSubstr("grps_rpc_server_sent_bytes_total{method=\"/"
                              "grpc.health.v1.Health/Check\"} 6"));
}

}  // namespace
}  // namespace grps
