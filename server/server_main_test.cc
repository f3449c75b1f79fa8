// Runs the grps-server binary against an in-process fake coordinator: the
// daemon's flags, port file, registration, heartbeats and exit status.
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
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

extern char** environ;

namespace grps {
namespace {

// Registers one server as shard 0 and answers heartbeats with the job state
// the test sets.
class FakeCoordinator final : public v1::Coordinator::Service {
 public:
  explicit FakeCoordinator(v1::JobConfig config) : config_(std::move(config)) {
    map_ = *BuildShardMap(ModelTensors(config_), config_.num_servers(),
                          config_.chunk_bytes());
  }

  grpc::Status RegisterServer(grpc::ServerContext*,
                              const v1::RegisterServerRequest* request,
                              v1::RegisterServerResponse* response) override {
    absl::MutexLock lock(&mu_);
    registered_address_ = request->address();
    response->set_shard(0);
    response->set_incarnation(7);
    *response->mutable_config() = config_;
    *response->mutable_shard_map() = map_;
    return grpc::Status::OK;
  }

  grpc::Status Heartbeat(grpc::ServerContext*,
                         const v1::HeartbeatRequest* request,
                         v1::HeartbeatResponse* response) override {
    absl::MutexLock lock(&mu_);
    ++heartbeats_;
    last_status_ = request->shard();
    if (taken_over_)
      return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION,
                          "stale incarnation 7 of shard 0");
    response->set_job_state(state_);
    response->add_live_workers(0);
    response->add_live_worker_incarnations(1);
    if (checkpoint_.id() > 0) *response->mutable_checkpoint() = checkpoint_;
    return grpc::Status::OK;
  }

  void AskForCheckpoint(v1::CheckpointRequest request) {
    absl::MutexLock lock(&mu_);
    checkpoint_ = std::move(request);
  }
  void TakeOver() {
    absl::MutexLock lock(&mu_);
    taken_over_ = true;
  }
  // Waits until a heartbeat reports checkpoint `id` in `state`.
  bool WaitForCheckpointReport(uint64_t id, v1::CheckpointState state,
                               absl::Duration timeout) {
    absl::MutexLock lock(&mu_);
    auto reported = [&] {
      mu_.AssertHeld();
      return last_status_.checkpoint().id() == id && last_status_.checkpoint().state() == state;
    };
    return mu_.AwaitWithTimeout(absl::Condition(&reported), timeout);
  }

  void SetState(v1::JobState state) {
    absl::MutexLock lock(&mu_);
    state_ = state;
  }
  std::string registered_address() {
    absl::MutexLock lock(&mu_);
    return registered_address_;
  }
  // Waits until a heartbeat reports at least `pushes` pushes (0: until any
  // heartbeat arrives).
  bool WaitForReportedPushes(uint64_t pushes, absl::Duration timeout) {
    absl::MutexLock lock(&mu_);
    auto reported = [&] {
      mu_.AssertHeld();
      return heartbeats_ > 0 && last_status_.pushes() >= pushes;
    };
    return mu_.AwaitWithTimeout(absl::Condition(&reported), timeout);
  }
  v1::ShardStatus last_status() {
    absl::MutexLock lock(&mu_);
    return last_status_;
  }
  const v1::ShardMap& map() const { return map_; }

 private:
  const v1::JobConfig config_;
  v1::ShardMap map_;
  absl::Mutex mu_;
  std::string registered_address_ ABSL_GUARDED_BY(mu_);
  int heartbeats_ ABSL_GUARDED_BY(mu_) = 0;
  v1::ShardStatus last_status_ ABSL_GUARDED_BY(mu_);
  v1::JobState state_ ABSL_GUARDED_BY(mu_) = v1::JOB_STATE_RUNNING;
  v1::CheckpointRequest checkpoint_ ABSL_GUARDED_BY(mu_);
  bool taken_over_ ABSL_GUARDED_BY(mu_) = false;
};

v1::JobConfig SmallJob() {
  v1::JobConfig config = DefaultJobConfig();
  config.set_job_id("binary-test");
  config.set_model(v1::MODEL_SOFTMAX);
  config.clear_hidden_units();
  config.set_input_features(4);
  config.set_num_classes(2);
  config.set_num_servers(1);
  config.set_num_workers(1);
  config.set_heartbeat_interval_ms(50);
  config.set_heartbeat_timeout_ms(1000);
  return config;
}

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

class GrpsServerBinaryTest : public ::testing::Test {
 protected:
  void StartCoordinator(v1::JobConfig config) {
    coordinator_ = std::make_unique<FakeCoordinator>(std::move(config));
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
  v1::CheckpointRequest request;
  request.set_id(3);
  request.set_dir(dir);
  coordinator_->AskForCheckpoint(request);
  ASSERT_TRUE(coordinator_->WaitForCheckpointReport(3, v1::CHECKPOINT_STATE_WRITTEN,
                                                    absl::Seconds(30)));
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

TEST_F(GrpsServerBinaryTest, ExitsOneWithoutACoordinatorFlag) {
  ServerProcess process({}, {});
  ASSERT_TRUE(process.started());
  EXPECT_EQ(process.WaitForExit(absl::Seconds(30)), 1);
}

}  // namespace
}  // namespace grps
