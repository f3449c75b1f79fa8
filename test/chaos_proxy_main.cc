// grps-chaos-proxy: a ParameterServer proxy in front of one real shard that
// drops, duplicates and delays pushes, and drops pulls or their replies (see
// test/chaos_proxy.h). For fault
// drills and end-to-end tests: point the workers at the proxy (the server
// advertises the proxy's address) and the proxy at the server. Prints its
// counters when it stops (SIGINT/SIGTERM).
#include <cstdio>
#include <string>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "daemon/daemon.h"
#include "daemon/env.h"
#include "spdlog/spdlog.h"
#include "test/chaos_proxy.h"

ABSL_FLAG(std::string, listen, "127.0.0.1:0", "address to serve on (port 0: any free port)");
ABSL_FLAG(std::string, backend, "", "host:port of the real grps-server");
ABSL_FLAG(uint64_t, seed, 1, "seed of the fault decisions");
ABSL_FLAG(double, drop_request, 0, "probability a push is dropped before the shard");
ABSL_FLAG(double, drop_reply, 0,
          "probability a push is applied but its reply dropped (the client retries)");
ABSL_FLAG(double, duplicate, 0,
          "probability a push is sent a second time, up to max_delay_ms later");
ABSL_FLAG(double, drop_pull_request, 0, "probability a pull is dropped before the shard");
ABSL_FLAG(double, drop_pull_reply, 0,
          "probability a pull is served but its reply dropped (the client pulls again)");
ABSL_FLAG(uint32_t, max_delay_ms, 0, "each push waits a uniform 0..max_delay_ms");
ABSL_FLAG(uint64_t, max_faults, 1000, "at most this many drops and duplicates in all");
ABSL_FLAG(std::string, port_file, "",
          "if set, the bound port is written here (atomically) once listening");

namespace grps {
namespace {

std::string Describe(const ChaosProxy::Counters& c) {
  return absl::StrCat(
      "calls=", c.calls, " pushes=", c.pushes, " dropped_requests=", c.dropped_requests,
      " dropped_replies=", c.dropped_replies, " duplicated=", c.duplicated, " delayed=", c.delayed,
      " faults=", c.faults, " dropped_pull_requests=", c.dropped_pull_requests,
      " dropped_pull_replies=", c.dropped_pull_replies);
}

int Run() {
  ChaosProxy::Options options;
  options.backend = absl::GetFlag(FLAGS_backend);
  options.seed = absl::GetFlag(FLAGS_seed);
  options.drop_request = absl::GetFlag(FLAGS_drop_request);
  options.drop_reply = absl::GetFlag(FLAGS_drop_reply);
  options.duplicate = absl::GetFlag(FLAGS_duplicate);
  options.drop_pull_request = absl::GetFlag(FLAGS_drop_pull_request);
  options.drop_pull_reply = absl::GetFlag(FLAGS_drop_pull_reply);
  options.max_delay_ms = absl::GetFlag(FLAGS_max_delay_ms);
  options.max_faults = absl::GetFlag(FLAGS_max_faults);
  absl::StatusOr<std::unique_ptr<ChaosProxy>> proxy = ChaosProxy::Create(options);
  if (!proxy.ok()) {
    spdlog::error("{}", std::string(proxy.status().message()));
    return 2;
  }
  absl::StatusOr<GrpcServer> server =
      StartGrpcServer(absl::GetFlag(FLAGS_listen), {proxy->get()});
  if (!server.ok()) {
    spdlog::error("{}", std::string(server.status().message()));
    return 1;
  }
  if (const std::string path = absl::GetFlag(FLAGS_port_file); !path.empty()) {
    if (absl::Status s = WriteFileAtomically(Env::Default(), path,
                                             absl::StrCat(server->port, "\n"));
        !s.ok()) {
      spdlog::error("{}", std::string(s.message()));
      return 1;
    }
  }
  spdlog::info(
      "chaos proxy on port {} in front of {} (seed {}, drop_request {}, "
      "drop_reply {}, duplicate {}, drop_pull_request {}, drop_pull_reply {}, "
      "max_delay_ms {}, max_faults {})",
      server->port, options.backend, options.seed, options.drop_request, options.drop_reply,
      options.duplicate, options.drop_pull_request, options.drop_pull_reply, options.max_delay_ms,
      options.max_faults);
  while (!ShutdownRequested()) SleepUnlessShutdown(absl::Seconds(1));
  server->server->Shutdown(absl::ToChronoTime(absl::Now() + absl::Seconds(2)));
  const std::string counters = Describe((*proxy)->counters());
  spdlog::info("chaos proxy stopped: {}", counters);
  // On stdout too, one line, for scripts.
  std::printf("chaos-proxy: %s\n", counters.c_str());
  std::fflush(stdout);
  return 0;
}

}  // namespace
}  // namespace grps

int main(int argc, char** argv) {
  grps::ParseFlagsWithEnvironment(
      argc, argv,
      "grps-chaos-proxy --backend=HOST:PORT [--listen=HOST:PORT] [--seed=N] "
      "[--drop_request=P] [--drop_reply=P] [--duplicate=P] [--max_delay_ms=N] "
      "[--max_faults=N] [--port_file=PATH]\n"
      "  A ParameterServer proxy that drops, duplicates and delays pushes.");
  grps::InitDaemon("chaos-proxy");
  grps::InstallShutdownHandlers();
  return grps::Run();
}
