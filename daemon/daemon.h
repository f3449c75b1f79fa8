// What every grps process does the same way: read flags (GRPS_* environment
// variables, then the command line), log, serve gRPC with health checking and
// reflection, open channels, and notice SIGINT/SIGTERM.
#ifndef GRPS_DAEMON_DAEMON_H_
#define GRPS_DAEMON_DAEMON_H_

#include <cstdint>
#include <functional>
#include <initializer_list>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "daemon/security.h"
#include "grpcpp/generic/generic_stub.h"
#include "grpcpp/grpcpp.h"
#include "grpcpp/resource_quota.h"
#include "grpcpp/support/client_callback.h"

namespace grps {

// The longest a channel made by MakeChannel waits before dialling a peer
// that refused or dropped it again.
inline constexpr absl::Duration kMaxReconnectBackoff = absl::Seconds(1);

// Largest message any grps channel or server accepts (bigger ones get
// RESOURCE_EXHAUSTED from gRPC before reaching a handler).
inline constexpr int kMaxMessageBytes = 64 << 20;

// The HTTP/2 receive window of each stream (gRPC's stream look-ahead) that
// every grps channel and server offers: a push schedule's request (at most
// 4 MiB) goes out whole without waiting for a WINDOW_UPDATE, which on a link
// busy the other way queues behind the bytes coming down. gRPC's default
// window (sized by its BDP probe) cost a sync step across hosts 6-8 %
// (docs/performance.md, "Receive windows").
inline constexpr int kStreamWindowBytes = 4 << 20;

// Sets every linked flag named by a GRPS_<FLAG> variable (a process that
// has no command line of its own: the grps Python package).
// INVALID_ARGUMENT naming the variable whose value does not parse (or holds
// a port out of range, see AddressUseOfFlag).
absl::Status SetFlagsFromEnvironment();

// How a HOST:PORT flag's address is used: listened on (port 0 picks a free
// one) or dialled.
enum class AddressUse { kListen, kDial };

// OK unless the port of `address` ("host:port", "[v6]:port", or a gRPC target
// such as "dns:///host:port") is outside 0-65535, or is 0 to dial:
// INVALID_ARGUMENT saying the range. gRPC keeps only the low 16 bits of a
// larger port (127.0.0.1:99999 is 127.0.0.1:34463). An address without a
// numeric port ("unix:/path", "[::1]") is left to gRPC.
absl::Status CheckAddressPort(absl::string_view address, AddressUse use);

// Which flags hold a HOST:PORT, by name: --listen and --*_listen are
// listened on, --coordinator, --address and --*_address dialled; the
// others none. Their values are checked with CheckAddressPort where
// flags are set (SetFlagsFromEnvironment, CheckCommandLine), so every
// binary refuses a bad port the same way.
std::optional<AddressUse> AddressUseOfFlag(absl::string_view name);

// Sets every registered absl flag `name` from the environment variable
// GRPS_<NAME> (upper case) when it is set, then parses the command line, which
// wins. Exits 2 (a usage error) with a clear message on a malformed value
// (from either; a port out of range included, see AddressUseOfFlag) or an
// unknown flag.
// Returns the positional arguments (argv[0] first).
//
// `unused_flags` names flags linked into the binary (from a library it
// shares) that it has no use for: one given on the command line is refused
// (exit 2, "--X is not used by <program>") rather than ignored. Only the
// command line is checked: GRPS_* variables are often set once for every
// daemon of a pod or a launch.
std::vector<char*> ParseFlagsWithEnvironment(
    int argc, char** argv, absl::string_view usage,
    std::initializer_list<absl::string_view> unused_flags = {});

// Checks the flag names and values of argv[1..argc) (up to "--") before
// absl parses them, so that a usage mistake exits 2 (absl's own parser exits
// 1). Returns the problem ("unknown flag --x", "bad value for --x: ..."), or
// "" if there is none. Sets the flags whose values it checked.
std::string CheckCommandLine(int argc, char** argv);

// The exit status of a daemon that cannot start for `status`: 2 for
// INVALID_ARGUMENT (a flag or a file the operator gave: a usage error, as
// every binary's help says), 1 for anything else (a port in use).
int ExitCodeOf(const absl::Status& status);

// The first of `flags` that argv[1..argc) sets (--name, --name=V, --noname,
// single dash too; none after "--"), or "" if none does.
std::string FirstFlagGiven(int argc, char** argv,
                           std::initializer_list<absl::string_view> flags);

// Sets up a daemon's process: the default logger ("[time] [name] [level]
// message" on stderr), and absl::Mutex without its deadlock detection.
// Debian's Abseil is built with the detection on: every lock taken while
// another is held then updates a graph of lock order under one global lock
// (a pair of nested locks cost 76 ns instead of 22 here, and every gRPC
// thread of a process queued on that lock). The unit tests, which do not
// call this, keep it; ThreadSanitizer reports lock-order inversions in the
// daemons the e2e tests start.
// It also calls KeepFreedMessageMemory.
void InitDaemon(absl::string_view process_name);

// Has glibc's malloc keep what a daemon frees for the next message instead
// of giving it back to the kernel at once. By default a heap whose free top
// passes 128 KiB (or twice the largest block that was mmapped and freed)
// is trimmed, each thread's arena its own, and blocks over 128 KiB at first
// are mmapped: a daemon that receives messages of megabytes (gRPC's read
// buffers, a sparse call's rows) frees them and asks for as much a step
// later, and each time faults the same pages in again, a fault costing
// microseconds under a hypervisor. Here every block below 32 MiB (glibc's
// largest threshold) comes from the heaps and a heap keeps up to
// kMaxMessageBytes free at its top. `grps_wire_bench --sparse_rows=131072
// --sparse_dims=16`: 1,290 page faults a step (a sparse push + pull and a
// dense one) before, 98 after, and about a fifth less CPU a step. The cost:
// memory one arena freed is not given back for another's, so a process's
// peak RSS can rise by up to that much per busy arena (the same bench with
// 64 MiB dense messages and both shards in its process: 583 MB to 948 MB;
// docs/performance.md, "Freed memory kept"). GLIBC_TUNABLES naming any
// glibc.malloc tunable leaves malloc as it says instead (e.g.
// glibc.malloc.trim_threshold=131072, glibc's first threshold). No effect where
// malloc is not glibc's (a sanitizer's allocator). True when malloc was
// changed.
bool KeepFreedMessageMemory();

// What gRPC may hold for a server's calls at once unless a daemon says
// otherwise (see ServerLimits::memory_bytes).
inline constexpr size_t kDefaultServerMemoryBytes = size_t{64} << 20;

// A started gRPC server. `port` is the bound port (useful with port 0).
struct GrpcServer {
  std::unique_ptr<grpc::Server> server;
  int port = 0;
  // The server's memory quota; Resize() it once the daemon knows what its
  // calls legitimately need.
  std::unique_ptr<grpc::ResourceQuota> quota;
};

// What a server accepts before any handler runs.
struct ServerLimits {
  // Larger messages are refused with RESOURCE_EXHAUSTED. gRPC (1.51) checks
  // this only once a message has wholly arrived, so by itself it bounds no
  // memory: four concurrent 200 MiB messages took a server with a 4 MiB
  // limit to 551 MB.
  int max_receive_bytes = kMaxMessageBytes;
  // What gRPC may hold for the server's calls at once (received messages
  // and buffers, all connections together). A stream that would go past it
  // is reset (the caller sees RESOURCE_EXHAUSTED) while it arrives, before
  // it is whole: with 64 MiB, the same four messages peaked at 99 MB. A
  // call that fails its token check is refused on its headers and costs
  // nothing of it.
  size_t memory_bytes = kDefaultServerMemoryBytes;
};

// Starts a server on `address` ("host:port"; port 0 picks a free one) with
// the given services, gRPC health checking and server reflection, secured
// as `security` says (see daemon/security.h; by default the process's
// settings).
absl::StatusOr<GrpcServer> StartGrpcServer(
    const std::string& address, const std::vector<grpc::Service*>& services,
    const ServerLimits& limits = {});
absl::StatusOr<GrpcServer> StartGrpcServer(
    const std::string& address, const std::vector<grpc::Service*>& services,
    const SecurityConfig& security, const ServerLimits& limits = {});

// A channel to `target` with grps's message limits and the process's
// security settings (TLS, token, member secret).
std::shared_ptr<grpc::Channel> MakeChannel(const std::string& target);
// The same with explicit settings; calls carry the process's member secret
// when `member_secret_source` is set.
std::shared_ptr<grpc::Channel> MakeChannel(const std::string& target,
                                           const SecurityConfig& security,
                                           bool member_secret_source);

// One unary call of `method` ("/package.Service/Method") with serialized
// request bytes, for services without a generated stub here; the reply's
// bytes, or the call's status.
absl::StatusOr<std::string> UnaryCallBytes(const std::shared_ptr<grpc::Channel>& channel,
                                           const std::string& method,
                                           const std::string& request_bytes,
                                           absl::Duration timeout);

// Starts a unary call of gRPC's callback API and runs `done` with its status
// on gRPC's callback thread when it completes. `bind` hands the reactor to the
// stub, e.g.
//
//   StartUnaryCall([&](grpc::ClientUnaryReactor* r) {
//     stub->async()->Pull(&context, &request, &response, r);
//   }, [&](grpc::Status s) { ... });
//
// Use it for every callback call instead of the std::function overloads:
// gRPC core (built without ThreadSanitizer in Debian) hands a completion to
// its executor through lock-free queues TSan cannot see, so what the caller
// wrote before the call (the request, the callback's captures) would read as
// racing with `done`. The reactor declares that hand-off on its own address
// (a release as the call starts, an acquire as it completes): exactly the
// order gRPC guarantees, per call, and no more, so a real race between
// `done` and another thread is still reported. No cost outside TSan builds.
void StartUnaryCall(const std::function<void(grpc::ClientUnaryReactor*)>& bind,
                    std::function<void(grpc::Status)> done);

// A unary call of `method` made as a stream of one message each way, so
// that the caller hears when its request has left: `written` runs (on a
// gRPC thread) once the request's bytes are written to the connection,
// within HTTP/2's flow control, or the write failed; `done` runs when the
// call ends, after `written`, with the reply in `reply`. The server sees a
// unary call. `request`, `reply` and `context` must outlive `done`. The same
// hand-over to gRPC's threads as StartUnaryCall's.
void StartOneMessageCall(grpc::GenericStub* stub, grpc::ClientContext* context,
                         const std::string& method, const grpc::ByteBuffer* request,
                         grpc::ByteBuffer* reply, std::function<void()> written,
                         std::function<void(grpc::Status)> done);

// Asks the gRPC health service behind `channel` about the whole server:
// true for SERVING, false for NOT_SERVING; the call's error otherwise.
absl::StatusOr<bool> IsServing(const std::shared_ptr<grpc::Channel>& channel,
                               absl::Duration timeout);

// Installs SIGINT/SIGTERM handlers that only record the signal.
void InstallShutdownHandlers();
// From now on, the first SIGTERM asks the process to leave its job
// gracefully (LeaveRequested) rather than to stop: a worker finishes its
// step in progress, tells the coordinator, and exits. SIGINT, a second
// SIGTERM, or kLeaveGrace after the first, still stop it (ShutdownRequested).
// After InstallShutdownHandlers.
void LeaveOnSigterm();
// For a process whose other signals are its host's (Python): installs the
// SIGTERM handler alone, in LeaveOnSigterm's way.
void InstallLeaveOnSigterm();
inline constexpr absl::Duration kLeaveGrace = absl::Seconds(20);
// True once SIGTERM arrived after LeaveOnSigterm().
bool LeaveRequested();

// Ends the process with `code` at once, after flushing the logs and stdio,
// without running destructors. For a daemon whose work is done and saved:
// gRPC's library shutdown, which the last gRPC object's destructor runs, can
// wait ~10 s for an executor thread that is polling (measured: 3 exits in
// 20 runs of bench/exit_latency, in ~grpc::Server).
[[noreturn]] void ExitNow(int code);

// The cores this process may run on (its CPU affinity mask), at least 1.
int UsableCores();
// The most resident memory this process has held so far (getrusage's
// ru_maxrss), in MiB.
double PeakRssMiB();
// `bytes` in MiB (2^20 bytes), for the logs.
inline double BytesInMiB(uint64_t bytes) { return static_cast<double>(bytes) / (1 << 20); }
// True once SIGINT or SIGTERM arrived (with LeaveOnSigterm: SIGINT, a second
// SIGTERM, or kLeaveGrace after the first).
bool ShutdownRequested();
// How many SIGINT and SIGTERM arrived so far (to tell a later one apart).
int ShutdownSignals();

// Sleeps for `d`, waking early when SIGINT or SIGTERM arrives.
void SleepUnlessShutdown(absl::Duration d);

// How RetryTransient spaces its attempts: sleeps double from `initial` up to
// `max`; no new attempt starts once `give_up_after` (from the first attempt)
// would be passed.
struct Backoff {
  absl::Duration initial = absl::Milliseconds(100);
  absl::Duration max = absl::Seconds(2);
  absl::Duration give_up_after = absl::InfiniteDuration();
  // UNAVAILABLE is always transient; DEADLINE_EXCEEDED only when this is set
  // (a call that merely outlived its deadline, such as a registration that
  // waits for the job to form).
  bool retry_deadline_exceeded = false;
  // RESOURCE_EXHAUSTED too: for calls whose handler never answers it, where
  // it can only be the peer's gRPC memory quota refusing the call while
  // something else holds the memory (a passing shortage).
  bool retry_resource_exhausted = false;
  // ALREADY_EXISTS too: a worker's registration for a rank whose old
  // incarnation is still alive, until the coordinator declares it dead.
  bool retry_already_exists = false;
};

// Calls `attempt` until it returns OK, and retries it while it fails with a
// transient status (see Backoff). Returns the first other status, the last
// transient one when the policy gives up, or CANCELLED once SIGINT or SIGTERM
// arrived. For calls to a peer that may be restarting; every grps call that
// is retried is idempotent on the receiving side.
absl::Status RetryTransient(const Backoff& policy,
                            const std::function<absl::Status()>& attempt);

// Whether "host:port" names this machine's loopback (localhost, 127.x,
// [::1], [::ffff:127.x]).
bool IsLoopbackAddress(absl::string_view address);
// Whether "host:port" names this machine: its loopback, a numeric IPv4 or
// IPv6 address one of its interfaces has now (getifaddrs), or its own host
// name (gethostname: what a server listening on every interface
// advertises). Another host name is not resolved: false.
bool IsThisMachinesAddress(absl::string_view address);
// Whether a gRPC peer string ("ipv4:127.0.0.1:5000", "ipv6:%5B::1%5D:5000",
// "unix:...") is a caller on this machine's loopback or a Unix socket.
bool IsLoopbackPeer(absl::string_view peer);

// "host:port" with the host part of `address` and the given port.
std::string WithPort(const std::string& address, int port);
// The host part of "host:port" ("[v6]" keeps its brackets); all of it when
// there is no port.
absl::string_view HostOf(absl::string_view address);

// `text` from the network, fit to quote in a status message or a log line:
// at most `max_bytes` of it, control and non-ASCII bytes escaped (\x..), and
// "... (N bytes)" when it was cut.
std::string QuoteUntrusted(absl::string_view text, size_t max_bytes = 64);

// Converts a gRPC status to an absl status, keeping code and message.
absl::Status ToAbsl(const grpc::Status& status);
// Converts an absl status to a gRPC status, keeping code and message.
grpc::Status ToGrpc(const absl::Status& status);

}  // namespace grps

#endif  // GRPS_DAEMON_DAEMON_H_
