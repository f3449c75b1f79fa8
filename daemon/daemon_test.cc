#include "daemon/daemon.h"

#include <cstdlib>

#include "absl/flags/flag.h"
#include "gtest/gtest.h"

ABSL_FLAG(int, daemon_test_port, 1, "a flag for the test");
ABSL_FLAG(std::string, daemon_test_name, "none", "a flag for the test");

namespace grps {
namespace {

TEST(Daemon, EnvironmentSetsFlagsAndCommandLineWins) {
  setenv("GRPS_DAEMON_TEST_PORT", "77", 1);
  setenv("GRPS_DAEMON_TEST_NAME", "from-env", 1);
  char arg0[] = "prog";
  char arg1[] = "--daemon-test-name=from-argv";
  char* argv[] = {arg0, arg1, nullptr};
  ParseFlagsWithEnvironment(2, argv, "test");
  EXPECT_EQ(absl::GetFlag(FLAGS_daemon_test_port), 77);
  EXPECT_EQ(absl::GetFlag(FLAGS_daemon_test_name), "from-argv");
}

TEST(Daemon, WithPortReplacesThePort) {
  EXPECT_EQ(WithPort("127.0.0.1:0", 5000), "127.0.0.1:5000");
}

TEST(Daemon, StatusConversionKeepsCodeAndMessage) {
  absl::Status s = ToAbsl(ToGrpc(absl::NotFoundError("no chunk 7")));
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(s.message(), "no chunk 7");
}

}  // namespace
}  // namespace grps
