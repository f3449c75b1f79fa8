// CoordinatorService over real gRPC on 127.0.0.1 with real stubs: roles and
// job ids, statuses, blocking registrations, watch streams, checkpoints and
// take-overs end to end. The job's rules alone are job_state_machine_test's.
// Liveness runs on a fake clock, so no test waits for a heartbeat timeout.
#include "coordinator/coordinator_service.h"

#include <atomic>
#include <functional>
#include <memory>
#include <thread>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "checkpoint/checkpoint.h"
#include "coordinator/example_ledger.h"
#include "coordinator/testing/fake_clock.h"
#include "coordinator/testing/test_job.h"
#include "daemon/daemon.h"
#include "daemon/env.h"
#include "gmock/gmock.h"
#include "google/protobuf/util/message_differencer.h"
#include "grpcpp/generic/generic_stub.h"
#include "gtest/gtest.h"
#include "job/job_config.h"
#include "job/shard_map.h"
#include "job/user_model.h"
#include "test/captured_log.h"
#include "test/temp_folders.h"

namespace grps {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

class CoordinatorServiceTest : public ::testing::Test {
 protected:
  ~CoordinatorServiceTest() override {
    if (service_ != nullptr) service_->Shutdown();
    if (server_.server != nullptr) server_.server->Shutdown();
  }

  void StartJob(uint32_t servers, uint32_t workers, v1::ConsistencyMode mode = v1::MODE_SYNC,
                const std::string& checkpoint_dir = "",
                const std::function<void(CoordinatorService*)>& before_serving = nullptr) {
    config_ = TestJobConfig(servers, workers, mode, checkpoint_dir);
    config_.set_checkpoint_storage(storage_);
    config_.set_max_workers(max_workers_);
    if (configure_) configure_(&config_);
    absl::StatusOr<v1::ShardMap> map = TestShardMap(config_);
    ASSERT_TRUE(map.ok()) << map.status();
    map_ = *map;
    CoordinatorOptions options;
    if (!checkpoint_dir.empty()) options.state_path = JoinPath(checkpoint_dir, "coordinator.state");
    service_ = std::make_unique<CoordinatorService>(
        config_, *map, [this] { return clock_.Now(); }, options);
    if (before_serving) before_serving(service_.get());
    absl::StatusOr<GrpcServer> server = StartGrpcServer("127.0.0.1:0", {service_.get()});
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = std::move(*server);
    stub_ = v1::Coordinator::NewStub(MakeChannel(WithPort("127.0.0.1:0", server_.port)));
  }

  static std::unique_ptr<grpc::ClientContext> Context(absl::Duration timeout = absl::Seconds(10)) {
    auto context = std::make_unique<grpc::ClientContext>();
    context->set_deadline(absl::ToChronoTime(absl::Now() + timeout));
    return context;
  }

  grpc::Status RegisterServer(int32_t shard, const std::string& address,
                              v1::RegisterServerResponse* response,
                              const std::string& job_id = "test-job",
                              const v1::ShardCheckpoint* restore_failed = nullptr) {
    v1::RegisterServerRequest request;
    request.set_job_id(job_id);
    request.set_address(address);
    request.set_requested_shard(shard);
    if (restore_failed != nullptr) *request.mutable_restore_failed() = *restore_failed;
    return stub_->RegisterServer(Context().get(), request, response);
  }

  // Registers servers for every shard at 127.0.0.1:7000 + shard.
  std::vector<v1::RegisterServerResponse> RegisterAllServers() {
    std::vector<v1::RegisterServerResponse> out(config_.num_servers());
    for (uint32_t s = 0; s < config_.num_servers(); ++s) {
      grpc::Status st = RegisterServer(-1, absl::StrCat("127.0.0.1:", 7000 + s), &out[s]);
      EXPECT_TRUE(st.ok()) << st.error_message();
    }
    return out;
  }

  grpc::Status RegisterWorker(int32_t rank, v1::RegisterWorkerResponse* response,
                              absl::Duration timeout = absl::Seconds(10)) {
    v1::RegisterWorkerRequest request;
    request.set_job_id("test-job");
    request.set_host("worker-host");
    request.set_backend("cpu");
    request.set_requested_rank(rank);
    return stub_->RegisterWorker(Context(timeout).get(), request, response);
  }

  std::vector<v1::RegisterWorkerResponse> RegisterAllWorkers() {
    std::vector<v1::RegisterWorkerResponse> out(config_.num_workers());
    for (uint32_t r = 0; r < config_.num_workers(); ++r) {
      grpc::Status st = RegisterWorker(-1, &out[r]);
      EXPECT_TRUE(st.ok()) << st.error_message();
    }
    return out;
  }

  grpc::Status WorkerBeat(uint32_t rank, uint64_t incarnation, const v1::WorkerProgress& progress,
                          v1::HeartbeatResponse* response, uint64_t map_epoch = ~0ull) {
    v1::HeartbeatRequest request;
    request.set_job_id("test-job");
    request.set_worker_rank(rank);
    request.set_incarnation(incarnation);
    *request.mutable_progress() = progress;
    request.set_shard_map_epoch(map_epoch);
    return stub_->Heartbeat(Context().get(), request, response);
  }

  grpc::Status ServerBeat(uint32_t shard, uint64_t incarnation, v1::HeartbeatResponse* response,
                          const v1::ShardStatus& status = v1::ShardStatus(),
                          bool final_report = false) {
    v1::HeartbeatRequest request;
    request.set_job_id("test-job");
    request.set_server_shard(shard);
    request.set_incarnation(incarnation);
    *request.mutable_shard() = status;
    request.set_final_report(final_report);
    request.set_shard_map_epoch(~0ull);
    return stub_->Heartbeat(Context().get(), request, response);
  }

  grpc::Status Done(uint32_t rank, uint64_t incarnation, uint64_t step, bool final_eval = false) {
    v1::WorkerDoneRequest request;
    request.set_job_id("test-job");
    request.set_worker_rank(rank);
    request.set_incarnation(incarnation);
    request.mutable_progress()->set_step(step);
    if (final_eval) {
      request.set_has_final_eval(true);
      request.set_final_test_accuracy(0.87f);
      request.set_final_test_loss(0.36f);
    }
    v1::WorkerDoneResponse response;
    return stub_->WorkerDone(Context().get(), request, &response);
  }

  v1::JobStatus Status() {
    v1::JobStatus status;
    grpc::Status st = stub_->GetJobStatus(Context().get(), v1::GetJobStatusRequest(), &status);
    EXPECT_TRUE(st.ok()) << st.error_message();
    return status;
  }

  // A shard's checkpoint report may complete a checkpoint, whose manifest
  // the service writes on a thread of its own: waits for that too.
  grpc::Status Beat(const v1::HeartbeatRequest& request, v1::HeartbeatResponse* response) {
    grpc::Status s = stub_->Heartbeat(Context().get(), request, response);
    if (request.shard().has_checkpoint()) service_->WaitForManifestWrites();
    return s;
  }

  static v1::HeartbeatRequest ServerRequest(uint32_t shard, uint64_t incarnation, uint64_t version,
                                            uint64_t generation = 0) {
    v1::HeartbeatRequest request;
    request.set_job_id("test-job");
    request.set_server_shard(shard);
    request.set_incarnation(incarnation);
    request.set_generation(generation);
    request.set_shard_map_epoch(~0ull);
    request.mutable_shard()->set_version(version);
    request.mutable_shard()->set_num_chunks(1);
    return request;
  }

  // What this coordinator persists now (in `dir`), as a coordinator that
  // takes the job over reads it; *file names the state file.
  v1::CoordinatorState PersistedState(const std::string& dir, std::string* file) {
    EXPECT_TRUE(service_->PersistState(/*force=*/true).ok());
    *file = JoinPath(dir, "coordinator.state");
    absl::StatusOr<std::string> bytes = Env::Default()->ReadFile(*file);
    EXPECT_TRUE(bytes.ok()) << bytes.status();
    v1::CoordinatorState state;
    EXPECT_TRUE(bytes.ok() && state.ParseFromString(*bytes));
    return state;
  }

  // Whether a RegisterWorker call is blocked in the service, waiting for the
  // shards, within 10 s (polls the service's hook: no guessed sleep).
  bool WaitUntilARegistrationWaits() {
    const absl::Time patience = absl::Now() + absl::Seconds(10);
    while (service_->waiting_registrations() == 0 && absl::Now() < patience)
      absl::SleepFor(absl::Milliseconds(1));
    return service_->waiting_registrations() > 0;
  }

  // A fresh empty folder for this test, removed after it.
  std::string TempFolder(const std::string& name) { return temp_.Make("coord-" + name); }

  // What shard `shard`'s server does for `request`: writes a (small) shard
  // file with WriteShardFile (into request.dir(), or with per-shard storage
  // into the checkpoint's folder under `own_root`), and returns the report.
  v1::ShardCheckpoint WriteFakeShard(const v1::CheckpointRequest& request, uint32_t shard,
                                     uint64_t version, const std::string& own_root = "") {
    const v1::ShardCheckpointFile file = FakeShardFile(map_, request.id(), shard, version);
    absl::StatusOr<v1::ShardCheckpoint> written = WriteShardFile(
        Env::Default(), own_root.empty() ? request.dir() : CheckpointFolder(own_root, request.id()),
        file);
    EXPECT_TRUE(written.ok()) << written.status();
    if (!written.ok()) return v1::ShardCheckpoint();
    written->set_coordinator_incarnation(request.coordinator_incarnation());
    return *written;
  }

  // What a refused call must leave as it was: the job's status (the fake
  // clock stands still, so an equal job answers an equal status), with its
  // membership epoch, and the state file PersistState writes.
  struct Snapshot {
    v1::JobStatus status;
    std::string state_file;
  };
  Snapshot Snap(const std::string& dir) {
    Snapshot snap;
    snap.status = Status();
    EXPECT_TRUE(service_->PersistState(/*force=*/true).ok());
    absl::StatusOr<std::string> bytes =
        Env::Default()->ReadFile(JoinPath(dir, "coordinator.state"));
    EXPECT_TRUE(bytes.ok()) << bytes.status();
    snap.state_file = bytes.value_or("");
    return snap;
  }
  void ExpectUnchanged(const Snapshot& before, const std::string& dir) {
    const Snapshot after = Snap(dir);
    std::string differences;
    google::protobuf::util::MessageDifferencer differ;
    differ.ReportDifferencesToString(&differences);
    EXPECT_TRUE(differ.Compare(before.status, after.status)) << differences;
    EXPECT_EQ(after.status.membership_epoch(), before.status.membership_epoch());
    EXPECT_TRUE(after.state_file == before.state_file) << "the state file changed";
  }

  TempFolders temp_;  // first: its folders go after the service that writes there
  FakeClock clock_;
  v1::CheckpointStorage storage_ = v1::CHECKPOINT_STORAGE_SHARED;  // set before StartJob
  uint32_t max_workers_ = 0;                       // set before StartJob: an elastic job
  std::function<void(v1::JobConfig*)> configure_;  // set before StartJob: edits the job
  v1::ShardMap map_;
  v1::JobConfig config_;
  std::unique_ptr<CoordinatorService> service_;
  GrpcServer server_;
  std::unique_ptr<v1::Coordinator::Stub> stub_;
};

TEST_F(CoordinatorServiceTest, ServersAndWorkersGetSlotsInRegistrationOrder) {
  StartJob(2, 2);
  v1::RegisterServerResponse s1, s0;
  ASSERT_TRUE(RegisterServer(1, "127.0.0.1:7001", &s1).ok());
  ASSERT_TRUE(RegisterServer(-1, "127.0.0.1:7000", &s0, /*job_id=*/"").ok());
  EXPECT_EQ(s1.shard(), 1u);
  EXPECT_EQ(s0.shard(), 0u);
  EXPECT_NE(s0.incarnation(), s1.incarnation());
  EXPECT_EQ(s0.config().job_id(), "test-job");
  EXPECT_EQ(s0.shard_map().shards(1).address(), "127.0.0.1:7001");

  std::vector<v1::RegisterWorkerResponse> w = RegisterAllWorkers();
  EXPECT_EQ(w[0].rank(), 0u);
  EXPECT_EQ(w[1].rank(), 1u);
  EXPECT_EQ(w[1].config().num_workers(), 2u);
  const v1::ShardMap& map = w[0].shard_map();
  EXPECT_TRUE(ValidateShardMap(map).ok());
  ASSERT_EQ(map.shards_size(), 2);
  EXPECT_EQ(map.shards(0).address(), "127.0.0.1:7000");
  EXPECT_EQ(map.shards(0).incarnation(), s0.incarnation());
  EXPECT_EQ(map.shards(1).address(), "127.0.0.1:7001");

  v1::ShardMap fetched;
  ASSERT_TRUE(stub_->GetShardMap(Context().get(), v1::GetShardMapRequest(), &fetched).ok());
  EXPECT_EQ(fetched.SerializeAsString(), map.SerializeAsString());

  v1::RegisterWorkerResponse extra;
  EXPECT_EQ(RegisterWorker(-1, &extra).error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
}

TEST_F(CoordinatorServiceTest, RegisterWorkerBlocksUntilEveryShardRegisters) {
  StartJob(2, 1);
  std::atomic<bool> returned{false};
  v1::RegisterWorkerResponse response;
  grpc::Status status;
  std::thread worker([&] {
    status = RegisterWorker(-1, &response);
    returned = true;
  });
  v1::RegisterServerResponse s0, s1;
  EXPECT_TRUE(WaitUntilARegistrationWaits());
  EXPECT_FALSE(returned);
  ASSERT_TRUE(RegisterServer(-1, "127.0.0.1:7000", &s0).ok());
  // Woken by that registration, it waits again: shard 1 is still missing.
  EXPECT_TRUE(WaitUntilARegistrationWaits());
  EXPECT_FALSE(returned) << "returned with shard 1 still missing";
  EXPECT_EQ(Status().workers(0).state(), v1::MEMBER_STATE_UNSPECIFIED);
  ASSERT_TRUE(RegisterServer(-1, "127.0.0.1:7001", &s1).ok());
  worker.join();
  ASSERT_TRUE(status.ok()) << status.error_message();
  EXPECT_EQ(response.rank(), 0u);
  EXPECT_EQ(response.shard_map().shards(1).address(), "127.0.0.1:7001");
}

TEST_F(CoordinatorServiceTest, RegisterWorkerGivesUpAtTheDeadlineHoldingNoRank) {
  StartJob(2, 1);
  v1::RegisterWorkerResponse response;
  const absl::Time start = absl::Now();
  grpc::Status st = RegisterWorker(-1, &response, absl::Milliseconds(300));
  EXPECT_EQ(st.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED);
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
  // The worker that gave up holds no rank; the next one gets rank 0.
  EXPECT_EQ(Status().workers(0).state(), v1::MEMBER_STATE_UNSPECIFIED);
  RegisterAllServers();
  ASSERT_TRUE(RegisterWorker(-1, &response).ok());
  EXPECT_EQ(response.rank(), 0u);
}

TEST_F(CoordinatorServiceTest, ShutdownReleasesAWaitingRegistration) {
  StartJob(1, 1);
  grpc::Status status;
  std::thread worker([&] {
    v1::RegisterWorkerResponse response;
    status = RegisterWorker(-1, &response, absl::Seconds(30));
  });
  // Shut down only once the registration waits (one that came after the
  // shutdown would be refused on arrival, and the test would not test the
  // release).
  EXPECT_TRUE(WaitUntilARegistrationWaits());
  const absl::Time start = absl::Now();
  service_->Shutdown();
  worker.join();
  EXPECT_EQ(status.error_code(), grpc::StatusCode::UNAVAILABLE);
  EXPECT_LT(absl::Now() - start, absl::Seconds(10));
}

TEST_F(CoordinatorServiceTest, RequestsForAnotherJobAreRejected) {
  StartJob(1, 1);
  v1::RegisterServerResponse s;
  grpc::Status st = RegisterServer(-1, "127.0.0.1:7000", &s, "other-job");
  EXPECT_EQ(st.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_THAT(st.error_message(), ::testing::HasSubstr("test-job"));
  ASSERT_TRUE(RegisterServer(-1, "127.0.0.1:7000", &s).ok());

  v1::HeartbeatRequest beat;
  beat.set_job_id("other-job");
  beat.set_server_shard(0);
  beat.set_incarnation(s.incarnation());
  v1::HeartbeatResponse reply;
  EXPECT_EQ(stub_->Heartbeat(Context().get(), beat, &reply).error_code(),
            grpc::StatusCode::FAILED_PRECONDITION);
  beat.set_job_id("");  // only registration may leave the job id out
  EXPECT_EQ(stub_->Heartbeat(Context().get(), beat, &reply).error_code(),
            grpc::StatusCode::FAILED_PRECONDITION);

  v1::WorkerDoneRequest done;
  done.set_job_id("other-job");
  v1::WorkerDoneResponse done_reply;
  EXPECT_EQ(stub_->WorkerDone(Context().get(), done, &done_reply).error_code(),
            grpc::StatusCode::FAILED_PRECONDITION);
}

TEST_F(CoordinatorServiceTest, AnEmptyRegistrationTakesAFreeSlotNotALiveSlotZero) {
  StartJob(2, 2);
  v1::RegisterServerResponse first;
  ASSERT_TRUE(RegisterServer(0, "127.0.0.1:7000", &first).ok());
  // A zero-byte RegisterServerRequest (bar its address): shard 1, and shard 0
  // keeps its incarnation.
  v1::RegisterServerRequest bare_server;
  bare_server.set_address("127.0.0.1:7001");
  v1::RegisterServerResponse second;
  ASSERT_TRUE(stub_->RegisterServer(Context().get(), bare_server, &second).ok());
  EXPECT_EQ(second.shard(), 1u);

  v1::RegisterWorkerResponse rank0;
  ASSERT_TRUE(RegisterWorker(0, &rank0).ok());
  v1::RegisterWorkerResponse other;
  ASSERT_TRUE(stub_->RegisterWorker(Context().get(), v1::RegisterWorkerRequest(), &other).ok());
  EXPECT_EQ(other.rank(), 1u);
  const v1::JobStatus status = service_->Status();
  EXPECT_EQ(status.shards(0).incarnation(), first.incarnation());
  EXPECT_EQ(status.workers(0).incarnation(), rank0.incarnation());
}

TEST_F(CoordinatorServiceTest, AHugeJobIdIsCutAndEscapedInTheError) {
  StartJob(1, 1);
  v1::RegisterServerResponse s;
  const std::string huge = std::string("\x01\n", 2) + std::string(1 << 20, 'j');
  grpc::Status st = RegisterServer(-1, "127.0.0.1:7000", &s, huge);
  EXPECT_EQ(st.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_LT(st.error_message().size(), 512u);
  EXPECT_THAT(st.error_message(), ::testing::HasSubstr("\\x01\\n"));
  EXPECT_EQ(st.error_message().find('\n'), std::string::npos);
}

TEST_F(CoordinatorServiceTest, MalformedHeartbeatsGetClearErrors) {
  StartJob(1, 1);
  RegisterAllServers();
  v1::HeartbeatRequest beat;
  beat.set_job_id("test-job");
  v1::HeartbeatResponse reply;
  EXPECT_EQ(stub_->Heartbeat(Context().get(), beat, &reply).error_code(),
            grpc::StatusCode::INVALID_ARGUMENT);
  // Without an incarnation a member cannot be adopted: register first.
  EXPECT_EQ(WorkerBeat(0, 0, v1::WorkerProgress(), &reply).error_code(),
            grpc::StatusCode::NOT_FOUND);
  EXPECT_EQ(ServerBeat(0, 0, &reply).error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_EQ(ServerBeat(3, 1, &reply).error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  v1::RegisterServerResponse bad;
  EXPECT_EQ(RegisterServer(-1, "no-port", &bad).error_code(), grpc::StatusCode::INVALID_ARGUMENT);
}

TEST_F(CoordinatorServiceTest, HeartbeatsReportStateLiveWorkersAndNewerMaps) {
  StartJob(2, 2);
  std::vector<v1::RegisterServerResponse> s = RegisterAllServers();
  std::vector<v1::RegisterWorkerResponse> w(2);
  ASSERT_TRUE(RegisterWorker(-1, &w[0]).ok());
  EXPECT_EQ(Status().state(), v1::JOB_STATE_WAITING);
  EXPECT_EQ(Status().message(), "waiting for worker 1 to register");
  ASSERT_TRUE(RegisterWorker(-1, &w[1]).ok());

  v1::HeartbeatResponse reply;
  ASSERT_TRUE(WorkerBeat(0, w[0].incarnation(), v1::WorkerProgress(), &reply, 0).ok());
  EXPECT_EQ(reply.job_state(), v1::JOB_STATE_RUNNING);
  EXPECT_THAT(reply.live_workers(), ElementsAre(0u, 1u));
  EXPECT_THAT(reply.live_worker_incarnations(),
              ElementsAre(w[0].incarnation(), w[1].incarnation()));
  EXPECT_EQ(reply.membership_epoch(), Status().membership_epoch());
  // The member knew map epoch 0: it gets the current map.
  EXPECT_EQ(reply.shard_map().shards(1).address(), "127.0.0.1:7001");
  const uint64_t map_epoch = reply.shard_map().epoch();
  ASSERT_TRUE(WorkerBeat(0, w[0].incarnation(), v1::WorkerProgress(), &reply, map_epoch).ok());
  EXPECT_FALSE(reply.has_shard_map());

  // A server restarting elsewhere changes the map; members learn it.
  v1::RegisterServerResponse moved;
  ASSERT_TRUE(RegisterServer(1, "127.0.0.1:7101", &moved).ok());
  ASSERT_TRUE(WorkerBeat(0, w[0].incarnation(), v1::WorkerProgress(), &reply, map_epoch).ok());
  ASSERT_TRUE(reply.has_shard_map());
  EXPECT_GT(reply.shard_map().epoch(), map_epoch);
  EXPECT_EQ(reply.shard_map().shards(1).address(), "127.0.0.1:7101");
  EXPECT_EQ(ServerBeat(1, s[1].incarnation(), &reply).error_code(),
            grpc::StatusCode::FAILED_PRECONDITION);
}

TEST_F(CoordinatorServiceTest, HeartbeatsUpdateTheJobStatus) {
  StartJob(2, 2);
  std::vector<v1::RegisterServerResponse> s = RegisterAllServers();
  std::vector<v1::RegisterWorkerResponse> w = RegisterAllWorkers();
  clock_.Advance(absl::Milliseconds(700));
  v1::HeartbeatResponse reply;
  v1::WorkerProgress p;
  p.set_step(12);
  p.set_total_steps(300);
  p.set_loss(0.9f);
  p.set_samples_per_sec(640);
  ASSERT_TRUE(WorkerBeat(1, w[1].incarnation(), p, &reply).ok());
  v1::ShardStatus shard;
  shard.set_version(11);
  shard.set_num_chunks(5);
  shard.set_bytes_in(1234);
  ASSERT_TRUE(ServerBeat(0, s[0].incarnation(), &reply, shard).ok());
  shard.set_version(12);
  ASSERT_TRUE(ServerBeat(1, s[1].incarnation(), &reply, shard).ok());
  clock_.Advance(absl::Milliseconds(300));

  v1::JobStatus status = Status();
  EXPECT_EQ(status.job_id(), "test-job");
  EXPECT_EQ(status.state(), v1::JOB_STATE_RUNNING);
  EXPECT_EQ(status.mode(), v1::MODE_SYNC);
  EXPECT_EQ(status.config().num_servers(), 2u);
  ASSERT_EQ(status.workers_size(), 2);
  EXPECT_EQ(status.workers(1).progress().step(), 12u);
  EXPECT_EQ(status.workers(1).last_heartbeat_ms_ago(), 300u);
  EXPECT_EQ(status.workers(0).last_heartbeat_ms_ago(), 1000u);
  EXPECT_EQ(status.workers(1).host(), "worker-host");
  ASSERT_EQ(status.shards_size(), 2);
  EXPECT_EQ(status.shards(0).bytes_in(), 1234u);
  EXPECT_EQ(status.shards(0).address(), "127.0.0.1:7000");
  EXPECT_EQ(status.shards(0).state(), v1::MEMBER_STATE_ALIVE);
  EXPECT_EQ(status.global_step(), 11u);
  EXPECT_EQ(status.total_steps(), 300u);
  EXPECT_FLOAT_EQ(status.samples_per_sec(), 640);
  EXPECT_DOUBLE_EQ(status.elapsed_seconds(), 1.0);
}

TEST_F(CoordinatorServiceTest, ALiveRankIsRefusedUntilItsWorkerIsDeclaredDead) {
  StartJob(1, 2);
  RegisterAllServers();
  std::vector<v1::RegisterWorkerResponse> w = RegisterAllWorkers();
  const uint64_t epoch = Status().membership_epoch();
  // A restart within the heartbeat timeout: the old incarnation still lives.
  clock_.Advance(absl::Milliseconds(500));
  v1::RegisterWorkerResponse again;
  grpc::Status taken = RegisterWorker(1, &again);
  EXPECT_EQ(taken.error_code(), grpc::StatusCode::ALREADY_EXISTS);
  EXPECT_NE(taken.error_message().find("once the old incarnation is declared dead"),
            std::string::npos)
      << taken.error_message();
  EXPECT_EQ(Status().membership_epoch(), epoch);
  v1::HeartbeatResponse reply;
  EXPECT_TRUE(WorkerBeat(1, w[1].incarnation(), v1::WorkerProgress(), &reply).ok());
  // Silent for longer than the timeout: declared dead, and the rank is free.
  clock_.Advance(absl::Milliseconds(1100));
  service_->DetectFailures();
  EXPECT_EQ(Status().workers(1).state(), v1::MEMBER_STATE_DEAD);
  ASSERT_TRUE(RegisterWorker(1, &again).ok());
  EXPECT_GT(again.incarnation(), w[1].incarnation());
}

TEST_F(CoordinatorServiceTest, ReturningWorkerGetsANewIncarnation) {
  StartJob(1, 2);
  RegisterAllServers();
  std::vector<v1::RegisterWorkerResponse> w = RegisterAllWorkers();
  clock_.Advance(absl::Seconds(2));
  service_->DetectFailures();  // both dead

  v1::RegisterWorkerResponse again;
  ASSERT_TRUE(RegisterWorker(1, &again).ok());
  EXPECT_EQ(again.rank(), 1u);
  EXPECT_GT(again.incarnation(), w[1].incarnation());
  v1::HeartbeatResponse reply;
  EXPECT_EQ(WorkerBeat(1, w[1].incarnation(), v1::WorkerProgress(), &reply).error_code(),
            grpc::StatusCode::FAILED_PRECONDITION);
  ASSERT_TRUE(WorkerBeat(1, again.incarnation(), v1::WorkerProgress(), &reply).ok());
  EXPECT_THAT(reply.live_workers(), ElementsAre(1u));
  EXPECT_THAT(reply.live_worker_incarnations(), ElementsAre(again.incarnation()));
  EXPECT_EQ(Status().workers(1).incarnation(), again.incarnation());
}

TEST_F(CoordinatorServiceTest, ATwoClassModelsAucReachesTheStatusAndOneOutsideZeroToOneIsRefused) {
  StartJob(1, 1);
  RegisterAllServers();
  std::vector<v1::RegisterWorkerResponse> w = RegisterAllWorkers();
  v1::WorkerDoneRequest done;
  done.set_job_id("test-job");
  done.set_worker_rank(0);
  done.set_incarnation(w[0].incarnation());
  done.mutable_progress()->set_step(10);
  done.mutable_progress()->set_test_accuracy(0.8f);
  done.mutable_progress()->set_test_loss(0.4f);
  done.mutable_progress()->set_test_auc(0.85f);
  done.set_has_final_eval(true);
  done.set_final_test_accuracy(0.8f);
  done.set_final_test_loss(0.4f);
  done.set_final_test_auc(1.5f);
  v1::WorkerDoneResponse reply;
  EXPECT_EQ(stub_->WorkerDone(Context().get(), done, &reply).error_code(),
            grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(Status().state(), v1::JOB_STATE_RUNNING);
  done.set_final_test_auc(0.875f);
  ASSERT_TRUE(stub_->WorkerDone(Context().get(), done, &reply).ok());
  const v1::JobStatus status = Status();
  EXPECT_EQ(status.state(), v1::JOB_STATE_COMPLETED);
  ASSERT_TRUE(status.has_final_test_auc());
  EXPECT_FLOAT_EQ(status.final_test_auc(), 0.875f);
  ASSERT_TRUE(status.has_test_auc());
  EXPECT_FLOAT_EQ(status.test_auc(), 0.875f);  // the final evaluation is the latest
}

TEST_F(CoordinatorServiceTest, JobCompletesWhenEveryWorkerIsDone) {
  StartJob(2, 2);
  std::vector<v1::RegisterServerResponse> s = RegisterAllServers();
  std::vector<v1::RegisterWorkerResponse> w = RegisterAllWorkers();
  ASSERT_TRUE(Done(0, w[0].incarnation(), 100).ok());
  EXPECT_EQ(Status().state(), v1::JOB_STATE_RUNNING);
  EXPECT_FALSE(service_->EveryLiveMemberSawEnd());
  ASSERT_TRUE(Done(1, w[1].incarnation(), 100, /*final_eval=*/true).ok());

  v1::JobStatus status = Status();
  EXPECT_EQ(status.state(), v1::JOB_STATE_COMPLETED);
  EXPECT_TRUE(status.has_final_eval());
  EXPECT_FLOAT_EQ(status.final_test_accuracy(), 0.87f);
  EXPECT_FLOAT_EQ(status.final_test_loss(), 0.36f);
  EXPECT_FLOAT_EQ(status.test_accuracy(), 0.87f);
  EXPECT_FALSE(status.has_final_test_auc());  // not a two-class model's
  EXPECT_FALSE(status.has_test_auc());
  EXPECT_EQ(status.workers(0).state(), v1::MEMBER_STATE_FINISHED);
  EXPECT_TRUE(service_->WaitForEnd(absl::ZeroDuration()));

  // The coordinator may exit once every live server has learned the end and
  // sent its final report.
  EXPECT_FALSE(service_->EveryLiveMemberSawEnd());
  v1::HeartbeatResponse reply;
  ASSERT_TRUE(ServerBeat(0, s[0].incarnation(), &reply).ok());
  EXPECT_EQ(reply.job_state(), v1::JOB_STATE_COMPLETED);
  EXPECT_TRUE(reply.live_workers().empty());
  EXPECT_FALSE(service_->EveryLiveMemberSawEnd());
  ASSERT_TRUE(ServerBeat(0, s[0].incarnation(), &reply, v1::ShardStatus(), true).ok());
  EXPECT_FALSE(service_->EveryLiveMemberSawEnd());
  ASSERT_TRUE(ServerBeat(1, s[1].incarnation(), &reply, v1::ShardStatus(), true).ok());
  // The finished workers still heartbeat: they must hear the end too.
  EXPECT_FALSE(service_->EveryLiveMemberSawEnd());
  for (uint32_t r = 0; r < 2; ++r) {
    ASSERT_TRUE(WorkerBeat(r, w[r].incarnation(), v1::WorkerProgress(), &reply).ok());
    EXPECT_EQ(reply.job_state(), v1::JOB_STATE_COMPLETED);
  }
  EXPECT_TRUE(service_->EveryLiveMemberSawEnd());

  v1::RegisterWorkerResponse late;
  EXPECT_EQ(RegisterWorker(-1, &late).error_code(), grpc::StatusCode::FAILED_PRECONDITION);
}

TEST_F(CoordinatorServiceTest, AnEvaluatorWhoseProgramHasNoEvaluationCompletesTheJobWithoutOne) {
  StartJob(1, 2);
  RegisterAllServers();
  std::vector<v1::RegisterWorkerResponse> w = RegisterAllWorkers();
  ASSERT_TRUE(Done(0, w[0].incarnation(), 10).ok());
  ASSERT_TRUE(Done(1, w[1].incarnation(), 10).ok());
  EXPECT_EQ(Status().state(), v1::JOB_STATE_RUNNING);  // waits for the final evaluation

  v1::WorkerDoneRequest declined;
  declined.set_job_id("test-job");
  declined.set_worker_rank(0);
  declined.set_incarnation(w[0].incarnation());
  declined.set_no_final_eval(true);
  declined.set_has_final_eval(true);
  declined.set_final_test_accuracy(0.5f);
  v1::WorkerDoneResponse reply;
  EXPECT_EQ(stub_->WorkerDone(Context().get(), declined, &reply).error_code(),
            grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(Status().state(), v1::JOB_STATE_RUNNING);
  declined.set_has_final_eval(false);
  ASSERT_TRUE(stub_->WorkerDone(Context().get(), declined, &reply).ok());
  v1::JobStatus status = Status();
  EXPECT_EQ(status.state(), v1::JOB_STATE_COMPLETED);
  EXPECT_FALSE(status.has_final_eval());
  EXPECT_THAT(status.message(), HasSubstr("the evaluating worker's program has none"));
}

TEST_F(CoordinatorServiceTest, ACollectiveWaitsForEveryRankWhileTheJobFormsThenForTheLiveOnes) {
  StartJob(1, 2);
  RegisterAllServers();
  v1::RegisterWorkerResponse w0, w1;
  ASSERT_TRUE(RegisterWorker(0, &w0).ok());
  v1::CollectiveRequest request;
  request.set_job_id("test-job");
  request.set_worker_rank(0);
  request.set_incarnation(w0.incarnation());
  request.set_name("avg_loss");
  request.set_payload("zero");
  v1::CollectiveResponse first;
  ASSERT_TRUE(stub_->Collective(Context().get(), request, &first).ok());
  // Rank 1 has not registered: the job waits for it, and so does the round.
  EXPECT_FALSE(first.complete());

  ASSERT_TRUE(RegisterWorker(1, &w1).ok());
  request.set_worker_rank(1);
  request.set_incarnation(w1.incarnation());
  request.set_payload("one");
  v1::CollectiveResponse second;
  ASSERT_TRUE(stub_->Collective(Context().get(), request, &second).ok());
  ASSERT_TRUE(second.complete());
  EXPECT_EQ(second.round(), first.round());
  EXPECT_THAT(second.ranks(), ElementsAre(0, 1));
  EXPECT_THAT(second.payloads(), ElementsAre("zero", "one"));

  // Rank 0 asks for its round's result.
  v1::CollectiveRequest ask;
  ask.set_job_id("test-job");
  ask.set_worker_rank(0);
  ask.set_incarnation(w0.incarnation());
  ask.set_round(first.round());
  v1::CollectiveResponse result;
  ASSERT_TRUE(stub_->Collective(Context().get(), ask, &result).ok());
  EXPECT_THAT(result.payloads(), ElementsAre("zero", "one"));

  request.set_name("");
  EXPECT_EQ(stub_->Collective(Context().get(), request, &result).error_code(),
            grpc::StatusCode::INVALID_ARGUMENT);
}

TEST_F(CoordinatorServiceTest, RestartedWorkerGetsStartStep) {
  StartJob(1, 2);
  RegisterAllServers();
  std::vector<v1::RegisterWorkerResponse> w = RegisterAllWorkers();
  EXPECT_EQ(w[0].start_step(), 0u);
  EXPECT_EQ(w[1].start_step(), 0u);
  v1::WorkerProgress progress;
  progress.set_step(37);
  v1::HeartbeatResponse reply;
  ASSERT_TRUE(WorkerBeat(1, w[1].incarnation(), progress, &reply).ok());
  clock_.Advance(absl::Seconds(2));
  service_->DetectFailures();  // both dead

  v1::RegisterWorkerResponse again;
  ASSERT_TRUE(RegisterWorker(1, &again).ok());
  EXPECT_EQ(again.start_step(), 37u);
  ASSERT_TRUE(RegisterWorker(0, &again).ok());
  EXPECT_EQ(again.start_step(), 0u);
}

TEST_F(CoordinatorServiceTest, StopJobStopsWithTheReason) {
  StartJob(1, 1);
  std::vector<v1::RegisterServerResponse> s = RegisterAllServers();
  v1::StopJobRequest stop;
  stop.set_reason("operator test");
  v1::StopJobResponse stopped;
  ASSERT_TRUE(stub_->StopJob(Context().get(), stop, &stopped).ok());
  v1::JobStatus status = Status();
  EXPECT_EQ(status.state(), v1::JOB_STATE_STOPPED);
  EXPECT_EQ(status.message(), "operator test");

  v1::HeartbeatResponse reply;
  ASSERT_TRUE(ServerBeat(0, s[0].incarnation(), &reply).ok());
  EXPECT_EQ(reply.job_state(), v1::JOB_STATE_STOPPED);
  ASSERT_TRUE(ServerBeat(0, s[0].incarnation(), &reply, v1::ShardStatus(), true).ok());
  EXPECT_TRUE(service_->EveryLiveMemberSawEnd());
  v1::RegisterWorkerResponse w;
  EXPECT_EQ(RegisterWorker(-1, &w).error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_TRUE(stub_->StopJob(Context().get(), stop, &stopped).ok());  // idempotent
}

TEST_F(CoordinatorServiceTest, ADrainedWorkerLeavesWithoutAFinalEvaluation) {
  StartJob(1, 2);
  RegisterAllServers();
  std::vector<v1::RegisterWorkerResponse> w = RegisterAllWorkers();
  v1::DrainWorkerRequest drain;
  drain.set_rank(1);
  v1::DrainWorkerResponse drained;
  ASSERT_TRUE(stub_->DrainWorker(Context().get(), drain, &drained).ok());
  drain.set_rank(7);
  EXPECT_EQ(stub_->DrainWorker(Context().get(), drain, &drained).error_code(),
            grpc::StatusCode::NOT_FOUND);
  v1::WorkerDoneRequest leave;
  leave.set_job_id("test-job");
  leave.set_worker_rank(1);
  leave.set_incarnation(w[1].incarnation());
  leave.set_leaving(true);
  leave.set_has_final_eval(true);
  leave.set_final_test_accuracy(0.5f);
  v1::WorkerDoneResponse done;
  EXPECT_EQ(stub_->WorkerDone(Context().get(), leave, &done).error_code(),
            grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(Status().workers(1).state(), v1::MEMBER_STATE_ALIVE);
  leave.set_has_final_eval(false);
  ASSERT_TRUE(stub_->WorkerDone(Context().get(), leave, &done).ok());
  EXPECT_EQ(Status().workers(1).state(), v1::MEMBER_STATE_LEFT);
  EXPECT_EQ(Status().worker_leaves(), 1u);
}

TEST_F(CoordinatorServiceTest, LeaseExamplesRefusesOversizedOrIncompleteRequestsAndChangesNothing) {
  max_workers_ = 4;
  StartJob(1, 2);
  RegisterAllServers();
  std::vector<v1::RegisterWorkerResponse> w = RegisterAllWorkers();
  auto request = [&] {
    v1::LeaseExamplesRequest r;
    r.set_job_id("test-job");
    r.set_worker_rank(0);
    r.set_incarnation(w[0].incarnation());
    r.set_want(1);
    r.set_train_examples(64 * 10);
    return r;
  };
  auto code = [&](const v1::LeaseExamplesRequest& r) {
    v1::LeaseExamplesResponse reply;
    return stub_->LeaseExamples(Context().get(), r, &reply).error_code();
  };
  v1::LeaseExamplesRequest r = request();
  r.set_want(65);
  EXPECT_EQ(code(r), grpc::StatusCode::INVALID_ARGUMENT);
  r = request();
  for (int i = 0; i < 1025; ++i) r.add_trained()->set_block(0);
  EXPECT_EQ(code(r), grpc::StatusCode::INVALID_ARGUMENT);
  r = request();
  r.set_train_examples(0);
  EXPECT_EQ(code(r), grpc::StatusCode::INVALID_ARGUMENT);
  r = request();
  r.set_job_id("other-job");
  EXPECT_EQ(code(r), grpc::StatusCode::FAILED_PRECONDITION);
  r = request();
  r.set_incarnation(w[1].incarnation());  // not rank 0's
  EXPECT_EQ(code(r), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_FALSE(Status().has_data()) << "no refused request sized the ledger";

  // At the limits: 64 wanted, 1024 reported.
  r = request();
  r.set_want(64);
  v1::LeaseExamplesResponse reply;
  grpc::Status st = stub_->LeaseExamples(Context().get(), r, &reply);
  ASSERT_TRUE(st.ok()) << st.error_message();
  EXPECT_EQ(reply.blocks_size(), 15);  // 30 blocks over 2 live workers
  EXPECT_EQ(reply.blocks_per_epoch(), 10u);
  r = request();
  r.set_want(0);
  for (int i = 0; i < 1024; ++i) r.add_trained()->set_block(0);  // retries of one
  st = stub_->LeaseExamples(Context().get(), r, &reply);
  ASSERT_TRUE(st.ok()) << st.error_message();
  EXPECT_EQ(reply.blocks_size(), 0);
  const v1::DataProgress data = Status().data();
  EXPECT_EQ(data.consumed(), 1u);
  EXPECT_EQ(data.leased(), 14u);
  EXPECT_EQ(data.refused_reports(), 0u);
}

// ---- A worker-token holder's hostile requests (issue 39) ----

TEST_F(CoordinatorServiceTest, DefineModelRefusesWrappingOrOversizedModelsAndChangesNothing) {
  configure_ = [](v1::JobConfig* c) { c->set_model(v1::MODEL_USER); };
  const std::string dir = TempFolder("define-model");
  StartJob(2, 2, v1::MODE_SYNC, dir);
  auto model = [](const std::vector<std::vector<int64_t>>& shapes, int name_bytes = 2) {
    v1::DefineModelRequest request;
    request.set_job_id("test-job");
    for (size_t i = 0; i < shapes.size(); ++i) {
      v1::TensorSpec* t = request.add_tensors();
      const std::string index = std::to_string(i);
      t->set_name(std::string(std::max<int>(0, name_bytes - index.size()), 'w') + index);
      for (int64_t d : shapes[i]) t->add_shape(d);
      t->set_initializer("given");
    }
    return request;
  };
  const int64_t k2To32 = int64_t{1} << 32;
  const std::vector<std::pair<v1::DefineModelRequest, std::string>> hostile = {
      // The element count wraps to 0: the shard map divided by it (SIGFPE).
      {model({{k2To32, k2To32}}), "tensor 0 'w0' has shape [4294967296, 4294967296]"},
      {model({{int64_t{1} << 40, 1 << 24}}), "tensor 0 'w0' has shape [1099511627776"},
      // Wraps to 1: "a tensor of 3.4e38 elements" in one chunk of one.
      {model({{k2To32 + 1, k2To32 - 1, k2To32 + 1, k2To32 - 1}}), "16 GiB on the shards"},
      {model({{int64_t{1} << 33}}), "tensor 0 'w0' has shape [8589934592]"},
      {model(std::vector<std::vector<int64_t>>(100000, {1})), "100000 tensors (at most 16384)"},
      {model(std::vector<std::vector<int64_t>>(16384, {1}), 64), "description takes"},
  };
  const Snapshot before = Snap(dir);
  for (const auto& [request, expected] : hostile) {
    v1::DefineModelResponse reply;
    grpc::Status st = stub_->DefineModel(Context().get(), request, &reply);
    EXPECT_EQ(st.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << expected;
    EXPECT_THAT(st.error_message(), HasSubstr(expected));
    ExpectUnchanged(before, dir);
  }
  // Still up, and a real model defines the job.
  v1::DefineModelResponse reply;
  grpc::Status st = stub_->DefineModel(Context().get(), model({{64, 8}, {64}}), &reply);
  ASSERT_TRUE(st.ok()) << st.error_message();
  EXPECT_TRUE(reply.defined());
  EXPECT_EQ(Status().config().model_tensors_size(), 2);
}

TEST_F(CoordinatorServiceTest, DefineModelRefusesAModelOfMoreChunksThanAShardMapCarries) {
  configure_ = [](v1::JobConfig* c) {
    c->set_model(v1::MODEL_USER);
    c->set_chunk_bytes(1024);
  };
  const std::string dir = TempFolder("define-model-chunks");
  StartJob(2, 2, v1::MODE_SYNC, dir);
  v1::DefineModelRequest request;
  request.set_job_id("test-job");
  v1::TensorSpec* t = request.add_tensors();
  t->set_name("embedding");
  t->add_shape(1 << 16);
  t->add_shape(1 << 16);  // 16 GiB on the shards: 16,777,216 chunks of 1 KiB
  t->set_initializer("given");
  const Snapshot before = Snap(dir);
  v1::DefineModelResponse reply;
  grpc::Status st = stub_->DefineModel(Context().get(), request, &reply);
  EXPECT_EQ(st.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(st.error_message(), HasSubstr("cuts into 16777216 chunks of 1024 bytes"));
  ExpectUnchanged(before, dir);
}

TEST_F(CoordinatorServiceTest, AHeartbeatItsMemberCancelledBeforeItsMessageIsNoRefusal) {
  // A member stopping its heartbeats cancels the one in flight; the server
  // then reads no message ("Couldn't initialize byte buffer reader",
  // INTERNAL), which was logged as a refusal in about one job of four.
  CapturedLog log;
  StartJob(1, 1);
  grpc::GenericStub stub(MakeChannel(WithPort("127.0.0.1:0", server_.port)));
  for (int i = 0; i < 20; ++i) {
    grpc::ClientContext context;
    grpc::CompletionQueue cq;
    std::unique_ptr<grpc::GenericClientAsyncReaderWriter> call =
        stub.PrepareCall(&context, "/grps.v1.Coordinator/Heartbeat", &cq);
    void* tag = nullptr;
    bool ok = false;
    call->StartCall(nullptr);
    ASSERT_TRUE(cq.Next(&tag, &ok));
    absl::SleepFor(absl::Milliseconds(20));  // the server has the headers
    context.TryCancel();
    grpc::Status status;
    call->Finish(&status, nullptr);
    ASSERT_TRUE(cq.Next(&tag, &ok));
    EXPECT_EQ(status.error_code(), grpc::StatusCode::CANCELLED);
    cq.Shutdown();
    while (cq.Next(&tag, &ok)) {
    }
  }
  server_.server->Shutdown();  // every call's end is logged by now
  for (const std::string& line : log.Lines())
    EXPECT_EQ(line.find("refused"), std::string::npos) << line;
}

class HostileLeaseTest : public CoordinatorServiceTest {
 protected:
  // An elastic job (2 workers, up to 4) running, with rank 2 joining it.
  void SetUp() override {
    max_workers_ = 4;
    dir_ = TempFolder("hostile-lease");
    StartJob(1, 2, v1::MODE_SYNC, dir_);
    RegisterAllServers();
    workers_ = RegisterAllWorkers();
    ASSERT_EQ(Status().state(), v1::JOB_STATE_RUNNING);
    ASSERT_TRUE(RegisterWorker(2, &joiner_).ok());
    ASSERT_TRUE(Status().workers(2).joining());
  }

  v1::LeaseExamplesRequest Lease(uint32_t rank, uint64_t incarnation, uint64_t train_examples,
                                 uint32_t want) {
    v1::LeaseExamplesRequest r;
    r.set_job_id("test-job");
    r.set_worker_rank(rank);
    r.set_incarnation(incarnation);
    r.set_train_examples(train_examples);
    r.set_want(want);
    return r;
  }

  grpc::Status Call(const v1::LeaseExamplesRequest& r, v1::LeaseExamplesResponse* reply) {
    return stub_->LeaseExamples(Context().get(), r, reply);
  }

  std::string dir_;
  std::vector<v1::RegisterWorkerResponse> workers_;
  v1::RegisterWorkerResponse joiner_;
};

TEST_F(HostileLeaseTest, ARefusedFirstLeaseSizesNoLedgerAndMarksNoRankReady) {
  const Snapshot before = Snap(dir_);
  v1::LeaseExamplesResponse reply;
  // 2,100 examples and a report of block 2^64 - 1, from rank 0 and from the
  // joiner: before, the first sized the ledger at 2,100's shape and the
  // second made rank 2 ready, though both were refused.
  for (auto [rank, incarnation] :
       {std::pair<uint32_t, uint64_t>{0, workers_[0].incarnation()}, {2, joiner_.incarnation()}}) {
    v1::LeaseExamplesRequest r = Lease(rank, incarnation, 2100, 1);
    r.add_trained()->set_block(~uint64_t{0});
    grpc::Status st = Call(r, &reply);
    EXPECT_EQ(st.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << rank;
    EXPECT_THAT(st.error_message(),
                HasSubstr("trained block 18446744073709551615 is out of range"));
    ExpectUnchanged(before, dir_);
  }
  EXPECT_TRUE(Status().workers(2).joining());
  // Each other way to be refused: none changes anything either.
  std::vector<std::pair<v1::LeaseExamplesRequest, std::string>> refused;
  refused.push_back({Lease(0, workers_[0].incarnation(), ~uint64_t{0}, 64),
                     "train_examples 18446744073709551615 is more than 1099511627776"});
  refused.push_back({Lease(0, workers_[0].incarnation(), 0, 1), "train_examples must be"});
  refused.push_back({Lease(2, joiner_.incarnation(), 2000, 65), "want 65 is more than 64"});
  v1::LeaseExamplesRequest held = Lease(2, joiner_.incarnation(), 2000, 1);
  held.add_held(93);  // 2,000 examples: 31 blocks an epoch, 93 in all
  refused.push_back({held, "held block 93 is out of range; the job has 93"});
  v1::LeaseExamplesRequest reports = Lease(2, joiner_.incarnation(), 2000, 1);
  for (int i = 0; i < 1025; ++i) reports.add_trained()->set_block(0);
  refused.push_back({reports, "at most 1024 trained blocks per report"});
  for (const auto& [r, expected] : refused) {
    grpc::Status st = Call(r, &reply);
    EXPECT_EQ(st.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << expected;
    EXPECT_THAT(st.error_message(), HasSubstr(expected));
    ExpectUnchanged(before, dir_);
  }

  // The real training set sizes the ledger, and the joiner's first lease
  // makes it ready.
  grpc::Status st = Call(Lease(0, workers_[0].incarnation(), 2000, 8), &reply);
  ASSERT_TRUE(st.ok()) << st.error_message();
  EXPECT_EQ(reply.blocks_size(), 8);
  EXPECT_EQ(reply.blocks_per_epoch(), 31u);
  st = Call(Lease(2, joiner_.incarnation(), 2000, 1), &reply);
  ASSERT_TRUE(st.ok()) << st.error_message();
  EXPECT_FALSE(Status().workers(2).joining());
  EXPECT_EQ(Status().membership_epoch(), before.status.membership_epoch() + 1);
  // Another training set is refused now, and changes nothing.
  const Snapshot sized = Snap(dir_);
  EXPECT_EQ(Call(Lease(1, workers_[1].incarnation(), 2100, 1), &reply).error_code(),
            grpc::StatusCode::FAILED_PRECONDITION);
  ExpectUnchanged(sized, dir_);
}

// The bounded form of "a lease loop of 30 s keeps the coordinator's memory
// flat" (docs/security.md has the 30 s figure): a rank that never reports
// holds at most kMaxHeld blocks, and the ledger and the state file stop
// growing there.
TEST_F(HostileLeaseTest, ALeaseLoopThatNeverReportsHoldsABoundedNumberOfBlocks) {
  const uint64_t train_examples = 64 * 100000;  // 300,000 blocks over 3 epochs
  v1::LeaseExamplesResponse reply;
  uint64_t leased = 0;
  for (int i = 0; i < 2; ++i) {
    grpc::Status st = Call(Lease(0, workers_[0].incarnation(), train_examples, 64), &reply);
    ASSERT_TRUE(st.ok()) << st.error_message();
    leased += reply.blocks_size();
  }
  EXPECT_EQ(leased, ExampleLedger::kMaxHeld);
  const Snapshot full = Snap(dir_);
  for (int i = 0; i < 2000; ++i) {
    grpc::Status st = Call(Lease(0, workers_[0].incarnation(), train_examples, 64), &reply);
    ASSERT_TRUE(st.ok()) << st.error_message();
    ASSERT_EQ(reply.blocks_size(), 0) << "call " << i;
    ASSERT_FALSE(reply.exhausted()) << "blocks are left for the others";
  }
  ExpectUnchanged(full, dir_);
  EXPECT_EQ(Status().data().leased(), ExampleLedger::kMaxHeld);
  // The other workers are leased as before.
  grpc::Status st = Call(Lease(1, workers_[1].incarnation(), train_examples, 8), &reply);
  ASSERT_TRUE(st.ok()) << st.error_message();
  EXPECT_EQ(reply.blocks_size(), 8);
}

TEST_F(CoordinatorServiceTest, LeaseExamplesInAJobThatIsNotElasticIsFailedPrecondition) {
  StartJob(1, 2);
  RegisterAllServers();
  std::vector<v1::RegisterWorkerResponse> w = RegisterAllWorkers();
  v1::LeaseExamplesRequest r;
  r.set_job_id("test-job");
  r.set_worker_rank(0);
  r.set_incarnation(w[0].incarnation());
  r.set_want(1);
  r.set_train_examples(640);
  v1::LeaseExamplesResponse reply;
  EXPECT_EQ(stub_->LeaseExamples(Context().get(), r, &reply).error_code(),
            grpc::StatusCode::FAILED_PRECONDITION);
}

TEST_F(CoordinatorServiceTest, StopJobCannotStopACompletedJob) {
  StartJob(1, 1);
  RegisterAllServers();
  std::vector<v1::RegisterWorkerResponse> w = RegisterAllWorkers();
  ASSERT_TRUE(Done(0, w[0].incarnation(), 10, /*final_eval=*/true).ok());
  v1::StopJobResponse stopped;
  EXPECT_EQ(stub_->StopJob(Context().get(), v1::StopJobRequest(), &stopped).error_code(),
            grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_EQ(Status().state(), v1::JOB_STATE_COMPLETED);
}

TEST_F(CoordinatorServiceTest, WatchStreamsSnapshotsUntilTheJobCompletes) {
  StartJob(1, 1);
  RegisterAllServers();
  std::vector<v1::RegisterWorkerResponse> w = RegisterAllWorkers();

  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(20)));
  v1::WatchJobStatusRequest request;
  request.set_interval_ms(20);
  std::unique_ptr<grpc::ClientReader<v1::JobStatus>> reader =
      stub_->WatchJobStatus(&context, request);
  v1::JobStatus snapshot;
  for (int i = 0; i < 3; ++i) {
    ASSERT_TRUE(reader->Read(&snapshot));
    EXPECT_EQ(snapshot.state(), v1::JOB_STATE_RUNNING);
  }
  ASSERT_TRUE(Done(0, w[0].incarnation(), 10, /*final_eval=*/true).ok());
  std::vector<v1::JobState> rest;
  while (reader->Read(&snapshot)) rest.push_back(snapshot.state());
  grpc::Status st = reader->Finish();
  EXPECT_TRUE(st.ok()) << st.error_message();
  ASSERT_FALSE(rest.empty());
  EXPECT_EQ(rest.back(), v1::JOB_STATE_COMPLETED);
}

TEST_F(CoordinatorServiceTest, WatchEndsWhenTheClientCancels) {
  StartJob(1, 1);
  grpc::ClientContext context;
  v1::WatchJobStatusRequest request;
  request.set_interval_ms(60'000);
  std::unique_ptr<grpc::ClientReader<v1::JobStatus>> reader =
      stub_->WatchJobStatus(&context, request);
  v1::JobStatus snapshot;
  ASSERT_TRUE(reader->Read(&snapshot));
  EXPECT_EQ(snapshot.state(), v1::JOB_STATE_WAITING);
  context.TryCancel();
  while (reader->Read(&snapshot)) {
  }
  EXPECT_EQ(reader->Finish().error_code(), grpc::StatusCode::CANCELLED);
  // grpc::Server::Shutdown() waits for every handler: the watch must have
  // noticed the cancellation rather than sleep out its minute.
  const absl::Time start = absl::Now();
  server_.server->Shutdown();
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
}

TEST_F(CoordinatorServiceTest, WatchStreamsAreLimitedAndSoIsTheirRate) {
  StartJob(1, 1);
  std::vector<std::unique_ptr<grpc::ClientContext>> contexts;
  std::vector<std::unique_ptr<grpc::ClientReader<v1::JobStatus>>> readers;
  v1::WatchJobStatusRequest request;
  request.set_interval_ms(1);  // taken as the minimum, 100 ms
  v1::JobStatus snapshot;
  for (int i = 0; i < CoordinatorService::kMaxWatchStreams; ++i) {
    contexts.push_back(std::make_unique<grpc::ClientContext>());
    readers.push_back(stub_->WatchJobStatus(contexts.back().get(), request));
    ASSERT_TRUE(readers.back()->Read(&snapshot));
  }
  // Three more snapshots take at least two minimum intervals.
  const absl::Time start = absl::Now();
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(readers[0]->Read(&snapshot));
  EXPECT_GE(absl::Now() - start, absl::Milliseconds(190));
  grpc::ClientContext one_more;
  auto refused = stub_->WatchJobStatus(&one_more, request);
  EXPECT_FALSE(refused->Read(&snapshot));
  EXPECT_EQ(refused->Finish().error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  // A stream that ends makes room.
  contexts[0]->TryCancel();
  while (readers[0]->Read(&snapshot)) {
  }
  readers[0]->Finish();
  const absl::Time until = absl::Now() + absl::Seconds(10);
  bool admitted = false;
  while (!admitted && absl::Now() < until) {
    grpc::ClientContext again;
    auto reader = stub_->WatchJobStatus(&again, request);
    admitted = reader->Read(&snapshot);
    again.TryCancel();
    while (reader->Read(&snapshot)) {
    }
    reader->Finish();
  }
  EXPECT_TRUE(admitted);
  for (auto& context : contexts) context->TryCancel();
  for (size_t i = 1; i < readers.size(); ++i) {  // readers[0] has finished
    while (readers[i]->Read(&snapshot)) {
    }
    readers[i]->Finish();
  }
}

TEST_F(CoordinatorServiceTest, StatusFlagsStragglersAndAggregatesLiveWorkers) {
  StartJob(1, 3);
  RegisterAllServers();
  std::vector<v1::RegisterWorkerResponse> w = RegisterAllWorkers();
  EXPECT_FLOAT_EQ(Status().test_accuracy(), -1);

  const uint64_t steps[] = {100, 95, 50};
  const float losses[] = {0.3f, 0.4f, 0.8f};
  v1::HeartbeatResponse reply;
  for (uint32_t r = 0; r < 3; ++r) {
    v1::WorkerProgress p;
    p.set_step(steps[r]);
    p.set_total_steps(1000);
    p.set_loss(losses[r]);
    p.set_samples_per_sec(100);
    p.set_test_accuracy(-1);
    if (r == 1) {
      p.set_test_accuracy(0.7f);
      p.set_test_loss(0.9f);
    }
    ASSERT_TRUE(WorkerBeat(r, w[r].incarnation(), p, &reply).ok());
  }
  v1::JobStatus status = Status();
  EXPECT_FALSE(status.workers(0).straggler());
  EXPECT_FALSE(status.workers(1).straggler());
  EXPECT_TRUE(status.workers(2).straggler());
  EXPECT_FLOAT_EQ(status.samples_per_sec(), 300);
  EXPECT_FLOAT_EQ(status.loss(), 0.5f);
  EXPECT_FLOAT_EQ(status.test_accuracy(), 0.7f);
  EXPECT_FLOAT_EQ(status.test_loss(), 0.9f);
  EXPECT_FALSE(status.has_final_eval());
  EXPECT_EQ(status.global_step(), 100u);  // no shard has reported a version
  EXPECT_EQ(status.total_steps(), 1000u);
}

}  // namespace
}  // namespace grps

namespace grps {
namespace {

TEST_F(CoordinatorServiceTest, CheckpointJobWithoutCheckpointDirIsFailedPrecondition) {
  StartJob(1, 1);
  RegisterAllServers();
  RegisterAllWorkers();
  v1::CheckpointJobRequest request;
  v1::CheckpointJobResponse response;
  grpc::Status st = stub_->CheckpointJob(Context().get(), request, &response);
  EXPECT_EQ(st.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_NE(st.error_message().find("checkpoint_dir"), std::string::npos);
}

TEST_F(CoordinatorServiceTest, CheckpointJobBeforeTheJobRunsIsFailedPrecondition) {
  StartJob(1, 1, v1::MODE_SYNC, TempFolder("notrunning"));
  v1::CheckpointJobResponse response;
  EXPECT_EQ(
      stub_->CheckpointJob(Context().get(), v1::CheckpointJobRequest(), &response).error_code(),
      grpc::StatusCode::FAILED_PRECONDITION);
}

TEST_F(CoordinatorServiceTest,
       SyncCheckpointGoesToEveryServerAheadOfEveryShardAndCompletesOnlyWhenAllWrote) {
  const std::string dir = TempFolder("sync");
  StartJob(2, 1, v1::MODE_SYNC, dir);
  std::vector<v1::RegisterServerResponse> s = RegisterAllServers();
  RegisterAllWorkers();
  v1::HeartbeatResponse r0, r1;
  ASSERT_TRUE(Beat(ServerRequest(0, s[0].incarnation(), 7), &r0).ok());
  ASSERT_TRUE(Beat(ServerRequest(1, s[1].incarnation(), 8), &r1).ok());

  v1::CheckpointJobResponse asked;
  ASSERT_TRUE(stub_->CheckpointJob(Context().get(), v1::CheckpointJobRequest(), &asked).ok());
  EXPECT_EQ(asked.checkpoint().state(), v1::CHECKPOINT_STATE_PENDING);

  ASSERT_TRUE(Beat(ServerRequest(0, s[0].incarnation(), 8), &r0).ok());
  ASSERT_TRUE(Beat(ServerRequest(1, s[1].incarnation(), 8), &r1).ok());
  ASSERT_TRUE(r0.has_checkpoint());
  ASSERT_TRUE(r1.has_checkpoint());
  const v1::CheckpointRequest request = r0.checkpoint();
  EXPECT_EQ(request.id(), asked.checkpoint().id());
  EXPECT_EQ(r1.checkpoint().id(), request.id());
  EXPECT_GT(request.version(), 8u);  // ahead of every shard
  EXPECT_EQ(request.dir(), CheckpointFolder(dir, request.id()));

  // Shard 0 wrote its file: not a checkpoint yet.
  v1::HeartbeatRequest beat0 = ServerRequest(0, s[0].incarnation(), request.version());
  *beat0.mutable_shard()->mutable_checkpoint() = WriteFakeShard(request, 0, request.version());
  ASSERT_TRUE(Beat(beat0, &r0).ok());
  EXPECT_FALSE(r0.has_checkpoint());  // reported: no longer asked
  absl::StatusOr<CheckpointChoice> choice = FindNewestCheckpoint(Env::Default(), dir, "test-job");
  ASSERT_TRUE(choice.ok()) << choice.status();
  EXPECT_FALSE(choice->manifest.has_value());
  EXPECT_EQ(Status().pending_checkpoint().state(), v1::CHECKPOINT_STATE_PENDING);

  v1::HeartbeatRequest beat1 = ServerRequest(1, s[1].incarnation(), request.version());
  *beat1.mutable_shard()->mutable_checkpoint() = WriteFakeShard(request, 1, request.version());
  ASSERT_TRUE(Beat(beat1, &r1).ok());
  choice = FindNewestCheckpoint(Env::Default(), dir, "test-job");
  ASSERT_TRUE(choice.ok()) << choice.status();
  ASSERT_TRUE(choice->manifest.has_value());
  EXPECT_EQ(choice->manifest->id(), request.id());
  EXPECT_EQ(choice->manifest->step(), request.version());
  ASSERT_EQ(choice->manifest->worker_steps_size(), 1);
  EXPECT_EQ(choice->manifest->worker_steps(0), request.version());
  v1::JobStatus status = Status();
  EXPECT_EQ(status.last_checkpoint().id(), request.id());
  EXPECT_EQ(status.last_checkpoint().state(), v1::CHECKPOINT_STATE_COMPLETE);
  EXPECT_EQ(status.checkpoints_completed(), 1u);

  // wait=true on a new one returns once it failed (a shard reports FAILED).
  v1::CheckpointJobRequest wait;
  wait.set_wait(true);
  v1::CheckpointJobResponse waited;
  grpc::Status wait_status;
  std::thread waiter([&] { wait_status = stub_->CheckpointJob(Context().get(), wait, &waited); });
  v1::CheckpointRequest second;
  while (!second.id()) {  // polls until the checkpoint has been asked for
    ASSERT_TRUE(Beat(ServerRequest(0, s[0].incarnation(), 20), &r0).ok());
    if (r0.has_checkpoint()) second = r0.checkpoint();
  }
  v1::HeartbeatRequest failed = ServerRequest(0, s[0].incarnation(), 20);
  v1::ShardCheckpoint* report = failed.mutable_shard()->mutable_checkpoint();
  report->set_id(second.id());
  report->set_coordinator_incarnation(second.coordinator_incarnation());
  report->set_state(v1::CHECKPOINT_STATE_FAILED);
  report->set_error("chunk 3 already at version 30 > 22");
  ASSERT_TRUE(Beat(failed, &r0).ok());
  waiter.join();
  ASSERT_TRUE(wait_status.ok()) << wait_status.error_message();
  EXPECT_EQ(waited.checkpoint().state(), v1::CHECKPOINT_STATE_FAILED);
  EXPECT_NE(waited.checkpoint().error().find("version 30"), std::string::npos);
  status = Status();
  EXPECT_EQ(status.pending_checkpoint().state(), v1::CHECKPOINT_STATE_FAILED);
  EXPECT_EQ(status.last_checkpoint().id(), request.id());
}

TEST_F(CoordinatorServiceTest, ResumedJobHandsOutRestoreOrdersAndStartSteps) {
  const std::string dir = TempFolder("resume");
  v1::CheckpointManifest manifest;
  manifest.set_job_id("test-job");
  manifest.set_id(4);
  manifest.set_mode(v1::MODE_ASYNC);
  manifest.set_step(120);
  manifest.add_worker_steps(61);
  manifest.add_worker_steps(59);
  StartJob(2, 2, v1::MODE_ASYNC, dir, [&](CoordinatorService* service) {
    service->ResumeFrom(manifest, CheckpointFolder(dir, 4));
  });
  std::vector<v1::RegisterServerResponse> s = RegisterAllServers();
  for (const v1::RegisterServerResponse& r : s) {
    EXPECT_EQ(r.restore().generation(), 2u);
    EXPECT_EQ(r.restore().checkpoint_id(), 4u);
    EXPECT_EQ(r.restore().dir(), CheckpointFolder(dir, 4));
    EXPECT_EQ(r.restore().step(), 120u);
  }
  std::vector<v1::RegisterWorkerResponse> w = RegisterAllWorkers();
  EXPECT_EQ(w[0].start_step(), 61u);
  EXPECT_EQ(w[1].start_step(), 59u);
  EXPECT_EQ(w[0].generation(), 2u);
  v1::HeartbeatResponse reply;
  ASSERT_TRUE(Beat(ServerRequest(0, s[0].incarnation(), 120, /*generation=*/2), &reply).ok());
  EXPECT_EQ(reply.generation(), 2u);
  EXPECT_FALSE(reply.has_restore());
  // A member still in the job's first generation is told what to restore.
  ASSERT_TRUE(Beat(ServerRequest(1, s[1].incarnation(), 0, /*generation=*/1), &reply).ok());
  EXPECT_EQ(reply.restore().checkpoint_id(), 4u);
  EXPECT_EQ(Status().last_checkpoint().id(), 4u);
}

TEST_F(CoordinatorServiceTest, SyncServerRestartRollsBackAndFinishedRanksTrainAgain) {
  StartJob(2, 2);
  std::vector<v1::RegisterServerResponse> s = RegisterAllServers();
  std::vector<v1::RegisterWorkerResponse> w = RegisterAllWorkers();
  v1::WorkerProgress progress;
  progress.set_step(50);
  progress.set_total_steps(50);
  v1::WorkerDoneRequest done;
  done.set_job_id("test-job");
  done.set_worker_rank(0);
  done.set_incarnation(w[0].incarnation());
  *done.mutable_progress() = progress;
  v1::WorkerDoneResponse done_reply;
  ASSERT_TRUE(stub_->WorkerDone(Context().get(), done, &done_reply).ok());
  EXPECT_EQ(Status().workers(0).state(), v1::MEMBER_STATE_FINISHED);

  // Shard 1's server restarts (same address) while the job runs.
  v1::RegisterServerResponse again;
  ASSERT_TRUE(RegisterServer(1, "127.0.0.1:7001", &again).ok());
  EXPECT_EQ(again.restore().generation(), 2u);
  EXPECT_EQ(again.restore().checkpoint_id(), 0u);  // no checkpoint: step 0
  ASSERT_EQ(again.restore().worker_steps_size(), 2);
  EXPECT_EQ(again.restore().worker_steps(0), 0u);

  v1::JobStatus status = Status();
  EXPECT_EQ(status.generation(), 2u);
  EXPECT_EQ(status.workers(0).state(), v1::MEMBER_STATE_ALIVE);
  v1::HeartbeatResponse reply;
  ASSERT_TRUE(Beat(ServerRequest(0, s[0].incarnation(), 30, /*generation=*/1), &reply).ok());
  EXPECT_EQ(reply.generation(), 2u);
  EXPECT_EQ(reply.restore().generation(), 2u);
  EXPECT_THAT(reply.live_workers(), ElementsAre(0, 1));
  // The old generation's WorkerDone is refused; rank 0 trains again.
  v1::HeartbeatRequest old_beat;
  old_beat.set_job_id("test-job");
  old_beat.set_worker_rank(0);
  old_beat.set_incarnation(w[0].incarnation());
  old_beat.set_generation(1);
  ASSERT_TRUE(Beat(old_beat, &reply).ok());
  EXPECT_EQ(reply.restore().generation(), 2u);
  done.set_generation(1);
  EXPECT_EQ(stub_->WorkerDone(Context().get(), done, &done_reply).error_code(),
            grpc::StatusCode::ABORTED);
}

TEST_F(CoordinatorServiceTest, AsyncServerRestartRollsTheJobBackToo) {
  StartJob(2, 1, v1::MODE_ASYNC);
  RegisterAllServers();
  RegisterAllWorkers();
  EXPECT_EQ(Status().generation(), 1u);
  v1::RegisterServerResponse again;
  ASSERT_TRUE(RegisterServer(1, "127.0.0.1:7001", &again).ok());
  EXPECT_EQ(again.restore().generation(), 2u);
  EXPECT_EQ(again.restore().checkpoint_id(), 0u);  // none yet: the initial values
  EXPECT_EQ(Status().generation(), 2u);
}

TEST_F(CoordinatorServiceTest, TakenOverStateAnswersTheOldMembersAndTheJobCompletes) {
  const std::string dir = TempFolder("takeover");
  StartJob(1, 2, v1::MODE_SYNC, dir);
  std::vector<v1::RegisterServerResponse> s = RegisterAllServers();
  std::vector<v1::RegisterWorkerResponse> w = RegisterAllWorkers();
  ASSERT_TRUE(Done(1, w[1].incarnation(), 10).ok());
  std::string state_file;
  const v1::CoordinatorState state = PersistedState(dir, &state_file);
  EXPECT_EQ(state.state(), v1::JOB_STATE_RUNNING);

  // The coordinator dies; a new one takes the job back from the file.
  service_->Shutdown();
  server_.server->Shutdown();
  clock_.Advance(absl::Seconds(5));
  StartJob(1, 2, v1::MODE_SYNC, dir, [&](CoordinatorService* service) {
    ASSERT_TRUE(service->TakeOver(state, state_file).ok());
  });
  v1::JobStatus status = Status();
  EXPECT_EQ(status.state(), v1::JOB_STATE_RUNNING);
  EXPECT_TRUE(status.coordinator_restarted());
  EXPECT_EQ(status.workers(1).state(), v1::MEMBER_STATE_FINISHED);
  v1::HeartbeatResponse reply;
  ASSERT_TRUE(Beat(ServerRequest(0, s[0].incarnation(), 10), &reply).ok());
  ASSERT_TRUE(WorkerBeat(0, w[0].incarnation(), v1::WorkerProgress(), &reply).ok());
  EXPECT_EQ(reply.job_state(), v1::JOB_STATE_RUNNING);
  ASSERT_TRUE(Done(0, w[0].incarnation(), 10).ok());
  // The final checkpoint is asked for; the shard writes it.
  ASSERT_TRUE(Beat(ServerRequest(0, s[0].incarnation(), 10), &reply).ok());
  ASSERT_TRUE(reply.has_checkpoint());
  EXPECT_EQ(reply.checkpoint().version(), 10u);
  v1::HeartbeatRequest written = ServerRequest(0, s[0].incarnation(), 10);
  *written.mutable_shard()->mutable_checkpoint() = WriteFakeShard(reply.checkpoint(), 0, 10);
  ASSERT_TRUE(Beat(written, &reply).ok());
  ASSERT_TRUE(Done(0, w[0].incarnation(), 10, /*final_eval=*/true).ok());
  status = Status();
  EXPECT_EQ(status.state(), v1::JOB_STATE_COMPLETED) << status.message();
  EXPECT_EQ(status.last_checkpoint().step(), 10u);
}

TEST_F(CoordinatorServiceTest, ATakenOverJobGivesItsMembersAGraceToReconnect) {
  const std::string dir = TempFolder("grace");
  StartJob(1, 2, v1::MODE_SYNC, dir);
  std::vector<v1::RegisterServerResponse> s = RegisterAllServers();
  std::vector<v1::RegisterWorkerResponse> w = RegisterAllWorkers();
  std::string state_file;
  const v1::CoordinatorState state = PersistedState(dir, &state_file);
  service_->Shutdown();
  server_.server->Shutdown();
  StartJob(1, 2, v1::MODE_SYNC, dir, [&](CoordinatorService* service) {
    ASSERT_TRUE(service->TakeOver(state, state_file).ok());
  });
  // Past the heartbeat timeout (1 s) but within the grace (1 s + 1 s of
  // reconnection + 100 ms): the members are still dialling; nobody dies.
  clock_.Advance(absl::Milliseconds(1900));
  service_->DetectFailures();
  v1::JobStatus status = Status();
  EXPECT_EQ(status.shards(0).state(), v1::MEMBER_STATE_ALIVE);
  EXPECT_EQ(status.workers(0).state(), v1::MEMBER_STATE_ALIVE);
  EXPECT_EQ(status.workers(1).state(), v1::MEMBER_STATE_ALIVE);
  // Rank 1 comes back; the others stay silent past the grace: dead.
  v1::HeartbeatResponse reply;
  ASSERT_TRUE(WorkerBeat(1, w[1].incarnation(), v1::WorkerProgress(), &reply).ok());
  clock_.Advance(absl::Milliseconds(300));
  service_->DetectFailures();
  status = Status();
  EXPECT_EQ(status.shards(0).state(), v1::MEMBER_STATE_DEAD);
  EXPECT_EQ(status.workers(0).state(), v1::MEMBER_STATE_DEAD);
  EXPECT_EQ(status.workers(1).state(), v1::MEMBER_STATE_ALIVE);
}

TEST_F(CoordinatorServiceTest, AWorkerDoneLostWithTheCoordinatorIsTakenFromTheHeartbeat) {
  // Both workers finish, but the coordinator dies before it saves that; the
  // one that takes over from the older state hears "finished" in their
  // heartbeats and the job goes on to its end instead of waiting for good.
  const std::string dir = TempFolder("lostdone");
  StartJob(1, 2, v1::MODE_SYNC, dir);
  std::vector<v1::RegisterServerResponse> s = RegisterAllServers();
  std::vector<v1::RegisterWorkerResponse> w = RegisterAllWorkers();
  std::string state_file;
  const v1::CoordinatorState state = PersistedState(dir, &state_file);
  ASSERT_TRUE(Done(0, w[0].incarnation(), 10).ok());
  ASSERT_TRUE(Done(1, w[1].incarnation(), 10).ok());

  service_->Shutdown();
  server_.server->Shutdown();
  StartJob(1, 2, v1::MODE_SYNC, dir, [&](CoordinatorService* service) {
    ASSERT_TRUE(service->TakeOver(state, state_file).ok());
  });
  EXPECT_EQ(Status().workers(0).state(), v1::MEMBER_STATE_ALIVE);
  v1::HeartbeatResponse reply;
  for (uint32_t rank : {0u, 1u}) {
    v1::HeartbeatRequest beat;
    beat.set_job_id("test-job");
    beat.set_worker_rank(rank);
    beat.set_incarnation(w[rank].incarnation());
    beat.set_generation(1);
    beat.set_finished(true);
    beat.mutable_progress()->set_step(10);
    beat.mutable_progress()->set_total_steps(10);
    ASSERT_TRUE(Beat(beat, &reply).ok());
  }
  const v1::JobStatus status = Status();
  EXPECT_EQ(status.workers(0).state(), v1::MEMBER_STATE_FINISHED);
  EXPECT_EQ(status.workers(1).state(), v1::MEMBER_STATE_FINISHED);
  // Training is done: the final checkpoint is asked of the shard.
  ASSERT_TRUE(Beat(ServerRequest(0, s[0].incarnation(), 10), &reply).ok());
  ASSERT_TRUE(reply.has_checkpoint());
  EXPECT_EQ(reply.checkpoint().version(), 10u);
}

TEST_F(CoordinatorServiceTest, CoordinatorWithoutStateAdoptsMembersFromHeartbeats) {
  StartJob(1, 2);
  v1::HeartbeatRequest server = ServerRequest(0, 1'600'000'000'000, 40);
  server.mutable_shard()->set_address("127.0.0.1:7100");
  v1::HeartbeatResponse reply;
  ASSERT_TRUE(Beat(server, &reply).ok());
  v1::HeartbeatRequest worker;
  worker.set_job_id("test-job");
  worker.set_worker_rank(0);
  worker.set_incarnation(1'600'000'000'001);
  worker.mutable_progress()->set_step(40);
  ASSERT_TRUE(Beat(worker, &reply).ok());
  EXPECT_EQ(Status().state(), v1::JOB_STATE_WAITING);
  v1::HeartbeatRequest finished = worker;
  finished.set_worker_rank(1);
  finished.set_incarnation(1'600'000'000'002);
  finished.set_finished(true);
  ASSERT_TRUE(Beat(finished, &reply).ok());
  v1::JobStatus status = Status();
  EXPECT_EQ(status.state(), v1::JOB_STATE_RUNNING);
  EXPECT_TRUE(status.coordinator_restarted());
  EXPECT_EQ(status.shards(0).address(), "127.0.0.1:7100");
  EXPECT_EQ(status.workers(0).state(), v1::MEMBER_STATE_ALIVE);
  EXPECT_EQ(status.workers(1).state(), v1::MEMBER_STATE_FINISHED);
  // An older incarnation does not replace the adopted one.
  v1::HeartbeatRequest older = worker;
  older.set_incarnation(1'500'000'000'000);
  EXPECT_EQ(Beat(older, &reply).error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  // New registrations get incarnations above the adopted ones.
  v1::RegisterServerResponse again;
  ASSERT_TRUE(RegisterServer(0, "127.0.0.1:7100", &again).ok());
  EXPECT_GT(again.incarnation(), 1'600'000'000'002u);
}

TEST_F(CoordinatorServiceTest, PeriodicCheckpointByStepsAndARestartRollsBackToTheNewestComplete) {
  const std::string dir = TempFolder("periodic");
  StartJob(1, 2, v1::MODE_SYNC, dir);
  // Periodic rule: every 10 global steps (the config is the service's copy;
  // restart the service with it).
  config_.set_checkpoint_every_steps(10);
  {
    service_->Shutdown();
    server_.server->Shutdown();
    CoordinatorOptions options;
    service_ = std::make_unique<CoordinatorService>(
        config_, map_, [this] { return clock_.Now(); }, options);
    absl::StatusOr<GrpcServer> server = StartGrpcServer("127.0.0.1:0", {service_.get()});
    ASSERT_TRUE(server.ok());
    server_ = std::move(*server);
    stub_ = v1::Coordinator::NewStub(MakeChannel(WithPort("127.0.0.1:0", server_.port)));
  }
  std::vector<v1::RegisterServerResponse> s = RegisterAllServers();
  std::vector<v1::RegisterWorkerResponse> w = RegisterAllWorkers();
  v1::HeartbeatResponse reply;
  // The step moves a step a second (each a second after the last, no cut
  // waits for its rate to be measured).
  ASSERT_TRUE(Beat(ServerRequest(0, s[0].incarnation(), 5), &reply).ok());
  clock_.Advance(absl::Seconds(1));
  service_->DetectFailures();
  ASSERT_TRUE(Beat(ServerRequest(0, s[0].incarnation(), 5), &reply).ok());
  EXPECT_FALSE(reply.has_checkpoint());  // 5 + the least margin, 4: step 10 can wait
  ASSERT_TRUE(Beat(ServerRequest(0, s[0].incarnation(), 6), &reply).ok());
  clock_.Advance(absl::Seconds(1));
  service_->DetectFailures();
  ASSERT_TRUE(Beat(ServerRequest(0, s[0].incarnation(), 6), &reply).ok());
  ASSERT_TRUE(reply.has_checkpoint());
  const v1::CheckpointRequest request = reply.checkpoint();
  EXPECT_EQ(request.version(), 10u);  // asked for in time to cut at exactly step 10
  v1::HeartbeatRequest written = ServerRequest(0, s[0].incarnation(), request.version());
  *written.mutable_shard()->mutable_checkpoint() = WriteFakeShard(request, 0, request.version());
  ASSERT_TRUE(Beat(written, &reply).ok());
  EXPECT_EQ(Status().last_checkpoint().id(), request.id());

  // The server restarts: every rank resumes at the checkpoint's step.
  v1::RegisterServerResponse again;
  ASSERT_TRUE(RegisterServer(0, "127.0.0.1:7000", &again).ok());
  EXPECT_EQ(again.restore().generation(), 2u);
  EXPECT_EQ(again.restore().checkpoint_id(), request.id());
  EXPECT_EQ(again.restore().step(), request.version());
  EXPECT_EQ(again.restore().dir(), request.dir());
  ASSERT_EQ(again.restore().worker_steps_size(), 2);
  EXPECT_EQ(again.restore().worker_steps(1), request.version());
  // Rank 1's process dies too, and is declared dead before its restart
  // takes the rank.
  clock_.Advance(absl::Seconds(2));
  service_->DetectFailures();
  v1::RegisterWorkerResponse restarted_worker;
  ASSERT_TRUE(RegisterWorker(1, &restarted_worker).ok());
  EXPECT_EQ(restarted_worker.start_step(), request.version());
  EXPECT_EQ(restarted_worker.generation(), 2u);
}

TEST_F(CoordinatorServiceTest, AsyncCheckpointRecordsEachWorkersStepAtTheRequest) {
  const std::string dir = TempFolder("async");
  StartJob(1, 2, v1::MODE_ASYNC, dir);
  std::vector<v1::RegisterServerResponse> s = RegisterAllServers();
  std::vector<v1::RegisterWorkerResponse> w = RegisterAllWorkers();
  v1::HeartbeatResponse reply;
  v1::WorkerProgress p;
  p.set_step(33);
  ASSERT_TRUE(WorkerBeat(0, w[0].incarnation(), p, &reply).ok());
  p.set_step(35);
  ASSERT_TRUE(WorkerBeat(1, w[1].incarnation(), p, &reply).ok());
  v1::CheckpointJobResponse asked;
  ASSERT_TRUE(stub_->CheckpointJob(Context().get(), v1::CheckpointJobRequest(), &asked).ok());
  ASSERT_TRUE(Beat(ServerRequest(0, s[0].incarnation(), 60), &reply).ok());
  ASSERT_TRUE(reply.has_checkpoint());
  EXPECT_EQ(reply.checkpoint().version(), 0u);
  v1::HeartbeatRequest written = ServerRequest(0, s[0].incarnation(), 68);
  *written.mutable_shard()->mutable_checkpoint() = WriteFakeShard(reply.checkpoint(), 0, 68);
  ASSERT_TRUE(Beat(written, &reply).ok());
  absl::StatusOr<CheckpointChoice> choice = FindNewestCheckpoint(Env::Default(), dir, "test-job");
  ASSERT_TRUE(choice.ok() && choice->manifest.has_value());
  EXPECT_EQ(choice->manifest->step(), 68u);
  EXPECT_THAT(choice->manifest->worker_steps(), ElementsAre(33, 35));
  // A restarted async server rolls the job back to it: every worker resumes
  // at the step it had when the checkpoint was asked for.
  v1::RegisterServerResponse again;
  ASSERT_TRUE(RegisterServer(0, "127.0.0.1:7000", &again).ok());
  EXPECT_EQ(again.restore().generation(), 2u);
  EXPECT_EQ(again.restore().checkpoint_id(), asked.checkpoint().id());
  EXPECT_THAT(again.restore().worker_steps(), ElementsAre(33, 35));
}

TEST_F(CoordinatorServiceTest, ARollBackRefusesADamagedNewestCheckpointAndUsesTheOneBefore) {
  const std::string dir = TempFolder("damaged");
  StartJob(1, 1, v1::MODE_ASYNC, dir);
  std::vector<v1::RegisterServerResponse> s = RegisterAllServers();
  std::vector<v1::RegisterWorkerResponse> w = RegisterAllWorkers();
  v1::HeartbeatResponse reply;
  // Two complete checkpoints, at versions 10 and 20.
  std::vector<v1::CheckpointRequest> taken;
  for (uint64_t version : {10u, 20u}) {
    v1::CheckpointJobResponse asked;
    ASSERT_TRUE(stub_->CheckpointJob(Context().get(), v1::CheckpointJobRequest(), &asked).ok());
    ASSERT_TRUE(Beat(ServerRequest(0, s[0].incarnation(), version), &reply).ok());
    ASSERT_TRUE(reply.has_checkpoint());
    taken.push_back(reply.checkpoint());
    v1::HeartbeatRequest written = ServerRequest(0, s[0].incarnation(), version);
    *written.mutable_shard()->mutable_checkpoint() = WriteFakeShard(reply.checkpoint(), 0, version);
    ASSERT_TRUE(Beat(written, &reply).ok());
    ASSERT_EQ(Status().last_checkpoint().id(), taken.back().id());
  }
  // A byte of the newest one's shard file flips on disk.
  const std::string file = JoinPath(taken[1].dir(), ShardFileName(0));
  absl::StatusOr<std::string> bytes = Env::Default()->ReadFile(file);
  ASSERT_TRUE(bytes.ok()) << bytes.status();
  (*bytes)[bytes->size() / 2] ^= 0x40;
  ASSERT_TRUE(WriteFileAtomically(Env::Default(), file, *bytes).ok());
  // The server restarts: the job rolls back to the one before, which loads.
  v1::RegisterServerResponse again;
  ASSERT_TRUE(RegisterServer(0, "127.0.0.1:7000", &again).ok());
  EXPECT_EQ(again.restore().generation(), 2u);
  EXPECT_EQ(again.restore().checkpoint_id(), taken[0].id());
  EXPECT_EQ(again.restore().step(), 10u);
  // And the roll-back is in the state file already.
  absl::StatusOr<std::string> state_bytes =
      Env::Default()->ReadFile(JoinPath(dir, "coordinator.state"));
  ASSERT_TRUE(state_bytes.ok()) << state_bytes.status();
  v1::CoordinatorState state;
  ASSERT_TRUE(state.ParseFromString(*state_bytes));
  EXPECT_EQ(state.restore().generation(), 2u);
  EXPECT_EQ(state.restore().checkpoint_id(), taken[0].id());
}

TEST_F(CoordinatorServiceTest,
       PerShardStorageKeepsManifestsAndFallsBackFromACheckpointAShardCannotLoad) {
  // Each shard's files on its own volume, the manifests on the coordinator's.
  storage_ = v1::CHECKPOINT_STORAGE_PER_SHARD;
  const std::string dir = TempFolder("per-shard");
  const std::vector<std::string> own = {TempFolder("shard0"), TempFolder("shard1")};
  StartJob(2, 1, v1::MODE_ASYNC, dir);
  std::vector<v1::RegisterServerResponse> s = RegisterAllServers();
  std::vector<v1::RegisterWorkerResponse> w = RegisterAllWorkers();
  v1::HeartbeatResponse reply;
  std::vector<uint64_t> taken;
  for (uint64_t version : {10u, 20u}) {
    v1::CheckpointJobResponse asked;
    ASSERT_TRUE(stub_->CheckpointJob(Context().get(), v1::CheckpointJobRequest(), &asked).ok());
    for (uint32_t k = 0; k < 2; ++k) {
      ASSERT_TRUE(Beat(ServerRequest(k, s[k].incarnation(), version), &reply).ok());
      ASSERT_TRUE(reply.has_checkpoint());
      v1::HeartbeatRequest written = ServerRequest(k, s[k].incarnation(), version);
      *written.mutable_shard()->mutable_checkpoint() =
          WriteFakeShard(reply.checkpoint(), k, version, own[k]);
      ASSERT_TRUE(Beat(written, &reply).ok());
    }
    taken.push_back(asked.checkpoint().id());
    ASSERT_EQ(Status().last_checkpoint().id(), taken.back());
  }
  // The coordinator's folder holds the manifests and no shard file: as
  // shared storage it verifies nothing, by its manifests alone the newest.
  absl::StatusOr<std::vector<std::string>> names =
      Env::Default()->ListDir(CheckpointFolder(dir, taken[1]));
  ASSERT_TRUE(names.ok()) << names.status();
  EXPECT_THAT(*names, ElementsAre(kManifestName));
  absl::StatusOr<CheckpointChoice> shared = FindNewestCheckpoint(Env::Default(), dir, "");
  ASSERT_TRUE(shared.ok());
  EXPECT_FALSE(shared->manifest.has_value());
  absl::StatusOr<CheckpointChoice> manifests =
      FindNewestCheckpoint(Env::Default(), dir, "", CheckpointFiles::kManifestOnly);
  ASSERT_TRUE(manifests.ok() && manifests->manifest.has_value());
  EXPECT_EQ(manifests->manifest->id(), taken[1]);

  // Server 1 restarts: the order carries the manifest (its shard's file
  // size and CRC-32 are what it checks its own file against).
  v1::RegisterServerResponse again;
  ASSERT_TRUE(RegisterServer(1, "127.0.0.1:7001", &again).ok());
  EXPECT_EQ(again.restore().generation(), 2u);
  EXPECT_EQ(again.restore().checkpoint_id(), taken[1]);
  EXPECT_EQ(again.restore().manifest().id(), taken[1]);
  ASSERT_EQ(again.restore().manifest().shards_size(), 2);
  // Its file is damaged: it says so as it registers again, and the job
  // goes to the checkpoint before, for every member.
  v1::ShardCheckpoint failed;
  failed.set_id(taken[1]);
  failed.set_shard(1);
  failed.set_state(v1::CHECKPOINT_STATE_FAILED);
  failed.set_error("shard-00001.ckpt: CRC-32 mismatch");
  ASSERT_TRUE(RegisterServer(1, "127.0.0.1:7001", &again, "test-job", &failed).ok());
  EXPECT_EQ(again.restore().generation(), 3u);
  EXPECT_EQ(again.restore().checkpoint_id(), taken[0]);
  EXPECT_EQ(again.restore().manifest().id(), taken[0]);
  EXPECT_EQ(again.restore().step(), 10u);
  // A report of the refused one again (late) changes nothing.
  v1::HeartbeatRequest late = ServerRequest(0, s[0].incarnation(), 20, /*generation=*/2);
  *late.mutable_shard()->mutable_restore_failed() = failed;
  ASSERT_TRUE(Beat(late, &reply).ok());
  EXPECT_EQ(reply.generation(), 3u);
  EXPECT_EQ(reply.restore().checkpoint_id(), taken[0]);
  // Shard 0 cannot load that one either (its heartbeat says so): back to
  // the initial values, which need no file and no manifest.
  v1::HeartbeatRequest cannot = ServerRequest(0, s[0].incarnation(), 20, /*generation=*/2);
  failed.set_id(taken[0]);
  failed.set_shard(0);
  *cannot.mutable_shard()->mutable_restore_failed() = failed;
  ASSERT_TRUE(Beat(cannot, &reply).ok());
  EXPECT_EQ(reply.generation(), 4u);
  EXPECT_EQ(reply.restore().checkpoint_id(), 0u);
  EXPECT_FALSE(reply.restore().has_manifest());
  // The refusals are in the state file: a coordinator that takes the job
  // over does not order them again.
  ASSERT_TRUE(service_->PersistState(/*force=*/true).ok());
  absl::StatusOr<std::string> state_bytes =
      Env::Default()->ReadFile(JoinPath(dir, "coordinator.state"));
  ASSERT_TRUE(state_bytes.ok()) << state_bytes.status();
  v1::CoordinatorState state;
  ASSERT_TRUE(state.ParseFromString(*state_bytes));
  EXPECT_THAT(state.refused_checkpoints(), ElementsAre(taken[1], taken[0]));
}

TEST_F(CoordinatorServiceTest, AMemberOfANewerGenerationRollsTheJobBackPastIt) {
  // A coordinator that took over from an older state file (generation 1)
  // hears a server that rolled back in generation 2: every member is told
  // to roll back again, to one checkpoint, in generation 3.
  StartJob(1, 1);
  std::vector<v1::RegisterServerResponse> s = RegisterAllServers();
  std::vector<v1::RegisterWorkerResponse> w = RegisterAllWorkers();
  v1::HeartbeatResponse reply;
  ASSERT_TRUE(Beat(ServerRequest(0, s[0].incarnation(), 5, /*generation=*/2), &reply).ok());
  EXPECT_EQ(reply.generation(), 3u);
  EXPECT_EQ(reply.restore().generation(), 3u);
  ASSERT_TRUE(WorkerBeat(0, w[0].incarnation(), v1::WorkerProgress(), &reply).ok());
  EXPECT_EQ(reply.generation(), 3u);
}

}  // namespace
}  // namespace grps
