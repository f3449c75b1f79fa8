// grps-server: one parameter shard.
//
// Listens first (so it knows its port), registers with the coordinator,
// builds its ShardStore from the job config and shard map it gets back, then
// heartbeats until the job ends. Exit status: 0 when the job completes or is
// stopped, or on SIGINT/SIGTERM; 1 when it cannot start (bad flags, no
// coordinator within a minute, an invalid job) or the job failed.
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "daemon/daemon.h"
#include "job/job_config.h"
#include "proto/grps.grpc.pb.h"
#include "server/parameter_server_service.h"
#include "server/shard_store.h"
#include "spdlog/spdlog.h"

ABSL_FLAG(std::string, coordinator, "",
          "host:port of the coordinator (required)");
ABSL_FLAG(std::string, listen, "127.0.0.1:0",
          "host:port to serve Push/Pull on; port 0 picks a free port");
ABSL_FLAG(std::string, advertise_host, "",
          "host name workers use to reach this server (default: the host of "
          "--listen, or this machine's host name when that is a wildcard)");
ABSL_FLAG(int32_t, shard, -1, "shard to serve; -1 takes any free shard");
ABSL_FLAG(std::string, port_file, "",
          "if set, the bound port is written here (atomically) once listening");

namespace grps {
namespace {

constexpr absl::Duration kRegisterPatience = absl::Seconds(60);
constexpr absl::Duration kShutdownGrace = absl::Seconds(2);

// Writes "<port>\n" to `path` through a temporary file and a rename, so a
// reader never sees a partial number.
absl::Status WritePortFile(const std::string& path, int port) {
  const std::string tmp = absl::StrCat(path, ".tmp.", getpid());
  FILE* f = std::fopen(tmp.c_str(), "w");
  if (f == nullptr)
    return absl::InternalError(
        absl::StrCat("cannot write ", tmp, ": ", std::strerror(errno)));
  const bool written = std::fprintf(f, "%d\n", port) > 0 &&
                       std::fflush(f) == 0 && fsync(fileno(f)) == 0;
  const bool closed = std::fclose(f) == 0;
  if (!written || !closed || std::rename(tmp.c_str(), path.c_str()) != 0) {
    const std::string error = std::strerror(errno);
    std::remove(tmp.c_str());
    return absl::InternalError(absl::StrCat("cannot write ", path, ": ", error));
  }
  return absl::OkStatus();
}

// The address other processes use to reach this server.
std::string AdvertisedAddress(const std::string& listen, int port) {
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

// Sleeps up to `d`, returning early on SIGINT/SIGTERM.
// RegisterServer, retried with exponential backoff while the coordinator is
// unreachable, for up to kRegisterPatience. CANCELLED if a signal arrived.
absl::StatusOr<v1::RegisterServerResponse> Register(
    v1::Coordinator::Stub& coordinator, const std::string& address,
    int32_t shard) {
  v1::RegisterServerRequest request;
  request.set_address(address);
  request.set_requested_shard(shard);
  Backoff policy;
  policy.max = absl::Seconds(5);
  policy.give_up_after = kRegisterPatience;
  policy.retry_deadline_exceeded = true;
  v1::RegisterServerResponse response;
  int attempts = 0;
  absl::Status status = RetryTransient(policy, [&] {
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(5)));
    absl::Status s = ToAbsl(coordinator.RegisterServer(&context, request, &response));
    if (!s.ok() && (++attempts == 1 || attempts % 10 == 0))
      spdlog::warn("coordinator not reachable yet ({}); retrying",
                   std::string(s.message()));
    return s;
  });
  if (status.ok()) return response;
  if (absl::IsUnavailable(status) || absl::IsDeadlineExceeded(status))
    return absl::UnavailableError(absl::StrCat(
        "coordinator unreachable for ", absl::FormatDuration(kRegisterPatience),
        ": ", status.message()));
  return status;
}

double MiB(uint64_t bytes) { return static_cast<double>(bytes) / (1 << 20); }

int Run() {
  const std::string coordinator_address = absl::GetFlag(FLAGS_coordinator);
  const std::string listen = absl::GetFlag(FLAGS_listen);
  const int32_t requested_shard = absl::GetFlag(FLAGS_shard);
  if (coordinator_address.empty()) {
    spdlog::error("--coordinator (or GRPS_COORDINATOR) is required");
    return 1;
  }
  if (requested_shard < -1) {
    spdlog::error("--shard must be -1 (any) or a shard index, got {}",
                  requested_shard);
    return 1;
  }

  // Declared before the gRPC server, which must shut down before either
  // goes away.
  std::unique_ptr<ShardStore> store;
  ParameterServerService service;
  absl::StatusOr<GrpcServer> server = StartGrpcServer(listen, {&service});
  if (!server.ok()) {
    spdlog::error("{}", server.status().ToString());
    return 1;
  }
  const std::string address = AdvertisedAddress(listen, server->port);
  if (const std::string path = absl::GetFlag(FLAGS_port_file); !path.empty()) {
    if (absl::Status s = WritePortFile(path, server->port); !s.ok()) {
      spdlog::error("{}", std::string(s.message()));
      return 1;
    }
  }
  auto stop_server = [&] {
    if (store != nullptr) store->Shutdown();
    server->server->Shutdown(absl::ToChronoTime(absl::Now() + kShutdownGrace));
  };

  std::unique_ptr<v1::Coordinator::Stub> coordinator =
      v1::Coordinator::NewStub(MakeChannel(coordinator_address));
  absl::StatusOr<v1::RegisterServerResponse> registration =
      Register(*coordinator, address, requested_shard);
  if (!registration.ok()) {
    stop_server();
    if (absl::IsCancelled(registration.status())) return 0;
    spdlog::error("cannot register with the coordinator at {}: {}",
                  coordinator_address,
                  std::string(registration.status().message()));
    return 1;
  }

  ShardStore::Options options;
  options.config = registration->config();
  options.shard_map = registration->shard_map();
  options.shard = registration->shard();
  options.incarnation = registration->incarnation();
  options.address = address;
  absl::StatusOr<std::unique_ptr<ShardStore>> created =
      ShardStore::Create(std::move(options));
  if (!created.ok()) {
    stop_server();
    spdlog::error("invalid job from the coordinator: {}",
                  std::string(created.status().message()));
    return 1;
  }
  store = std::move(*created);
  service.Attach(store.get());
  const v1::JobConfig& config = store->config();
  {
    const v1::ShardStatus s = store->ShardStatus();
    spdlog::info(
        "shard {} of {} serving {} chunks ({} elements, {:.2f} MiB) at {} "
        "(job {}, mode {}, incarnation {})",
        store->shard(), config.num_servers(), s.num_chunks(), s.num_elements(),
        MiB(s.num_elements() * sizeof(float)), address, config.job_id(),
        ModeName(config.mode()), registration->incarnation());
  }

  const absl::Duration interval =
      absl::Milliseconds(config.heartbeat_interval_ms());
  uint64_t map_epoch = store->shard_map().epoch();
  int exit_code = 0;
  std::string reason = "signal received";
  int failures = 0;
  while (!ShutdownRequested()) {
    const absl::Time tick = absl::Now();
    v1::HeartbeatRequest request;
    request.set_job_id(config.job_id());
    request.set_server_shard(store->shard());
    request.set_incarnation(registration->incarnation());
    *request.mutable_shard() = store->ShardStatus();
    request.set_shard_map_epoch(map_epoch);
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(
        absl::Now() + std::max(interval, absl::Seconds(1))));
    v1::HeartbeatResponse response;
    const grpc::Status status =
        coordinator->Heartbeat(&context, request, &response);
    if (!status.ok()) {
      // Training goes on without the coordinator; keep trying.
      if (failures++ % 20 == 0)
        spdlog::warn("heartbeat to {} failed ({}); still serving",
                     coordinator_address, status.error_message());
    } else {
      if (failures > 0) spdlog::info("coordinator reachable again");
      failures = 0;
      const v1::JobState state = response.job_state();
      if (state == v1::JOB_STATE_COMPLETED || state == v1::JOB_STATE_STOPPED) {
        reason = absl::StrCat("job ", JobStateName(state));
        // Leave the coordinator this shard's final figures.
        request.set_final_report(true);
        *request.mutable_shard() = store->ShardStatus();
        grpc::ClientContext last;
        last.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(2)));
        coordinator->Heartbeat(&last, request, &response).ok();
        break;
      }
      if (state == v1::JOB_STATE_FAILED) {
        reason = "job failed";
        exit_code = 1;
        break;
      }
      // Until the job runs, every rank counts toward a step's quorum, so an
      // early worker cannot complete step 0 alone.
      if (state == v1::JOB_STATE_RUNNING)
        store->SetLiveWorkers(
            std::vector<uint32_t>(response.live_workers().begin(),
                                  response.live_workers().end()),
            std::vector<uint64_t>(response.live_worker_incarnations().begin(),
                                  response.live_worker_incarnations().end()));
      if (response.has_shard_map() && response.shard_map().epoch() > map_epoch)
        map_epoch = response.shard_map().epoch();
    }
    SleepUnlessShutdown(interval - (absl::Now() - tick));
  }

  stop_server();
  const v1::ShardStatus s = store->ShardStatus();
  spdlog::info(
      "shard {} exiting ({}): version {}, {} updates, {} pushes ({} "
      "duplicate, {} rejected), {} pulls, {:.1f} MiB in, {:.1f} MiB out",
      store->shard(), reason, s.version(), s.updates_applied(), s.pushes(),
      s.duplicate_pushes(), s.rejected_pushes(), s.pulls(), MiB(s.bytes_in()),
      MiB(s.bytes_out()));
  spdlog::default_logger()->flush();
  return exit_code;
}

}  // namespace
}  // namespace grps

int main(int argc, char** argv) {
  grps::ParseFlagsWithEnvironment(
      argc, argv,
      "grps-server --coordinator=HOST:PORT [--listen=HOST:PORT] [--shard=N] "
      "[--port_file=PATH]\n  One parameter shard of a grps job.");
  grps::InitLogging("server");
  grps::InstallShutdownHandlers();
  return grps::Run();
}
