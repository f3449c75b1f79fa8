// Authentication, roles, member secrets and TLS, over real gRPC on
// 127.0.0.1: a coordinator and a shard served with a job's tokens, called by
// clients holding the admin token, the worker token, a wrong one or none.
#include "daemon/security.h"

#include <atomic>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "coordinator/coordinator_service.h"
#include "daemon/daemon.h"
#include "daemon/env.h"
#include "gtest/gtest.h"
#include "job/job_config.h"
#include "job/shard_map.h"
#include "test/in_process_shards.h"
#include "wire/shared_lane.h"

#ifndef GRPS_TESTDATA_DIR
#define GRPS_TESTDATA_DIR "test/testdata"
#endif

namespace grps {
namespace {

constexpr char kAdmin[] = "admin-token-for-tests";
constexpr char kWorker[] = "worker-token-for-tests";

std::string Pem(const std::string& name) {
  absl::StatusOr<std::string> text =
      Env::Default()->ReadFile(absl::StrCat(GRPS_TESTDATA_DIR, "/tls/", name));
  EXPECT_TRUE(text.ok()) << text.status();
  return text.ok() ? *text : "";
}

SecurityConfig Served() {
  SecurityConfig config;
  config.admin_token = kAdmin;
  config.worker_token = kWorker;
  return config;
}

SecurityConfig Caller(const std::string& token) {
  SecurityConfig config;
  config.call_token = token;
  return config;
}

std::unique_ptr<grpc::ClientContext> Context() {
  auto context = std::make_unique<grpc::ClientContext>();
  context->set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(5)));
  return context;
}

class SecurityTest : public ::testing::Test {
 protected:
  void SetUp() override {
    config_ = DefaultJobConfig();
    config_.set_job_id("secure-job");
    config_.set_num_servers(1);
    config_.set_num_workers(2);
    ASSERT_TRUE(ValidateJobConfig(config_).ok());
    absl::StatusOr<v1::ShardMap> map =
        BuildShardMap(ModelTensors(config_), 1, config_.chunk_bytes());
    ASSERT_TRUE(map.ok());
    CoordinatorOptions options;
    options.member_key = MemberKey(kAdmin);
    service_ = std::make_unique<CoordinatorService>(config_, *map, &absl::Now, options);
    absl::StatusOr<GrpcServer> server =
        StartGrpcServer("127.0.0.1:0", {service_.get()}, Served());
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = std::move(*server);
    address_ = absl::StrCat("127.0.0.1:", server_.port);
  }
  void TearDown() override {
    service_->Shutdown();
    server_.server->Shutdown();
  }

  std::unique_ptr<v1::Coordinator::Stub> Stub(const std::string& token) {
    return v1::Coordinator::NewStub(MakeChannel(address_, Caller(token), false));
  }

  // Registers the shard with the admin token and both ranks with the worker
  // token, so the job runs.
  void FormJob() {
    v1::RegisterServerRequest server;
    server.set_address("127.0.0.1:1");
    v1::RegisterServerResponse server_reply;
    ASSERT_TRUE(Stub(kAdmin)->RegisterServer(Context().get(), server, &server_reply).ok());
    shard_secret_ = server_reply.member_secret();
    for (int rank = 0; rank < 2; ++rank) {
      v1::RegisterWorkerRequest worker;
      worker.set_requested_rank(rank);
      worker.set_host("h");
      worker.set_backend("cpu");
      v1::RegisterWorkerResponse reply;
      grpc::Status s = Stub(kWorker)->RegisterWorker(Context().get(), worker, &reply);
      ASSERT_TRUE(s.ok()) << s.error_message();
      worker_secrets_.push_back(reply.member_secret());
      incarnations_.push_back(reply.incarnation());
    }
    ASSERT_EQ(service_->state(), v1::JOB_STATE_RUNNING);
  }

  grpc::Status WorkerHeartbeat(uint32_t rank, const std::string& secret) {
    v1::HeartbeatRequest request;
    request.set_job_id("secure-job");
    request.set_worker_rank(rank);
    request.set_incarnation(incarnations_[rank]);
    v1::HeartbeatResponse reply;
    auto context = Context();
    if (!secret.empty()) context->AddMetadata("grps-member-secret", secret);
    return Stub(kWorker)->Heartbeat(context.get(), request, &reply);
  }

  v1::JobConfig config_;
  std::unique_ptr<CoordinatorService> service_;
  GrpcServer server_;
  std::string address_;
  std::string shard_secret_;
  std::vector<std::string> worker_secrets_;
  std::vector<uint64_t> incarnations_;
};

TEST_F(SecurityTest, EveryCoordinatorRpcWithoutTheTokenIsUnauthenticatedAndChangesNothing) {
  for (const std::string& token : {std::string(), std::string("wrong-token")}) {
    SCOPED_TRACE(token.empty() ? "no token" : "wrong token");
    auto stub = Stub(token);
    v1::RegisterServerRequest register_server;
    register_server.set_address("127.0.0.1:1");
    v1::RegisterServerResponse register_server_reply;
    EXPECT_EQ(stub->RegisterServer(Context().get(), register_server, &register_server_reply)
                  .error_code(),
              grpc::StatusCode::UNAUTHENTICATED);
    v1::RegisterWorkerRequest register_worker;
    v1::RegisterWorkerResponse register_worker_reply;
    EXPECT_EQ(stub->RegisterWorker(Context().get(), register_worker, &register_worker_reply)
                  .error_code(),
              grpc::StatusCode::UNAUTHENTICATED);
    v1::HeartbeatRequest heartbeat;
    heartbeat.set_job_id("secure-job");
    heartbeat.set_server_shard(0);
    heartbeat.set_incarnation(1);
    v1::HeartbeatResponse heartbeat_reply;
    EXPECT_EQ(stub->Heartbeat(Context().get(), heartbeat, &heartbeat_reply).error_code(),
              grpc::StatusCode::UNAUTHENTICATED);
    v1::WorkerDoneRequest done;
    done.set_job_id("secure-job");
    v1::WorkerDoneResponse done_reply;
    EXPECT_EQ(stub->WorkerDone(Context().get(), done, &done_reply).error_code(),
              grpc::StatusCode::UNAUTHENTICATED);
    v1::ShardMap map;
    EXPECT_EQ(stub->GetShardMap(Context().get(), {}, &map).error_code(),
              grpc::StatusCode::UNAUTHENTICATED);
    v1::JobStatus status;
    EXPECT_EQ(stub->GetJobStatus(Context().get(), {}, &status).error_code(),
              grpc::StatusCode::UNAUTHENTICATED);
    auto watch_context = Context();
    auto watch = stub->WatchJobStatus(watch_context.get(), {});
    EXPECT_FALSE(watch->Read(&status));
    EXPECT_EQ(watch->Finish().error_code(), grpc::StatusCode::UNAUTHENTICATED);
    v1::StopJobResponse stop_reply;
    EXPECT_EQ(stub->StopJob(Context().get(), {}, &stop_reply).error_code(),
              grpc::StatusCode::UNAUTHENTICATED);
    v1::CheckpointJobResponse checkpoint_reply;
    EXPECT_EQ(stub->CheckpointJob(Context().get(), {}, &checkpoint_reply).error_code(),
              grpc::StatusCode::UNAUTHENTICATED);
    v1::DrainWorkerResponse drain_reply;
    EXPECT_EQ(stub->DrainWorker(Context().get(), {}, &drain_reply).error_code(),
              grpc::StatusCode::UNAUTHENTICATED);
    v1::LeaseExamplesRequest lease;
    lease.set_job_id("secure-job");
    lease.set_want(1);
    lease.set_train_examples(640);
    v1::LeaseExamplesResponse lease_reply;
    EXPECT_EQ(stub->LeaseExamples(Context().get(), lease, &lease_reply).error_code(),
              grpc::StatusCode::UNAUTHENTICATED);
    // Reflection and any other service too: the check runs before routing.
    EXPECT_EQ(UnaryCallBytes(MakeChannel(address_, Caller(token), false),
                             "/grps.v1.NoSuchService/NoSuchMethod", "", absl::Seconds(5))
                  .status()
                  .code(),
              absl::StatusCode::kUnauthenticated);
  }
  const v1::JobStatus status = service_->Status();
  EXPECT_EQ(status.state(), v1::JOB_STATE_WAITING);
  EXPECT_EQ(status.shards(0).state(), v1::MEMBER_STATE_UNSPECIFIED);
  EXPECT_TRUE(status.workers().empty() ||
              status.workers(0).state() == v1::MEMBER_STATE_UNSPECIFIED);
}

TEST_F(SecurityTest, HealthChecksNeedNoToken) {
  absl::StatusOr<bool> serving =
      IsServing(MakeChannel(address_, Caller(""), false), absl::Seconds(5));
  ASSERT_TRUE(serving.ok()) << serving.status();
  EXPECT_TRUE(*serving);
}

TEST_F(SecurityTest, TheWorkerTokenCannotStopTheJobCheckpointDrainOrRegisterAServer) {
  auto stub = Stub(kWorker);
  v1::DrainWorkerResponse drain_reply;
  EXPECT_EQ(stub->DrainWorker(Context().get(), {}, &drain_reply).error_code(),
            grpc::StatusCode::PERMISSION_DENIED);
  // The admin's drain reaches the job (which has no live rank 0 yet).
  EXPECT_EQ(Stub(kAdmin)->DrainWorker(Context().get(), {}, &drain_reply).error_code(),
            grpc::StatusCode::FAILED_PRECONDITION);
  v1::StopJobResponse stop_reply;
  EXPECT_EQ(stub->StopJob(Context().get(), {}, &stop_reply).error_code(),
            grpc::StatusCode::PERMISSION_DENIED);
  v1::CheckpointJobResponse checkpoint_reply;
  EXPECT_EQ(stub->CheckpointJob(Context().get(), {}, &checkpoint_reply).error_code(),
            grpc::StatusCode::PERMISSION_DENIED);
  v1::RegisterServerRequest register_server;
  register_server.set_address("127.0.0.1:1");
  v1::RegisterServerResponse register_server_reply;
  EXPECT_EQ(stub->RegisterServer(Context().get(), register_server, &register_server_reply)
                .error_code(),
            grpc::StatusCode::PERMISSION_DENIED);
  // Reading the status is allowed.
  v1::JobStatus status;
  EXPECT_TRUE(stub->GetJobStatus(Context().get(), {}, &status).ok());
  EXPECT_EQ(service_->state(), v1::JOB_STATE_WAITING);
  EXPECT_EQ(status.shards(0).address(), "");
  // The admin token may stop it.
  EXPECT_TRUE(Stub(kAdmin)->StopJob(Context().get(), {}, &stop_reply).ok());
  EXPECT_EQ(service_->state(), v1::JOB_STATE_STOPPED);
}

TEST_F(SecurityTest, OnlyTheHolderOfARanksMemberSecretMayHeartbeatOrFinishAsIt) {
  FormJob();
  ASSERT_EQ(worker_secrets_.size(), 2u);
  EXPECT_NE(worker_secrets_[0], worker_secrets_[1]);
  EXPECT_EQ(WorkerHeartbeat(0, "").error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_EQ(WorkerHeartbeat(0, worker_secrets_[1]).error_code(),
            grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_TRUE(WorkerHeartbeat(0, worker_secrets_[0]).ok());

  // WorkerDone as rank 1 without its secret: refused, the quorum stays.
  v1::WorkerDoneRequest done;
  done.set_job_id("secure-job");
  done.set_worker_rank(1);
  done.set_incarnation(incarnations_[1]);
  v1::WorkerDoneResponse done_reply;
  auto forged = Context();
  forged->AddMetadata("grps-member-secret", worker_secrets_[0]);
  EXPECT_EQ(Stub(kWorker)->WorkerDone(forged.get(), done, &done_reply).error_code(),
            grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_EQ(service_->Status().workers(1).state(), v1::MEMBER_STATE_ALIVE);

  // LeaseExamples as rank 1 without its secret: refused before the job
  // hears of it; with it, the (not elastic) job answers.
  v1::LeaseExamplesRequest lease;
  lease.set_job_id("secure-job");
  lease.set_worker_rank(1);
  lease.set_incarnation(incarnations_[1]);
  lease.set_want(1);
  lease.set_train_examples(640);
  v1::LeaseExamplesResponse lease_reply;
  auto forged_lease = Context();
  forged_lease->AddMetadata("grps-member-secret", worker_secrets_[0]);
  EXPECT_EQ(Stub(kWorker)->LeaseExamples(forged_lease.get(), lease, &lease_reply).error_code(),
            grpc::StatusCode::UNAUTHENTICATED);
  auto own_lease = Context();
  own_lease->AddMetadata("grps-member-secret", worker_secrets_[1]);
  EXPECT_EQ(Stub(kWorker)->LeaseExamples(own_lease.get(), lease, &lease_reply).error_code(),
            grpc::StatusCode::FAILED_PRECONDITION);

  // A forged shard status (server heartbeat) without the shard's secret.
  v1::HeartbeatRequest shard_beat;
  shard_beat.set_job_id("secure-job");
  shard_beat.set_server_shard(0);
  shard_beat.set_incarnation(1);
  shard_beat.mutable_shard()->set_version(999999);
  v1::HeartbeatResponse reply;
  EXPECT_EQ(Stub(kAdmin)->Heartbeat(Context().get(), shard_beat, &reply).error_code(),
            grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_NE(service_->Status().shards(0).version(), 999999u);
  // The status never shows a secret.
  const std::string shown = service_->Status().DebugString();
  for (const std::string& secret : worker_secrets_)
    EXPECT_EQ(shown.find(secret), std::string::npos);
}

// A call on a channel that sends no token of its own, carrying `token`.
std::unique_ptr<grpc::ClientContext> WithToken(const std::string& token) {
  std::unique_ptr<grpc::ClientContext> context = Context();
  context->AddMetadata("authorization", absl::StrCat("Bearer ", token));
  return context;
}

TEST_F(SecurityTest, EachCallOnAConnectionGetsTheRoleOfItsOwnToken) {
  // One channel, one connection: the admin token first, then the worker's.
  auto stub = Stub("");
  v1::JobStatus status;
  ASSERT_TRUE(stub->GetJobStatus(WithToken(kAdmin).get(), {}, &status).ok());
  v1::StopJobResponse stop_reply;
  EXPECT_EQ(stub->StopJob(WithToken(kWorker).get(), {}, &stop_reply).error_code(),
            grpc::StatusCode::PERMISSION_DENIED);
  // A role header of the caller's own is not believed.
  auto claims_admin = WithToken(kWorker);
  claims_admin->AddMetadata("grps-role", "admin");
  EXPECT_EQ(stub->StopJob(claims_admin.get(), {}, &stop_reply).error_code(),
            grpc::StatusCode::PERMISSION_DENIED);
  // Two tokens on one call: refused, whichever comes first.
  auto both = WithToken(kWorker);
  both->AddMetadata("authorization", absl::StrCat("Bearer ", kAdmin));
  EXPECT_EQ(stub->StopJob(both.get(), {}, &stop_reply).error_code(),
            grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_EQ(service_->state(), v1::JOB_STATE_WAITING);

  // Another connection: the worker token first, then the admin's.
  auto other = Stub("");
  ASSERT_TRUE(other->GetJobStatus(WithToken(kWorker).get(), {}, &status).ok());
  v1::CheckpointJobResponse checkpoint_reply;
  const grpc::Status checkpoint =
      other->CheckpointJob(WithToken(kAdmin).get(), {}, &checkpoint_reply);
  EXPECT_NE(checkpoint.error_code(), grpc::StatusCode::PERMISSION_DENIED)
      << checkpoint.error_message();
  EXPECT_TRUE(other->StopJob(WithToken(kAdmin).get(), {}, &stop_reply).ok());
  EXPECT_EQ(service_->state(), v1::JOB_STATE_STOPPED);
}

TEST_F(SecurityTest, ConcurrentAuthenticatedCallsOnOneConnectionEachKeepTheirRole) {
  FormJob();
  // Threads share one channel; half of them hold the admin token, half the
  // worker token, all on the same connection at once.
  auto stub = Stub("");
  constexpr int kThreads = 8;
  constexpr int kCalls = 300;
  std::atomic<int> wrong{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t)
    threads.emplace_back([&, t] {
      const bool admin = t % 2 == 0;
      for (int i = 0; i < kCalls; ++i) {
        v1::HeartbeatRequest beat;
        beat.set_job_id("secure-job");
        beat.set_worker_rank(0);
        beat.set_incarnation(incarnations_[0]);
        auto context = WithToken(admin ? kAdmin : kWorker);
        context->AddMetadata("grps-member-secret", worker_secrets_[0]);
        v1::HeartbeatResponse reply;
        if (!stub->Heartbeat(context.get(), beat, &reply).ok()) ++wrong;
        v1::StopJobResponse stop_reply;
        v1::StopJobRequest stop;
        // The admin's StopJob is never made: the job must stay up.
        if (!admin && stub->StopJob(WithToken(kWorker).get(), stop, &stop_reply).error_code() !=
                          grpc::StatusCode::PERMISSION_DENIED)
          ++wrong;
      }
    });
  for (std::thread& thread : threads) thread.join();
  EXPECT_EQ(wrong.load(), 0);
  EXPECT_EQ(service_->state(), v1::JOB_STATE_RUNNING);
}

TEST_F(SecurityTest, ALiveRankIsNotHandedOverUnlessTheCallerHoldsItsSecret) {
  FormJob();
  v1::RegisterWorkerRequest take;
  take.set_requested_rank(0);
  take.set_host("stranger");
  take.set_backend("cpu");
  v1::RegisterWorkerResponse reply;
  // Without rank 0's secret, or with another rank's: refused, rank 0 keeps
  // its incarnation and goes on.
  for (const std::string& secret : {std::string(), worker_secrets_[1]}) {
    auto context = Context();
    if (!secret.empty()) context->AddMetadata("grps-member-secret", secret);
    const grpc::Status taken = Stub(kWorker)->RegisterWorker(context.get(), take, &reply);
    EXPECT_EQ(taken.error_code(), grpc::StatusCode::ALREADY_EXISTS);
    EXPECT_NE(taken.error_message().find("rank 0 is alive"), std::string::npos)
        << taken.error_message();
  }
  EXPECT_EQ(service_->Status().workers(0).incarnation(), incarnations_[0]);
  EXPECT_TRUE(WorkerHeartbeat(0, worker_secrets_[0]).ok());
  // With its secret, the member itself may register again (a new incarnation).
  auto holder = Context();
  holder->AddMetadata("grps-member-secret", worker_secrets_[0]);
  const grpc::Status again = Stub(kWorker)->RegisterWorker(holder.get(), take, &reply);
  ASSERT_TRUE(again.ok()) << again.error_message();
  EXPECT_EQ(reply.rank(), 0u);
  EXPECT_GT(reply.incarnation(), incarnations_[0]);
}

TEST_F(SecurityTest, APushWithoutItsRanksMemberSecretIsRefusedAndChangesNothing) {
  v1::JobConfig config = config_;
  absl::StatusOr<v1::ShardMap> map = OneTensorMap(config, 16);
  ASSERT_TRUE(map.ok());
  InProcessShards shards;
  ASSERT_TRUE(shards.Serve(config, &*map, Served()).ok());
  shards.SetLiveWorkers(2);
  auto stub = v1::ParameterServer::NewStub(
      MakeChannel(map->shards(0).address(), Caller(kWorker), false));
  v1::PushRequest push;
  push.set_job_id("secure-job");
  push.set_worker_rank(0);
  push.set_incarnation(1);
  push.set_step(0);
  push.set_num_samples(1);
  v1::ChunkData* chunk = push.add_chunks();
  chunk->set_chunk_id(0);
  chunk->set_dtype(v1::DTYPE_F32);
  chunk->set_data(std::string(16 * sizeof(float), '\0'));
  const std::string key = MemberKey(kAdmin);
  for (const std::string& secret :
       {std::string(), MemberSecret(key, "secure-job", MemberKind::kWorker, 1, 1),
        MemberSecret(key, "secure-job", MemberKind::kWorker, 0, 2)}) {
    auto context = Context();
    if (!secret.empty()) context->AddMetadata("grps-member-secret", secret);
    v1::PushResponse reply;
    EXPECT_EQ(stub->Push(context.get(), push, &reply).error_code(),
              grpc::StatusCode::UNAUTHENTICATED);
  }
  EXPECT_EQ(shards.store(0).ShardStatus().pushes(), 0u);
  auto context = Context();
  context->AddMetadata("grps-member-secret",
                       MemberSecret(key, "secure-job", MemberKind::kWorker, 0, 1));
  v1::PushResponse reply;
  grpc::Status s = stub->Push(context.get(), push, &reply);
  EXPECT_TRUE(s.ok()) << s.error_message();
  EXPECT_EQ(shards.store(0).ShardStatus().pushes(), 1u);

  // Through a shared-memory lane: the member secret is checked before the
  // shard looks at the lane (a lane it could not map would be UNIMPLEMENTED).
  absl::StatusOr<std::shared_ptr<LaneSegment>> lane = LaneSegment::Create(4096);
  ASSERT_TRUE(lane.ok()) << lane.status();
  push.set_worker_rank(1);
  push.mutable_chunks(0)->clear_data();
  push.mutable_chunks(0)->set_lane_offset(kLaneHeaderBytes);
  *push.mutable_lane() = (*lane)->Ref();
  push.mutable_lane()->set_nonce(push.lane().nonce() + 1);
  auto no_secret = Context();
  EXPECT_EQ(stub->Push(no_secret.get(), push, &reply).error_code(),
            grpc::StatusCode::UNAUTHENTICATED);
  *push.mutable_lane() = (*lane)->Ref();
  auto member = Context();
  member->AddMetadata("grps-member-secret",
                      MemberSecret(key, "secure-job", MemberKind::kWorker, 1, 1));
  s = stub->Push(member.get(), push, &reply);
  EXPECT_TRUE(s.ok()) << s.error_message();
  EXPECT_EQ(shards.store(0).ShardStatus().pushes(), 2u);
}

TEST_F(SecurityTest, EveryParameterServerRpcWithoutTheTokenIsUnauthenticatedAndChangesNothing) {
  absl::StatusOr<v1::ShardMap> map = OneTensorMap(config_, 16);
  ASSERT_TRUE(map.ok());
  InProcessShards shards;
  ASSERT_TRUE(shards.Serve(config_, &*map, Served()).ok());
  shards.SetLiveWorkers(2);
  const std::string key = MemberKey(kAdmin);
  for (const std::string& token : {std::string(), std::string("wrong-token")}) {
    SCOPED_TRACE(token.empty() ? "no token" : "wrong token");
    auto stub = v1::ParameterServer::NewStub(
        MakeChannel(map->shards(0).address(), Caller(token), false));
    // With rank 0's real member secret: the token is checked first. Each
    // call waits for the new channel's connection (within the deadline): a
    // TSan run once had all five calls of the second channel fail
    // UNAVAILABLE without reaching the server, the connection not made yet.
    auto context = [&] {
      auto c = Context();
      c->set_wait_for_ready(true);
      c->AddMetadata("grps-member-secret",
                     MemberSecret(key, "secure-job", MemberKind::kWorker, 0, 1));
      return c;
    };
    v1::PushRequest push;
    push.set_job_id("secure-job");
    push.set_incarnation(1);
    push.set_num_samples(1);
    v1::ChunkData* chunk = push.add_chunks();
    chunk->set_dtype(v1::DTYPE_F32);
    chunk->set_data(std::string(16 * sizeof(float), '\0'));
    v1::PushResponse push_reply;
    EXPECT_EQ(stub->Push(context().get(), push, &push_reply).error_code(),
              grpc::StatusCode::UNAUTHENTICATED);
    v1::PullRequest pull;
    pull.set_job_id("secure-job");
    pull.add_chunk_ids(0);
    v1::PullResponse pull_reply;
    EXPECT_EQ(stub->Pull(context().get(), pull, &pull_reply).error_code(),
              grpc::StatusCode::UNAUTHENTICATED);
    v1::SparsePushRequest push_sparse;
    push_sparse.set_job_id("secure-job");
    v1::SparsePushResponse push_sparse_reply;
    EXPECT_EQ(stub->PushSparse(context().get(), push_sparse, &push_sparse_reply).error_code(),
              grpc::StatusCode::UNAUTHENTICATED);
    v1::SparsePullRequest pull_sparse;
    pull_sparse.set_job_id("secure-job");
    v1::SparsePullResponse pull_sparse_reply;
    EXPECT_EQ(stub->PullSparse(context().get(), pull_sparse, &pull_sparse_reply).error_code(),
              grpc::StatusCode::UNAUTHENTICATED);
    v1::ShardStatus status_reply;
    EXPECT_EQ(stub->GetShardStatus(context().get(), {}, &status_reply).error_code(),
              grpc::StatusCode::UNAUTHENTICATED);
  }
  const v1::ShardStatus status = shards.store(0).ShardStatus();
  EXPECT_EQ(status.pushes(), 0u);
  EXPECT_EQ(status.updates_applied(), 0u);
  EXPECT_EQ(status.bytes_in(), 0u);
  EXPECT_EQ(status.bytes_out(), 0u);
}

TEST(SecurityConfigTest, ATokenWithoutTlsIsOnlyServedOnLoopback) {
  absl::StatusOr<GrpcServer> server = StartGrpcServer("0.0.0.0:0", {}, Served());
  ASSERT_FALSE(server.ok());
  EXPECT_NE(server.status().message().find("loopback"), std::string::npos)
      << server.status();
}

// gRPC aborts a process whose call carries a header value it refuses (every
// client died of SIGABRT with GRPS_TOKEN=$'abc\n'): refused where tokens are read.
TEST(SecurityConfigTest, ATokenThatCannotTravelInAHeaderIsRefusedNamingTheFlag) {
  EXPECT_TRUE(CheckToken("a token with spaces~", "token").ok());
  EXPECT_TRUE(CheckToken(std::string(kMaxTokenBytes, 'a'), "token").ok());
  const absl::Status newline = CheckToken("abc\n", "token");
  EXPECT_TRUE(absl::IsInvalidArgument(newline));
  EXPECT_NE(newline.message().find("--token holds byte 3 of value 10 (a line end"),
            std::string::npos)
      << newline;
  EXPECT_NE(CheckToken("t\xc3\xb6k", "worker_token").message().find("--worker_token holds byte 1"),
            std::string::npos);
  EXPECT_NE(CheckToken(std::string(kMaxTokenBytes + 1, 'a'), "token").message().find("4097 bytes"),
            std::string::npos);
}

// TLS: a job served with the test CA's server certificate.
class TlsTest : public ::testing::Test {
 protected:
  void Serve(bool require_client_cert) {
    SecurityConfig served = Served();
    served.tls_cert_pem = Pem("server.pem");
    served.tls_key_pem = Pem("server-key.pem");
    served.tls_ca_pem = Pem("ca.pem");
    served.tls_require_client_cert = require_client_cert;
    config_ = DefaultJobConfig();
    config_.set_job_id("tls-job");
    absl::StatusOr<v1::ShardMap> map =
        BuildShardMap(ModelTensors(config_), config_.num_servers(), config_.chunk_bytes());
    ASSERT_TRUE(map.ok());
    service_ = std::make_unique<CoordinatorService>(config_, *map);
    absl::StatusOr<GrpcServer> server =
        StartGrpcServer("127.0.0.1:0", {service_.get()}, served);
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = std::move(*server);
  }
  void TearDown() override {
    if (service_ != nullptr) service_->Shutdown();
    if (server_.server != nullptr) server_.server->Shutdown();
  }
  grpc::Status Status(const SecurityConfig& caller) {
    auto stub = v1::Coordinator::NewStub(
        MakeChannel(absl::StrCat("127.0.0.1:", server_.port), caller, false));
    v1::JobStatus status;
    return stub->GetJobStatus(Context().get(), {}, &status);
  }

  v1::JobConfig config_;
  std::unique_ptr<CoordinatorService> service_;
  GrpcServer server_;
};

// gRPC refuses the pair only when the port is made: the message said
// "port in use?".
TEST_F(TlsTest, AKeyOfAnotherCertificateIsSaidToBeOneWhenThePortCannotBeMade) {
  SecurityConfig served = Served();
  served.tls_cert_pem = Pem("server.pem");
  served.tls_key_pem = Pem("client-key.pem");
  absl::StatusOr<GrpcServer> server = StartGrpcServer("127.0.0.1:0", {}, served);
  ASSERT_FALSE(server.ok());
  EXPECT_NE(server.status().message().find("--tls_cert and --tls_key refused"), std::string::npos)
      << server.status();
}

TEST_F(TlsTest, AClientTrustingAnotherCaCannotConnect) {
  Serve(false);
  SecurityConfig caller = Caller(kAdmin);
  caller.tls_ca_pem = Pem("wrong-ca.pem");
  EXPECT_EQ(Status(caller).error_code(), grpc::StatusCode::UNAVAILABLE);
  caller.tls_ca_pem = Pem("ca.pem");
  grpc::Status s = Status(caller);
  EXPECT_TRUE(s.ok()) << s.error_message();
  // TLS does not replace the token.
  caller.call_token.clear();
  EXPECT_EQ(Status(caller).error_code(), grpc::StatusCode::UNAUTHENTICATED);
}

// The caller sees "Socket closed" and nothing about TLS: the hint says it.
TEST_F(TlsTest, APlaintextClientCannotTalkToATlsPortAndIsToldWhy) {
  Serve(false);
  const grpc::Status s = Status(Caller(kAdmin));
  EXPECT_EQ(s.error_code(), grpc::StatusCode::UNAVAILABLE);
  EXPECT_EQ(TlsHint(s.error_message(), Caller(kAdmin)),
            " (a server that speaks TLS closes a plaintext connection: give --tls_ca)")
      << s.error_message();
  EXPECT_EQ(TlsHint("failed to connect: Connection refused", Caller(kAdmin)), "");
}

TEST_F(TlsTest, MutualTlsRefusesAClientWithoutACertificate) {
  Serve(true);
  SecurityConfig caller = Caller(kAdmin);
  caller.tls_ca_pem = Pem("ca.pem");
  const grpc::Status refused = Status(caller);
  EXPECT_EQ(refused.error_code(), grpc::StatusCode::UNAVAILABLE);
  if (absl::StrContains(refused.error_message(), "Socket closed"))
    EXPECT_EQ(TlsHint(refused.error_message(), caller),
              " (a server that requires client certificates closes a connection without one: "
              "give --tls_cert and --tls_key)");
  caller.tls_cert_pem = Pem("client.pem");
  caller.tls_key_pem = Pem("client-key.pem");
  grpc::Status s = Status(caller);
  EXPECT_TRUE(s.ok()) << s.error_message();
}

}  // namespace
}  // namespace grps
