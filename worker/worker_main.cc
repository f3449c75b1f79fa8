// grps-worker: registers with the coordinator, trains its data partition
// against the shards, and exits when the job is done.
//
// SIGTERM after registration leaves the job after the step in progress
// (WorkerDone with leaving), as a drain (grpsctl drain RANK) does; SIGINT, a
// second SIGTERM, or 20 s, stop it at once.
//
// Exit codes: 0 when the job completed or was stopped, the worker left, or on
// SIGINT/SIGTERM;
// 1 when the job failed, the coordinator was lost (no answer for
// coordinator_timeout_ms where the worker needed one), or training failed;
// 2 on bad flags.
#include <cstdio>
#include <memory>
#include <optional>
#include <string>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "daemon/daemon.h"
#include "daemon/metrics.h"
#include "daemon/security.h"
#include "job/job_config.h"
#include "job/shard_map.h"
#include "member/member_agent.h"
#include "member/member_flags.h"
#include "proto/grps.grpc.pb.h"
#include "spdlog/spdlog.h"
#include "tensor/backend.h"
#include "tensor/cpu_backend.h"
#include "worker/parameter_client.h"
#include "worker/sparse_client.h"
#include "worker/straggler.h"
#include "worker/trainer.h"
#include "worker/worker_session.h"

ABSL_FLAG(std::string, coordinator, "127.0.0.1:7070", "coordinator host:port");
ABSL_FLAG(int, rank, -1, "requested worker rank (-1: any free rank)");
ABSL_FLAG(std::string, backend, "auto", "compute backend: auto, cpu or cuda");
ABSL_FLAG(int, blas_threads, 0,
          "OpenBLAS threads of the cpu backend (0: one per usable core); set it "
          "when several workers share a machine's cores");
ABSL_FLAG(std::string, curve_csv, "",
          "write the training curve to this CSV (appended to: a worker started again for its "
          "rank adds its rows)");
ABSL_FLAG(std::string, examples_log, "",
          "write each trained step (step, epoch, Unix ms, example indices) to this file, a line "
          "per step (appended to: a worker started again for its rank adds its steps)");
ABSL_FLAG(double, straggle_factor, 1.0,
          "experiments: make this worker F times slower (after each step it "
          "sleeps F - 1 times its own step time); 1 = no slowdown");
ABSL_FLAG(int, straggle_ms, 0,
          "experiments: sleep this many milliseconds after each step");
ABSL_FLAG(bool, load_ahead, true,
          "prepare the next step's batch on a data-loading thread while this one "
          "trains (false: in the training thread, for comparisons)");
ABSL_FLAG(std::string, health_listen, "",
          "serve gRPC health, and nothing else, on HOST:PORT (for probes; no "
          "token needed): NOT_SERVING until the worker is registered, then "
          "SERVING while it trains and waits for the job to end; empty: no port");

namespace grps {
namespace {


absl::StatusOr<v1::RegisterWorkerResponse> Register(v1::Coordinator::Stub* stub,
                                                    const std::string& backend) {
  absl::StatusOr<v1::RegisterWorkerResponse> registered = RegisterWorker(
      stub, WorkerRegistration("", absl::GetFlag(FLAGS_rank), "", backend),
      RegisterOptionsFromFlags());
  if (registered.ok()) return registered;
  const absl::Status& st = registered.status();
  return absl::Status(st.code(), absl::StrCat("cannot register with the coordinator at ",
                                              absl::GetFlag(FLAGS_coordinator), ": ",
                                              st.message()));
}

// --backend, --blas_threads and the straggler flags: the backend and the
// straggler, or the exit code (2: bad flags; 1: the backend cannot start),
// logged.
std::optional<int> SetUpCompute(std::unique_ptr<Backend>* backend, Straggler* straggler) {
  absl::StatusOr<BackendKind> kind = ParseBackendKind(absl::GetFlag(FLAGS_backend));
  if (!kind.ok()) {
    spdlog::error("{}", std::string(kind.status().message()));
    return 2;
  }
  absl::StatusOr<std::unique_ptr<Backend>> created = CreateBackend(*kind);
  if (!created.ok()) {
    spdlog::error("--backend={}: {}", absl::GetFlag(FLAGS_backend),
                  std::string(created.status().message()));
    return 1;
  }
  *backend = std::move(*created);

  absl::StatusOr<Straggler> made =
      Straggler::Create(absl::GetFlag(FLAGS_straggle_factor),
                        absl::Milliseconds(absl::GetFlag(FLAGS_straggle_ms)));
  if (!made.ok()) {
    spdlog::error("--straggle_factor/--straggle_ms: {}", std::string(made.status().message()));
    return 2;
  }
  *straggler = *made;

  if (absl::GetFlag(FLAGS_blas_threads) < 0) {
    spdlog::error("--blas_threads must be >= 0");
    return 2;
  }
  if (absl::GetFlag(FLAGS_blas_threads) > 0 && !(*backend)->IsCuda())
    SetCpuBlasThreads(absl::GetFlag(FLAGS_blas_threads));
  return std::nullopt;
}

// --health_listen: a port that answers gRPC health and nothing else,
// NOT_SERVING until registered; none when the flag is empty.
absl::StatusOr<std::optional<GrpcServer>> StartHealth() {
  const std::string listen = absl::GetFlag(FLAGS_health_listen);
  if (listen.empty()) return std::nullopt;
  // The worker only calls out; this port answers health checks alone, so
  // probes ask the worker what they ask every daemon. It serves with the
  // process's TLS, and a token that no one holds when the job has tokens:
  // every call but health (reflection) is then refused, and without TLS
  // the port must be on loopback, as every daemon's.
  SecurityConfig security = ProcessSecurity();
  security.worker_token.clear();
  if (!security.call_token.empty()) security.admin_token = RandomHexToken();
  ServerLimits limits;
  limits.max_receive_bytes = 4 << 10;  // a health check is a few bytes
  absl::StatusOr<GrpcServer> started = StartGrpcServer(listen, {}, security, limits);
  if (!started.ok())
    return absl::Status(started.status().code(),
                        absl::StrCat("--health_listen: ", started.status().message()));
  started->server->GetHealthCheckService()->SetServingStatus(false);
  spdlog::info("gRPC health on port {}: NOT_SERVING until registered", started->port);
  return std::optional<GrpcServer>(std::move(*started));
}

void LogRegistration(const v1::RegisterWorkerResponse& reg) {
  spdlog::info("registered as rank {} (incarnation {}) of job {}{}{}", reg.rank(),
               reg.incarnation(), reg.config().job_id(),
               reg.start_step() > 0
                   ? absl::StrCat("; resuming at step ", reg.start_step())
                   : std::string(),
               reg.generation() > 0 ? absl::StrCat(" (generation ", reg.generation(), ")")
                                    : std::string());
}

// The trainer's clients of `map`'s shards over gRPC, as the registration's
// rank and incarnation: of its own map, and of one a re-sharding brings
// (already checked by the session: valid, the job's chunks, every address).
ConnectShards GrpcShards(const v1::RegisterWorkerResponse& reg) {
  return [config = reg.config(), rank = reg.rank(),
          incarnation = reg.incarnation()](const v1::ShardMap& map)
             -> absl::StatusOr<TrainerShards> {
    TrainerShards shards;
    shards.dense = std::make_unique<ParameterClient>(config, map, rank, incarnation);
    if (config.model() == v1::MODEL_EMBEDDING) {
      shards.sparse = std::make_unique<SparseClient>(config, map, rank, incarnation);
      shards.eval_sparse = std::make_unique<SparseClient>(config, map, rank, incarnation);
    }
    return shards;
  };
}

int Main(int argc, char** argv) {
  ParseFlagsWithEnvironment(argc, argv,
                            "grps-worker --coordinator=HOST:PORT [--backend=auto]");
  InitDaemon("worker");
  InstallShutdownHandlers();
  if (absl::Status s = InitProcessSecurity(Role::kWorker, /*serves=*/false); !s.ok()) {
    spdlog::error("{}", std::string(s.message()));
    return 2;
  }
  std::unique_ptr<Backend> backend;
  Straggler straggler;
  if (std::optional<int> code = SetUpCompute(&backend, &straggler)) return *code;

  absl::StatusOr<std::unique_ptr<MetricsEndpoint>> metrics = StartMetricsFromFlags("grps-worker");
  if (!metrics.ok()) {
    spdlog::error("{}", std::string(metrics.status().message()));
    return ExitCodeOf(metrics.status());
  }
  absl::StatusOr<std::optional<GrpcServer>> health = StartHealth();
  if (!health.ok()) {
    spdlog::error("{}", std::string(health.status().message()));
    return ExitCodeOf(health.status());
  }

  auto stub = v1::Coordinator::NewStub(MakeChannel(absl::GetFlag(FLAGS_coordinator)));
  absl::StatusOr<v1::RegisterWorkerResponse> reg = Register(stub.get(), backend->Name());
  if (reg.ok()) SetMemberSecret(reg->member_secret());
  if (IsJobEnded(reg.status())) {
    // A worker started (or restarted) after the others finished.
    spdlog::info("{}: nothing left to train", std::string(reg.status().message()));
    return 0;
  }
  if (!reg.ok()) {
    spdlog::error("{}", std::string(reg.status().message()));
    return ShutdownRequested() ? 0 : 1;
  }
  if (absl::Status valid = CheckRegistration(*reg); !valid.ok()) {
    spdlog::error("{}", std::string(valid.message()));
    return 1;
  }
  LogRegistration(*reg);
  if (*health) (*health)->server->GetHealthCheckService()->SetServingStatus(true);

  TrainerOptions options;
  options.curve_csv = absl::GetFlag(FLAGS_curve_csv);
  options.examples_log = absl::GetFlag(FLAGS_examples_log);
  options.straggler = straggler;
  options.load_ahead = absl::GetFlag(FLAGS_load_ahead);
  options.connect_shards = GrpcShards(*reg);
  absl::StatusOr<TrainerShards> shards = options.connect_shards(reg->shard_map());
  if (!shards.ok()) {
    spdlog::error("{}", std::string(shards.status().message()));
    return 1;
  }
  Trainer trainer(stub.get(), *reg, backend.get(), std::move(*shards), options);
  // A member of the job now: SIGTERM (Kubernetes' scale-down) leaves it
  // after the step in progress.
  LeaveOnSigterm();
  absl::Status s = trainer.Run();
  if (!s.ok()) {
    // "job failed: <reason>", a lost coordinator, or a training error.
    spdlog::error("{}; exiting 1", std::string(s.message()));
    ExitNow(1);
  }
  spdlog::info("done (peak RSS {:.1f} MiB)", PeakRssMiB());
  // Skip gRPC's library shutdown (see ExitNow).
  ExitNow(0);
}

}  // namespace
}  // namespace grps

int main(int argc, char** argv) { return grps::Main(argc, argv); }
