// Who may reach a grps port and how they prove it: TLS on every gRPC port
// (server certificates, optional mutual TLS), a bearer token checked on every
// RPC but gRPC health checks, roles, and per-member secrets.
//
// Roles. The job has two tokens: the admin token (`--token`, GRPS_TOKEN),
// held by the coordinator, the servers and operators (grpsctl), and the
// worker token (`--worker_token`, GRPS_WORKER_TOKEN), held by workers. A call
// that carries neither is refused with UNAUTHENTICATED before any handler
// runs; handlers then check the role with RequireRole (a worker's token cannot
// stop the job or register a server). The role is decided for each call from
// that call's token; nothing about it is kept on the connection.
//
// Member secrets. Registration returns a secret bound to (job, member kind,
// rank or shard, incarnation), never shown in any status; a push, heartbeat or
// WorkerDone acting as a rank must carry its secret (metadata
// `grps-member-secret`), so a holder of the worker token cannot act as
// another worker. The secrets are HMAC-SHA256 values under a member key
// derived from the admin token, so a restarted coordinator derives the same
// ones, and servers (given the key at registration) check pushes without a
// round trip.
//
// Plaintext. With a token but no TLS, a daemon listens on loopback only (a
// token sent in clear over a network is anyone's): StartGrpcServer refuses
// other addresses. With no token at all, authentication is off and every
// caller is trusted (a warning says so).
#ifndef GRPS_DAEMON_SECURITY_H_
#define GRPS_DAEMON_SECURITY_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "grpcpp/grpcpp.h"
#include "grpcpp/support/client_interceptor.h"
#include "grpcpp/support/server_interceptor.h"

namespace grps {

enum class Role {
  kWorker = 1,  // register as a worker, push, pull, heartbeat, read status
  kAdmin = 2,   // all of the above, register servers, stop, checkpoint
};

// A process's security settings: what it accepts when it serves and what it
// presents when it calls. Plain values (PEM texts, not paths) so that tests
// can build one without files.
struct SecurityConfig {
  // Tokens accepted from callers, by role. Authentication is on when
  // admin_token is set.
  std::string admin_token;
  std::string worker_token;
  // The token this process sends on its own calls (empty: none).
  std::string call_token;
  // TLS, PEM. Serving needs cert and key; calling needs ca (to verify the
  // servers) and, for mutual TLS, cert and key.
  std::string tls_cert_pem;
  std::string tls_key_pem;
  std::string tls_ca_pem;
  bool tls_require_client_cert = false;  // mutual TLS on serving ports
  // Name checked against the servers' certificates instead of the host part
  // of the target (for certificates issued for a DNS name).
  std::string tls_server_name;

  bool auth_enabled() const { return !admin_token.empty(); }
  bool tls_enabled() const { return !tls_ca_pem.empty() || !tls_cert_pem.empty(); }
};

// The most bytes a token may have: it travels in every call's headers
// (gRPC refuses headers past 8 KiB in all).
inline constexpr size_t kMaxTokenBytes = 4096;

// OK unless `token` (the value of --`flag`) cannot travel in a call's
// header: past kMaxTokenBytes, or a byte that is not printable ASCII (a
// line end, a UTF-8 letter). gRPC aborts the process that sends such a
// header. INVALID_ARGUMENT naming the flag and the byte.
absl::Status CheckToken(absl::string_view token, absl::string_view flag);

// Reads the security flags (--token, --worker_token, --tls_cert, --tls_key,
// --tls_ca, --tls_client_auth, --tls_server_name, or their GRPS_* variables)
// and the files they name. A process of `own_role` presents its role's token
// (a worker: --worker_token, or --token when that is unset). Each token is
// checked (CheckToken).
absl::StatusOr<SecurityConfig> SecurityConfigFromFlags(Role own_role);

// SecurityConfigFromFlags, then SetProcessSecurity: what every main does
// right after parsing its flags. A process that `serves` warns when
// authentication is off.
absl::Status InitProcessSecurity(Role own_role, bool serves);

// What a failed call's `error` may mean about TLS, for the message that
// reports it ("" when nothing): a server that speaks TLS closes a plaintext
// connection, and one that requires client certificates a connection
// without one, and the caller sees only "Socket closed".
std::string TlsHint(absl::string_view error, const SecurityConfig& caller);

// The settings StartGrpcServer and MakeChannel use when given none. Set once
// at start-up, before any server or channel exists (not thread-safe
// against concurrent readers).
void SetProcessSecurity(SecurityConfig config);
const SecurityConfig& ProcessSecurity();

// The member secret this process sends on every later call of every
// channel made with the process's settings (after its registration).
// Thread-safe.
void SetMemberSecret(std::string secret);

// Credentials for serving with `config` on `address`. Fails when a token is
// set without TLS and `address` is not a loopback address.
absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> MakeServerCredentials(
    const SecurityConfig& config, absl::string_view address);

// Credentials, interceptors (the token; with `member_secret_source`, the
// process's member secret too) and channel arguments for calling with
// `config`.
std::shared_ptr<grpc::ChannelCredentials> MakeChannelCredentials(
    const SecurityConfig& config);
std::vector<std::unique_ptr<grpc::experimental::ClientInterceptorFactoryInterface>>
MakeChannelInterceptors(const SecurityConfig& config, bool member_secret_source);
void AddChannelSecurityArguments(const SecurityConfig& config,
                                 grpc::ChannelArguments* args);

// The server interceptor that gives each call its role, from that call's own
// bearer token (never from its connection: two calls on one connection with
// different tokens get different roles). Every server serving with `config`
// installs it (StartGrpcServer does).
std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>
MakeRoleInterceptorFactory(const SecurityConfig& config);

// OK when the caller of `context` holds `needed` (or any role above it);
// PERMISSION_DENIED otherwise. Always OK when authentication is off.
// Reads the role MakeRoleInterceptorFactory's interceptor gave the call; a
// call with none (a server without it) is refused.
grpc::Status RequireRole(const grpc::ServerContextBase& context, Role needed);

// The member secret the caller sent, or "" when none.
std::string CallerMemberSecret(const grpc::ServerContextBase& context);

// Member secrets: `key` from MemberKey(admin_token) (empty when
// authentication is off, and then every secret matches).
std::string MemberKey(absl::string_view admin_token);
enum class MemberKind { kWorker, kServer };
std::string MemberSecret(absl::string_view key, absl::string_view job_id,
                         MemberKind kind, uint32_t index, uint64_t incarnation);
// OK when `presented` is the secret of (kind, index, incarnation), or the key
// is empty; UNAUTHENTICATED otherwise (compared in constant time).
grpc::Status CheckMemberSecret(absl::string_view key, absl::string_view job_id,
                               MemberKind kind, uint32_t index,
                               uint64_t incarnation, absl::string_view presented);

// The TLS flags this process was given, as "--tls_...=value" with absolute
// paths, to pass on to the daemons a launcher starts.
std::vector<std::string> TlsFlagsToPassOn();

// `bytes` random bytes from the kernel, as lowercase hex (tokens).
std::string RandomHexToken(size_t bytes = 32);

}  // namespace grps

#endif  // GRPS_DAEMON_SECURITY_H_
