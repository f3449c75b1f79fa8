// grps-server: one parameter shard.
//
// Listens first (so it knows its port), registers with the coordinator,
// builds its ShardStore from the job config and shard map it gets back, then
// heartbeats until the job ends. Its chunks start from the restore order the
// coordinator hands out (a checkpoint, or the initial values); heartbeat
// replies may ask it to checkpoint (written on a thread of its own) or to
// roll back to a checkpoint (docs/durability.md).
//
// Jobs whose servers scale (JobConfig.max_servers; docs/elasticity.md): a
// server for a shard the job's map does not have yet stands by, registering
// without a time limit until the job scales to include the shard. A
// re-sharding (a map that places the chunks on another shard count, with a
// roll-back to the cut) rebuilds the store for the new map from the cut, or
// retires a shard the new map does not have.
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
#include <thread>
#include <utility>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "checkpoint/checkpoint.h"
#include "daemon/daemon.h"
#include "grpcpp/health_check_service_interface.h"
#include "daemon/env.h"
#include "daemon/metrics.h"
#include "job/job_config.h"
#include "job/shard_map.h"
#include "member/member_agent.h"
#include "member/member_flags.h"
#include "proto/grps.grpc.pb.h"
#include "server/parameter_server_service.h"
#include "server/shard_metrics.h"
#include "server/shard_store.h"
#include "prometheus/family.h"
#include "prometheus/histogram.h"
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
          "volume. Must be empty or the job's folder with shared storage");
ABSL_FLAG(uint32_t, grpc_memory_mib, 0,
          "what gRPC may hold for this server's calls at once, in MiB; a push that "
          "would go past it is refused with RESOURCE_EXHAUSTED while it arrives. "
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

// RegisterServer, retried by the member agent while the coordinator is
// unreachable or not ready, for up to --register_timeout_s, and without a
// limit while it answers that the shard stands by (a shard the job's map
// does not have yet, until the job scales to it). CANCELLED if a signal
// arrived. `restore_failed`: the order of the previous registration could
// not be followed (the coordinator then answers with the checkpoint before).
absl::StatusOr<v1::RegisterServerResponse> Register(
    v1::Coordinator::Stub& coordinator, const std::string& address,
    int32_t shard, const v1::ShardCheckpoint* restore_failed = nullptr) {
  v1::RegisterServerRequest request;
  request.set_address(address);
  request.set_requested_shard(shard);
  if (restore_failed != nullptr) *request.mutable_restore_failed() = *restore_failed;
  RegisterOptions options = RegisterOptionsFromFlags();
  options.on_standby = [shard](const absl::Status& standby) {
    spdlog::info("shard {} stands by: {}", shard, std::string(standby.message()));
  };
  return RegisterServer(&coordinator, request, options);
}

double MiB(uint64_t bytes) { return static_cast<double>(bytes) / (1 << 20); }

// How long a checkpoint may wait for its version to be reached.
constexpr absl::Duration kCaptureTimeout = absl::Seconds(60);

bool PerShardStorage(const v1::JobConfig& config) {
  return config.checkpoint_storage() == v1::CHECKPOINT_STORAGE_PER_SHARD;
}

// The folder of checkpoint `id` where this shard's file is: the
// coordinator's (`dir`, the request's or order's) with shared storage; with
// per-shard storage the job's path on this server's own volume, or under
// its --checkpoint_dir.
std::string OwnCheckpointFolder(const v1::JobConfig& config, uint64_t id,
                                const std::string& dir) {
  if (!PerShardStorage(config)) return dir;
  const std::string own = absl::GetFlag(FLAGS_checkpoint_dir);
  return CheckpointFolder(own.empty() ? config.checkpoint_dir() : own, id);
}

// Per-shard storage: the manifest comes with the order (it is on the
// coordinator's volume); the shard checks and loads its own file only.
absl::StatusOr<ShardState> LoadOwnRestore(const v1::RestoreOrder& order,
                                          const v1::JobConfig& config, const v1::ShardMap& map,
                                          uint32_t shard) {
  const v1::CheckpointManifest& manifest = order.manifest();
  if (manifest.id() != order.checkpoint_id())
    return absl::FailedPreconditionError(absl::StrCat(
        "the restore order of checkpoint ", order.checkpoint_id(),
        " carries no manifest (the coordinator is not set up for per-shard storage?)"));
  const std::string dir = OwnCheckpointFolder(config, order.checkpoint_id(), order.dir());
  if (absl::Status s = CheckManifest(manifest, dir); !s.ok()) return s;
  if (absl::Status s = CheckSameChunks(manifest.shard_map(), map); !s.ok()) return s;
  if (absl::Status s = CheckSameShards(manifest.shard_map(), map); !s.ok()) return s;
  if (absl::Status s = CheckSameTables(manifest.config(), config); !s.ok()) return s;
  if (absl::Status s = VerifyShardFile(Env::Default(), dir, manifest, shard); !s.ok()) return s;
  return LoadShardState(Env::Default(), dir, manifest, ChunksOfShard(map, shard),
                        static_cast<uint32_t>(map.shards_size()), shard);
}

// How often a starting server reports a checkpoint it cannot load before it
// gives up (each report sends the job one checkpoint further back).
constexpr int kMaxRestoreRefusals = 64;

// What a shard reports of a restore order it could not follow.
v1::ShardCheckpoint RestoreFailure(const v1::RestoreOrder& order, uint32_t shard,
                                   const absl::Status& why) {
  v1::ShardCheckpoint failed;
  failed.set_id(order.checkpoint_id());
  failed.set_shard(shard);
  failed.set_state(v1::CHECKPOINT_STATE_FAILED);
  failed.set_error(std::string(why.message()));
  return failed;
}

// The states of this shard's chunks and sparse tables for `order`: none
// (the initial values) when it names no checkpoint, else read from the
// checkpoint's files, whose chunk layout and tables must be this job's.
absl::StatusOr<ShardState> LoadRestore(const v1::RestoreOrder& order, const v1::JobConfig& config,
                                       const v1::ShardMap& map, uint32_t shard) {
  if (order.checkpoint_id() == 0) return ShardState{};
  if (PerShardStorage(config)) return LoadOwnRestore(order, config, map, shard);
  absl::StatusOr<v1::CheckpointManifest> manifest =
      VerifyCheckpoint(Env::Default(), order.dir(), "");
  if (!manifest.ok()) return manifest.status();
  if (absl::Status s = CheckSameChunks(manifest->shard_map(), map); !s.ok()) return s;
  if (absl::Status s = CheckSameTables(manifest->config(), config); !s.ok()) return s;
  return LoadShardState(Env::Default(), order.dir(), *manifest, ChunksOfShard(map, shard),
                        static_cast<uint32_t>(map.shards_size()), shard);
}

// grps_checkpoint_write_seconds{result}: how long this shard took to collect
// and write its part of a checkpoint.
prometheus::Histogram& CheckpointSeconds(bool ok) {
  static prometheus::Family<prometheus::Histogram>& family =
      prometheus::BuildHistogram()
          .Name("grps_checkpoint_write_seconds")
          .Help("time to collect and write the shard's part of a checkpoint, by result")
          .Register(*ProcessMetrics());
  return family.Add({{"result", ok ? "ok" : "failed"}}, DurationBuckets());
}

// Takes the checkpoints the coordinator asks for, one at a time, on a
// thread of its own: capture (which may wait for a sync step boundary), then
// write the shard's file. The heartbeat thread only arms a request and hands
// it over, never waiting for a write: an fsync that takes seconds on a busy
// disk must not stop the heartbeats, or the coordinator would take the shard
// for dead. The outcome is reported through the store's ShardStatus, the
// newest request's only. Thread-safe.
class Checkpointer {
 public:
  // `before`: the checkpointer of the store `store` replaces (a
  // re-sharding), whose last request is not started again on this one (it
  // would write the new layout into that checkpoint's folder).
  explicit Checkpointer(ShardStore* store, const Checkpointer* before = nullptr)
      : store_(store), thread_([this] { Loop(); }) {
    if (before != nullptr) {
      last_id_ = before->last_id_;
      last_incarnation_ = before->last_incarnation_;
    }
  }
  ~Checkpointer() { Join(); }

  // Starts checkpoint `request` unless it is the one last started. One still
  // being taken (waiting for its version) is superseded: the coordinator
  // has given up on it. One still being written finishes first.
  void MaybeStart(const v1::CheckpointRequest& request) {
    if (request.id() == 0 || (request.id() == last_id_ &&
                              request.coordinator_incarnation() == last_incarnation_))
      return;
    last_id_ = request.id();
    last_incarnation_ = request.coordinator_incarnation();
    v1::ShardCheckpoint report;
    report.set_id(request.id());
    report.set_shard(store_->shard());
    report.set_coordinator_incarnation(request.coordinator_incarnation());
    // Armed now, on the heartbeat thread, so that a sync cut a few steps
    // ahead is not missed; collected and written on the checkpoint thread.
    // Arming supersedes the capture in progress, whose Take then ends.
    absl::Status armed = store_->ArmCheckpoint(request);
    absl::MutexLock lock(&mu_);
    const uint64_t seq = ++latest_;
    if (!armed.ok()) {
      report.set_state(v1::CHECKPOINT_STATE_FAILED);
      report.set_error(std::string(armed.message()));
      spdlog::warn("checkpoint {}: shard {} failed: {}", request.id(), store_->shard(),
                   report.error());
      store_->SetCheckpointReport(report);
      pending_.reset();
      return;
    }
    report.set_state(v1::CHECKPOINT_STATE_PENDING);
    store_->SetCheckpointReport(report);
    pending_ = Pending{request, seq};
  }

  // Takes the request handed over last, if any, and ends the thread.
  void Join() {
    {
      absl::MutexLock lock(&mu_);
      stopping_ = true;
    }
    if (thread_.joinable()) thread_.join();
  }

 private:
  struct Pending {
    v1::CheckpointRequest request;
    uint64_t seq = 0;
  };

  void Loop() {
    while (true) {
      Pending next;
      {
        absl::MutexLock lock(&mu_);
        mu_.Await(absl::Condition(this, &Checkpointer::HasWorkLocked));
        if (!pending_.has_value()) return;  // stopping, nothing left
        next = std::move(*pending_);
        pending_.reset();
      }
      Take(next.request, next.seq);
    }
  }

  void Take(const v1::CheckpointRequest& request, uint64_t seq) {
    const absl::Time start = absl::Now();
    v1::ShardCheckpoint report;
    report.set_id(request.id());
    report.set_shard(store_->shard());
    absl::StatusOr<v1::ShardCheckpointFile> file =
        store_->CollectCheckpoint(request.id(), start + kCaptureTimeout);
    absl::StatusOr<v1::ShardCheckpoint> written =
        file.ok() ? WriteShardFile(Env::Default(),
                                   OwnCheckpointFolder(store_->config(), request.id(),
                                                       request.dir()),
                                   *file)
                  : absl::StatusOr<v1::ShardCheckpoint>(file.status());
    CheckpointSeconds(written.ok()).Observe(absl::ToDoubleSeconds(absl::Now() - start));
    if (written.ok()) {
      report = *written;
      report.set_coordinator_incarnation(request.coordinator_incarnation());
      for (const v1::ChunkState& chunk : file->chunks())
        LowerHeldFrom(chunk.held_from(), report.mutable_held_from());
      for (const v1::TableState& table : file->tables())
        LowerHeldFrom(table.held_from(), report.mutable_held_from());
      spdlog::info("checkpoint {}: shard {} wrote {} chunks{} ({:.2f} MiB) at versions "
                   "{}..{} in {}",
                   request.id(), store_->shard(), report.num_chunks(),
                   report.num_tables() > 0 ? absl::StrCat(" and ", report.num_rows(), " sparse rows")
                                           : "",
                   MiB(report.bytes()),
                   report.min_version(), report.max_version(),
                   absl::FormatDuration(absl::Now() - start));
    } else {
      report.set_state(v1::CHECKPOINT_STATE_FAILED);
      report.set_coordinator_incarnation(request.coordinator_incarnation());
      report.set_error(std::string(written.status().message()));
      spdlog::warn("checkpoint {}: shard {} failed: {}", request.id(), store_->shard(),
                   report.error());
    }
    // A superseded checkpoint leaves the report to the newer one.
    absl::MutexLock lock(&mu_);
    if (seq == latest_) store_->SetCheckpointReport(report);
  }

  // Loop's wait condition (called by Await, with mu_ held).
  bool HasWorkLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return pending_.has_value() || stopping_;
  }

  ShardStore* const store_;
  // The request last started, by (id, coordinator incarnation): used by
  // the heartbeat thread only.
  uint64_t last_id_ = 0;
  uint64_t last_incarnation_ = 0;
  absl::Mutex mu_;
  uint64_t latest_ ABSL_GUARDED_BY(mu_) = 0;  // the newest request's number
  std::optional<Pending> pending_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;  // last: started once the members above exist
};

// How the shard's part in the job ended.
struct Ending {
  int exit_code = 0;
  std::string reason = "signal received";
};

// A roll-back order the shard could not follow (`why`): recorded in
// *restore_failed, which every heartbeat reports until the coordinator
// orders another (it refuses the checkpoint and orders the one before; the
// shard keeps its state and generation meanwhile, so it serves nothing of
// the new one). Returns an Ending when the order was the initial values,
// which leave nothing further back.
std::optional<Ending> RefuseRestore(const v1::RestoreOrder& order, uint32_t shard,
                                    const absl::Status& why,
                                    std::optional<v1::ShardCheckpoint>* restore_failed) {
  if (order.checkpoint_id() == 0)
    return Ending{1, absl::StrCat("cannot roll back to the initial values: ", why.message())};
  if (!restore_failed->has_value() || (*restore_failed)->id() != order.checkpoint_id())
    spdlog::error("shard {} cannot roll back to checkpoint {}: {}; reported", shard,
                  order.checkpoint_id(), std::string(why.message()));
  *restore_failed = RestoreFailure(order, shard, why);
  return std::nullopt;
}

// A roll-back order from a heartbeat reply, for the shard's chunks as they
// are placed now: restores the store in place, or refuses the order
// (RefuseRestore).
std::optional<Ending> FollowRestoreOrder(const v1::RestoreOrder& order, ShardStore& store,
                                         std::optional<v1::ShardCheckpoint>* restore_failed) {
  absl::StatusOr<ShardState> states =
      LoadRestore(order, store.config(), store.shard_map(), store.shard());
  absl::Status restored =
      states.ok() ? store.Restore(order.generation(), order.checkpoint_id(), states->chunks,
                                  order.worker_steps(), states->tables)
                  : states.status();
  if (!restored.ok()) return RefuseRestore(order, store.shard(), restored, restore_failed);
  restore_failed->reset();
  spdlog::info("shard {} rolled back to checkpoint {} at step {} (generation {})", store.shard(),
               order.checkpoint_id(), order.step(), order.generation());
  return std::nullopt;
}

// A registration, and the state its restore order names, loaded.
struct Registered {
  v1::RegisterServerResponse registration;
  ShardState loaded;
};

// Registers with the coordinator and loads the state the answer's restore
// order names. A checkpoint this shard cannot load (a damaged or missing
// file) is reported by registering again: the coordinator refuses it and
// answers with the one before it, down to the initial values, which always
// load. On failure, *exit_code is how the process ends (0: a signal
// cancelled the registration).
std::optional<Registered> RegisterAndLoad(v1::Coordinator::Stub& coordinator,
                                          const std::string& coordinator_address,
                                          const std::string& address, int32_t requested_shard,
                                          int* exit_code) {
  *exit_code = 1;
  absl::StatusOr<v1::RegisterServerResponse> registration =
      Register(coordinator, address, requested_shard);
  for (int refusals = 0;; ++refusals) {
    if (!registration.ok()) {
      if (absl::IsCancelled(registration.status())) {
        *exit_code = 0;
        return std::nullopt;
      }
      if (IsJobEnded(registration.status())) {  // started after the job ended
        spdlog::info("{}: nothing to serve", std::string(registration.status().message()));
        *exit_code = 0;
        return std::nullopt;
      }
      spdlog::error("cannot register with the coordinator at {}: {}", coordinator_address,
                    std::string(registration.status().message()));
      return std::nullopt;
    }
    if (absl::Status valid = ValidateShardMap(registration->shard_map()); !valid.ok()) {
      spdlog::error("invalid job from the coordinator: {}", std::string(valid.message()));
      return std::nullopt;
    }
    const std::string own_dir = absl::GetFlag(FLAGS_checkpoint_dir);
    if (!PerShardStorage(registration->config()) && !own_dir.empty() &&
        own_dir != registration->config().checkpoint_dir()) {
      spdlog::error("--checkpoint_dir={} is for per-shard checkpoint storage; this job keeps "
                    "every shard's files in the coordinator's {}",
                    own_dir, registration->config().checkpoint_dir());
      *exit_code = 2;
      return std::nullopt;
    }
    const v1::RestoreOrder& order = registration->restore();
    absl::StatusOr<ShardState> loaded = LoadRestore(
        order, registration->config(), registration->shard_map(), registration->shard());
    if (loaded.ok()) return Registered{std::move(*registration), std::move(*loaded)};
    spdlog::error("cannot restore shard {} from checkpoint {} in {}: {}", registration->shard(),
                  order.checkpoint_id(),
                  OwnCheckpointFolder(registration->config(), order.checkpoint_id(), order.dir()),
                  std::string(loaded.status().message()));
    if (order.checkpoint_id() == 0 || refusals == kMaxRestoreRefusals) return std::nullopt;
    const v1::ShardCheckpoint failed =
        RestoreFailure(order, registration->shard(), loaded.status());
    registration = Register(coordinator, address, static_cast<int32_t>(registration->shard()),
                            &failed);
  }
}

// The options of the store of a registration's shard, but for its state.
ShardStore::Options OptionsOf(const v1::RegisterServerResponse& registration,
                              const std::string& address) {
  ShardStore::Options options;
  options.config = registration.config();
  options.shard_map = registration.shard_map();
  options.shard = registration.shard();
  options.incarnation = registration.incarnation();
  options.address = address;
  return options;
}

// The store of `options`, in the generation of `order`, from the state
// `loaded` from what the order names.
absl::StatusOr<std::unique_ptr<ShardStore>> CreateStore(ShardStore::Options options,
                                                        const v1::RestoreOrder& order,
                                                        ShardState loaded) {
  options.generation = order.generation();
  options.restored_checkpoint = order.checkpoint_id();
  options.resume_steps.assign(order.worker_steps().begin(), order.worker_steps().end());
  options.restore = std::move(loaded.chunks);
  options.restore_tables = std::move(loaded.tables);
  return ShardStore::Create(std::move(options));
}

// The counts a restored state brought (v1::StateCounters), for the logs:
// summed over the shards a checkpoint was restored into, they are the
// checkpoint's (a re-sharding conserves them).
std::string StateCounts(const v1::ShardStatus& s) {
  return absl::StrCat(s.updates_applied(), " updates, ", s.pushes(), " pushes (",
                      s.duplicate_pushes(), " duplicate, ", s.too_stale(), " too stale, ",
                      s.late_gradients(), " late)");
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
      MiB(held.num_elements() * sizeof(float)), address, config.job_id(),
      ModeName(config.mode()), registration.incarnation(), MiB(memory));
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
      s.too_stale(), s.rejected_pushes(), s.doorbell_pushes(), s.pulls(), MiB(s.bytes_in()),
      MiB(s.bytes_out()), PeakRssMiB());
  for (const v1::SparseTableStatus& t : s.tables())
    spdlog::info("shard {} table {}: {} rows x {} ({:.1f} MiB, {:.0f} bytes a row), version "
                 "{}, {} rows pushed, {} pulled, hottest 1% of rows {:.1f}% of that",
                 shard, t.name(), t.rows(), t.dim(), MiB(t.bytes()), t.bytes_per_row(),
                 t.version(), t.rows_pushed(), t.rows_pulled(), 100 * t.hottest_share());
}

// The gRPC server of `service` on `listen`, started but not yet SERVING
// (health check), its port written to --port_file when one is given.
absl::StatusOr<GrpcServer> StartServer(const std::string& listen,
                                       ParameterServerService& service) {
  absl::StatusOr<GrpcServer> server = StartGrpcServer(listen, {&service});
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

// The stores of this process's shard: the one it serves, and those that
// re-shardings replaced. A replaced store is shut down but kept until the
// process exits: RPC handlers may still hold a raw pointer to it (a
// PullReactor keeps its ShardStore*). Run's thread only.
struct ShardStores {
  std::unique_ptr<ShardStore> current;
  std::vector<std::unique_ptr<ShardStore>> retired;
};

// Whether `map` places `shard`'s chunks otherwise than `before` (a
// re-sharding), rather than only naming other endpoints.
bool PlacedOtherwise(const v1::ShardMap& map, const v1::ShardMap& before, uint32_t shard) {
  return map.shards_size() != before.shards_size() ||
         ChunksOfShard(map, shard) != ChunksOfShard(before, shard);
}

// The shard's part in the job once it serves: heartbeats as its member
// until the job ends, another server takes the shard, the coordinator has
// been silent past its timeout, a re-sharding retires the shard, or a
// signal arrives; follows what the replies carry (a roll-back, a
// re-sharding, a checkpoint, the live workers, the shard map's epoch).
// Owns the Checkpointer of the current store. Run's thread only.
class ShardHeartbeat {
 public:
  ShardHeartbeat(MemberAgent& agent, ShardStores& stores, const Attachment& attachment,
                 std::string address, std::string coordinator_address)
      : agent_(agent),
        stores_(stores),
        attachment_(attachment),
        address_(std::move(address)),
        coordinator_address_(std::move(coordinator_address)),
        coordinator_timeout_(absl::Milliseconds(store().config().coordinator_timeout_ms() > 0
                                                    ? store().config().coordinator_timeout_ms()
                                                    : 60000)),
        checkpointer_(std::make_unique<Checkpointer>(&store())),
        map_(store().shard_map()) {}

  // Heartbeats until the end; how the shard's part ended. Call once.
  Ending Run();
  // Ends the checkpoint thread. Call once the store has been shut down,
  // which ends a capture that waits.
  void JoinCheckpoints() { checkpointer_->Join(); }

 private:
  ShardStore& store() const { return *stores_.current; }

  void Fill(v1::HeartbeatRequest* request) const;
  MemberAgent::Next OnError(const grpc::Status& status);
  MemberAgent::Next OnReply(const v1::HeartbeatResponse& response);
  // Leaves the coordinator this shard's final figures.
  void SendFinalReport();
  // The reply's shard map and roll-back order: a newer map is remembered;
  // a roll-back is followed in place, or by a new store when the map
  // places the shard's chunks otherwise. An Ending when the shard ends.
  std::optional<Ending> FollowMap(const v1::HeartbeatResponse& response);
  Ending Retire();
  std::optional<Ending> Reshard(const v1::RestoreOrder& order);
  void Replace(std::unique_ptr<ShardStore> next);

  MemberAgent& agent_;
  ShardStores& stores_;
  const Attachment attachment_;
  const std::string address_;
  const std::string coordinator_address_;
  const absl::Duration coordinator_timeout_;
  std::unique_ptr<Checkpointer> checkpointer_;
  // The newest map the coordinator sent (its epoch is the one reported). It
  // differs from the store's in placement while a re-sharding's roll-back
  // is refused: the next order rebuilds for it.
  v1::ShardMap map_;
  std::optional<v1::ShardCheckpoint> restore_failed_;
  int failures_ = 0;
  Ending ending_;
};

Ending ShardHeartbeat::Run() {
  MemberAgent::Handlers handlers;
  handlers.fill = [this](v1::HeartbeatRequest* request) { Fill(request); };
  handlers.on_error = [this](const grpc::Status& status) { return OnError(status); };
  handlers.on_reply = [this](const v1::HeartbeatResponse& r) { return OnReply(r); };
  agent_.Run(handlers);
  return ending_;
}

void ShardHeartbeat::Fill(v1::HeartbeatRequest* request) const {
  *request->mutable_shard() = attachment_.service.ShardStatus(store());
  if (restore_failed_.has_value())
    *request->mutable_shard()->mutable_restore_failed() = *restore_failed_;
  request->set_shard_map_epoch(map_.epoch());
  request->set_generation(store().generation());
}

MemberAgent::Next ShardHeartbeat::OnError(const grpc::Status& status) {
  if (status.error_code() == grpc::StatusCode::FAILED_PRECONDITION) {
    // Our incarnation is stale: another server has taken this shard.
    ending_ = {1, absl::StrCat("shard ", store().shard(), " was taken over by another server (",
                               status.error_message(), ")")};
    return MemberAgent::Next::kStop;
  }
  // Training goes on without the coordinator; keep trying, for a while.
  if (failures_++ % 20 == 0)
    spdlog::warn("heartbeat to {} failed ({}); still serving", coordinator_address_,
                 status.error_message());
  if (agent_.Silence() > coordinator_timeout_) {
    ending_ = {1, absl::StrCat("no answer from the coordinator for ",
                               absl::FormatDuration(coordinator_timeout_))};
    return MemberAgent::Next::kStop;
  }
  return MemberAgent::Next::kGoOn;
}

MemberAgent::Next ShardHeartbeat::OnReply(const v1::HeartbeatResponse& response) {
  if (failures_ > 0) spdlog::info("coordinator reachable again");
  failures_ = 0;
  const v1::JobState state = response.job_state();
  if (state == v1::JOB_STATE_COMPLETED || state == v1::JOB_STATE_STOPPED) {
    ending_.reason = absl::StrCat("job ", JobStateName(state));
    SendFinalReport();
    return MemberAgent::Next::kStop;
  }
  if (state == v1::JOB_STATE_FAILED) {
    ending_ = {1, "job failed"};
    return MemberAgent::Next::kStop;
  }
  if (std::optional<Ending> end = FollowMap(response)) {
    ending_ = *std::move(end);
    return MemberAgent::Next::kStop;
  }
  if (response.has_checkpoint()) checkpointer_->MaybeStart(response.checkpoint());
  // Until the job runs, every rank counts toward a step's quorum, so an
  // early worker cannot complete step 0 alone.
  if (state == v1::JOB_STATE_RUNNING)
    store().SetLiveWorkers(std::vector<uint32_t>(response.live_workers().begin(),
                                                 response.live_workers().end()),
                           std::vector<uint64_t>(response.live_worker_incarnations().begin(),
                                                 response.live_worker_incarnations().end()),
                           std::vector<uint64_t>(response.live_worker_counts_from().begin(),
                                                 response.live_worker_counts_from().end()));
  return MemberAgent::Next::kGoOn;
}

void ShardHeartbeat::SendFinalReport() {
  v1::HeartbeatRequest last;
  Fill(&last);
  last.set_final_report(true);
  v1::HeartbeatResponse ignored;
  agent_.Beat(std::move(last), &ignored, absl::Seconds(2)).IgnoreError();
}

std::optional<Ending> ShardHeartbeat::FollowMap(const v1::HeartbeatResponse& response) {
  if (response.has_shard_map() && response.shard_map().epoch() > map_.epoch()) {
    if (absl::Status valid = ValidateShardMap(response.shard_map()); !valid.ok())
      return Ending{1, absl::StrCat("invalid shard map from the coordinator: ", valid.message())};
    map_ = response.shard_map();
  }
  if (store().shard() >= static_cast<uint32_t>(map_.shards_size())) return Retire();
  if (!response.has_restore() || response.restore().generation() <= store().generation())
    return std::nullopt;
  if (PlacedOtherwise(map_, store().shard_map(), store().shard()))
    return Reshard(response.restore());
  return FollowRestoreOrder(response.restore(), store(), &restore_failed_);
}

// The map has no place for this shard any more: the shard leaves, as at
// the end of the job.
Ending ShardHeartbeat::Retire() {
  SendFinalReport();
  return Ending{0, absl::StrCat("shard ", store().shard(), " retired: the job re-sharded to ",
                                map_.shards_size(), " shards")};
}

// A roll-back into map_, which places this shard's chunks otherwise: the
// state for them is loaded (a checkpoint restores into any shard count
// with shared storage) into a new store, which replaces the current one.
std::optional<Ending> ShardHeartbeat::Reshard(const v1::RestoreOrder& order) {
  const uint32_t shard = store().shard();
  ShardStore::Options options;
  options.config = store().config();
  options.config.set_num_servers(static_cast<uint32_t>(map_.shards_size()));
  options.shard_map = map_;
  options.shard = shard;
  options.incarnation = agent_.identity().incarnation;
  options.address = address_;
  absl::StatusOr<ShardState> loaded = LoadRestore(order, options.config, map_, shard);
  absl::StatusOr<std::unique_ptr<ShardStore>> next =
      loaded.ok() ? CreateStore(std::move(options), order, *std::move(loaded))
                  : absl::StatusOr<std::unique_ptr<ShardStore>>(loaded.status());
  if (!next.ok()) return RefuseRestore(order, shard, next.status(), &restore_failed_);
  restore_failed_.reset();
  const v1::ShardStatus restored = (*next)->ShardStatus();
  Replace(*std::move(next));
  spdlog::info("shard {} re-sharded: {} shards (map epoch {}), {} chunks from checkpoint {} at "
               "step {} (generation {}); counts restored: {}",
               shard, map_.shards_size(), map_.epoch(), store().chunk_ids().size(),
               order.checkpoint_id(), order.step(), order.generation(), StateCounts(restored));
  return std::nullopt;
}

// Serves `next` in place of the current store: attached first, then the
// old store is shut down (its waiting pulls fail UNAVAILABLE, and the
// workers retry on the new one; a capture in progress ends) and kept, and
// its checkpointer is joined.
void ShardHeartbeat::Replace(std::unique_ptr<ShardStore> next) {
  Attach(*next, attachment_);
  std::unique_ptr<ShardStore> old = std::exchange(stores_.current, std::move(next));
  old->Shutdown();
  checkpointer_->Join();
  checkpointer_ = std::make_unique<Checkpointer>(&store(), checkpointer_.get());
  stores_.retired.push_back(std::move(old));
}

// The flags Run reads, checked: what is wrong, as INVALID_ARGUMENT.
absl::Status CheckRunFlags() {
  if (absl::GetFlag(FLAGS_coordinator).empty())
    return absl::InvalidArgumentError("--coordinator (or GRPS_COORDINATOR) is required");
  if (absl::GetFlag(FLAGS_shard) < -1)
    return absl::InvalidArgumentError(absl::StrCat(
        "--shard must be -1 (any) or a shard index, got ", absl::GetFlag(FLAGS_shard)));
  return absl::OkStatus();
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
  absl::StatusOr<GrpcServer> server = StartServer(listen, service);
  if (!server.ok()) {
    spdlog::error("{}", std::string(server.status().message()));
    return 1;
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
    return 1;
  }

  std::unique_ptr<v1::Coordinator::Stub> coordinator =
      v1::Coordinator::NewStub(MakeChannel(coordinator_address));
  int exit_code = 0;
  std::optional<Registered> registered = RegisterAndLoad(
      *coordinator, coordinator_address, address, requested_shard, &exit_code);
  if (!registered.has_value()) {
    stop_server();
    return exit_code;
  }
  const v1::RegisterServerResponse& registration = registered->registration;
  SetMemberSecret(registration.member_secret());
  absl::StatusOr<std::unique_ptr<ShardStore>> created =
      CreateStore(OptionsOf(registration, address), registration.restore(),
                  std::move(registered->loaded));
  if (!created.ok()) {
    stop_server();
    spdlog::error("invalid job from the coordinator: {}",
                  std::string(created.status().message()));
    return 1;
  }
  stores.current = std::move(*created);
  const Attachment attachment{*server, service, attached};
  GoLive(*stores.current, attachment, registration, address);
  const absl::Duration interval =
      absl::Milliseconds(registration.config().heartbeat_interval_ms());
  MemberAgent agent(coordinator.get(),
                    {registration.config().job_id(), MemberKind::kServer, registration.shard(),
                     registration.incarnation()},
                    interval, std::max(interval, absl::Seconds(1)));
  ShardHeartbeat heartbeat(agent, stores, attachment, address, coordinator_address);
  const Ending ending = heartbeat.Run();

  stop_server();  // the current store's: also ends a checkpoint capture that is waiting
  heartbeat.JoinCheckpoints();
  if (ending.exit_code != 0) spdlog::error("{}", ending.reason);
  LogExit(stores.current->shard(), service.ShardStatus(*stores.current), ending.reason);
  // Everything is saved and every thread of ours has stopped; skip gRPC's
  // library shutdown (see ExitNow).
  ExitNow(ending.exit_code);
}

}  // namespace
}  // namespace grps

int main(int argc, char** argv) {
  grps::ParseFlagsWithEnvironment(
      argc, argv,
      "grps-server --coordinator=HOST:PORT [--listen=HOST:PORT] [--shard=N] "
      "[--port_file=PATH]\n  One parameter shard of a grps job.");
  grps::InitDaemon("server");
  grps::InstallShutdownHandlers();
  if (absl::Status s = grps::InitProcessSecurity(grps::Role::kAdmin, /*serves=*/true);
      !s.ok()) {
    spdlog::error("{}", std::string(s.message()));
    return 2;
  }
  return grps::Run();
}
