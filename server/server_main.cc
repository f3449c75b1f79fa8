// grps-server: one parameter shard.
//
// Listens first (so it knows its port), registers with the coordinator,
// builds its ShardStore from the job config and shard map it gets back, then
// heartbeats until the job ends. Its chunks start from the restore order the
// coordinator hands out (a checkpoint, or the initial values); heartbeat
// replies may ask it to checkpoint (written on a thread of its own) or to
// roll back to a checkpoint (docs/durability.md). The shard's life is
// ShardAgent's (shard_agent.h, with RegisterAndLoad); this file parses the
// flags, serves the gRPC service and its metrics, and wires them together.
//
// Jobs whose servers scale (JobConfig.max_servers; docs/elasticity.md): a
// server for a shard the job's map does not have yet stands by, registering
// without a time limit until the job scales to include the shard. A
// re-sharding (a map that places the chunks on another shard count, with a
// roll-back to the cut) rebuilds the store for the new map from the cut, or
// retires a shard the new map does not have.
//
// grps-server --serve is the lookup service instead (lookup_service.h,
// served_rows.h): no job, no coordinator; the rows of a job's sparse tables
// from the checkpoints in --checkpoint_dir, for inference, until SIGINT or
// SIGTERM (exit 0; 1 when it cannot start).
//
// Exit status: 0 when the job completes or is stopped, when a re-sharding
// retires the shard, or on SIGINT/SIGTERM;
// 1 when it cannot start (bad flags, no coordinator within a minute, an
// invalid job, an unreadable checkpoint), when the job failed, when another
// server took its shard over, or when the coordinator was silent for the
// job's coordinator_timeout_ms.
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "daemon/daemon.h"
#include "grpcpp/health_check_service_interface.h"
#include "daemon/env.h"
#include "daemon/metrics.h"
#include "job/job_config.h"
#include "job/shard_map.h"
#include "member/member_agent.h"
#include "member/member_flags.h"
#include "proto/grps.grpc.pb.h"
#include "server/lookup_service.h"
#include "server/parameter_server_service.h"
#include "server/shard_metrics.h"
#include "server/shard_agent.h"
#include "server/shard_restore.h"
#include "server/served_rows.h"
#include "server/shard_store.h"
#include "spdlog/spdlog.h"

ABSL_FLAG(std::string, coordinator, "",
          "host:port of the coordinator (required)");
ABSL_FLAG(std::string, listen, "127.0.0.1:0",
          "host:port to serve Push/Pull on; port 0 picks a free port");
ABSL_FLAG(std::string, advertise_host, "",
          "host name workers use to reach this server (default: the host of "
          "--listen, or this machine's host name when that is a wildcard)");
ABSL_FLAG(std::string, advertise_address, "",
          "host:port workers use to reach this server, when it is not the listen "
          "port (a proxy or a forwarded port in front of it); overrides "
          "--advertise_host");
ABSL_FLAG(int32_t, shard, -1, "shard to serve; -1 takes any free shard");
ABSL_FLAG(std::string, port_file, "",
          "if set, the bound port is written here (atomically) once listening");
ABSL_FLAG(std::string, checkpoint_dir, "",
          "with per-shard checkpoint storage (the coordinator's "
          "--checkpoint_storage=per_shard): where this server keeps its shard's "
          "checkpoint files; empty: the job's --checkpoint_dir, on this server's own "
          "volume. Must be empty or the job's folder with shared storage. With "
          "--serve: the job's checkpoint folder (shared storage) to serve from");
ABSL_FLAG(bool, serve, false,
          "serve lookups of the sparse tables' rows for inference (proto/lookup.proto), "
          "read-only, from the newest checkpoint in --checkpoint_dir, following the job's "
          "new checkpoints as they appear (increments applied as they come); no "
          "coordinator, no shard of a job");
ABSL_FLAG(uint32_t, serve_poll_ms, 200,
          "with --serve: how often to look for a newer checkpoint, in ms (1..60000)");
ABSL_FLAG(uint32_t, grpc_memory_mib, 0,
          "what gRPC may hold for this server's calls at once, in MiB, at least 64 (a "
          "message of the port's largest must fit); a push that would go past it is "
          "refused with RESOURCE_EXHAUSTED while it arrives, and sent again. "
          "0: derived from the shard (64 MiB + 4 x workers x its largest push)");

namespace grps {
namespace {

constexpr absl::Duration kShutdownGrace = absl::Seconds(2);

// What gRPC may hold for the calls of a shard of `num_elements` values:
// every worker's push four times over (a push in flight, retries, a fused
// pull's reply) at 8 bytes a value (the largest push, a sparse one of f32
// values and u32 indices), and 64 MiB for everything else.
size_t ServerMemoryBytes(uint64_t num_elements, uint32_t num_workers) {
  if (const uint32_t mib = absl::GetFlag(FLAGS_grpc_memory_mib); mib > 0)
    return size_t{mib} << 20;
  return kDefaultServerMemoryBytes + size_t{4} * num_workers * 8 * num_elements;
}

// The address other processes use to reach this server.
std::string AdvertisedAddress(const std::string& listen, int port) {
  if (std::string address = absl::GetFlag(FLAGS_advertise_address); !address.empty())
    return address;
  std::string host = absl::GetFlag(FLAGS_advertise_host);
  if (host.empty()) {
    const size_t colon = listen.rfind(':');
    host = colon == std::string::npos ? listen : listen.substr(0, colon);
    if (host.empty() || host == "0.0.0.0" || host == "[::]" || host == "::") {
      char name[256] = {};
      host = gethostname(name, sizeof(name) - 1) == 0 ? name : "localhost";
    }
  }
  return absl::StrCat(host, ":", port);
}

// What the shard serves, once it does, and what it restored (`held`: its
// status before it served).
void LogServing(const ShardStore& store, const v1::ShardStatus& held,
                const v1::RegisterServerResponse& registration, const std::string& address,
                size_t memory) {
  const v1::JobConfig& config = store.config();
  spdlog::info(
      "shard {} of {} serving {} chunks ({} elements, {:.2f} MiB) at {} "
      "(job {}, mode {}, incarnation {}; gRPC may hold {:.0f} MiB)",
      store.shard(), config.num_servers(), held.num_chunks(), held.num_elements(),
      BytesInMiB(held.num_elements() * sizeof(float)), address, config.job_id(),
      ModeName(config.mode()), registration.incarnation(), BytesInMiB(memory));
  const v1::RestoreOrder& order = registration.restore();
  if (order.checkpoint_id() == 0) return;
  uint64_t rows = 0;
  for (const v1::SparseTableStatus& t : held.tables()) rows += t.rows();
  spdlog::info("shard {} restored {} chunks{} from checkpoint {} at step {} (generation {}); "
               "counts restored: {}",
               store.shard(), held.num_chunks(),
               held.tables_size() > 0 ? absl::StrCat(" and ", rows, " sparse rows") : "",
               order.checkpoint_id(), order.step(), order.generation(), StateCounts(held));
}

// The shard's last word: why it ends, and what it did.
void LogExit(uint32_t shard, const v1::ShardStatus& s, const std::string& reason) {
  spdlog::info(
      "shard {} exiting ({}): version {}, {} updates, {} pushes ({} "
      "duplicate, {} too stale, {} rejected, {} rung at lane doorbells), {} pulls, {:.1f} MiB "
      "in, {:.1f} MiB out; peak RSS {:.1f} MiB",
      shard, reason, s.version(), s.updates_applied(), s.pushes(), s.duplicate_pushes(),
      s.too_stale(), s.rejected_pushes(), s.doorbell_pushes(), s.pulls(), BytesInMiB(s.bytes_in()),
      BytesInMiB(s.bytes_out()), PeakRssMiB());
  for (const v1::SparseTableStatus& t : s.tables())
    spdlog::info("shard {} table {}: {} rows x {} ({:.1f} MiB, {:.0f} bytes a row), version "
                 "{}, {} rows pushed, {} pulled, hottest 1% of rows {:.1f}% of that; {} rows "
                 "evicted, {} admitted, {} row gradients dropped before admission",
                 shard, t.name(), t.rows(), t.dim(), BytesInMiB(t.bytes()), t.bytes_per_row(),
                 t.version(), t.rows_pushed(), t.rows_pulled(), 100 * t.hottest_share(),
                 t.rows_evicted(), t.rows_admitted(), t.rows_dropped());
}

// The gRPC server of `services` on `listen`, started but not yet SERVING
// (health check), its port written to --port_file when one is given.
absl::StatusOr<GrpcServer> StartServer(const std::string& listen,
                                       const std::vector<grpc::Service*>& services) {
  absl::StatusOr<GrpcServer> server = StartGrpcServer(listen, services);
  if (!server.ok()) return absl::Status(server.status().code(), server.status().ToString());
  server->server->GetHealthCheckService()->SetServingStatus(false);
  if (const std::string path = absl::GetFlag(FLAGS_port_file); !path.empty()) {
    if (absl::Status s = WriteFileAtomically(Env::Default(), path,
                                             absl::StrCat(server->port, "\n"));
        !s.ok())
      return s;
  }
  return server;
}

// The metrics endpoint the flags ask for: the RPC metrics from the start,
// the shard's own once a store is `attached`.
absl::StatusOr<std::unique_ptr<MetricsEndpoint>> StartMetrics(
    const std::atomic<const ShardStore*>& attached, const ParameterServerService& service) {
  auto shard_metrics = std::make_shared<CollectFunction>([&attached, &service] {
    const ShardStore* s = attached.load();
    return s != nullptr ? ShardMetricFamilies(service.ShardStatus(*s))
                        : std::vector<prometheus::MetricFamily>{};
  });
  return StartMetricsFromFlags("grps-server", {shard_metrics});
}

// What a store is attached to: the service answers with it, the metrics
// report it, and the gRPC server's memory quota is sized for it.
struct Attachment {
  GrpcServer& server;
  ParameterServerService& service;
  std::atomic<const ShardStore*>& metrics;
};

// Sizes the quota for `store` and attaches it. Returns the quota.
size_t Attach(ShardStore& store, const Attachment& to) {
  const v1::ShardStatus held = store.ShardStatus();
  const size_t memory = ServerMemoryBytes(held.num_elements(), JobRanks(store.config()));
  to.server.quota->Resize(memory);
  to.service.Attach(&store);
  to.metrics.store(&store);
  return memory;
}

// Attaches the store, and only then says SERVING (health check): before,
// every RPC answers UNAVAILABLE.
void GoLive(ShardStore& store, const Attachment& to,
            const v1::RegisterServerResponse& registration, const std::string& address) {
  const v1::ShardStatus restored = store.ShardStatus();
  const size_t memory = Attach(store, to);
  to.server.server->GetHealthCheckService()->SetServingStatus(true);
  LogServing(store, restored, registration, address, memory);
}

// The flags Run reads, checked: what is wrong, as INVALID_ARGUMENT.
absl::Status CheckRunFlags() {
  if (absl::GetFlag(FLAGS_coordinator).empty())
    return absl::InvalidArgumentError("--coordinator (or GRPS_COORDINATOR) is required");
  if (absl::GetFlag(FLAGS_shard) < -1)
    return absl::InvalidArgumentError(absl::StrCat(
        "--shard must be -1 (any) or a shard index, got ", absl::GetFlag(FLAGS_shard)));
  // Below one message of the port's largest, a push gRPC refuses for memory
  // would be refused every time it is sent again, and the job would wait at
  // its first step for ever (a 1 MiB quota and 4 MiB chunks did, saying
  // nothing).
  if (const uint32_t mib = absl::GetFlag(FLAGS_grpc_memory_mib);
      mib > 0 && size_t{mib} << 20 < size_t{kMaxMessageBytes})
    return absl::InvalidArgumentError(absl::StrCat(
        "--grpc_memory_mib must be 0 (derived from the shard) or at least ", kMaxMessageBytes >> 20,
        " (one message of the largest a server takes), got ", mib));
  return absl::OkStatus();
}

// Registers as `asked` says and builds the store of the shard the
// coordinator hands out, from the checkpoint its order names; nullptr (and
// the exit code) when that fails.
std::unique_ptr<ShardStore> RegisterShard(v1::Coordinator::Stub& coordinator,
                                          const ShardRegistration& asked,
                                          v1::RegisterServerResponse* registration,
                                          int* exit_code) {
  std::optional<RegisteredShard> registered = RegisterAndLoad(coordinator, asked, exit_code);
  if (!registered.has_value()) return nullptr;
  *registration = registered->registration;
  absl::StatusOr<std::unique_ptr<ShardStore>> created =
      CreateStore(StoreOptionsOf(*registration, asked.address), registration->restore(),
                  std::move(registered->loaded));
  registered->heard.reset();
  if (!created.ok()) {
    spdlog::error("invalid job from the coordinator: {}",
                  std::string(created.status().message()));
    *exit_code = 1;
    return nullptr;
  }
  return *std::move(created);
}

int Run() {
  if (absl::Status s = CheckRunFlags(); !s.ok()) {
    spdlog::error("{}", std::string(s.message()));
    return 1;
  }
  const std::string coordinator_address = absl::GetFlag(FLAGS_coordinator);
  const std::string listen = absl::GetFlag(FLAGS_listen);
  const int32_t requested_shard = absl::GetFlag(FLAGS_shard);

  // Declared before the gRPC server, which must shut down before they go
  // away.
  ShardStores stores;
  ParameterServerService service(MemberKey(ProcessSecurity().admin_token));
  absl::StatusOr<GrpcServer> server = StartServer(listen, {&service});
  if (!server.ok()) {
    spdlog::error("{}", std::string(server.status().message()));
    return ExitCodeOf(server.status());
  }
  const std::string address = AdvertisedAddress(listen, server->port);
  auto stop_server = [&] {
    if (stores.current != nullptr) stores.current->Shutdown();
    service.StopDoorbells();
    server->server->Shutdown(absl::ToChronoTime(absl::Now() + kShutdownGrace));
  };

  // Metrics from the start (a scrape before the shard is attached finds the
  // RPC metrics only), the shard's own once it is attached.
  std::atomic<const ShardStore*> attached{nullptr};
  absl::StatusOr<std::unique_ptr<MetricsEndpoint>> metrics = StartMetrics(attached, service);
  if (!metrics.ok()) {
    stop_server();
    spdlog::error("{}", std::string(metrics.status().message()));
    return ExitCodeOf(metrics.status());
  }

  std::unique_ptr<v1::Coordinator::Stub> coordinator =
      v1::Coordinator::NewStub(MakeChannel(coordinator_address));
  ShardRegistration asked;
  asked.coordinator_address = coordinator_address;
  asked.address = address;
  asked.requested_shard = requested_shard;
  asked.own_checkpoint_dir = absl::GetFlag(FLAGS_checkpoint_dir);
  asked.options = RegisterOptionsFromFlags();
  v1::RegisterServerResponse registration;
  int exit_code = 0;
  stores.current = RegisterShard(*coordinator, asked, &registration, &exit_code);
  if (stores.current == nullptr) {
    stop_server();
    return exit_code;
  }
  const Attachment attachment{*server, service, attached};
  GoLive(*stores.current, attachment, registration, address);
  MemberAgent agent(coordinator.get(), ServerIdentity(registration),
                    absl::Milliseconds(registration.config().heartbeat_interval_ms()),
                    HeartbeatCallTimeout(registration.config()));
  ShardAgent::Options options;
  options.address = address;
  options.coordinator_address = coordinator_address;
  options.own_checkpoint_dir = asked.own_checkpoint_dir;
  options.attach = [&attachment](ShardStore& store) { Attach(store, attachment); };
  options.status = [&service](const ShardStore& store) { return service.ShardStatus(store); };
  ShardAgent shard_agent(agent, stores, std::move(options));
  const ShardEnding ending = shard_agent.Run();

  stop_server();  // the current store's: also ends a checkpoint capture that is waiting
  shard_agent.JoinCheckpoints();
  if (ending.exit_code != 0) spdlog::error("{}", ending.reason);
  LogExit(stores.current->shard(), service.ShardStatus(*stores.current), ending.reason);
  // Everything is saved and every thread of ours has stopped; skip gRPC's
  // library shutdown (see ExitNow).
  ExitNow(ending.exit_code);
}

// grps-server --serve: the lookup service over --checkpoint_dir, until
// SIGINT or SIGTERM. SERVING (health check) once a checkpoint is served.
int Serve() {
  const std::string dir = absl::GetFlag(FLAGS_checkpoint_dir);
  const uint32_t poll_ms = absl::GetFlag(FLAGS_serve_poll_ms);
  if (dir.empty()) {
    spdlog::error("--serve needs --checkpoint_dir: the job's checkpoint folder");
    return 2;
  }
  if (poll_ms < 1 || poll_ms > 60000) {
    spdlog::error("--serve_poll_ms must be within 1..60000, got {}", poll_ms);
    return 2;
  }
  ServedRows rows(Env::Default(), dir);
  LookupService service(rows);
  absl::StatusOr<GrpcServer> server = StartServer(absl::GetFlag(FLAGS_listen), {&service});
  if (!server.ok()) {
    spdlog::error("{}", std::string(server.status().message()));
    return ExitCodeOf(server.status());
  }
  absl::StatusOr<std::unique_ptr<MetricsEndpoint>> metrics = StartMetricsFromFlags(
      "grps-server", {std::make_shared<CollectFunction>([&rows] {
        return LookupMetricFamilies(rows);
      })});
  if (!metrics.ok()) {
    server->server->Shutdown(absl::ToChronoTime(absl::Now() + kShutdownGrace));
    spdlog::error("{}", std::string(metrics.status().message()));
    return ExitCodeOf(metrics.status());
  }
  spdlog::info("serving lookups at port {} from the checkpoints in {} (looking every {} ms)",
               server->port, dir, poll_ms);
  std::string last_error;
  while (!ShutdownRequested()) {
    const absl::Time start = absl::Now();
    absl::StatusOr<bool> refreshed = rows.Refresh(start);
    if (!refreshed.ok()) {
      if (std::string error(refreshed.status().message()); error != last_error) {
        spdlog::warn("not served: {}", error);
        last_error = std::move(error);
      }
    } else if (*refreshed) {
      const v1::LookupStatusResponse s = rows.Status();
      uint64_t total_rows = 0;
      for (const v1::ServedTable& t : s.tables()) total_rows += t.rows();
      spdlog::info("serving checkpoint {} (step {}) of job {}: {} rows in {} tables; read in "
                   "{:.3f} s, {:.3f} s after its manifest was written ({} increments applied, "
                   "{} shard states read whole so far)",
                   s.checkpoint_id(), s.step(), s.job_id(), total_rows, s.tables_size(),
                   absl::ToDoubleSeconds(absl::Now() - start),
                   (absl::ToUnixMillis(absl::Now()) - static_cast<int64_t>(
                                                          s.written_unix_time_ms())) / 1000.0,
                   s.increments_applied(), s.full_reads());
      server->server->GetHealthCheckService()->SetServingStatus(true);
    }
    SleepUnlessShutdown(absl::Milliseconds(poll_ms));
  }
  server->server->Shutdown(absl::ToChronoTime(absl::Now() + kShutdownGrace));
  const ServedRows::Counts counts = rows.counts();
  spdlog::info("lookup service exiting: {} lookups of {} ids ({} missing) answered; peak RSS "
               "{:.1f} MiB",
               counts.lookups, counts.ids, counts.missing, PeakRssMiB());
  return 0;
}

}  // namespace
}  // namespace grps

int main(int argc, char** argv) {
  grps::ParseFlagsWithEnvironment(
      argc, argv,
      "grps-server --coordinator=HOST:PORT [--listen=HOST:PORT] [--shard=N] "
      "[--port_file=PATH]\n  One parameter shard of a grps job.\n"
      "grps-server --serve --checkpoint_dir=DIR [--listen=HOST:PORT]\n"
      "  The lookup service: a job's sparse rows for inference, from its checkpoints.");
  grps::InitDaemon("server");
  grps::InstallShutdownHandlers();
  if (absl::Status s = grps::InitProcessSecurity(grps::Role::kAdmin, /*serves=*/true);
      !s.ok()) {
    spdlog::error("{}", std::string(s.message()));
    return 2;
  }
  return absl::GetFlag(FLAGS_serve) ? grps::Serve() : grps::Run();
}
