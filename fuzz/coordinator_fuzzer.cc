// Fuzz target: the coordinator's request handlers. The input is a script of
// requests (fuzz/coordinator_script.h) played against a CoordinatorService
// called directly, in process: no gRPC server, a bare ServerContext (no
// deadline, no metadata, so authentication is off as with no --token), a
// fake clock, and the file system in memory.
//
// Every input starts from a fresh service, clock and MemoryEnv, so nothing
// carries over from one input to the next and memory stays bounded by the
// input's size. WatchJobStatus is not called (it needs a live stream).
//
// Handlers that wait in real time (RegisterWorker until every shard has
// registered, CheckpointJob with wait) would wait forever without a client
// deadline; the service is Shutdown() before the first request, which is
// what makes such a wait answer UNAVAILABLE at once. Nothing else looks at
// it.
//
// Besides not crashing: whatever the coordinator hands a member must be what
// members accept (shard maps pass ValidateShardMap, ranks and shards are in
// range), and the state file it writes must be taken back by a restarted
// coordinator (TakeOver) whenever the job is still waiting or running.
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "coordinator/coordinator_service.h"
#include "coordinator/fake_clock.h"
#include "fuzz/coordinator_script.h"
#include "fuzz/fuzz_check.h"
#include "fuzz/memory_env.h"
#include "fuzz/quiet_logs.h"
#include "job/job_config.h"
#include "job/shard_map.h"

namespace grps {
namespace {

void CheckShardMap(const v1::ShardMap& map, const v1::JobConfig& config) {
  absl::Status valid = ValidateShardMap(map);
  FUZZ_CHECK(valid.ok(), std::string(valid.message()));
  FUZZ_CHECK(static_cast<uint32_t>(map.shards_size()) == config.num_servers(),
             absl::StrCat(map.shards_size(), " shards"));
}

// Parses `payload` as a Request (as gRPC would before the handler: a payload
// protobuf refuses never reaches it) and calls `handler`. OK and the
// response, or the handler's error.
template <typename Request, typename Response>
grpc::Status Call(CoordinatorService& service,
                  grpc::Status (CoordinatorService::*handler)(grpc::ServerContext*,
                                                              const Request*, Response*),
                  absl::string_view payload, Response* response) {
  Request request;
  if (!request.ParseFromArray(payload.data(), static_cast<int>(payload.size())))
    return grpc::Status(grpc::StatusCode::INTERNAL, "not parsed");
  grpc::ServerContext context;
  return (service.*handler)(&context, &request, response);
}

void Play(CoordinatorService& service, const v1::JobConfig& config, FakeClock& clock,
          const CoordinatorRecord& record) {
  switch (record.action) {
    case CoordinatorAction::kRegisterServer: {
      v1::RegisterServerResponse r;
      if (!Call(service, &CoordinatorService::RegisterServer, record.payload, &r).ok()) return;
      FUZZ_CHECK(r.shard() < config.num_servers(), absl::StrCat("shard ", r.shard()));
      FUZZ_CHECK(r.config().job_id() == config.job_id(), r.config().job_id());
      CheckShardMap(r.shard_map(), config);
      return;
    }
    case CoordinatorAction::kRegisterWorker: {
      v1::RegisterWorkerResponse r;
      if (!Call(service, &CoordinatorService::RegisterWorker, record.payload, &r).ok()) return;
      FUZZ_CHECK(r.rank() < config.num_workers(), absl::StrCat("rank ", r.rank()));
      CheckShardMap(r.shard_map(), config);
      return;
    }
    case CoordinatorAction::kHeartbeat: {
      v1::HeartbeatResponse r;
      if (!Call(service, &CoordinatorService::Heartbeat, record.payload, &r).ok()) return;
      FUZZ_CHECK(r.live_workers_size() == r.live_worker_incarnations_size(),
                 absl::StrCat(r.live_workers_size(), " live workers, ",
                              r.live_worker_incarnations_size(), " incarnations"));
      for (uint32_t rank : r.live_workers())
        FUZZ_CHECK(rank < config.num_workers(), absl::StrCat("live rank ", rank));
      if (r.has_shard_map()) CheckShardMap(r.shard_map(), config);
      return;
    }
    case CoordinatorAction::kWorkerDone: {
      v1::WorkerDoneResponse r;
      Call(service, &CoordinatorService::WorkerDone, record.payload, &r);
      return;
    }
    case CoordinatorAction::kGetShardMap: {
      v1::ShardMap r;
      if (Call(service, &CoordinatorService::GetShardMap, record.payload, &r).ok())
        CheckShardMap(r, config);
      return;
    }
    case CoordinatorAction::kGetJobStatus: {
      v1::JobStatus r;
      Call(service, &CoordinatorService::GetJobStatus, record.payload, &r);
      return;
    }
    case CoordinatorAction::kStopJob: {
      v1::StopJobResponse r;
      Call(service, &CoordinatorService::StopJob, record.payload, &r);
      return;
    }
    case CoordinatorAction::kCheckpointJob: {
      v1::CheckpointJobResponse r;
      Call(service, &CoordinatorService::CheckpointJob, record.payload, &r);
      return;
    }
    case CoordinatorAction::kAdvanceClock: {
      uint32_t ms = 0;
      std::memcpy(&ms, record.payload.data(), std::min<size_t>(4, record.payload.size()));
      clock.Advance(absl::Milliseconds(std::min(ms, kMaxClockStepMs)));
      service.DetectFailures();
      return;
    }
  }
}

// What a restarted coordinator does with the state file: a waiting or
// running job must be taken back.
void CheckRestart(const v1::JobConfig& config, const v1::ShardMap& map, FakeClock& clock,
                  MemoryEnv& env) {
  if (!env.FileExists(kCoordinatorFuzzStatePath)) return;
  absl::StatusOr<std::string> bytes = env.ReadFile(kCoordinatorFuzzStatePath);
  FUZZ_CHECK(bytes.ok(), std::string(bytes.status().message()));
  v1::CoordinatorState state;
  FUZZ_CHECK(state.ParseFromString(*bytes), "the state file does not parse");
  if (state.state() != v1::JOB_STATE_WAITING && state.state() != v1::JOB_STATE_RUNNING)
    return;
  CoordinatorOptions options;
  options.env = &env;
  options.state_path = kCoordinatorFuzzStatePath;
  CoordinatorService restarted(config, map, [&clock] { return clock.Now(); }, options);
  absl::Status s = restarted.TakeOver(state, kCoordinatorFuzzStatePath);
  FUZZ_CHECK(s.ok(), std::string(s.message()));
  restarted.Shutdown();
}

}  // namespace
}  // namespace grps

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace grps;
  QuietLogs();
  if (size == 0) return 0;
  const v1::JobConfig config = CoordinatorFuzzConfig(data[0]);
  absl::StatusOr<v1::ShardMap> map =
      BuildShardMap(ModelTensors(config), config.num_servers(), config.chunk_bytes());
  FUZZ_CHECK(map.ok(), std::string(map.status().message()));

  FakeClock clock(absl::UnixEpoch());
  MemoryEnv env;
  {
    CoordinatorOptions options;
    options.env = &env;
    options.state_path = kCoordinatorFuzzStatePath;
    CoordinatorService service(config, *map, [&clock] { return clock.Now(); }, options);
    service.Shutdown();  // see the top of this file: no real-time waits
    for (const CoordinatorRecord& record : ParseCoordinatorScript(data, size))
      Play(service, config, clock, record);
    // What the hosting process reads between requests.
    (void)service.Status();
    (void)service.EveryLiveMemberSawEnd();
    (void)service.restore_order();
    absl::Status persisted = service.PersistState(/*force=*/true);
    FUZZ_CHECK(persisted.ok(), std::string(persisted.message()));
    service.WaitForManifestWrites();
  }
  CheckRestart(config, *map, clock, env);
  return 0;
}
