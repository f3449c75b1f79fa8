// grps-flood-client: sends `--count` concurrent calls of `--method`, each
// carrying `--mib` MiB of bytes, to `--target`, and prints each call's
// status, one line per call ("RESOURCE_EXHAUSTED: ..."). For the tests of a
// daemon's limits: what a client that is not one of the job's processes can
// make a daemon hold. Plaintext; `--token` (or GRPS_TOKEN) is sent as the
// bearer token when set. Exits 0 once every call ended, 2 on bad flags.
#include <cstdio>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/declare.h"
#include "absl/flags/flag.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "daemon/daemon.h"
#include "grpcpp/generic/generic_stub.h"
#include "grpcpp/grpcpp.h"

ABSL_FLAG(std::string, target, "", "host:port to call (required)");
ABSL_FLAG(std::string, method, "/grps.v1.ParameterServer/Push",
          "the full method name to call");
ABSL_FLAG(uint32_t, mib, 200, "size of each call's message, in MiB");
ABSL_FLAG(uint32_t, count, 4, "calls in flight at once");
// --token (GRPS_TOKEN) is daemon/security.cc's.
ABSL_DECLARE_FLAG(std::string, token);
ABSL_FLAG(uint32_t, timeout_s, 60, "deadline of each call");

namespace grps {
namespace {

int Main(int argc, char** argv) {
  ParseFlagsWithEnvironment(argc, argv, "grps-flood-client --target=HOST:PORT [flags]");
  const std::string target = absl::GetFlag(FLAGS_target);
  const uint32_t mib = absl::GetFlag(FLAGS_mib);
  const uint32_t count = absl::GetFlag(FLAGS_count);
  if (target.empty() || mib == 0 || mib > 2000 || count == 0 || count > 64) {
    std::fprintf(stderr,
                 "grps-flood-client: --target is required, --mib 1..2000, --count 1..64\n");
    return 2;
  }
  grpc::ChannelArguments args;
  args.SetMaxSendMessageSize(-1);
  grpc::GenericStub stub(
      grpc::CreateCustomChannel(target, grpc::InsecureChannelCredentials(), args));
  const std::string token = absl::GetFlag(FLAGS_token);
  const std::string method = absl::GetFlag(FLAGS_method);
  // One message, shared by every call (its slice is reference-counted).
  grpc::Slice payload(std::string(size_t{mib} << 20, '\x7f'));
  std::vector<std::string> results(count);
  std::vector<std::thread> calls;
  for (uint32_t i = 0; i < count; ++i) {
    calls.emplace_back([&, i] {
      grpc::ClientContext context;
      if (!token.empty()) context.AddMetadata("authorization", absl::StrCat("Bearer ", token));
      context.set_deadline(std::chrono::system_clock::now() +
                           std::chrono::seconds(absl::GetFlag(FLAGS_timeout_s)));
      grpc::ByteBuffer request(&payload, 1);
      grpc::ByteBuffer reply;
      absl::Notification done;
      grpc::Status status;
      StartUnaryCall(
          [&](grpc::ClientUnaryReactor* r) {
            stub.PrepareUnaryCall(&context, method, grpc::StubOptions(), &request, &reply, r);
          },
          [&](grpc::Status s) {
            status = std::move(s);
            done.Notify();
          });
      done.WaitForNotification();
      results[i] = absl::StrCat(
          absl::StatusCodeToString(static_cast<absl::StatusCode>(status.error_code())), ": ",
                                status.error_message());
    });
  }
  for (std::thread& t : calls) t.join();
  for (const std::string& r : results) std::printf("%s\n", r.c_str());
  return 0;
}

}  // namespace
}  // namespace grps

int main(int argc, char** argv) { return grps::Main(argc, argv); }
