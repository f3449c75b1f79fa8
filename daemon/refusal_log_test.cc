#include "daemon/refusal_log.h"

#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "daemon/daemon.h"
#include "daemon/security.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "spdlog/spdlog.h"
#include "test/captured_log.h"

namespace grps {
namespace {

using ::testing::HasSubstr;

TEST(RefusalLog, OneLinePerKindPerIntervalAndTheNextSaysHowManyWereNotLogged) {
  CapturedLog log;
  absl::Time now = absl::UnixEpoch();
  RefusalLog refusals(absl::Seconds(10), [&] { return now; });
  EXPECT_TRUE(refusals.Note("/grps.v1.ParameterServer/Push", grpc::StatusCode::INVALID_ARGUMENT,
                            "ipv4:127.0.0.1:5000", "chunk 3: expected 16 bytes"));
  for (int i = 0; i < 999; ++i) {
    now += absl::Milliseconds(5);
    EXPECT_FALSE(refusals.Note("/grps.v1.ParameterServer/Push",
                               grpc::StatusCode::INVALID_ARGUMENT, "ipv4:127.0.0.1:5000",
                               "chunk 3: expected 16 bytes"));
  }
  // Another code or another method is another kind.
  EXPECT_TRUE(refusals.Note("/grps.v1.ParameterServer/Push", grpc::StatusCode::NOT_FOUND,
                            "ipv4:127.0.0.1:5000", "unknown chunk 99"));
  EXPECT_TRUE(refusals.Note("/grps.v1.ParameterServer/Pull", grpc::StatusCode::INVALID_ARGUMENT,
                            "ipv4:127.0.0.1:5000", "unknown worker rank 9"));
  ASSERT_EQ(log.Lines().size(), 3u);
  now += absl::Seconds(10);
  EXPECT_TRUE(refusals.Note("/grps.v1.ParameterServer/Push", grpc::StatusCode::INVALID_ARGUMENT,
                            "ipv4:127.0.0.1:5001", "chunk 3: expected 16 bytes"));
  const std::vector<std::string> lines = log.Lines();
  ASSERT_EQ(lines.size(), 4u);
  EXPECT_THAT(lines[0], HasSubstr("refused /grps.v1.ParameterServer/Push from "
                                  "ipv4:127.0.0.1:5000: INVALID_ARGUMENT: "
                                  "chunk 3: expected 16 bytes"));
  EXPECT_THAT(lines[3], HasSubstr("(and 999 more like it in the last 14.9s, not logged)"));
}

TEST(RefusalLog, ManyKindsShareOneOnceThereAreTooMany) {
  CapturedLog log;
  absl::Time now = absl::UnixEpoch();
  RefusalLog refusals(absl::Seconds(10), [&] { return now; });
  int logged = 0;
  for (int i = 0; i < 1000; ++i)
    logged += refusals.Note(absl::StrCat("/no.Such/Method", i), grpc::StatusCode::UNIMPLEMENTED,
                            "peer", "");
  EXPECT_EQ(logged, static_cast<int>(RefusalLog::kMaxKinds) + 1);
}

TEST(RefusalLog, WhatTheCallerSentIsQuotedAndCut) {
  CapturedLog log;
  RefusalLog refusals;
  refusals.Note(std::string(100000, 'm'), grpc::StatusCode::INVALID_ARGUMENT, "peer\n\x1b[2J",
                "bad");
  const std::vector<std::string> lines = log.Lines();
  ASSERT_EQ(lines.size(), 1u);
  EXPECT_LT(lines[0].size(), 600u);
  EXPECT_THAT(lines[0], HasSubstr("(100000 bytes) from peer\\n\\x1b[2J: "));
}

TEST(RefusalLog, EveryCodeThatIsNoFaultOfTheCallerIsNoRefusal) {
  for (grpc::StatusCode code :
       {grpc::StatusCode::OK, grpc::StatusCode::CANCELLED, grpc::StatusCode::DEADLINE_EXCEEDED,
        grpc::StatusCode::UNAVAILABLE, grpc::StatusCode::ABORTED})
    EXPECT_FALSE(IsRefusal(code)) << code;
  for (grpc::StatusCode code :
       {grpc::StatusCode::INVALID_ARGUMENT, grpc::StatusCode::FAILED_PRECONDITION,
        grpc::StatusCode::NOT_FOUND, grpc::StatusCode::PERMISSION_DENIED,
        grpc::StatusCode::UNAUTHENTICATED, grpc::StatusCode::RESOURCE_EXHAUSTED,
        grpc::StatusCode::UNIMPLEMENTED, grpc::StatusCode::INTERNAL})
    EXPECT_TRUE(IsRefusal(code)) << code;
}

// How many lines 200 refused calls of `method` (with `request`) to a real
// server secured by `security` logged; each call must end with `expected`.
int RefusedCallsLogged(const SecurityConfig& security, const std::string& method,
                       const std::string& request, grpc::StatusCode expected) {
  CapturedLog log;
  absl::StatusOr<GrpcServer> server = StartGrpcServer("127.0.0.1:0", {}, security);
  EXPECT_TRUE(server.ok()) << server.status();
  if (!server.ok()) return -1;
  auto channel = grpc::CreateChannel(absl::StrCat("127.0.0.1:", server->port),
                                     grpc::InsecureChannelCredentials());
  for (int i = 0; i < 200; ++i)
    EXPECT_EQ(static_cast<int>(
                  UnaryCallBytes(channel, method, request, absl::Seconds(5)).status().code()),
              static_cast<int>(expected));
  server->server->Shutdown();
  int logged = 0;
  for (const std::string& line : log.Lines())
    logged += line.find("refused") != std::string::npos;
  return logged;
}

TEST(RefusalLog, AServerLogsTwoHundredRefusedCallsOnce) {
  // A health check of a service the server does not have: NOT_FOUND.
  // (grpc.health.v1.HealthCheckRequest{service: "no.such.Service"}.)
  EXPECT_EQ(RefusedCallsLogged(SecurityConfig(), "/grpc.health.v1.Health/Check",
                               std::string("\x0a\x0fno.such.Service"), grpc::StatusCode::NOT_FOUND),
            1);
}

TEST(RefusalLog, TwoHundredCallsWithoutATokenAreLoggedOnce) {
  SecurityConfig security;
  security.admin_token = "the-token";
  EXPECT_EQ(RefusedCallsLogged(security, "/grps.v1.Coordinator/StopJob", "",
                               grpc::StatusCode::UNAUTHENTICATED),
            1);
}

}  // namespace
}  // namespace grps
