#include "daemon/security.h"

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <sys/random.h>

#include <filesystem>
#include <map>
#include <utility>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "absl/synchronization/mutex.h"
#include "daemon/daemon.h"
#include "daemon/env.h"
#include "daemon/hand_over.h"
#include "daemon/refusal_log.h"
#include "grpcpp/security/auth_metadata_processor.h"
#include "spdlog/spdlog.h"

ABSL_FLAG(std::string, token, "",
          "the job's admin token (coordinator, servers, operators); every RPC "
          "but health checks must carry it or the worker token. Prefer the "
          "GRPS_TOKEN variable: a flag shows in the process list");
ABSL_FLAG(std::string, worker_token, "",
          "the job's worker token (GRPS_WORKER_TOKEN): workers present it; it "
          "cannot stop the job, checkpoint or register a server");
ABSL_FLAG(std::string, tls_cert, "",
          "PEM certificate chain this process presents (serving; and as a "
          "client with mutual TLS)");
ABSL_FLAG(std::string, tls_key, "", "PEM private key of --tls_cert");
ABSL_FLAG(std::string, tls_ca, "",
          "PEM CA certificates that sign the peers' certificates (clients "
          "verify servers with it; servers verify clients with --tls_client_auth)");
ABSL_FLAG(bool, tls_client_auth, false,
          "mutual TLS: serving ports require a client certificate signed by "
          "--tls_ca");
ABSL_FLAG(std::string, tls_server_name, "",
          "the name to check in the servers' certificates instead of the "
          "host of the address dialled");

namespace grps {
namespace {

// The call's role, as GiveRole writes it into the call's own metadata
// (a caller's header of that name is dropped first).
constexpr char kRoleHeader[] = "grps-role";
constexpr char kAdminRole[] = "admin";
constexpr char kWorkerRole[] = "worker";
constexpr char kMemberSecretHeader[] = "grps-member-secret";
constexpr char kHealthPathPrefix[] = "/grpc.health.v1.Health/";

SecurityConfig& MutableProcessSecurity() {
  static SecurityConfig* config = new SecurityConfig();
  return *config;
}

ABSL_CONST_INIT absl::Mutex g_secret_mu(absl::kConstInit);
std::string& MemberSecretStorage() ABSL_EXCLUSIVE_LOCKS_REQUIRED(g_secret_mu) {
  static std::string* secret = new std::string();
  return *secret;
}

bool ConstantTimeEquals(absl::string_view a, absl::string_view b) {
  if (a.size() != b.size()) return false;
  return CRYPTO_memcmp(a.data(), b.data(), a.size()) == 0;
}

absl::StatusOr<std::string> ReadPem(const std::string& path, const char* flag) {
  if (path.empty()) return std::string();
  absl::StatusOr<std::string> text = Env::Default()->ReadFile(path);
  if (!text.ok())
    return absl::InvalidArgumentError(
        absl::StrCat("--", flag, "=", path, ": ", text.status().message()));
  if (!absl::StrContains(*text, "-----BEGIN "))
    return absl::InvalidArgumentError(
        absl::StrCat("--", flag, "=", path, ": not a PEM file"));
  return text;
}

// The job's two tokens and the role each earns.
struct TokenRoles {
  std::string admin_token;
  std::string worker_token;

  // kAdminRole, kWorkerRole, or nullptr for any other token (compared in
  // constant time).
  const char* RoleOf(absl::string_view token) const {
    if (ConstantTimeEquals(token, admin_token)) return kAdminRole;
    if (!worker_token.empty() && ConstantTimeEquals(token, worker_token))
      return kWorkerRole;
    return nullptr;
  }

  // The role of a call whose metadata carries exactly one "authorization:
  // Bearer <token>" header with one of the job's tokens; UNAUTHENTICATED,
  // saying why, otherwise. The one check the processor (which refuses) and
  // GiveRole (which tells the handlers) both apply.
  grpc::Status RoleOfCall(const std::multimap<grpc::string_ref, grpc::string_ref>& metadata,
                          const char** role) const {
    *role = nullptr;
    const grpc::string_ref key("authorization");
    auto header = metadata.find(key);
    if (header == metadata.end())
      return grpc::Status(grpc::StatusCode::UNAUTHENTICATED,
                          "no bearer token (authorization: Bearer <token>)");
    if (metadata.count(key) > 1)
      return grpc::Status(grpc::StatusCode::UNAUTHENTICATED,
                          "more than one authorization header");
    absl::string_view value(header->second.data(), header->second.size());
    if (!absl::ConsumePrefix(&value, "Bearer "))
      return grpc::Status(grpc::StatusCode::UNAUTHENTICATED,
                          "the authorization header is not 'Bearer <token>'");
    *role = RoleOf(value);
    if (*role == nullptr)
      return grpc::Status(grpc::StatusCode::UNAUTHENTICATED, "wrong bearer token");
    return grpc::Status::OK;
  }
};

// Refuses every call without a known token, but health checks. Per call:
// gRPC hands it the connection's AuthContext, which it only reads.
class TokenProcessor : public grpc::AuthMetadataProcessor {
 public:
  TokenProcessor(std::string admin_token, std::string worker_token)
      : tokens_{std::move(admin_token), std::move(worker_token)} {}

  bool IsBlocking() const override { return false; }

  grpc::Status Process(const InputMetadata& metadata, grpc::AuthContext* context,
                       OutputMetadata* consumed, OutputMetadata* response) override {
    grpc::Status status = Check(tokens_, metadata);
    if (!status.ok()) {
      auto path = metadata.find(":path");
      RefusalLog::Process().Note(
          path == metadata.end() ? absl::string_view("?")
                                 : absl::string_view(path->second.data(), path->second.size()),
          status.error_code(), PeerOf(*context), status.error_message());
    }
    return status;
  }

 private:
  // Who the caller is, as far as the token check can tell: gRPC gives it
  // the transport's security properties, not the caller's address. With
  // mutual TLS, the common name of the client's certificate.
  static std::string PeerOf(const grpc::AuthContext& context) {
    const std::vector<grpc::string_ref> names =
        context.FindPropertyValues(GRPC_X509_CN_PROPERTY_NAME);
    if (!names.empty())
      return absl::StrCat("certificate CN=", absl::string_view(names.front().data(),
                                                                names.front().size()));
    return "a caller (address unknown to the token check)";
  }

  static grpc::Status Check(const TokenRoles& tokens, const InputMetadata& metadata) {
    auto path = metadata.find(":path");
    if (path != metadata.end() &&
        absl::StartsWith(absl::string_view(path->second.data(), path->second.size()),
                         kHealthPathPrefix))
      return grpc::Status::OK;
    // Nothing is written to the AuthContext: it is the connection's, shared
    // by every call on it (GiveRole gives each call its role), and
    // the header stays in the call's metadata for GiveRole to read.
    const char* role = nullptr;
    return tokens.RoleOfCall(metadata, &role);
  }

  const TokenRoles tokens_;
};

// Gives each call its own role: drops any grps-role header the caller sent
// and adds the one its bearer token earns (every caller is an admin when
// authentication is off). TokenProcessor has refused every call with a
// wrong token before this runs. The header lives in the call's metadata
// map, which gRPC frees with the call, and the values are string literals:
// nothing is shared between calls and nothing grows.
// (HandedOver: gRPC makes, runs and deletes an interceptor on whichever of
// its threads the call is on; CI's TSan run once reported its delete on
// another thread than its new.)
struct GiveRole {
  const TokenRoles* tokens;  // owned by the factory, which outlives calls
  bool auth_enabled;

  void operator()(grpc::experimental::InterceptorBatchMethods* methods) const {
    if (!methods->QueryInterceptionHookPoint(
            grpc::experimental::InterceptionHookPoints::POST_RECV_INITIAL_METADATA))
      return;
    std::multimap<grpc::string_ref, grpc::string_ref>* metadata = methods->GetRecvInitialMetadata();
    metadata->erase(grpc::string_ref(kRoleHeader));
    const char* role = kAdminRole;
    if (auth_enabled) tokens->RoleOfCall(*metadata, &role).IgnoreError();
    if (role != nullptr) metadata->emplace(kRoleHeader, role);
  }
};

class RoleInterceptorFactory
    : public grpc::experimental::ServerInterceptorFactoryInterface {
 public:
  explicit RoleInterceptorFactory(const SecurityConfig& config)
      : tokens_{config.admin_token, config.worker_token},
        auth_enabled_(config.auth_enabled()) {}
  grpc::experimental::Interceptor* CreateServerInterceptor(
      grpc::experimental::ServerRpcInfo*) override {
    return new HandedOver<GiveRole>(GiveRole{&tokens_, auth_enabled_});
  }

 private:
  const TokenRoles tokens_;
  const bool auth_enabled_;
};

// Adds the bearer token and, when set, the process's member secret to every
// call of a channel. (An interceptor, not call credentials: those need
// secure channel credentials, and LOCAL_TCP's stall the odd connection for a
// second.)
class TokenInterceptor : public grpc::experimental::Interceptor {
 public:
  TokenInterceptor(const std::string* header, bool member_secret_source)
      : header_(header), member_secret_source_(member_secret_source) {}

  void Intercept(grpc::experimental::InterceptorBatchMethods* methods) override {
    if (methods->QueryInterceptionHookPoint(
            grpc::experimental::InterceptionHookPoints::PRE_SEND_INITIAL_METADATA)) {
      std::multimap<std::string, std::string>* metadata = methods->GetSendInitialMetadata();
      metadata->insert({"authorization", *header_});
      if (member_secret_source_) {
        absl::MutexLock lock(&g_secret_mu);
        const std::string& secret = MemberSecretStorage();
        if (!secret.empty()) metadata->insert({kMemberSecretHeader, secret});
      }
    }
    methods->Proceed();
  }

 private:
  const std::string* const header_;  // owned by the factory, which outlives calls
  const bool member_secret_source_;
};

class TokenInterceptorFactory
    : public grpc::experimental::ClientInterceptorFactoryInterface {
 public:
  TokenInterceptorFactory(const std::string& token, bool member_secret_source)
      : header_(absl::StrCat("Bearer ", token)),
        member_secret_source_(member_secret_source) {}
  grpc::experimental::Interceptor* CreateClientInterceptor(
      grpc::experimental::ClientRpcInfo*) override {
    return new TokenInterceptor(&header_, member_secret_source_);
  }

 private:
  const std::string header_;
  const bool member_secret_source_;
};

}  // namespace

absl::Status CheckToken(absl::string_view token, absl::string_view flag) {
  if (token.size() > kMaxTokenBytes)
    return absl::InvalidArgumentError(
        absl::StrCat("--", flag, " is ", token.size(), " bytes, past the ", kMaxTokenBytes,
                     " a call's headers carry"));
  for (size_t i = 0; i < token.size(); ++i) {
    const unsigned char c = static_cast<unsigned char>(token[i]);
    if (c < 0x20 || c > 0x7e)
      return absl::InvalidArgumentError(absl::StrCat(
          "--", flag, " holds byte ", i, " of value ", static_cast<int>(c),
          c == '\n' || c == '\r' ? " (a line end: a token read from a file keeps its last one; "
                                   "strip it)"
                                   : "",
          ": a token is printable ASCII (it travels in a call's header)"));
  }
  return absl::OkStatus();
}

absl::StatusOr<SecurityConfig> SecurityConfigFromFlags(Role own_role) {
  SecurityConfig config;
  config.admin_token = absl::GetFlag(FLAGS_token);
  config.worker_token = absl::GetFlag(FLAGS_worker_token);
  if (absl::Status s = CheckToken(config.admin_token, "token"); !s.ok()) return s;
  if (absl::Status s = CheckToken(config.worker_token, "worker_token"); !s.ok()) return s;
  if (!config.admin_token.empty() && config.admin_token == config.worker_token)
    return absl::InvalidArgumentError(
        "--token and --worker_token must differ (the roles would be one)");
  // A process presents its own role's token, or the other one it was given.
  const bool worker_first = own_role == Role::kWorker;
  config.call_token = worker_first ? config.worker_token : config.admin_token;
  if (config.call_token.empty())
    config.call_token = worker_first ? config.admin_token : config.worker_token;
  absl::StatusOr<std::string> cert = ReadPem(absl::GetFlag(FLAGS_tls_cert), "tls_cert");
  if (!cert.ok()) return cert.status();
  absl::StatusOr<std::string> key = ReadPem(absl::GetFlag(FLAGS_tls_key), "tls_key");
  if (!key.ok()) return key.status();
  absl::StatusOr<std::string> ca = ReadPem(absl::GetFlag(FLAGS_tls_ca), "tls_ca");
  if (!ca.ok()) return ca.status();
  if (cert->empty() != key->empty())
    return absl::InvalidArgumentError("--tls_cert and --tls_key go together");
  config.tls_cert_pem = *std::move(cert);
  config.tls_key_pem = *std::move(key);
  config.tls_ca_pem = *std::move(ca);
  config.tls_require_client_cert = absl::GetFlag(FLAGS_tls_client_auth);
  if (config.tls_require_client_cert && config.tls_ca_pem.empty())
    return absl::InvalidArgumentError(
        "--tls_client_auth needs --tls_ca to verify the clients' certificates");
  config.tls_server_name = absl::GetFlag(FLAGS_tls_server_name);
  return config;
}

absl::Status InitProcessSecurity(Role own_role, bool serves) {
  absl::StatusOr<SecurityConfig> config = SecurityConfigFromFlags(own_role);
  if (!config.ok()) return config.status();
  if (serves && !config->auth_enabled())
    spdlog::warn("authentication is off: anyone who can reach this process's "
                 "port may act on the job (set GRPS_TOKEN; see docs/security.md)");
  SetProcessSecurity(*std::move(config));
  return absl::OkStatus();
}

std::string TlsHint(absl::string_view error, const SecurityConfig& caller) {
  if (!absl::StrContains(error, "Socket closed")) return "";
  if (!caller.tls_enabled())
    return " (a server that speaks TLS closes a plaintext connection: give --tls_ca)";
  if (caller.tls_cert_pem.empty())
    return " (a server that requires client certificates closes a connection without one: "
           "give --tls_cert and --tls_key)";
  return "";
}

void SetProcessSecurity(SecurityConfig config) {
  MutableProcessSecurity() = std::move(config);
}

const SecurityConfig& ProcessSecurity() { return MutableProcessSecurity(); }

void SetMemberSecret(std::string secret) {
  absl::MutexLock lock(&g_secret_mu);
  MemberSecretStorage() = std::move(secret);
}

absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> MakeServerCredentials(
    const SecurityConfig& config, absl::string_view address) {
  if (!config.worker_token.empty() && config.admin_token.empty())
    return absl::InvalidArgumentError(
        "--worker_token needs --token (the admin token) as well");
  std::shared_ptr<grpc::ServerCredentials> credentials;
  if (!config.tls_cert_pem.empty()) {
    grpc::SslServerCredentialsOptions options(
        config.tls_require_client_cert
            ? GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY
            : GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE);
    options.pem_root_certs = config.tls_ca_pem;
    options.pem_key_cert_pairs.push_back({config.tls_key_pem, config.tls_cert_pem});
    credentials = grpc::SslServerCredentials(options);
  } else if (config.auth_enabled()) {
    if (!IsLoopbackAddress(address))
      return absl::InvalidArgumentError(absl::StrCat(
          "a token without TLS is only accepted on a loopback address, not ",
          address, " (anyone on the network could read it): give --tls_cert "
          "and --tls_key, or listen on 127.0.0.1"));
    // Plaintext like InsecureServerCredentials, but it takes an
    // AuthMetadataProcessor (and accepts loopback peers only).
    credentials = grpc::experimental::LocalServerCredentials(LOCAL_TCP);
  } else {
    if (!config.tls_ca_pem.empty())
      return absl::InvalidArgumentError("--tls_ca without --tls_cert: a serving "
                                        "process needs its own certificate");
    return grpc::InsecureServerCredentials();
  }
  if (config.auth_enabled())
    credentials->SetAuthMetadataProcessor(
        std::make_shared<TokenProcessor>(config.admin_token, config.worker_token));
  return credentials;
}

std::shared_ptr<grpc::ChannelCredentials> MakeChannelCredentials(
    const SecurityConfig& config) {
  if (!config.tls_enabled()) return grpc::InsecureChannelCredentials();
  grpc::SslCredentialsOptions options;
  options.pem_root_certs = config.tls_ca_pem;
  options.pem_private_key = config.tls_key_pem;
  options.pem_cert_chain = config.tls_cert_pem;
  return grpc::SslCredentials(options);
}

std::vector<std::unique_ptr<grpc::experimental::ClientInterceptorFactoryInterface>>
MakeChannelInterceptors(const SecurityConfig& config, bool member_secret_source) {
  std::vector<std::unique_ptr<grpc::experimental::ClientInterceptorFactoryInterface>> out;
  if (!config.call_token.empty())
    out.push_back(
        std::make_unique<TokenInterceptorFactory>(config.call_token, member_secret_source));
  return out;
}

void AddChannelSecurityArguments(const SecurityConfig& config,
                                 grpc::ChannelArguments* args) {
  if (config.tls_enabled() && !config.tls_server_name.empty())
    args->SetSslTargetNameOverride(config.tls_server_name);
}

std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>
MakeRoleInterceptorFactory(const SecurityConfig& config) {
  return std::make_unique<RoleInterceptorFactory>(config);
}

grpc::Status RequireRole(const grpc::ServerContextBase& context, Role needed) {
  const auto& metadata = context.client_metadata();
  auto it = metadata.find(grpc::string_ref(kRoleHeader));
  // No role: a server built without MakeRoleInterceptorFactory. Refuse
  // rather than trust.
  if (it == metadata.end())
    return grpc::Status(grpc::StatusCode::PERMISSION_DENIED,
                        "this server gives calls no role");
  const absl::string_view role(it->second.data(), it->second.size());
  if (role == kAdminRole || (needed == Role::kWorker && role == kWorkerRole))
    return grpc::Status::OK;
  return grpc::Status(grpc::StatusCode::PERMISSION_DENIED,
                      "this call needs the admin token; the worker token may not make it");
}

std::string CallerMemberSecret(const grpc::ServerContextBase& context) {
  const auto& metadata = context.client_metadata();
  auto it = metadata.find(kMemberSecretHeader);
  if (it == metadata.end()) return "";
  return std::string(it->second.data(), it->second.size());
}

std::string MemberKey(absl::string_view admin_token) {
  if (admin_token.empty()) return "";
  unsigned char out[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  constexpr absl::string_view kLabel = "grps member key v1";
  HMAC(EVP_sha256(), admin_token.data(), static_cast<int>(admin_token.size()),
       reinterpret_cast<const unsigned char*>(kLabel.data()), kLabel.size(), out, &len);
  return std::string(reinterpret_cast<const char*>(out), len);
}

std::string MemberSecret(absl::string_view key, absl::string_view job_id,
                         MemberKind kind, uint32_t index, uint64_t incarnation) {
  if (key.empty()) return "";
  // Length-prefixed job id: no two (job, kind, index, incarnation) share a
  // message.
  const std::string message =
      absl::StrCat(job_id.size(), ":", job_id, "/",
                   kind == MemberKind::kWorker ? "worker" : "server", "/", index,
                   "/", incarnation);
  unsigned char out[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  HMAC(EVP_sha256(), key.data(), static_cast<int>(key.size()),
       reinterpret_cast<const unsigned char*>(message.data()), message.size(), out,
       &len);
  return absl::BytesToHexString(
      absl::string_view(reinterpret_cast<const char*>(out), 16));
}

grpc::Status CheckMemberSecret(absl::string_view key, absl::string_view job_id,
                               MemberKind kind, uint32_t index,
                               uint64_t incarnation, absl::string_view presented) {
  if (key.empty()) return grpc::Status::OK;
  const std::string expected = MemberSecret(key, job_id, kind, index, incarnation);
  if (ConstantTimeEquals(presented, expected)) return grpc::Status::OK;
  return grpc::Status(
      grpc::StatusCode::UNAUTHENTICATED,
      absl::StrCat(presented.empty() ? "no member secret" : "wrong member secret",
                   " for ", kind == MemberKind::kWorker ? "worker " : "shard ", index,
                   " incarnation ", incarnation,
                   ": only the member that registered may act as it"));
}

std::vector<std::string> TlsFlagsToPassOn() {
  std::vector<std::string> flags;
  for (const auto& [name, path] :
       {std::pair<const char*, std::string>{"tls_cert", absl::GetFlag(FLAGS_tls_cert)},
        {"tls_key", absl::GetFlag(FLAGS_tls_key)},
        {"tls_ca", absl::GetFlag(FLAGS_tls_ca)}})
    if (!path.empty())
      flags.push_back(absl::StrCat(
          "--", name, "=", std::filesystem::absolute(path).lexically_normal().string()));
  if (absl::GetFlag(FLAGS_tls_client_auth)) flags.push_back("--tls_client_auth");
  if (const std::string name = absl::GetFlag(FLAGS_tls_server_name); !name.empty())
    flags.push_back(absl::StrCat("--tls_server_name=", name));
  return flags;
}

std::string RandomHexToken(size_t bytes) {
  std::string raw(bytes, '\0');
  size_t filled = 0;
  while (filled < bytes) {
    ssize_t n = getrandom(raw.data() + filled, bytes - filled, 0);
    if (n > 0) filled += static_cast<size_t>(n);
  }
  return absl::BytesToHexString(raw);
}

}  // namespace grps
