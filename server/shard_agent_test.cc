// ShardAgent and RegisterAndLoad against an in-process fake coordinator and
// a fake clock: a shard's registration and restore, its roll-backs (in
// place, refused), a re-sharding that rebuilds its store from the cut, its
// retirement, and the ends a coordinator's silence or a take-over bring.
#include "server/shard_agent.h"

#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "checkpoint/checkpoint.h"
#include "coordinator/testing/fake_clock.h"
#include "daemon/daemon.h"
#include "daemon/env.h"
#include "gtest/gtest.h"
#include "job/shard_map.h"
#include "server/testing/fake_coordinator.h"
#include "server/testing/shard_store_test_util.h"

namespace grps {
namespace {

constexpr absl::Duration kWait = absl::Seconds(30);

class ShardAgentTest : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = (std::filesystem::temp_directory_path() /
             absl::StrCat("shard_agent_test-", getpid(), "-",
                          ::testing::UnitTest::GetInstance()->current_test_info()->name()))
                .string();
    std::filesystem::remove_all(root_);
  }
  void TearDown() override {
    if (member_ != nullptr) member_->Stop();
    if (thread_.joinable()) thread_.join();
    if (agent_ != nullptr) {
      if (stores_.current != nullptr) stores_.current->Shutdown();
      agent_->JoinCheckpoints();
    }
    if (server_.server != nullptr) server_.server->Shutdown();
    std::filesystem::remove_all(root_);
  }

  void StartCoordinator(v1::JobConfig config, uint32_t shard = 0) {
    coordinator_ = std::make_unique<FakeCoordinator>(std::move(config), shard);
    absl::StatusOr<GrpcServer> server = StartGrpcServer("127.0.0.1:0", {coordinator_.get()});
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = std::move(*server);
    stub_ = v1::Coordinator::NewStub(MakeChannel(absl::StrCat("127.0.0.1:", server_.port)));
  }

  // Registers as grps-server does and builds the store it would serve.
  void Register() {
    ShardRegistration asked;
    asked.coordinator_address = absl::StrCat("127.0.0.1:", server_.port);
    asked.address = "127.0.0.1:1";
    asked.options.patience = kWait;
    int exit_code = -1;
    std::optional<RegisteredShard> registered = RegisterAndLoad(*stub_, asked, &exit_code);
    ASSERT_TRUE(registered.has_value()) << "exit code " << exit_code;
    registration_ = registered->registration;
    absl::StatusOr<std::unique_ptr<ShardStore>> store =
        CreateStore(StoreOptionsOf(registration_, asked.address), registration_.restore(),
                    std::move(registered->loaded));
    ASSERT_TRUE(store.ok()) << store.status();
    stores_.current = std::move(*store);
  }

  // Runs the agent of the registered store on a thread of its own.
  void StartAgent() {
    member_ = std::make_unique<MemberAgent>(
        stub_.get(),
        MemberAgent::Identity{registration_.config().job_id(), MemberKind::kServer,
                              registration_.shard(), registration_.incarnation()},
        absl::Milliseconds(20), absl::Seconds(1), [this] { return clock_.Now(); });
    ShardAgent::Options options;
    options.address = "127.0.0.1:1";
    options.coordinator_address = absl::StrCat("127.0.0.1:", server_.port);
    options.attach = [this](ShardStore& store) { attached_.push_back(&store); };
    options.status = [](const ShardStore& store) { return store.ShardStatus(); };
    agent_ = std::make_unique<ShardAgent>(*member_, stores_, std::move(options));
    thread_ = std::thread([this] {
      ending_ = agent_->Run();
      ended_.Notify();
    });
  }

  // Waits until the agent's Run returns by itself; false after kWait.
  bool Ended() {
    if (!ended_.WaitForNotificationWithTimeout(kWait)) return false;
    thread_.join();
    return true;
  }
  // Completes the job and waits for the agent's end; after it, the test
  // reads the stores (the agent's thread is joined).
  ShardEnding Complete() {
    coordinator_->SetState(v1::JOB_STATE_COMPLETED);
    EXPECT_TRUE(Ended());
    return ending_;
  }

  bool ReportedGeneration(uint64_t generation) {
    return coordinator_->WaitForStatus(
        [generation](const v1::ShardStatus& s) { return s.generation() == generation; }, kWait);
  }

  // Checkpoint `id` of the current store (the job's only shard), as it is
  // now, under root_ with its manifest. The order that restores it in
  // `generation`.
  v1::RestoreOrder WriteCheckpoint(uint64_t id, uint64_t generation) {
    ShardStore& store = *stores_.current;
    const std::string dir = CheckpointFolder(root_, id);
    v1::CheckpointRequest request;
    request.set_id(id);
    request.set_dir(dir);
    absl::StatusOr<v1::ShardCheckpointFile> file =
        store.CaptureCheckpoint(request, absl::Now() + kWait);
    EXPECT_TRUE(file.ok()) << file.status();
    absl::StatusOr<v1::ShardCheckpoint> written = WriteShardFile(Env::Default(), dir, *file);
    EXPECT_TRUE(written.ok()) << written.status();
    v1::CheckpointManifest manifest;
    manifest.set_job_id(store.config().job_id());
    manifest.set_id(id);
    manifest.set_mode(store.config().mode());
    manifest.set_step(1);
    *manifest.add_shards() = *written;
    *manifest.mutable_shard_map() = store.shard_map();
    *manifest.mutable_config() = store.config();
    manifest.add_worker_steps(1);
    EXPECT_TRUE(WriteManifest(Env::Default(), dir, manifest).ok());
    v1::RestoreOrder order;
    order.set_generation(generation);
    order.set_checkpoint_id(id);
    order.set_dir(dir);
    order.set_step(1);
    order.add_worker_steps(1);
    return order;
  }

  // Trains chunk `chunk` of the current store one step (rank 0, the job's
  // only worker): its values move away from the initial ones.
  void TrainChunk(uint32_t chunk) {
    const std::vector<float> before = Values(*stores_.current, chunk);
    ASSERT_TRUE(Send(*stores_.current,
                     {.rank = 0, .step = 0, .chunk = chunk,
                      .grad = std::vector<float>(before.size(), 1.0f)})
                    .ok());
    ASSERT_NE(Values(*stores_.current, chunk), before);
  }

  std::string root_;
  std::unique_ptr<FakeCoordinator> coordinator_;
  GrpcServer server_;
  std::unique_ptr<v1::Coordinator::Stub> stub_;
  v1::RegisterServerResponse registration_;
  ShardStores stores_;
  std::vector<ShardStore*> attached_;  // the agent's thread; read once it ended
  FakeClock clock_;
  std::unique_ptr<MemberAgent> member_;
  std::unique_ptr<ShardAgent> agent_;
  std::thread thread_;
  absl::Notification ended_;
  ShardEnding ending_;
};

TEST_F(ShardAgentTest, ARegistrationLoadsTheCheckpointItsRestoreOrderNames) {
  StartCoordinator(ScalingJob(1, 1, root_));
  ASSERT_NO_FATAL_FAILURE(Register());
  ASSERT_NO_FATAL_FAILURE(TrainChunk(0));
  const std::vector<float> trained = Values(*stores_.current, 0);
  coordinator_->SetRegistrationRestore(WriteCheckpoint(3, 1));

  stores_.current.reset();
  ASSERT_NO_FATAL_FAILURE(Register());
  EXPECT_EQ(stores_.current->generation(), 1u);
  EXPECT_EQ(stores_.current->ShardStatus().restored_checkpoint(), 3u);
  EXPECT_EQ(Values(*stores_.current, 0), trained);
  EXPECT_EQ(coordinator_->refused_restores(), 0);
}

TEST_F(ShardAgentTest, WhileItRestoresTheServerSaysSoEveryIntervalAndNothingElse) {
  v1::JobConfig config = ScalingJob(1, 1, root_);
  config.set_heartbeat_interval_ms(10);
  StartCoordinator(config);
  {
    RestoringHeartbeats heard(
        stub_.get(), MemberAgent::Identity{config.job_id(), MemberKind::kServer, 0, 7}, config);
    for (int i = 0; i < 3000 && coordinator_->restoring_heartbeats() < 3; ++i)
      absl::SleepFor(absl::Milliseconds(1));
  }
  EXPECT_GE(coordinator_->restoring_heartbeats(), 3);
  EXPECT_EQ(coordinator_->heartbeats(), 0);  // no status: only that it restores
  const int stopped = coordinator_->restoring_heartbeats();
  absl::SleepFor(absl::Milliseconds(50));
  EXPECT_EQ(coordinator_->restoring_heartbeats(), stopped);  // ended with it
}

TEST_F(ShardAgentTest, ARegistrationWhoseCheckpointCannotLoadReportsItAndTakesTheOrderBefore) {
  StartCoordinator(ScalingJob(1, 1, root_));
  v1::RestoreOrder missing;
  missing.set_generation(1);
  missing.set_checkpoint_id(9);
  missing.set_dir(CheckpointFolder(root_, 9));
  coordinator_->SetRegistrationRestore(missing);
  ASSERT_NO_FATAL_FAILURE(Register());
  EXPECT_EQ(coordinator_->refused_restores(), 1);
  EXPECT_EQ(stores_.current->ShardStatus().restored_checkpoint(), 0u);
  EXPECT_EQ(Values(*stores_.current, 0), InitialValues(*stores_.current, 0));
}

TEST_F(ShardAgentTest, ARollBackOrderRestoresTheStoreInPlace) {
  StartCoordinator(ScalingJob(1, 1, root_));
  ASSERT_NO_FATAL_FAILURE(Register());
  const v1::RestoreOrder order = WriteCheckpoint(3, 1);  // the initial values
  StartAgent();
  ASSERT_NO_FATAL_FAILURE(TrainChunk(0));

  coordinator_->Reshard(coordinator_->map(), order);
  ASSERT_TRUE(ReportedGeneration(1));
  EXPECT_EQ(Complete().exit_code, 0);
  EXPECT_EQ(Values(*stores_.current, 0), InitialValues(*stores_.current, 0));
  EXPECT_EQ(stores_.current->ShardStatus().restored_checkpoint(), 3u);
  EXPECT_TRUE(stores_.retired.empty());  // the same store
  EXPECT_TRUE(attached_.empty());
}

TEST_F(ShardAgentTest, ARollBackItCannotLoadIsReportedInEveryHeartbeatAndChangesNothing) {
  StartCoordinator(ScalingJob(1, 1, root_));
  ASSERT_NO_FATAL_FAILURE(Register());
  StartAgent();
  ASSERT_NO_FATAL_FAILURE(TrainChunk(0));
  const std::vector<float> trained = Values(*stores_.current, 0);
  v1::RestoreOrder missing;
  missing.set_generation(1);
  missing.set_checkpoint_id(9);
  missing.set_dir(CheckpointFolder(root_, 9));

  coordinator_->Reshard(coordinator_->map(), missing);
  ASSERT_TRUE(coordinator_->WaitForStatus(
      [](const v1::ShardStatus& s) { return s.restore_failed().id() == 9; }, kWait));
  EXPECT_EQ(coordinator_->last_status().generation(), 0u);
  EXPECT_EQ(Complete().exit_code, 0);
  EXPECT_EQ(Values(*stores_.current, 0), trained);
  EXPECT_EQ(stores_.current->generation(), 0u);
}

TEST_F(ShardAgentTest, AMapThatPlacesTheChunksOtherwiseRebuildsTheStoreFromTheCut) {
  StartCoordinator(ScalingJob(1, 2, root_));
  ASSERT_NO_FATAL_FAILURE(Register());
  StartAgent();
  const v1::ShardMap resharded = coordinator_->MapOf(2, 1);
  const std::vector<uint32_t> kept = ChunksOfShard(resharded, 0);
  ASSERT_LT(kept.size(), static_cast<size_t>(resharded.chunks_size()));
  ASSERT_NO_FATAL_FAILURE(TrainChunk(kept[0]));
  std::vector<std::vector<float>> cut;
  for (uint32_t id : kept) cut.push_back(Values(*stores_.current, id));
  const v1::RestoreOrder order = WriteCheckpoint(3, 1);

  coordinator_->Reshard(resharded, order);
  ASSERT_TRUE(ReportedGeneration(1));
  EXPECT_EQ(Complete().exit_code, 0);
  ShardStore& rebuilt = *stores_.current;
  EXPECT_EQ(rebuilt.chunk_ids(), kept);
  EXPECT_EQ(rebuilt.shard_map().epoch(), 1u);
  for (size_t i = 0; i < kept.size(); ++i)
    EXPECT_EQ(Values(rebuilt, kept[i]), cut[i]) << "chunk " << kept[i];
  ASSERT_EQ(stores_.retired.size(), 1u);  // the old store, shut down and kept
  EXPECT_EQ(attached_, std::vector<ShardStore*>{&rebuilt});
}

TEST_F(ShardAgentTest, AShardTheNewMapHasNoPlaceForRetiresAfterItsFinalReport) {
  StartCoordinator(ScalingJob(2, 2, root_), /*shard=*/1);
  ASSERT_NO_FATAL_FAILURE(Register());
  StartAgent();
  ASSERT_TRUE(coordinator_->WaitForReportedPushes(0, kWait));
  EXPECT_FALSE(ended_.HasBeenNotified());

  coordinator_->Reshard(coordinator_->MapOf(1, 1), v1::RestoreOrder());
  ASSERT_TRUE(Ended());
  EXPECT_EQ(ending_.exit_code, 0);
  EXPECT_EQ(ending_.reason, "shard 1 retired: the job re-sharded to 1 shards");
  EXPECT_TRUE(coordinator_->final_report());
}

TEST_F(ShardAgentTest, ACoordinatorSilentPastTheJobsTimeoutEndsTheShard) {
  v1::JobConfig config = ScalingJob(1, 1, root_);
  config.set_coordinator_timeout_ms(5000);
  StartCoordinator(config);
  ASSERT_NO_FATAL_FAILURE(Register());
  StartAgent();
  ASSERT_TRUE(coordinator_->WaitForReportedPushes(0, kWait));
  server_.server->Shutdown();
  clock_.Advance(absl::Seconds(4));  // silent, within the timeout: it serves on
  absl::SleepFor(absl::Milliseconds(300));
  EXPECT_FALSE(ended_.HasBeenNotified());
  clock_.Advance(absl::Seconds(2));
  ASSERT_TRUE(Ended());
  EXPECT_EQ(ending_.exit_code, 1);
  EXPECT_EQ(ending_.reason, "no answer from the coordinator for 5s");
}

TEST_F(ShardAgentTest, AnotherServerTakingTheShardOverEndsThisOne) {
  StartCoordinator(ScalingJob(1, 1, root_));
  ASSERT_NO_FATAL_FAILURE(Register());
  StartAgent();
  ASSERT_TRUE(coordinator_->WaitForReportedPushes(0, kWait));
  coordinator_->TakeOver();
  ASSERT_TRUE(Ended());
  EXPECT_EQ(ending_.exit_code, 1);
  EXPECT_NE(ending_.reason.find("taken over by another server"), std::string::npos)
      << ending_.reason;
}

}  // namespace
}  // namespace grps
