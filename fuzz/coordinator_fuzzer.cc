// Fuzz target: the coordinator's request handlers. The input is a script of
// requests (fuzz/coordinator_script.h) played against a CoordinatorService
// called directly, in process: no gRPC server, a ServerContext with no
// deadline whose only metadata is the role the server's interceptor would
// have given the call (RoleOf), a fake clock, and the file system in
// memory.
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
//
// DefineModel and LeaseExamples, which a worker-token holder may send with
// anything in them, are checked for more: a refused call changes nothing
// (the job's status, membership epoch and ledger progress included, and the
// state a restarted coordinator would read), and an accepted lease is at
// most what was wanted, of blocks in the ledger's range, with no rank
// holding more than ExampleLedger::kMaxHeld.
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "coordinator/coordinator_service.h"
#include "coordinator/example_ledger.h"
#include "coordinator/testing/fake_clock.h"
#include "fuzz/coordinator_script.h"
#include "fuzz/fuzz_check.h"
#include "fuzz/memory_env.h"
#include "fuzz/quiet_logs.h"
#include "google/protobuf/util/field_comparator.h"
#include "google/protobuf/util/message_differencer.h"
#include "grpcpp/test/server_context_test_spouse.h"
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

// The role daemon/security.cc's interceptor gives a call (its kRoleHeader):
// the worker token's for what a worker sends, which is all a worker-token
// holder may send; the admin's for a server's and an operator's calls (and
// for every call of a coordinator with no --token).
std::string RoleOf(CoordinatorAction action) {
  switch (action) {
    case CoordinatorAction::kRegisterWorker:
    case CoordinatorAction::kWorkerDone:
    case CoordinatorAction::kDefineModel:
    case CoordinatorAction::kLeaseExamples:
      return "worker";
    default:
      return "admin";
  }
}

// Calls `handler` with `request`, as `action`'s role.
template <typename Request, typename Response>
grpc::Status CallAs(CoordinatorService& service, CoordinatorAction action,
                    grpc::Status (CoordinatorService::*handler)(grpc::ServerContext*,
                                                                const Request*, Response*),
                    const Request& request, Response* response) {
  grpc::ServerContext context;
  grpc::testing::ServerContextTestSpouse metadata(&context);
  metadata.AddClientMetadata("grps-role", RoleOf(action));
  return (service.*handler)(&context, &request, response);
}

// Parses the record's payload as a Request (as gRPC would before the
// handler: a payload protobuf refuses never reaches it) and calls `handler`.
// OK and the response, or the handler's error.
template <typename Request, typename Response>
grpc::Status Call(CoordinatorService& service, const CoordinatorRecord& record,
                  grpc::Status (CoordinatorService::*handler)(grpc::ServerContext*,
                                                              const Request*, Response*),
                  Response* response) {
  Request request;
  if (!request.ParseFromArray(record.payload.data(), static_cast<int>(record.payload.size())))
    return grpc::Status(grpc::StatusCode::INTERNAL, "not parsed");
  return CallAs(service, record.action, handler, request, response);
}

// What a refused call must leave as it was (the clock stands still during a
// call, so an unchanged job reports an equal status and state).
struct JobSnapshot {
  v1::JobStatus status;
  v1::CoordinatorState state;
};

JobSnapshot Snapshot(const CoordinatorService& service) {
  return {service.Status(), service.ExportState()};
}

void CheckUnchanged(const JobSnapshot& before, const CoordinatorService& service,
                    absl::string_view call, const grpc::Status& refusal) {
  const JobSnapshot after = Snapshot(service);
  std::string differences;
  // A NaN figure that nothing changed (a reported loss) is the same value.
  google::protobuf::util::DefaultFieldComparator floats;
  floats.set_treat_nan_as_equal(true);
  google::protobuf::util::MessageDifferencer differ;
  differ.set_field_comparator(&floats);
  differ.ReportDifferencesToString(&differences);
  const bool same = differ.Compare(before.status, after.status) &&
                    differ.Compare(before.state, after.state);
  FUZZ_CHECK(same, absl::StrCat("a refused ", call, " (", refusal.error_message(),
                                ") changed the job: ", differences));
}

// DefineModel and LeaseExamples: see the top of this file.
void PlayWorkerRequest(CoordinatorService& service, const v1::JobConfig& config,
                       const CoordinatorRecord& record) {
  const JobSnapshot before = Snapshot(service);
  if (record.action == CoordinatorAction::kDefineModel) {
    v1::DefineModelResponse r;
    grpc::Status st = Call(service, record, &CoordinatorService::DefineModel, &r);
    if (!st.ok()) CheckUnchanged(before, service, "DefineModel", st);
    return;
  }
  v1::LeaseExamplesRequest request;
  if (!request.ParseFromArray(record.payload.data(), static_cast<int>(record.payload.size())))
    return;
  v1::LeaseExamplesResponse r;
  grpc::Status st =
      CallAs(service, record.action, &CoordinatorService::LeaseExamples, request, &r);
  if (!st.ok()) {
    CheckUnchanged(before, service, "LeaseExamples", st);
    return;
  }
  FUZZ_CHECK(static_cast<uint32_t>(r.blocks_size()) <= request.want(),
             absl::StrCat(r.blocks_size(), " blocks leased, ", request.want(), " wanted"));
  const v1::DataProgress data = service.Status().data();
  for (uint64_t block : r.blocks())
    FUZZ_CHECK(block < data.total_blocks(),
               absl::StrCat("block ", block, " leased of ", data.total_blocks()));
  FUZZ_CHECK(data.leased() <= ExampleLedger::kMaxHeld * JobRanks(config),
             absl::StrCat(data.leased(), " blocks held"));
}

void Play(CoordinatorService& service, const v1::JobConfig& config, FakeClock& clock,
          const CoordinatorRecord& record) {
  switch (record.action) {
    case CoordinatorAction::kRegisterServer: {
      v1::RegisterServerResponse r;
      if (!Call(service, record, &CoordinatorService::RegisterServer, &r).ok()) return;
      FUZZ_CHECK(r.shard() < config.num_servers(), absl::StrCat("shard ", r.shard()));
      FUZZ_CHECK(r.config().job_id() == config.job_id(), r.config().job_id());
      CheckShardMap(r.shard_map(), config);
      return;
    }
    case CoordinatorAction::kRegisterWorker: {
      v1::RegisterWorkerResponse r;
      if (!Call(service, record, &CoordinatorService::RegisterWorker, &r).ok()) return;
      FUZZ_CHECK(r.rank() < JobRanks(config), absl::StrCat("rank ", r.rank()));
      CheckShardMap(r.shard_map(), config);
      return;
    }
    case CoordinatorAction::kHeartbeat: {
      v1::HeartbeatResponse r;
      if (!Call(service, record, &CoordinatorService::Heartbeat, &r).ok()) return;
      FUZZ_CHECK(r.live_workers_size() == r.live_worker_incarnations_size(),
                 absl::StrCat(r.live_workers_size(), " live workers, ",
                              r.live_worker_incarnations_size(), " incarnations"));
      for (uint32_t rank : r.live_workers())
        FUZZ_CHECK(rank < JobRanks(config), absl::StrCat("live rank ", rank));
      if (r.has_shard_map()) CheckShardMap(r.shard_map(), config);
      return;
    }
    case CoordinatorAction::kWorkerDone: {
      v1::WorkerDoneResponse r;
      Call(service, record, &CoordinatorService::WorkerDone, &r);
      return;
    }
    case CoordinatorAction::kGetShardMap: {
      v1::ShardMap r;
      if (Call(service, record, &CoordinatorService::GetShardMap, &r).ok())
        CheckShardMap(r, config);
      return;
    }
    case CoordinatorAction::kGetJobStatus: {
      v1::JobStatus r;
      Call(service, record, &CoordinatorService::GetJobStatus, &r);
      return;
    }
    case CoordinatorAction::kStopJob: {
      v1::StopJobResponse r;
      Call(service, record, &CoordinatorService::StopJob, &r);
      return;
    }
    case CoordinatorAction::kCheckpointJob: {
      v1::CheckpointJobResponse r;
      Call(service, record, &CoordinatorService::CheckpointJob, &r);
      return;
    }
    case CoordinatorAction::kAdvanceClock: {
      uint32_t ms = 0;
      std::memcpy(&ms, record.payload.data(), std::min<size_t>(4, record.payload.size()));
      clock.Advance(absl::Milliseconds(std::min(ms, kMaxClockStepMs)));
      service.DetectFailures();
      return;
    }
    case CoordinatorAction::kDefineModel:
    case CoordinatorAction::kLeaseExamples:
      PlayWorkerRequest(service, config, record);
      return;
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
  absl::Status valid = ValidateJobConfig(config);
  FUZZ_CHECK(valid.ok(), std::string(valid.message()));
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
