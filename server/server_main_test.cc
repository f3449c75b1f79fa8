// Runs the grps-server binary against an in-process fake coordinator: the
// daemon's flags, port file, registration, heartbeats and exit status.
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "checkpoint/checkpoint.h"
#include "daemon/daemon.h"
#include "daemon/env.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "job/job_config.h"
#include "job/shard_map.h"
#include "proto/grps.grpc.pb.h"
#include "server/testing/fake_coordinator.h"

extern char** environ;

namespace grps {
namespace {

// The path CMake bakes in; else the binary in Bazel's runfiles (a test runs
// in the workspace's runfiles root).
std::string ServerBinary() {
#ifdef GRPS_SERVER_BINARY
  return GRPS_SERVER_BINARY;
#else
  return "server/grps-server";
#endif
}

class ServerProcess {
 public:
  // Starts grps-server with `args`, settings passed as GRPS_* variables where
  // given in `env`.
  ServerProcess(const std::vector<std::string>& args,
                const std::vector<std::string>& env) {
    std::vector<std::string> argv_storage = {ServerBinary()};
    argv_storage.insert(argv_storage.end(), args.begin(), args.end());
    std::vector<char*> argv;
    for (std::string& a : argv_storage) argv.push_back(a.data());
    argv.push_back(nullptr);
    std::vector<std::string> env_storage = env;
    for (char** e = environ; *e != nullptr; ++e) env_storage.push_back(*e);
    std::vector<char*> envp;
    for (std::string& e : env_storage) envp.push_back(e.data());
    envp.push_back(nullptr);
    started_ = posix_spawn(&pid_, argv[0], nullptr, nullptr, argv.data(),
                           envp.data()) == 0;
  }
  ~ServerProcess() {
    if (started_ && !exited_) {
      kill(pid_, SIGKILL);
      waitpid(pid_, nullptr, 0);
    }
  }
  bool started() const { return started_; }
  pid_t pid() const { return pid_; }

  // The exit status, or -1 if it is still running after `timeout`.
  int WaitForExit(absl::Duration timeout) {
    const absl::Time until = absl::Now() + timeout;
    while (absl::Now() < until) {
      int status = 0;
      if (waitpid(pid_, &status, WNOHANG) == pid_) {
        exited_ = true;
        return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
      }
      absl::SleepFor(absl::Milliseconds(20));
    }
    return -1;
  }

 private:
  pid_t pid_ = 0;
  bool started_ = false;
  bool exited_ = false;
};

std::string TempPath(const std::string& name) {
  return absl::StrCat(::testing::TempDir(), "/grps_server_test_", getpid(),
                      "_", name);
}

// The port written to `path`, or 0 if none appears within `timeout`.
int WaitForPortFile(const std::string& path, absl::Duration timeout) {
  const absl::Time until = absl::Now() + timeout;
  while (absl::Now() < until) {
    std::ifstream in(path);
    int port = 0;
    if (in >> port && port > 0) return port;
    absl::SleepFor(absl::Milliseconds(20));
  }
  return 0;
}

// Every chunk the server on `port` holds (each at `min_version` at least),
// once it answers a pull (it serves once registered), or the last error
// after `timeout`.
absl::StatusOr<v1::PullResponse> PullAll(int port, uint64_t min_version,
                                         absl::Duration timeout) {
  auto stub = v1::ParameterServer::NewStub(MakeChannel(absl::StrCat("127.0.0.1:", port)));
  v1::PullRequest pull;
  pull.set_job_id("binary-test");
  pull.set_min_version(min_version);
  pull.set_timeout_ms(5000);
  const absl::Time until = absl::Now() + timeout;
  while (true) {
    grpc::ClientContext context;
    v1::PullResponse pulled;
    const grpc::Status status = stub->Pull(&context, pull, &pulled);
    if (status.ok()) return pulled;
    if (absl::Now() >= until) return ToAbsl(status);
    absl::SleepFor(absl::Milliseconds(20));
  }
}

// A push of `value` to every element of every chunk in `chunks`, as
// worker 0 at `step`.
grpc::Status PushEverywhere(int port, const v1::PullResponse& chunks, float value,
                            uint64_t step) {
  v1::PushRequest push;
  push.set_job_id("binary-test");
  push.set_incarnation(1);
  push.set_step(step);
  push.set_num_samples(1);
  for (const v1::ChunkData& c : chunks.chunks()) {
    v1::ChunkData* g = push.add_chunks();
    g->set_chunk_id(c.chunk_id());
    g->set_version(c.version());
    g->set_dtype(v1::DTYPE_F32);
    std::vector<float> values(c.data().size() / sizeof(float), value);
    g->set_data(std::string(reinterpret_cast<const char*>(values.data()), c.data().size()));
  }
  auto stub = v1::ParameterServer::NewStub(MakeChannel(absl::StrCat("127.0.0.1:", port)));
  grpc::ClientContext context;
  v1::PushResponse pushed;
  return stub->Push(&context, push, &pushed);
}

class GrpsServerBinaryTest : public ::testing::Test {
 protected:
  // Asks the server for checkpoint `id` in `dir`; whether it reported it
  // written within 30 s.
  bool CheckpointWritten(uint64_t id, const std::string& dir) {
    v1::CheckpointRequest request;
    request.set_id(id);
    request.set_dir(dir);
    coordinator_->AskForCheckpoint(request);
    return coordinator_->WaitForCheckpointReport(id, v1::CHECKPOINT_STATE_WRITTEN,
                                                 absl::Seconds(30));
  }

  void StartCoordinator(v1::JobConfig config, uint32_t shard = 0) {
    coordinator_ = std::make_unique<FakeCoordinator>(std::move(config), shard);
    absl::StatusOr<GrpcServer> server =
        StartGrpcServer("127.0.0.1:0", {coordinator_.get()});
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = std::move(*server);
  }
  void TearDown() override {
    if (server_.server != nullptr) server_.server->Shutdown();
    std::remove(port_file_.c_str());
  }
  std::string coordinator_address() const {
    return absl::StrCat("127.0.0.1:", server_.port);
  }

  const std::string port_file_ = TempPath("port");
  std::unique_ptr<FakeCoordinator> coordinator_;
  GrpcServer server_;
};

TEST_F(GrpsServerBinaryTest, RegistersServesReportsAndExitsWhenTheJobCompletes) {
  StartCoordinator(SmallJob());
  ServerProcess process({"--port_file=" + port_file_},
                        {"GRPS_COORDINATOR=" + coordinator_address()});
  ASSERT_TRUE(process.started());
  const int port = WaitForPortFile(port_file_, absl::Seconds(30));
  ASSERT_GT(port, 0);

  auto stub = v1::ParameterServer::NewStub(
      MakeChannel(absl::StrCat("127.0.0.1:", port)));
  // Serving starts once registration is done.
  v1::PullRequest pull;
  pull.set_job_id("binary-test");
  v1::PullResponse pulled;
  const absl::Time until = absl::Now() + absl::Seconds(30);
  grpc::Status status;
  do {
    grpc::ClientContext context;
    pulled.Clear();
    status = stub->Pull(&context, pull, &pulled);
    if (status.ok()) break;
    absl::SleepFor(absl::Milliseconds(20));
  } while (absl::Now() < until);
  ASSERT_TRUE(status.ok()) << status.error_message();
  EXPECT_EQ(coordinator_->registered_address(),
            absl::StrCat("127.0.0.1:", port));
  ASSERT_EQ(pulled.chunks_size(), coordinator_->map().chunks_size());

  v1::PushRequest push;
  push.set_job_id("binary-test");
  push.set_incarnation(1);
  push.set_num_samples(1);
  for (const v1::ChunkData& c : pulled.chunks()) {
    v1::ChunkData* g = push.add_chunks();
    g->set_chunk_id(c.chunk_id());
    g->set_dtype(v1::DTYPE_F32);
    g->set_data(std::string(c.data().size(), '\0'));
  }
  v1::PushResponse pushed;
  grpc::ClientContext push_context;
  ASSERT_TRUE(stub->Push(&push_context, push, &pushed).ok());

  // The heartbeat carries the shard's status to the coordinator.
  EXPECT_TRUE(coordinator_->WaitForReportedPushes(push.chunks_size(),
                                                  absl::Seconds(30)));
  const v1::ShardStatus reported = coordinator_->last_status();
  EXPECT_EQ(reported.incarnation(), 7u);
  EXPECT_EQ(reported.version(), 1u);

  coordinator_->SetState(v1::JOB_STATE_COMPLETED);
  EXPECT_EQ(process.WaitForExit(absl::Seconds(30)), 0);
}

TEST_F(GrpsServerBinaryTest, RetriesRegistrationUntilTheCoordinatorAppears) {
  // Learn a free port, then leave it closed for a while.
  StartCoordinator(SmallJob());
  const std::string address = coordinator_address();
  server_.server->Shutdown();
  server_.server->Wait();
  server_ = GrpcServer();

  ServerProcess process(
      {"--coordinator=" + address, "--port_file=" + port_file_}, {});
  ASSERT_TRUE(process.started());
  const int port = WaitForPortFile(port_file_, absl::Seconds(30));
  ASSERT_GT(port, 0);
  // What is tested is that it does not give up: it must not exit while
  // registration fails for half a second.
  EXPECT_EQ(process.WaitForExit(absl::Milliseconds(500)), -1);  // still trying
  // Not registered, so not ready: health must not say SERVING.
  const auto channel = MakeChannel(absl::StrCat("127.0.0.1:", port));
  absl::StatusOr<bool> serving = IsServing(channel, absl::Seconds(5));
  ASSERT_TRUE(serving.ok()) << serving.status();
  EXPECT_FALSE(*serving);

  // The port was free a moment ago; another test's connection may hold it
  // as its own ephemeral port for a moment (the range is shared).
  absl::StatusOr<GrpcServer> server = StartGrpcServer(address, {coordinator_.get()});
  for (int tries = 0; !server.ok() && tries < 50; ++tries) {
    absl::SleepFor(absl::Milliseconds(100));
    server = StartGrpcServer(address, {coordinator_.get()});
  }
  ASSERT_TRUE(server.ok()) << server.status();
  server_ = std::move(*server);
  EXPECT_TRUE(coordinator_->WaitForReportedPushes(0, absl::Seconds(30)));
  EXPECT_FALSE(coordinator_->registered_address().empty());
  serving = IsServing(channel, absl::Seconds(5));
  ASSERT_TRUE(serving.ok()) << serving.status();
  EXPECT_TRUE(*serving);
  coordinator_->SetState(v1::JOB_STATE_STOPPED);
  EXPECT_EQ(process.WaitForExit(absl::Seconds(30)), 0);
}

TEST_F(GrpsServerBinaryTest, KeepsServingWhileTheCoordinatorIsDown) {
  StartCoordinator(SmallJob());
  ServerProcess process({"--coordinator=" + coordinator_address(),
                         "--port_file=" + port_file_},
                        {});
  ASSERT_TRUE(process.started());
  const int port = WaitForPortFile(port_file_, absl::Seconds(30));
  ASSERT_GT(port, 0);
  ASSERT_TRUE(coordinator_->WaitForReportedPushes(0, absl::Seconds(30)));
  server_.server->Shutdown();

  // Missed on purpose: it must not exit while heartbeats fail.
  EXPECT_EQ(process.WaitForExit(absl::Milliseconds(300)), -1);  // several missed heartbeats
  auto stub = v1::ParameterServer::NewStub(
      MakeChannel(absl::StrCat("127.0.0.1:", port)));
  v1::PullRequest pull;
  pull.set_job_id("binary-test");
  v1::PullResponse pulled;
  grpc::ClientContext context;
  const grpc::Status status = stub->Pull(&context, pull, &pulled);
  EXPECT_TRUE(status.ok()) << status.error_message();
  EXPECT_EQ(process.WaitForExit(absl::ZeroDuration()), -1);
  kill(process.pid(), SIGTERM);
  EXPECT_EQ(process.WaitForExit(absl::Seconds(30)), 0);
}

TEST_F(GrpsServerBinaryTest, ExitsZeroOnSigterm) {
  StartCoordinator(SmallJob());
  ServerProcess process(
      {"--coordinator=" + coordinator_address(), "--port_file=" + port_file_},
      {});
  ASSERT_TRUE(process.started());
  ASSERT_GT(WaitForPortFile(port_file_, absl::Seconds(30)), 0);
  kill(process.pid(), SIGTERM);
  EXPECT_EQ(process.WaitForExit(absl::Seconds(30)), 0);
}

TEST_F(GrpsServerBinaryTest, ExitsOneWhenTheCoordinatorSendsAnInvalidJob) {
  v1::JobConfig config = SmallJob();
  config.set_batch_size(0);
  StartCoordinator(config);
  ServerProcess process({"--coordinator=" + coordinator_address()}, {});
  ASSERT_TRUE(process.started());
  EXPECT_EQ(process.WaitForExit(absl::Seconds(30)), 1);
}

TEST_F(GrpsServerBinaryTest, WritesTheCheckpointAHeartbeatAsksForAndReportsIt) {
  StartCoordinator(SmallJob());
  ServerProcess process({"--coordinator=" + coordinator_address()}, {});
  ASSERT_TRUE(process.started());
  ASSERT_TRUE(coordinator_->WaitForReportedPushes(0, absl::Seconds(30)));
  const std::string dir = CheckpointFolder(TempPath("checkpoints"), 3);
  ASSERT_TRUE(CheckpointWritten(3, dir));
  const v1::ShardCheckpoint report = coordinator_->last_status().checkpoint();
  EXPECT_EQ(report.file(), ShardFileName(0));
  EXPECT_EQ(report.num_chunks(), static_cast<uint32_t>(coordinator_->map().chunks_size()));
  absl::StatusOr<v1::ShardCheckpointFile> file =
      ReadShardFile(Env::Default(), dir, report, "binary-test", 3);
  ASSERT_TRUE(file.ok()) << file.status();
  EXPECT_EQ(file->chunks_size(), coordinator_->map().chunks_size());
  coordinator_->SetState(v1::JOB_STATE_COMPLETED);
  EXPECT_EQ(process.WaitForExit(absl::Seconds(30)), 0);
  std::filesystem::remove_all(TempPath("checkpoints"));
}

TEST_F(GrpsServerBinaryTest, ExitsOneWhenTheJobFailed) {
  StartCoordinator(SmallJob());
  ServerProcess process({"--coordinator=" + coordinator_address()}, {});
  ASSERT_TRUE(process.started());
  ASSERT_TRUE(coordinator_->WaitForReportedPushes(0, absl::Seconds(30)));
  coordinator_->SetState(v1::JOB_STATE_FAILED);
  EXPECT_EQ(process.WaitForExit(absl::Seconds(30)), 1);
}

TEST_F(GrpsServerBinaryTest, ExitsOneWhenAnotherServerTookItsShard) {
  StartCoordinator(SmallJob());
  ServerProcess process({"--coordinator=" + coordinator_address()}, {});
  ASSERT_TRUE(process.started());
  ASSERT_TRUE(coordinator_->WaitForReportedPushes(0, absl::Seconds(30)));
  coordinator_->TakeOver();
  EXPECT_EQ(process.WaitForExit(absl::Seconds(30)), 1);
}

TEST_F(GrpsServerBinaryTest, GivesUpWhenTheCoordinatorStaysSilentPastItsTimeout) {
  v1::JobConfig config = SmallJob();
  config.set_coordinator_timeout_ms(1500);
  StartCoordinator(config);
  ServerProcess process({"--coordinator=" + coordinator_address()}, {});
  ASSERT_TRUE(process.started());
  ASSERT_TRUE(coordinator_->WaitForReportedPushes(0, absl::Seconds(30)));
  server_.server->Shutdown();
  const absl::Time gone = absl::Now();
  EXPECT_EQ(process.WaitForExit(absl::Seconds(30)), 1);
  EXPECT_GE(absl::Now() - gone, absl::Milliseconds(1400));
}

TEST_F(GrpsServerBinaryTest, AStandbyKeepsRegisteringPastItsTimeoutUntilTheJobTakesItsShard) {
  StartCoordinator(ScalingJob(1, 2, TempPath("standby")), /*shard=*/1);
  coordinator_->AnswerStandbys();
  ServerProcess process({"--coordinator=" + coordinator_address(), "--shard=1",
                         "--register_timeout_s=1"},
                        {});
  ASSERT_TRUE(process.started());
  // Standby answers for three times its patience: it must not give up.
  EXPECT_EQ(process.WaitForExit(absl::Seconds(3)), -1);
  EXPECT_GE(coordinator_->standby_answers(), 2);
  EXPECT_TRUE(coordinator_->registered_address().empty());

  coordinator_->Reshard(coordinator_->MapOf(2, 1), v1::RestoreOrder());
  coordinator_->TakeStandbysIn();
  EXPECT_TRUE(coordinator_->WaitForReportedPushes(0, absl::Seconds(30)));
  EXPECT_EQ(coordinator_->last_status().shard(), 1u);
  coordinator_->SetState(v1::JOB_STATE_COMPLETED);
  EXPECT_EQ(process.WaitForExit(absl::Seconds(30)), 0);
}

TEST_F(GrpsServerBinaryTest, AStandbyExitsZeroOnSigterm) {
  StartCoordinator(ScalingJob(1, 2, TempPath("standby")), /*shard=*/1);
  coordinator_->AnswerStandbys();
  ServerProcess process({"--coordinator=" + coordinator_address(), "--shard=1"}, {});
  ASSERT_TRUE(process.started());
  const absl::Time until = absl::Now() + absl::Seconds(30);
  while (coordinator_->standby_answers() == 0 && absl::Now() < until)
    absl::SleepFor(absl::Milliseconds(20));
  ASSERT_GT(coordinator_->standby_answers(), 0);
  kill(process.pid(), SIGTERM);
  EXPECT_EQ(process.WaitForExit(absl::Seconds(30)), 0);
}

// Grows a 1-shard job to 2 shards through checkpoint 3, taken after one
// push: the server, shard 0, must serve its chunks of the new map with the
// values of the checkpoint.
TEST_F(GrpsServerBinaryTest, RebuildsItsStoreForAReshardedMapFromTheCut) {
  const std::string root = TempPath("reshard");
  StartCoordinator(ScalingJob(1, 2, root));
  ServerProcess process({"--coordinator=" + coordinator_address(), "--port_file=" + port_file_},
                        {});
  ASSERT_TRUE(process.started());
  const int port = WaitForPortFile(port_file_, absl::Seconds(30));
  ASSERT_GT(port, 0);
  absl::StatusOr<v1::PullResponse> initial = PullAll(port, 0, absl::Seconds(30));
  ASSERT_TRUE(initial.ok()) << initial.status();
  ASSERT_TRUE(PushEverywhere(port, *initial, 1.0f, 0).ok());
  absl::StatusOr<v1::PullResponse> trained = PullAll(port, 1, absl::Seconds(30));
  ASSERT_TRUE(trained.ok()) << trained.status();

  const std::string dir = CheckpointFolder(root, 3);
  ASSERT_TRUE(CheckpointWritten(3, dir));
  v1::CheckpointManifest manifest;
  manifest.set_job_id("binary-test");
  manifest.set_id(3);
  manifest.set_mode(coordinator_->config().mode());
  manifest.set_step(1);
  *manifest.add_shards() = coordinator_->last_status().checkpoint();
  *manifest.mutable_shard_map() = coordinator_->map();
  *manifest.mutable_config() = coordinator_->config();
  manifest.add_worker_steps(1);
  ASSERT_TRUE(WriteManifest(Env::Default(), dir, manifest).ok());

  const v1::ShardMap resharded = coordinator_->MapOf(2, 1);
  const std::vector<uint32_t> kept = ChunksOfShard(resharded, 0);
  ASSERT_LT(kept.size(), static_cast<size_t>(resharded.chunks_size()));  // placed otherwise
  v1::RestoreOrder order;
  order.set_generation(1);
  order.set_checkpoint_id(3);
  order.set_dir(dir);
  order.set_step(1);
  order.add_worker_steps(1);
  coordinator_->Reshard(resharded, order);
  ASSERT_TRUE(coordinator_->WaitForStatus(
      [](const v1::ShardStatus& s) { return s.generation() == 1; }, absl::Seconds(30)));
  const v1::ShardStatus reported = coordinator_->last_status();
  EXPECT_EQ(reported.num_chunks(), kept.size());
  EXPECT_EQ(reported.restored_checkpoint(), 3u);
  EXPECT_FALSE(reported.has_restore_failed());

  absl::StatusOr<v1::PullResponse> served = PullAll(port, 0, absl::Seconds(30));
  ASSERT_TRUE(served.ok()) << served.status();
  ASSERT_EQ(served->chunks_size(), static_cast<int>(kept.size()));
  for (size_t i = 0; i < kept.size(); ++i) {
    const v1::ChunkData& c = served->chunks(static_cast<int>(i));
    ASSERT_EQ(c.chunk_id(), kept[i]);
    EXPECT_EQ(c.data(), trained->chunks(kept[i]).data()) << "chunk " << kept[i];
    EXPECT_NE(c.data(), initial->chunks(kept[i]).data()) << "chunk " << kept[i];
  }
  coordinator_->SetState(v1::JOB_STATE_COMPLETED);
  EXPECT_EQ(process.WaitForExit(absl::Seconds(30)), 0);
  std::filesystem::remove_all(root);
}

TEST_F(GrpsServerBinaryTest, ReportsAReshardItCannotLoadAndRebuildsOnTheNextOrder) {
  const std::string root = TempPath("refused");
  StartCoordinator(ScalingJob(1, 2, root));
  ServerProcess process({"--coordinator=" + coordinator_address()}, {});
  ASSERT_TRUE(process.started());
  ASSERT_TRUE(coordinator_->WaitForReportedPushes(0, absl::Seconds(30)));
  const v1::ShardMap resharded = coordinator_->MapOf(2, 1);
  v1::RestoreOrder missing;
  missing.set_generation(1);
  missing.set_checkpoint_id(9);
  missing.set_dir(CheckpointFolder(root, 9));
  coordinator_->Reshard(resharded, missing);
  ASSERT_TRUE(coordinator_->WaitForStatus(
      [](const v1::ShardStatus& s) { return s.restore_failed().id() == 9; },
      absl::Seconds(30)));
  EXPECT_EQ(coordinator_->last_status().generation(), 0u);

  // The next order comes without the map (the shard said it has epoch 1):
  // the shard rebuilds for the map it remembers.
  v1::RestoreOrder initial_values;
  initial_values.set_generation(2);
  coordinator_->Reshard(resharded, initial_values);
  ASSERT_TRUE(coordinator_->WaitForStatus(
      [](const v1::ShardStatus& s) { return s.generation() == 2; }, absl::Seconds(30)));
  const v1::ShardStatus reported = coordinator_->last_status();
  EXPECT_EQ(reported.num_chunks(), ChunksOfShard(resharded, 0).size());
  EXPECT_FALSE(reported.has_restore_failed());
  coordinator_->SetState(v1::JOB_STATE_COMPLETED);
  EXPECT_EQ(process.WaitForExit(absl::Seconds(30)), 0);
}

TEST_F(GrpsServerBinaryTest, ARetiredShardSendsItsFinalFiguresAndExitsZero) {
  StartCoordinator(ScalingJob(2, 2, TempPath("retired")), /*shard=*/1);
  ServerProcess process({"--coordinator=" + coordinator_address()}, {});
  ASSERT_TRUE(process.started());
  ASSERT_TRUE(coordinator_->WaitForReportedPushes(0, absl::Seconds(30)));
  EXPECT_EQ(process.WaitForExit(absl::Milliseconds(300)), -1);
  coordinator_->Reshard(coordinator_->MapOf(1, 1), v1::RestoreOrder());
  EXPECT_EQ(process.WaitForExit(absl::Seconds(30)), 0);
  EXPECT_TRUE(coordinator_->final_report());
}

TEST_F(GrpsServerBinaryTest, ExitsOneWithoutACoordinatorFlag) {
  ServerProcess process({}, {});
  ASSERT_TRUE(process.started());
  EXPECT_EQ(process.WaitForExit(absl::Seconds(30)), 1);
}

}  // namespace
}  // namespace grps
