#include "daemon/daemon.h"

#include <arpa/inet.h>
#include <malloc.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "grpcpp/generic/generic_stub.h"
#include "gtest/gtest.h"

ABSL_FLAG(int, daemon_test_port, 1, "a flag for the test");
ABSL_FLAG(std::string, daemon_test_name, "none", "a flag for the test");
ABSL_FLAG(bool, daemon_test_switch, false, "a flag for the test");
ABSL_FLAG(std::string, daemon_test_listen, "", "a HOST:PORT to listen on, for the test");
ABSL_FLAG(std::string, daemon_test_address, "", "a HOST:PORT to dial, for the test");

namespace grps {
namespace {

// What StartOneMessageCall reported, in order.
struct OneMessageCall {
  std::mutex mu;
  std::condition_variable changed;
  std::vector<std::string> events;
  grpc::Status status;
  std::string reply;

  void Note(std::string event) {
    std::lock_guard<std::mutex> lock(mu);
    events.push_back(std::move(event));
    changed.notify_all();
  }
};

// The health service's unary Check (the empty request: service ""), made
// by StartOneMessageCall to 127.0.0.1:`port` with `deadline`; what it
// reported, once it ended (by its deadline at the latest: the request,
// reply and context here must outlive it).
void CheckHealth(int port, std::chrono::seconds deadline, OneMessageCall* call) {
  grpc::GenericStub stub(MakeChannel(absl::StrCat("127.0.0.1:", port)));
  grpc::Slice empty("");
  grpc::ByteBuffer request(&empty, 1), reply;
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + deadline);
  StartOneMessageCall(&stub, &context, "/grpc.health.v1.Health/Check", &request, &reply,
                      [call] { call->Note("written"); },
                      [call](grpc::Status s) {
                        call->status = s;
                        call->Note("done");
                      });
  std::unique_lock<std::mutex> lock(call->mu);
  call->changed.wait(lock, [call] {
    return !call->events.empty() && call->events.back() == "done";
  });
  std::vector<grpc::Slice> slices;
  if (reply.Dump(&slices).ok())
    for (const grpc::Slice& slice : slices)
      call->reply.append(reinterpret_cast<const char*>(slice.begin()), slice.size());
}

TEST(Daemon, AOneMessageCallIsAUnaryCallToTheServerAndSaysItsRequestLeftBeforeItEnds) {
  absl::StatusOr<GrpcServer> server = StartGrpcServer("127.0.0.1:0", {});
  ASSERT_TRUE(server.ok()) << server.status();
  OneMessageCall call;
  CheckHealth(server->port, std::chrono::seconds(10), &call);
  EXPECT_EQ(call.events, (std::vector<std::string>{"written", "done"}));
  EXPECT_TRUE(call.status.ok()) << call.status.error_message();
  EXPECT_EQ(call.reply, std::string("\x08\x01", 2));  // SERVING
  server->server->Shutdown(std::chrono::system_clock::now());
}

TEST(Daemon, AOneMessageCallThatFailsStillSaysItsRequestWentBeforeItEnds) {
  // Nobody listens: the push schedule waits for `written` before its next
  // part, so a failed call must still give it.
  absl::StatusOr<GrpcServer> gone = StartGrpcServer("127.0.0.1:0", {});
  ASSERT_TRUE(gone.ok()) << gone.status();
  const int port = gone->port;
  gone->server->Shutdown(std::chrono::system_clock::now());
  gone->server.reset();
  OneMessageCall call;
  CheckHealth(port, std::chrono::seconds(2), &call);
  EXPECT_EQ(call.events, (std::vector<std::string>{"written", "done"}));
  EXPECT_FALSE(call.status.ok());
}

// A sanitizer's allocator stands in for glibc's malloc, whose figures the
// next test reads.
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define GRPS_SANITIZER_MALLOC 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
#define GRPS_SANITIZER_MALLOC 1
#endif
#endif

TEST(Daemon, FreedMessageMemoryStaysInTheHeapsUnlessTheOperatorTunesMalloc) {
  ASSERT_EQ(setenv("GLIBC_TUNABLES", "glibc.malloc.trim_threshold=131072", 1), 0);
  EXPECT_FALSE(KeepFreedMessageMemory());
  ASSERT_EQ(unsetenv("GLIBC_TUNABLES"), 0);
#if defined(GRPS_SANITIZER_MALLOC) || !defined(__GLIBC__)
  GTEST_SKIP() << "malloc here is not glibc's";
#else
  ASSERT_TRUE(KeepFreedMessageMemory());
  // A block below 32 MiB comes from a heap; one above it is mmapped.
  const size_t mapped = mallinfo2().hblks;
  char* message = static_cast<char*>(std::malloc(24 << 20));
  ASSERT_NE(message, nullptr);
  EXPECT_EQ(mallinfo2().hblks, mapped);
  void* huge = std::malloc(40 << 20);
  ASSERT_NE(huge, nullptr);
  EXPECT_EQ(mallinfo2().hblks, mapped + 1);
  std::free(huge);
  // Freed, the message's 24 MiB stay at the top of the heap for the next
  // one (glibc's default would have trimmed all but 128 KiB of them).
  std::memset(message, 1, 24 << 20);
  std::free(message);
  EXPECT_GE(mallinfo2().keepcost, size_t{24} << 20);
#endif
}

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

TEST(Daemon, FirstFlagGivenFindsAFlagInEverySpellingBeforeTheEndOfFlags) {
  auto given = [](std::vector<std::string> args) {
    std::vector<char*> argv;
    for (std::string& a : args) argv.push_back(a.data());
    return FirstFlagGiven(static_cast<int>(argv.size()), argv.data(),
                          {"metrics_listen", "tls_client_auth"});
  };
  EXPECT_EQ(given({"prog", "--metrics_listen=:9"}), "metrics_listen");
  EXPECT_EQ(given({"prog", "-metrics_listen", ":9"}), "metrics_listen");
  EXPECT_EQ(given({"prog", "--json", "--notls_client_auth"}), "tls_client_auth");
  EXPECT_EQ(given({"prog", "--tls_client_auth"}), "tls_client_auth");
  EXPECT_EQ(given({"prog", "--metrics_listener=x", "--nometrics", "status"}), "");
  EXPECT_EQ(given({"prog", "--", "--metrics_listen=:9"}), "");
}

TEST(Daemon, CheckCommandLineNamesAnUnknownFlagOrABadValueInEverySpelling) {
  auto problem = [](std::vector<std::string> args) {
    std::vector<char*> argv;
    for (std::string& a : args) argv.push_back(a.data());
    return CheckCommandLine(static_cast<int>(argv.size()), argv.data());
  };
  EXPECT_EQ(problem({"prog", "--daemon_test_port=8", "-daemon-test-name", "x", "pos"}), "");
  EXPECT_EQ(problem({"prog", "--daemon_test_switch", "--nodaemon_test_switch", "--help"}), "");
  EXPECT_EQ(problem({"prog", "--", "--no_such_flag=1"}), "");
  EXPECT_EQ(problem({"prog", "--no_such_flag=1"}), "unknown flag --no_such_flag=1");
  EXPECT_EQ(problem({"prog", "--nodaemon_test_port"}), "unknown flag --nodaemon_test_port");
  EXPECT_EQ(problem({"prog", "--undefok=no_such_flag,other", "--no_such_flag=1"}), "");
  EXPECT_TRUE(absl::StartsWith(problem({"prog", "--daemon_test_port=abc"}),
                               "bad value for --daemon_test_port: "));
  EXPECT_TRUE(absl::StartsWith(problem({"prog", "--daemon_test_port", "abc"}),
                               "bad value for --daemon_test_port: "));
  EXPECT_EQ(problem({"prog", "--daemon_test_port"}), "flag --daemon_test_port needs a value");
}

TEST(Daemon, APortPastSixteenBitsIsRefusedNotWrapped) {
  for (const char* address : {"127.0.0.1:0", "127.0.0.1:65535", "[::1]:7070", "0.0.0.0:00080",
                              "dns:///grps-0:7070", "unix:/tmp/grps.sock", "[::1]", "localhost"})
    EXPECT_TRUE(CheckAddressPort(address, AddressUse::kListen).ok()) << address;
  for (const char* address : {"127.0.0.1:65536", "127.0.0.1:99999", "[::1]:99999",
                              "h:99999999999999999999", "h:-1", "dns:///grps-0:70000"}) {
    const absl::Status s = CheckAddressPort(address, AddressUse::kListen);
    EXPECT_TRUE(absl::IsInvalidArgument(s)) << address;
    EXPECT_EQ(s.message(),
              absl::StrCat("the port of ", address, " must be 0-65535 (0 picks a free one)"));
  }
  // Port 0 means "pick one" only to a listener: nothing can be dialled there.
  EXPECT_TRUE(CheckAddressPort("127.0.0.1:1", AddressUse::kDial).ok());
  EXPECT_EQ(CheckAddressPort("127.0.0.1:0", AddressUse::kDial).message(),
            "the port of 127.0.0.1:0 must be 1-65535");
  EXPECT_FALSE(CheckAddressPort("127.0.0.1:99999", AddressUse::kDial).ok());
}

TEST(Daemon, AddressFlagsAreKnownByTheirNames) {
  for (const char* name : {"listen", "metrics_listen", "health_listen"})
    EXPECT_EQ(AddressUseOfFlag(name), AddressUse::kListen) << name;
  for (const char* name : {"coordinator", "address", "advertise_address"})
    EXPECT_EQ(AddressUseOfFlag(name), AddressUse::kDial) << name;
  for (const char* name : {"coordinator_timeout_ms", "listener", "port_file", "advertise_host"})
    EXPECT_FALSE(AddressUseOfFlag(name).has_value()) << name;
}

TEST(Daemon, AnAddressFlagWithAPortOutOfRangeIsAUsageError) {
  auto problem = [](std::vector<std::string> args) {
    std::vector<char*> argv;
    for (std::string& a : args) argv.push_back(a.data());
    return CheckCommandLine(static_cast<int>(argv.size()), argv.data());
  };
  EXPECT_EQ(
      problem({"prog", "--daemon_test_listen=127.0.0.1:0", "--daemon_test_address=127.0.0.1:7070"}),
      "");
  EXPECT_EQ(problem({"prog", "--daemon_test_listen=127.0.0.1:99999"}),
            "bad value for --daemon_test_listen: the port of 127.0.0.1:99999 must be 0-65535 "
            "(0 picks a free one)");
  EXPECT_EQ(problem({"prog", "--daemon_test_address", "127.0.0.1:0"}),
            "bad value for --daemon_test_address: the port of 127.0.0.1:0 must be 1-65535");
  // The same from the environment (the Python package's only way in).
  setenv("GRPS_DAEMON_TEST_ADDRESS", "127.0.0.1:70000", 1);
  const absl::Status s = SetFlagsFromEnvironment();
  unsetenv("GRPS_DAEMON_TEST_ADDRESS");
  EXPECT_TRUE(absl::IsInvalidArgument(s)) << s;
  EXPECT_EQ(s.message(),
            "GRPS_DAEMON_TEST_ADDRESS=127.0.0.1:70000: the port of "
            "127.0.0.1:70000 must be 1-65535");
}

TEST(Daemon, WithPortReplacesThePort) {
  EXPECT_EQ(WithPort("127.0.0.1:0", 5000), "127.0.0.1:5000");
}

// The address this machine would send from toward `peer` (a connected UDP
// socket sends nothing), or "" without a route.
std::string OwnAddressToward(const char* peer) {
  const int fd = socket(AF_INET, SOCK_DGRAM, 0);
  if (fd < 0) return "";
  sockaddr_in to{};
  to.sin_family = AF_INET;
  to.sin_port = htons(9);
  inet_pton(AF_INET, peer, &to.sin_addr);
  sockaddr_in own{};
  socklen_t len = sizeof(own);
  char text[INET_ADDRSTRLEN] = "";
  if (connect(fd, reinterpret_cast<sockaddr*>(&to), sizeof(to)) == 0 &&
      getsockname(fd, reinterpret_cast<sockaddr*>(&own), &len) == 0)
    inet_ntop(AF_INET, &own.sin_addr, text, sizeof(text));
  close(fd);
  return text;
}

TEST(Daemon, AnAddressOfThisMachineIsItsLoopbackOrOneOfItsInterfaces) {
  for (const char* address : {"localhost:1", "127.0.0.1:0", "[::1]:5"})
    EXPECT_TRUE(IsThisMachinesAddress(address)) << address;
  // 192.0.2.0/24 is for documentation: no interface has it.
  for (const char* address : {"192.0.2.1:7070", "[2001:db8::1]:1", "grps-server-0:7071", ""})
    EXPECT_FALSE(IsThisMachinesAddress(address)) << address;
  // Its own name, as a server on every interface advertises it.
  char name[256] = {};
  ASSERT_EQ(gethostname(name, sizeof(name) - 1), 0);
  EXPECT_TRUE(IsThisMachinesAddress(absl::StrCat(name, ":7071"))) << name;
  EXPECT_FALSE(IsThisMachinesAddress(absl::StrCat(name, "-other:7071"))) << name;
  const std::string own = OwnAddressToward("192.0.2.1");
  if (own.empty() || absl::StartsWith(own, "127.")) GTEST_SKIP() << "no route off this machine";
  EXPECT_TRUE(IsThisMachinesAddress(absl::StrCat(own, ":7071"))) << own;
  EXPECT_TRUE(IsThisMachinesAddress(absl::StrCat("[::ffff:", own, "]:7071"))) << own;
}

TEST(Daemon, LoopbackAddressesAndPeersAreThisMachinesOnly) {
  for (const char* address : {"localhost:1", "127.0.0.1:0", "127.9.8.7:70", "[::1]:5",
                              "[::ffff:127.0.0.1]:5"})
    EXPECT_TRUE(IsLoopbackAddress(address)) << address;
  for (const char* address : {"0.0.0.0:7070", "10.1.2.3:1", "[::]:1", "grps-server-0:7071",
                              "128.0.0.1:1"})
    EXPECT_FALSE(IsLoopbackAddress(address)) << address;
  // As gRPC names a caller.
  for (const char* peer : {"ipv4:127.0.0.1:43028", "ipv6:[::1]:5000", "ipv6:%5B::1%5D:5000",
                           "ipv6:%5B::ffff:127.0.0.1%5D:5000", "unix:/tmp/socket"})
    EXPECT_TRUE(IsLoopbackPeer(peer)) << peer;
  for (const char* peer : {"ipv4:10.77.3.2:41000", "ipv6:%5B2001:db8::1%5D:5000", "",
                           "127.0.0.1:5000", "ipv4:128.0.0.1:1"})
    EXPECT_FALSE(IsLoopbackPeer(peer)) << peer;
}

TEST(Daemon, StatusConversionKeepsCodeAndMessage) {
  absl::Status s = ToAbsl(ToGrpc(absl::NotFoundError("no chunk 7")));
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(s.message(), "no chunk 7");
}

TEST(Daemon, RetryTransientRetriesUnavailableUntilItSucceeds) {
  Backoff policy;
  policy.initial = absl::Milliseconds(1);
  int calls = 0;
  absl::Status s = RetryTransient(policy, [&] {
    return ++calls < 4 ? absl::UnavailableError("down") : absl::OkStatus();
  });
  EXPECT_TRUE(s.ok()) << s;
  EXPECT_EQ(calls, 4);
}

TEST(Daemon, RetryTransientReturnsOtherErrorsAtOnce) {
  Backoff policy;
  policy.initial = absl::Milliseconds(1);
  int calls = 0;
  absl::Status s = RetryTransient(policy, [&] {
    ++calls;
    return absl::DeadlineExceededError("slow");
  });
  EXPECT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_EQ(calls, 1) << "DEADLINE_EXCEEDED is retried only when asked";
  calls = 0;
  s = RetryTransient(policy, [&] {
    ++calls;
    return absl::InvalidArgumentError("bad");
  });
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(calls, 1);
}

TEST(Daemon, RetryTransientRetriesResourceExhaustedOnlyWhenAsked) {
  Backoff policy;
  policy.initial = absl::Milliseconds(1);
  int calls = 0;
  auto short_of_memory_twice = [&] {
    return ++calls < 3 ? absl::ResourceExhaustedError("Received RST_STREAM with error code 11")
                       : absl::OkStatus();
  };
  absl::Status s = RetryTransient(policy, short_of_memory_twice);
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(calls, 1);
  calls = 0;
  policy.retry_resource_exhausted = true;
  s = RetryTransient(policy, short_of_memory_twice);
  EXPECT_TRUE(s.ok()) << s;
  EXPECT_EQ(calls, 3);
}

TEST(Daemon, RetryTransientGivesUpWithTheLastStatus) {
  Backoff policy;
  policy.initial = absl::Milliseconds(5);
  policy.max = absl::Milliseconds(5);
  policy.give_up_after = absl::Milliseconds(60);
  policy.retry_deadline_exceeded = true;
  int calls = 0;
  const absl::Time start = absl::Now();
  absl::Status s = RetryTransient(policy, [&] {
    ++calls;
    return absl::DeadlineExceededError(absl::StrCat("try ", calls));
  });
  EXPECT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_EQ(s.message(), absl::StrCat("try ", calls));
  EXPECT_GT(calls, 1);
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
}

}  // namespace
}  // namespace grps
