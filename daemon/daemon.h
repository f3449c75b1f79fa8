// What every grps process does the same way: read flags (GRPS_* environment
// variables, then the command line), log, serve gRPC with health checking and
// reflection, open channels, and notice SIGINT/SIGTERM.
#ifndef GRPS_DAEMON_DAEMON_H_
#define GRPS_DAEMON_DAEMON_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "grpcpp/grpcpp.h"

namespace grps {

// Largest message any grps channel or server accepts (bigger ones get
// RESOURCE_EXHAUSTED from gRPC before reaching a handler).
inline constexpr int kMaxMessageBytes = 64 << 20;

// Sets every registered absl flag `name` from the environment variable
// GRPS_<NAME> (upper case) when it is set, then parses the command line, which
// wins. Exits 1 with a clear message on a malformed value (from either).
// Returns the positional arguments (argv[0] first).
std::vector<char*> ParseFlagsWithEnvironment(int argc, char** argv,
                                             absl::string_view usage);

// Sets up the default logger: "[time] [name] [level] message" on stderr.
void InitLogging(absl::string_view process_name);

// A started gRPC server. `port` is the bound port (useful with port 0).
struct GrpcServer {
  std::unique_ptr<grpc::Server> server;
  int port = 0;
};

// Starts a server on `address` ("host:port"; port 0 picks a free one) with
// the given services, gRPC health checking and server reflection.
absl::StatusOr<GrpcServer> StartGrpcServer(
    const std::string& address, const std::vector<grpc::Service*>& services);

// An insecure channel to `target` with grps's message limits.
std::shared_ptr<grpc::Channel> MakeChannel(const std::string& target);

// Installs SIGINT/SIGTERM handlers that only record the signal.
void InstallShutdownHandlers();
// True once SIGINT or SIGTERM arrived.
bool ShutdownRequested();

// "host:port" with the host part of `address` and the given port.
std::string WithPort(const std::string& address, int port);

// Converts a gRPC status to an absl status, keeping code and message.
absl::Status ToAbsl(const grpc::Status& status);
// Converts an absl status to a gRPC status, keeping code and message.
grpc::Status ToGrpc(const absl::Status& status);

}  // namespace grps

#endif  // GRPS_DAEMON_DAEMON_H_
