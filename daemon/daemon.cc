#include "daemon/daemon.h"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <malloc.h>
#include <netinet/in.h>
#include <sched.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>

#include "absl/algorithm/container.h"
#include "absl/flags/parse.h"
#include "absl/flags/reflection.h"
#include "absl/flags/usage.h"
#include "absl/flags/usage_config.h"
#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "absl/synchronization/mutex.h"
#include "daemon/hand_over.h"
#include "daemon/metrics.h"
#include "daemon/refusal_log.h"
#include "daemon/security.h"
#include "grpcpp/ext/proto_server_reflection_plugin.h"
#include "grpcpp/generic/generic_stub.h"
#include "grpcpp/health_check_service_interface.h"
#include "spdlog/sinks/stdout_color_sinks.h"
#include "spdlog/spdlog.h"

namespace grps {

namespace {

// Whether --help lists the flag defined in `filename`: every flag of grps
// (a binary's flags live in its libraries as well as in its main file, so
// Abseil's default, the flags of the file named after the binary, found
// none), none of Abseil's own (--flagfile, --helpfull, ...).
bool IsGrpsFlagFile(absl::string_view filename) {
  return !absl::StrContains(filename, "absl/");
}

// "server/server_main.cc", not the build machine's path to it. (Abseil
// filters the flags on this name: Abseil's own keep their path.)
std::string FolderAndFile(absl::string_view filename) {
  if (!IsGrpsFlagFile(filename)) return std::string(filename);
  const size_t last = filename.rfind('/');
  if (last == absl::string_view::npos || last == 0) return std::string(filename);
  const size_t folder = filename.rfind('/', last - 1);
  return std::string(folder == absl::string_view::npos ? filename
                                                       : filename.substr(folder + 1));
}

}  // namespace

int ExitCodeOf(const absl::Status& status) { return absl::IsInvalidArgument(status) ? 2 : 1; }

std::string FirstFlagGiven(int argc, char** argv,
                           std::initializer_list<absl::string_view> flags) {
  for (int i = 1; i < argc; ++i) {
    absl::string_view arg(argv[i]);
    if (arg == "--") break;
    if (!absl::ConsumePrefix(&arg, "-")) continue;
    absl::ConsumePrefix(&arg, "-");
    arg = arg.substr(0, arg.find('='));
    absl::string_view negated = arg;  // --noname sets a bool flag too
    const bool maybe_negated = absl::ConsumePrefix(&negated, "no");
    for (absl::string_view flag : flags)
      if (arg == flag || (maybe_negated && negated == flag)) return std::string(flag);
  }
  return "";
}

absl::Status CheckAddressPort(absl::string_view address, AddressUse use) {
  const size_t colon = address.rfind(':');
  if (colon == absl::string_view::npos) return absl::OkStatus();
  absl::string_view digits = address.substr(colon + 1);
  const bool negative = absl::ConsumePrefix(&digits, "-");
  if (digits.empty() || !std::all_of(digits.begin(), digits.end(), absl::ascii_isdigit))
    return absl::OkStatus();
  // Past its leading zeros, a port of more than 5 digits is out of range
  // (and may be out of an int's).
  while (digits.size() > 1 && digits.front() == '0') digits.remove_prefix(1);
  const int lowest = use == AddressUse::kListen ? 0 : 1;
  int port = 0;
  if (!negative && digits.size() <= 5 && absl::SimpleAtoi(digits, &port) && port >= lowest &&
      port <= 65535)
    return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat("the port of ", address, " must be ", lowest, "-65535",
                   use == AddressUse::kListen ? " (0 picks a free one)" : ""));
}

std::optional<AddressUse> AddressUseOfFlag(absl::string_view name) {
  if (name == "listen" || absl::EndsWith(name, "_listen")) return AddressUse::kListen;
  if (name == "coordinator" || name == "address" || absl::EndsWith(name, "_address"))
    return AddressUse::kDial;
  return std::nullopt;
}

namespace {

// "" unless `flag`, a HOST:PORT flag (AddressUseOfFlag) set to `value`, has
// a port out of range; then why.
std::string CheckAddressFlag(const absl::CommandLineFlag& flag, absl::string_view value) {
  const std::optional<AddressUse> use = AddressUseOfFlag(flag.Name());
  if (!use.has_value() || !flag.IsOfType<std::string>()) return "";
  const absl::Status s = CheckAddressPort(value, *use);
  return s.ok() ? "" : std::string(s.message());
}

}  // namespace

absl::Status SetFlagsFromEnvironment() {
  for (const auto& [name, flag] : absl::GetAllFlags()) {
    std::string env = absl::StrCat("GRPS_", absl::AsciiStrToUpper(name));
    const char* value = std::getenv(env.c_str());
    if (value == nullptr) continue;
    std::string error;
    if (!flag->ParseFrom(value, &error))
      return absl::InvalidArgumentError(absl::StrCat(env, "=", value, ": ", error));
    if (error = CheckAddressFlag(*flag, value); !error.empty())
      return absl::InvalidArgumentError(absl::StrCat(env, "=", value, ": ", error));
  }
  return absl::OkStatus();
}

std::string CheckCommandLine(int argc, char** argv) {
  // Names --undefok lets be unknown (absl ignores them).
  std::vector<std::string> undefok;
  for (int i = 1; i < argc; ++i) {
    absl::string_view arg(argv[i]);
    if (arg == "--") break;
    if (absl::ConsumePrefix(&arg, "--undefok=") || absl::ConsumePrefix(&arg, "-undefok="))
      for (absl::string_view name : absl::StrSplit(arg, ',', absl::SkipEmpty()))
        undefok.emplace_back(name);
  }
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    if (arg == "--") break;
    if (arg.size() < 2 || arg[0] != '-') continue;
    size_t start = arg[1] == '-' ? 2 : 1;
    size_t eq = arg.find('=');
    std::string name = arg.substr(start, eq == std::string::npos ? eq : eq - start);
    for (char& c : name)
      if (c == '-') c = '_';
    // absl's own flags (--help, --helpfull, --flagfile, ...) are not in the
    // registry.
    if (name.rfind("help", 0) == 0 || name == "version" || name == "flagfile" ||
        name == "fromenv" || name == "tryfromenv" || name == "undefok" || name == "only_check_args")
      continue;
    absl::CommandLineFlag* flag = absl::FindCommandLineFlag(name);
    if (flag == nullptr && name.rfind("no", 0) == 0 && eq == std::string::npos) {
      absl::CommandLineFlag* negated = absl::FindCommandLineFlag(name.substr(2));
      if (negated != nullptr && negated->IsOfType<bool>()) continue;
    }
    if (flag == nullptr) {
      const bool ok = absl::c_linear_search(undefok, name) ||
                      (name.rfind("no", 0) == 0 && absl::c_linear_search(undefok, name.substr(2)));
      if (ok) continue;
      return absl::StrCat("unknown flag ", arg);
    }
    if (eq == std::string::npos && flag->IsOfType<bool>()) continue;
    std::string value;
    if (eq != std::string::npos) {
      value = arg.substr(eq + 1);
    } else if (i + 1 < argc) {
      value = argv[++i];  // --name VALUE
    } else {
      return absl::StrCat("flag ", arg, " needs a value");
    }
    // Parsed into the flag itself (absl's own parse sets it again).
    std::string error;
    if (!flag->ParseFrom(value, &error)) return absl::StrCat("bad value for --", name, ": ", error);
    if (error = CheckAddressFlag(*flag, value); !error.empty())
      return absl::StrCat("bad value for --", name, ": ", error);
  }
  return "";
}

std::vector<char*> ParseFlagsWithEnvironment(
    int argc, char** argv, absl::string_view usage,
    std::initializer_list<absl::string_view> unused_flags) {
  absl::SetProgramUsageMessage(usage);
  absl::FlagsUsageConfig usage_config;
  usage_config.contains_help_flags = &IsGrpsFlagFile;
  usage_config.contains_helpshort_flags = &IsGrpsFlagFile;
  usage_config.normalize_filename = &FolderAndFile;
  absl::SetFlagsUsageConfig(usage_config);
  if (absl::Status s = SetFlagsFromEnvironment(); !s.ok()) {
    std::fprintf(stderr, "error: %s\n", std::string(s.message()).c_str());
    std::exit(2);
  }
  // Accept --result-json as well as --result_json.
  for (int i = 1; i < argc; ++i) {
    absl::string_view arg(argv[i]);
    if (arg == "--") break;
    if (arg.size() < 3 || arg.substr(0, 2) != "--") continue;
    for (char* p = argv[i] + 2; *p != '\0' && *p != '='; ++p)
      if (*p == '-') *p = '_';
  }
  if (const std::string unused = FirstFlagGiven(argc, argv, unused_flags); !unused.empty()) {
    const absl::string_view program(argv[0]);
    std::fprintf(stderr, "error: --%s is not used by %s\n", unused.c_str(),
                 std::string(program.substr(program.rfind('/') + 1)).c_str());
    std::exit(2);
  }
  if (const std::string problem = CheckCommandLine(argc, argv); !problem.empty()) {
    std::fprintf(stderr, "error: %s\n", problem.c_str());
    std::exit(2);
  }
  return absl::ParseCommandLine(argc, argv);
}

void InitDaemon(absl::string_view process_name) {
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
  auto logger = spdlog::stderr_color_mt(std::string(process_name));
  logger->set_pattern("[%Y-%m-%d %H:%M:%S.%e] [%n] [%^%l%$] %v");
  spdlog::set_default_logger(logger);
  spdlog::flush_every(std::chrono::seconds(1));
  KeepFreedMessageMemory();
}

bool KeepFreedMessageMemory() {
#ifdef __GLIBC__
  if (const char* tunables = std::getenv("GLIBC_TUNABLES");
      tunables != nullptr && absl::StrContains(tunables, "glibc.malloc."))
    return false;  // the operator's choice
  // Each fixed value also turns off glibc's own adjustment of both.
  // (mallopt answers 1 when it took the value.)
  return mallopt(M_MMAP_THRESHOLD, 32 << 20) == 1 &&
         mallopt(M_TRIM_THRESHOLD, kMaxMessageBytes) == 1;
#else
  return false;
#endif
}

absl::StatusOr<GrpcServer> StartGrpcServer(
    const std::string& address, const std::vector<grpc::Service*>& services,
    const ServerLimits& limits) {
  return StartGrpcServer(address, services, ProcessSecurity(), limits);
}

absl::StatusOr<GrpcServer> StartGrpcServer(
    const std::string& address, const std::vector<grpc::Service*>& services,
    const SecurityConfig& security, const ServerLimits& limits) {
  absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> credentials =
      MakeServerCredentials(security, address);
  if (!credentials.ok()) return credentials.status();
  grpc::EnableDefaultHealthCheckService(true);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  GrpcServer result;
  grpc::ServerBuilder builder;
  builder.AddListeningPort(address, *credentials, &result.port);
  builder.SetMaxReceiveMessageSize(limits.max_receive_bytes);
  result.quota = std::make_unique<grpc::ResourceQuota>("grps-server");
  result.quota->Resize(limits.memory_bytes);
  builder.SetResourceQuota(*result.quota);
  builder.SetMaxSendMessageSize(kMaxMessageBytes);
  // One listening socket: without this, gRPC's SO_REUSEPORT lets a second
  // server bind the same port and share its connections.
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  builder.AddChannelArgument(GRPC_ARG_HTTP2_STREAM_LOOKAHEAD_BYTES, kStreamWindowBytes);
  for (grpc::Service* s : services) builder.RegisterService(s);
  std::vector<std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>>
      interceptors;
  interceptors.push_back(MakeRoleInterceptorFactory(security));
  interceptors.push_back(MakeRefusalLogInterceptorFactory());
  interceptors.push_back(MakeRpcMetricsInterceptorFactory());
  builder.experimental().SetInterceptorCreators(std::move(interceptors));
  result.server = builder.BuildAndStart();
  // gRPC logs why above (its own words): a key that does not match its
  // certificate fails here too, not when the files are read.
  if (result.server == nullptr || result.port == 0)
    return absl::UnavailableError(
        absl::StrCat("cannot listen on ", address,
                     security.tls_cert_pem.empty()
                         ? " (port in use?)"
                         : " (port in use, or --tls_cert and --tls_key refused: a key of another "
                           "certificate; gRPC's line above says which)"));
  return result;
}

std::shared_ptr<grpc::Channel> MakeChannel(const std::string& target) {
  return MakeChannel(target, ProcessSecurity(), /*member_secret_source=*/true);
}

std::shared_ptr<grpc::Channel> MakeChannel(const std::string& target,
                                           const SecurityConfig& security,
                                           bool member_secret_source) {
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(kMaxMessageBytes);
  args.SetMaxSendMessageSize(kMaxMessageBytes);
  // Separate channels get separate TCP connections (see SPEC §8).
  args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
  args.SetInt(GRPC_ARG_HTTP2_STREAM_LOOKAHEAD_BYTES, kStreamWindowBytes);
  // A peer that comes back (a restarted coordinator or server) is dialled
  // again within kMaxReconnectBackoff of a refused attempt, not after
  // gRPC's default backoff, which grows to two minutes: a restarted
  // coordinator's grace for its members to reconnect counts on it. (The
  // time one attempt may take to connect stays gRPC's, 20 s: a TLS
  // handshake over a slow network must not be cut short.)
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS,
              static_cast<int>(absl::ToInt64Milliseconds(kMaxReconnectBackoff)));
  AddChannelSecurityArguments(security, &args);
  return grpc::experimental::CreateCustomChannelWithInterceptors(
      target, MakeChannelCredentials(security), args,
      MakeChannelInterceptors(security, member_secret_source));
}

absl::StatusOr<std::string> UnaryCallBytes(const std::shared_ptr<grpc::Channel>& channel,
                                           const std::string& method,
                                           const std::string& request_bytes,
                                           absl::Duration timeout) {
  grpc::GenericStub stub(channel);
  grpc::Slice slice(request_bytes);
  grpc::ByteBuffer request(&slice, 1), response;
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + timeout));
  // On a completion queue of its own, drained here: the call completes on
  // this thread (no hand-over to gRPC's executor).
  grpc::CompletionQueue queue;
  std::unique_ptr<grpc::GenericClientAsyncResponseReader> call =
      stub.PrepareUnaryCall(&context, method, request, &queue);
  call->StartCall();
  grpc::Status status;
  call->Finish(&response, &status, &queue);
  void* tag = nullptr;
  bool ok = false;
  queue.Next(&tag, &ok);
  queue.Shutdown();
  while (queue.Next(&tag, &ok)) {
  }
  if (!status.ok()) return ToAbsl(status);
  grpc::Slice reply;
  if (!response.TrySingleSlice(&reply).ok() && !response.DumpToSingleSlice(&reply).ok())
    return absl::InternalError(absl::StrCat("unreadable reply from ", method));
  return std::string(reinterpret_cast<const char*>(reply.begin()), reply.size());
}

namespace {

// A call's reactor that deletes itself once done (the calls of
// StartUnaryCall and StartOneMessageCall), with the hand-over to gRPC's
// threads those describe.
template <typename Reactor>
class OwnReactor : public Reactor {
 public:
  explicit OwnReactor(std::function<void(grpc::Status)> done) : done_(std::move(done)) {}

  // gRPC's last reaction: the reactor may go here.
  void OnDone(const grpc::Status& status) final {
    TakeOverFromGrpc(this);
    std::function<void(grpc::Status)> done = std::move(done_);
    delete this;
    done(status);
  }

 protected:
  void Launch() {
    HandOverToGrpc(this);
    this->StartCall();  // the last use of `this` on the calling thread
  }

 private:
  std::function<void(grpc::Status)> done_;
};

class UnaryCallReactor final : public OwnReactor<grpc::ClientUnaryReactor> {
 public:
  using OwnReactor::OwnReactor;
  void Start() { Launch(); }
};

class OneMessageCallReactor final
    : public OwnReactor<grpc::ClientBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>> {
 public:
  OneMessageCallReactor(std::function<void()> written, std::function<void(grpc::Status)> done)
      : OwnReactor(std::move(done)), written_(std::move(written)) {}

  void Start(const grpc::ByteBuffer* request, grpc::ByteBuffer* reply) {
    StartWriteLast(request, grpc::WriteOptions());
    StartRead(reply);
    Launch();
  }

  void OnWriteDone(bool /*ok*/) override {
    TakeOverFromGrpc(this);
    std::function<void()> written = std::move(written_);
    HandOverToGrpc(this);
    written();
  }
  // A reply that never came (the call failed) leaves `reply` empty: OnDone's
  // status says why.
  void OnReadDone(bool /*ok*/) override {}

 private:
  std::function<void()> written_;
};

}  // namespace

void StartUnaryCall(const std::function<void(grpc::ClientUnaryReactor*)>& bind,
                    std::function<void(grpc::Status)> done) {
  auto* reactor = new UnaryCallReactor(std::move(done));
  bind(reactor);
  reactor->Start();
}

void StartOneMessageCall(grpc::GenericStub* stub, grpc::ClientContext* context,
                         const std::string& method, const grpc::ByteBuffer* request,
                         grpc::ByteBuffer* reply, std::function<void()> written,
                         std::function<void(grpc::Status)> done) {
  auto* reactor = new OneMessageCallReactor(std::move(written), std::move(done));
  stub->PrepareBidiStreamingCall(context, method, grpc::StubOptions(), reactor);
  reactor->Start(request, reply);
}

absl::StatusOr<bool> IsServing(const std::shared_ptr<grpc::Channel>& channel,
                               absl::Duration timeout) {
  // grpc.health.v1.HealthCheckRequest{service: ""} is zero bytes; the reply
  // is HealthCheckResponse{status = 1 (SERVING) or 2 (NOT_SERVING)}.
  absl::StatusOr<std::string> reply =
      UnaryCallBytes(channel, "/grpc.health.v1.Health/Check", "", timeout);
  if (!reply.ok()) return reply.status();
  if (*reply == std::string("\x08\x01", 2)) return true;
  if (*reply == std::string("\x08\x02", 2)) return false;
  return absl::InternalError("unexpected health reply");
}

namespace {
std::atomic<bool> g_shutdown{false};
std::atomic<int> g_signals{0};
std::atomic<bool> g_leave_on_sigterm{false};
std::atomic<int64_t> g_leave_since_ns{0};  // CLOCK_MONOTONIC; 0: no leave asked

int64_t MonotonicNs() {
  struct timespec ts = {};
  clock_gettime(CLOCK_MONOTONIC, &ts);  // async-signal-safe
  return int64_t{ts.tv_sec} * 1000000000 + ts.tv_nsec + 1;  // never 0
}

void OnSignal(int signal) {
  if (signal == SIGTERM && g_leave_on_sigterm.load() && g_leave_since_ns.load() == 0) {
    g_leave_since_ns.store(MonotonicNs());
    return;
  }
  g_shutdown.store(true);
  g_signals.fetch_add(1);
}
}  // namespace

void ExitNow(int code) {
  if (auto logger = spdlog::default_logger()) logger->flush();
  std::fflush(nullptr);
  std::_Exit(code);
}

int UsableCores() {
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof(set), &set) == 0) return std::max(1, CPU_COUNT(&set));
  return std::max(1u, std::thread::hardware_concurrency());
}

double PeakRssMiB() {
  struct rusage usage = {};
  if (getrusage(RUSAGE_SELF, &usage) != 0) return 0;
  return static_cast<double>(usage.ru_maxrss) / 1024;  // Linux: KiB
}

void InstallShutdownHandlers() {
  struct sigaction sa = {};
  sa.sa_handler = OnSignal;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);
  signal(SIGPIPE, SIG_IGN);
}

void LeaveOnSigterm() { g_leave_on_sigterm.store(true); }

void InstallLeaveOnSigterm() {
  LeaveOnSigterm();
  struct sigaction sa = {};
  sa.sa_handler = OnSignal;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGTERM, &sa, nullptr);
}

bool LeaveRequested() { return g_leave_since_ns.load() != 0; }

bool ShutdownRequested() {
  if (g_shutdown.load()) return true;
  const int64_t since = g_leave_since_ns.load();
  return since != 0 && MonotonicNs() - since > absl::ToInt64Nanoseconds(kLeaveGrace);
}

int ShutdownSignals() { return g_signals.load(); }

void SleepUnlessShutdown(absl::Duration d) {
  const absl::Time until = absl::Now() + d;
  while (!ShutdownRequested() && absl::Now() < until)
    absl::SleepFor(std::min(absl::Milliseconds(50), until - absl::Now()));
}

absl::Status RetryTransient(const Backoff& policy,
                            const std::function<absl::Status()>& attempt) {
  const absl::Time give_up = absl::Now() + policy.give_up_after;
  absl::Duration backoff = policy.initial;
  while (true) {
    absl::Status status = attempt();
    const bool transient =
        absl::IsUnavailable(status) ||
        (policy.retry_deadline_exceeded && absl::IsDeadlineExceeded(status)) ||
        (policy.retry_resource_exhausted && absl::IsResourceExhausted(status)) ||
        (policy.retry_already_exists && absl::IsAlreadyExists(status));
    if (!transient || absl::Now() + backoff > give_up) return status;
    SleepUnlessShutdown(backoff);
    if (ShutdownRequested()) return absl::CancelledError("signal received");
    backoff = std::min(backoff * 2, policy.max);
  }
}

absl::string_view HostOf(absl::string_view address) {
  const size_t colon = address.rfind(':');
  return colon == absl::string_view::npos ? address : address.substr(0, colon);
}

bool IsLoopbackAddress(absl::string_view address) {
  const absl::string_view host = HostOf(address);
  return host == "localhost" || absl::StartsWith(host, "127.") || host == "[::1]" ||
         absl::StartsWith(host, "[::ffff:127.");
}

bool IsThisMachinesAddress(absl::string_view address) {
  if (IsLoopbackAddress(address)) return true;
  std::string host(HostOf(address));
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']')
    host = host.substr(1, host.size() - 2);
  // An IPv4 address written as IPv6 is compared as IPv4.
  if (absl::StartsWithIgnoreCase(host, "::ffff:") && host.find('.') != std::string::npos)
    host = host.substr(7);
  in_addr v4;
  in6_addr v6;
  const bool is_v4 = inet_pton(AF_INET, host.c_str(), &v4) == 1;
  const bool is_v6 = !is_v4 && inet_pton(AF_INET6, host.c_str(), &v6) == 1;
  if (!is_v4 && !is_v6) {
    // A name: this machine's own (what a server listening on every
    // interface advertises), not resolved.
    char name[256] = {};
    return !host.empty() && gethostname(name, sizeof(name) - 1) == 0 &&
           absl::EqualsIgnoreCase(host, name);
  }
  ifaddrs* interfaces = nullptr;
  if (getifaddrs(&interfaces) != 0) return false;
  bool mine = false;
  for (const ifaddrs* i = interfaces; i != nullptr && !mine; i = i->ifa_next) {
    if (i->ifa_addr == nullptr) continue;
    if (is_v4 && i->ifa_addr->sa_family == AF_INET)
      mine = reinterpret_cast<const sockaddr_in*>(i->ifa_addr)->sin_addr.s_addr == v4.s_addr;
    else if (is_v6 && i->ifa_addr->sa_family == AF_INET6)
      mine = std::memcmp(&reinterpret_cast<const sockaddr_in6*>(i->ifa_addr)->sin6_addr, &v6,
                         sizeof(v6)) == 0;
  }
  freeifaddrs(interfaces);
  return mine;
}

bool IsLoopbackPeer(absl::string_view peer) {
  if (absl::StartsWith(peer, "unix:")) return true;
  if (!absl::ConsumePrefix(&peer, "ipv4:") && !absl::ConsumePrefix(&peer, "ipv6:")) return false;
  // gRPC writes an IPv6 peer's brackets as %5B and %5D.
  return IsLoopbackAddress(
      absl::StrReplaceAll(peer, {{"%5B", "["}, {"%5D", "]"}, {"%5b", "["}, {"%5d", "]"}}));
}

std::string WithPort(const std::string& address, int port) {
  return absl::StrCat(HostOf(address), ":", port);
}

std::string QuoteUntrusted(absl::string_view text, size_t max_bytes) {
  if (text.size() <= max_bytes) return absl::CHexEscape(text);
  return absl::StrCat(absl::CHexEscape(text.substr(0, max_bytes)), "... (",
                      text.size(), " bytes)");
}

absl::Status ToAbsl(const grpc::Status& status) {
  return absl::Status(static_cast<absl::StatusCode>(status.error_code()),
                      status.error_message());
}

grpc::Status ToGrpc(const absl::Status& status) {
  return grpc::Status(static_cast<grpc::StatusCode>(status.code()),
                      std::string(status.message()));
}

}  // namespace grps
