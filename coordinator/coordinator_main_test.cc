// The grps-coordinator process: its exit codes, its port file, and how it
// lingers after the job ends until the servers have heard.
#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <optional>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "checkpoint/checkpoint.h"
#include "daemon/daemon.h"
#include "daemon/env.h"
#include "gtest/gtest.h"
#include "proto/grps.grpc.pb.h"
#include "test/temp_folders.h"

extern char** environ;

namespace grps {
namespace {


// $COORDINATOR_BINARY if set; else the path CMake bakes in; else the
// binary in Bazel's runfiles (a test runs in the workspace's runfiles root).
std::string CoordinatorBinary() {
  if (const char* path = std::getenv("COORDINATOR_BINARY")) return path;
#ifdef GRPS_COORDINATOR_BINARY
  return GRPS_COORDINATOR_BINARY;
#else
  return "coordinator/grps-coordinator";
#endif
}

// A grps-coordinator child process; killed if the test leaves it running.
class CoordinatorProcess {
 public:
  // With `stderr_path`, its standard error goes to that file.
  explicit CoordinatorProcess(std::vector<std::string> flags, const std::string& stderr_path = "") {
    static int counter = 0;
    port_file_ = absl::StrCat(::testing::TempDir(), "/coordinator-", getpid(), "-",
                              ++counter, ".port");
    std::remove(port_file_.c_str());
    std::vector<std::string> args = {CoordinatorBinary(),
                                     "--port_file=" + port_file_};
    args.insert(args.end(), flags.begin(), flags.end());
    std::vector<char*> argv;
    for (std::string& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    if (!stderr_path.empty())
      posix_spawn_file_actions_addopen(&actions, STDERR_FILENO, stderr_path.c_str(),
                                       O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (posix_spawn(&pid_, argv[0], &actions, nullptr, argv.data(), environ) != 0) pid_ = -1;
    posix_spawn_file_actions_destroy(&actions);
  }
  ~CoordinatorProcess() {
    if (pid_ > 0 && !exit_code_.has_value()) {
      kill(pid_, SIGKILL);
      waitpid(pid_, nullptr, 0);
    }
    std::remove(port_file_.c_str());
  }

  bool started() const { return pid_ > 0; }

  // The port from the port file, once the process has written it.
  std::optional<int> WaitForPort(absl::Duration timeout) {
    const absl::Time deadline = absl::Now() + timeout;
    while (absl::Now() < deadline) {
      std::ifstream in(port_file_);
      int port = 0;
      if (in >> port && port > 0) return port;
      if (ExitCode(absl::ZeroDuration()).has_value()) return std::nullopt;
      absl::SleepFor(absl::Milliseconds(20));
    }
    return std::nullopt;
  }

  // The exit code if the process ends within `timeout` (-1 for a signal).
  std::optional<int> ExitCode(absl::Duration timeout) {
    const absl::Time deadline = absl::Now() + timeout;
    while (!exit_code_.has_value()) {
      int status = 0;
      if (waitpid(pid_, &status, WNOHANG) == pid_)
        exit_code_ = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
      else if (absl::Now() >= deadline)
        break;
      else
        absl::SleepFor(absl::Milliseconds(20));
    }
    return exit_code_;
  }

  void Signal(int sig) { kill(pid_, sig); }
  pid_t pid() const { return pid_; }

 private:
  pid_t pid_ = -1;
  std::string port_file_;
  std::optional<int> exit_code_;
};

std::unique_ptr<grpc::ClientContext> Context() {
  auto context = std::make_unique<grpc::ClientContext>();
  context->set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(10)));
  return context;
}

// The TCP ports process `pid` listens on, from /proc.
std::set<int> ListeningPorts(pid_t pid) {
  std::set<std::string> sockets;  // inodes
  std::error_code error;
  for (const auto& fd : std::filesystem::directory_iterator(absl::StrCat("/proc/", pid, "/fd"),
                                                            error)) {
    const std::string target = std::filesystem::read_symlink(fd.path(), error).string();
    if (!error && absl::StartsWith(target, "socket:["))
      sockets.insert(target.substr(8, target.size() - 9));
  }
  std::set<int> ports;
  for (const char* table : {"/proc/net/tcp", "/proc/net/tcp6"}) {
    std::ifstream in(table);
    std::string line;
    std::getline(in, line);  // the header
    while (std::getline(in, line)) {
      std::istringstream fields(line);
      std::string slot, local, remote, state, queues, timer, retransmits, uid, timeout, inode;
      fields >> slot >> local >> remote >> state >> queues >> timer >> retransmits >> uid >>
          timeout >> inode;
      if (state == "0A" && sockets.count(inode) > 0)  // LISTEN
        ports.insert(std::stoi(local.substr(local.rfind(':') + 1), nullptr, 16));
    }
  }
  return ports;
}

TEST(CoordinatorProcess, ListensOnTheAdvertisedPortOnly) {
  CoordinatorProcess p({"--servers=1", "--workers=1", "--listen=127.0.0.1:0"});
  ASSERT_TRUE(p.started());
  const std::optional<int> port = p.WaitForPort(absl::Seconds(20));
  ASSERT_TRUE(port.has_value());
  EXPECT_EQ(ListeningPorts(p.pid()), std::set<int>{*port});
}

TEST(CoordinatorProcess, JobCompletedPerItsStateFileExitsZeroAtOnce) {
  TempFolders temp;  // declared first: removed after the process ends
  const std::string dir = temp.Make("coordinator-main-completed");
  v1::CoordinatorState state;
  state.mutable_config()->set_job_id("done-job");
  state.set_state(v1::JOB_STATE_COMPLETED);
  ASSERT_TRUE(WriteFileAtomically(Env::Default(), JoinPath(dir, "coordinator.state"),
                                  state.SerializeAsString())
                  .ok());
  CoordinatorProcess p({"--job_id=done-job", "--servers=1", "--workers=1",
                        "--checkpoint_dir=" + dir});
  ASSERT_TRUE(p.started());
  EXPECT_EQ(p.ExitCode(absl::Seconds(20)), 0);
}

// A complete checkpoint (id 1, job "other-job") in `dir` of a one-chunk
// model with one shard, its ranks at `step`.
void WriteOneChunkCheckpoint(const std::string& dir, uint64_t step) {
  v1::ShardMap map;
  v1::TensorSpec* t = map.add_tensors();
  t->set_name("other/weight");
  t->add_shape(4);
  v1::ChunkSpec* c = map.add_chunks();
  c->set_num_elements(4);
  map.add_shards()->set_address("127.0.0.1:1");
  v1::ShardCheckpointFile file;
  file.set_job_id("other-job");
  file.set_checkpoint_id(1);
  v1::ChunkState* chunk = file.add_chunks();
  chunk->set_num_elements(4);
  chunk->set_values(std::string(16, '\0'));
  const std::string ckpt = CheckpointFolder(dir, 1);
  absl::StatusOr<v1::ShardCheckpoint> written = WriteShardFile(Env::Default(), ckpt, file);
  ASSERT_TRUE(written.ok()) << written.status();
  v1::CheckpointManifest manifest;
  manifest.set_job_id("other-job");
  manifest.set_id(1);
  manifest.set_mode(v1::MODE_SYNC);
  manifest.set_step(step);
  manifest.add_worker_steps(step);
  *manifest.add_shards() = *written;
  *manifest.mutable_shard_map() = map;
  ASSERT_TRUE(WriteManifest(Env::Default(), ckpt, manifest).ok());
}

std::string ReadAll(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

TEST(CoordinatorProcess, CheckpointOfAnotherModelExitsTwo) {
  TempFolders temp;  // declared first: removed after the process ends
  const std::string dir = temp.Make("coordinator-main-othermodel");
  WriteOneChunkCheckpoint(dir, 0);
  const std::string err = JoinPath(dir, "stderr");
  CoordinatorProcess p(
      {"--job_id=other-job", "--servers=1", "--workers=1", "--checkpoint_dir=" + dir}, err);
  ASSERT_TRUE(p.started());
  EXPECT_EQ(p.ExitCode(absl::Seconds(20)), 2);
  EXPECT_TRUE(absl::StrContains(ReadAll(err),
                                "the model is cut differently: 1 tensors in the "
                                "checkpoint and 6 in this job's model"))
      << ReadAll(err);
}

// The job would report a model of 300 steps that has 600.
TEST(CoordinatorProcess, ACheckpointPastTheJobsLastStepExitsTwoSayingSo) {
  TempFolders temp;
  const std::string dir = temp.Make("coordinator-main-paststeps");
  WriteOneChunkCheckpoint(dir, 600);
  const std::string err = JoinPath(dir, "stderr");
  CoordinatorProcess p({"--job_id=other-job", "--servers=1", "--workers=1", "--steps=300",
                        "--checkpoint_dir=" + dir},
                       err);
  ASSERT_TRUE(p.started());
  EXPECT_EQ(p.ExitCode(absl::Seconds(20)), 2);
  EXPECT_TRUE(absl::StrContains(ReadAll(err), "is at step 600, past this job's --steps=300"))
      << ReadAll(err);
}

// Every checkpoint in the folder damaged: the job starts from step 0, and
// its status says what was lost (it said so in an info line only).
TEST(CoordinatorProcess, EveryCheckpointRefusedAtTheResumeIsAWarningOfTheJob) {
  TempFolders temp;
  const std::string dir = temp.Make("coordinator-main-refused");
  WriteOneChunkCheckpoint(dir, 600);
  std::ofstream(JoinPath(CheckpointFolder(dir, 1), "MANIFEST"), std::ios::trunc)
      << "not a manifest";
  CoordinatorProcess p(
      {"--job_id=refused-job", "--servers=1", "--workers=1", "--checkpoint_dir=" + dir});
  ASSERT_TRUE(p.started());
  std::optional<int> port = p.WaitForPort(absl::Seconds(20));
  ASSERT_TRUE(port.has_value());
  auto stub = v1::Coordinator::NewStub(MakeChannel(absl::StrCat("127.0.0.1:", *port)));
  v1::JobStatus status;
  ASSERT_TRUE(stub->GetJobStatus(Context().get(), v1::GetJobStatusRequest(), &status).ok());
  ASSERT_EQ(status.warnings_size(), 1);
  EXPECT_TRUE(absl::StartsWith(status.warnings(0),
                               absl::StrCat("1 checkpoint in ", dir, " refused (ckpt-00000001: ")))
      << status.warnings(0);
  EXPECT_TRUE(absl::EndsWith(status.warnings(0), "): the job started from step 0"))
      << status.warnings(0);
}

TEST(CoordinatorProcess, TakenBackJobWhoseShardNeverReturnsFailsWithExitOne) {
  TempFolders temp;  // declared first: removed after the process ends
  const std::string dir = temp.Make("coordinator-main-takeback");
  v1::CoordinatorState state;
  state.mutable_config()->set_job_id("back-job");
  state.set_state(v1::JOB_STATE_RUNNING);
  v1::ShardEndpoint* shard = state.add_shards();
  shard->set_address("127.0.0.1:1");
  shard->set_incarnation(5);
  v1::WorkerStatus* worker = state.add_workers();
  worker->set_incarnation(6);
  worker->set_host("h");
  worker->set_state(v1::MEMBER_STATE_ALIVE);
  ASSERT_TRUE(WriteFileAtomically(Env::Default(), JoinPath(dir, "coordinator.state"),
                                  state.SerializeAsString())
                  .ok());
  // Nobody heartbeats: the members die after 300 ms, the job fails 300 ms
  // later.
  CoordinatorProcess p({"--job_id=back-job", "--servers=1", "--workers=1",
                        "--heartbeat_ms=50", "--heartbeat_timeout_ms=300",
                        "--recovery_timeout_ms=300", "--linger_ms=0",
                        "--state_dir=" + dir});
  ASSERT_TRUE(p.started());
  EXPECT_EQ(p.ExitCode(absl::Seconds(20)), 1);
  absl::StatusOr<std::string> bytes =
      Env::Default()->ReadFile(JoinPath(dir, "coordinator.state"));
  ASSERT_TRUE(bytes.ok());
  v1::CoordinatorState after;
  ASSERT_TRUE(after.ParseFromString(*bytes));
  EXPECT_EQ(after.state(), v1::JOB_STATE_FAILED);
}

TEST(CoordinatorProcess, InvalidJobExitsTwo) {
  CoordinatorProcess p({"--mode=bsp"});
  ASSERT_TRUE(p.started());
  EXPECT_EQ(p.ExitCode(absl::Seconds(20)), 2);
  CoordinatorProcess q({"--workers=0"});
  EXPECT_EQ(q.ExitCode(absl::Seconds(20)), 2);
}

TEST(CoordinatorProcess, CompletedJobExitsZeroOnceTheServerHeard) {
  CoordinatorProcess p({"--job_id=proc-job", "--servers=1", "--workers=1",
                        "--heartbeat_ms=100", "--linger_ms=20000"});
  ASSERT_TRUE(p.started());
  std::optional<int> port = p.WaitForPort(absl::Seconds(20));
  ASSERT_TRUE(port.has_value());
  auto stub = v1::Coordinator::NewStub(MakeChannel(absl::StrCat("127.0.0.1:", *port)));

  v1::RegisterServerRequest server;
  server.set_address("127.0.0.1:7000");
  server.set_requested_shard(-1);
  v1::RegisterServerResponse server_reg;
  ASSERT_TRUE(stub->RegisterServer(Context().get(), server, &server_reg).ok());
  v1::RegisterWorkerRequest worker;
  worker.set_requested_rank(-1);
  v1::RegisterWorkerResponse worker_reg;
  ASSERT_TRUE(stub->RegisterWorker(Context().get(), worker, &worker_reg).ok());
  EXPECT_EQ(worker_reg.config().job_id(), "proc-job");

  v1::WorkerDoneRequest done;
  done.set_job_id("proc-job");
  done.set_worker_rank(worker_reg.rank());
  done.set_incarnation(worker_reg.incarnation());
  done.set_has_final_eval(true);  // the job completes with its final evaluation
  done.set_final_test_accuracy(0.9f);
  done.set_final_test_loss(0.3f);
  v1::WorkerDoneResponse done_reply;
  ASSERT_TRUE(stub->WorkerDone(Context().get(), done, &done_reply).ok());

  // The job is over, but the live server has not heard yet: still serving.
  EXPECT_FALSE(p.ExitCode(absl::Milliseconds(500)).has_value());
  v1::HeartbeatRequest beat;
  beat.set_job_id("proc-job");
  beat.set_server_shard(server_reg.shard());
  beat.set_incarnation(server_reg.incarnation());
  v1::HeartbeatResponse reply;
  ASSERT_TRUE(stub->Heartbeat(Context().get(), beat, &reply).ok());
  EXPECT_EQ(reply.job_state(), v1::JOB_STATE_COMPLETED);
  // Told, the server sends its final report; the finished worker, still
  // heartbeating, hears the end too; then the coordinator may go.
  beat.set_final_report(true);
  ASSERT_TRUE(stub->Heartbeat(Context().get(), beat, &reply).ok());
  EXPECT_FALSE(p.ExitCode(absl::Milliseconds(300)).has_value());
  v1::HeartbeatRequest worker_beat;
  worker_beat.set_job_id("proc-job");
  worker_beat.set_worker_rank(worker_reg.rank());
  worker_beat.set_incarnation(worker_reg.incarnation());
  ASSERT_TRUE(stub->Heartbeat(Context().get(), worker_beat, &reply).ok());
  EXPECT_EQ(reply.job_state(), v1::JOB_STATE_COMPLETED);
  EXPECT_EQ(p.ExitCode(absl::Seconds(10)), 0);
}

// Starts a coordinator with one shard, registers a server for it and
// returns its registration.
v1::RegisterServerResponse StartWithServer(CoordinatorProcess* p,
                                           std::unique_ptr<v1::Coordinator::Stub>* stub) {
  v1::RegisterServerResponse reg;
  std::optional<int> port = p->WaitForPort(absl::Seconds(20));
  EXPECT_TRUE(port.has_value());
  if (!port.has_value()) return reg;
  *stub = v1::Coordinator::NewStub(MakeChannel(absl::StrCat("127.0.0.1:", *port)));
  v1::RegisterServerRequest server;
  server.set_address("127.0.0.1:7000");
  server.set_requested_shard(-1);
  grpc::Status st = (*stub)->RegisterServer(Context().get(), server, &reg);
  EXPECT_TRUE(st.ok()) << st.error_message();
  return reg;
}

// The heartbeat of the server that registered with `reg`.
v1::HeartbeatRequest BeatOf(const v1::RegisterServerResponse& reg) {
  v1::HeartbeatRequest beat;
  beat.set_job_id(reg.config().job_id());
  beat.set_server_shard(reg.shard());
  beat.set_incarnation(reg.incarnation());
  return beat;
}

// Sends `beat` until the reply says STOPPED, for at most 5 s; the last state.
v1::JobState BeatUntilStopped(v1::Coordinator::Stub& stub, const v1::HeartbeatRequest& beat) {
  v1::HeartbeatResponse reply;
  const absl::Time deadline = absl::Now() + absl::Seconds(5);
  while (absl::Now() < deadline && reply.job_state() != v1::JOB_STATE_STOPPED) {
    if (!stub.Heartbeat(Context().get(), beat, &reply).ok()) break;
    absl::SleepFor(absl::Milliseconds(20));
  }
  return reply.job_state();
}

TEST(CoordinatorProcess, SigtermStopsTheJobAndExitsZero) {
  CoordinatorProcess p({"--servers=1", "--workers=1", "--linger_ms=20000"});
  ASSERT_TRUE(p.started());
  std::unique_ptr<v1::Coordinator::Stub> stub;
  v1::RegisterServerResponse reg = StartWithServer(&p, &stub);
  ASSERT_NE(stub, nullptr);

  p.Signal(SIGTERM);
  v1::HeartbeatRequest beat = BeatOf(reg);
  EXPECT_EQ(BeatUntilStopped(*stub, beat), v1::JOB_STATE_STOPPED);
  beat.set_final_report(true);
  v1::HeartbeatResponse reply;
  ASSERT_TRUE(stub->Heartbeat(Context().get(), beat, &reply).ok());
  // Its only live member has sent its final report: no 20 s linger.
  EXPECT_EQ(p.ExitCode(absl::Seconds(10)), 0);
}

TEST(CoordinatorProcess, ASignalDuringTheLingerEndsItAtOnce) {
  // A server that heard the end but never sends its final report (and stays
  // live for 60 s) would keep the coordinator lingering for 60 s.
  CoordinatorProcess p({"--servers=1", "--workers=1", "--linger_ms=60000",
                        "--heartbeat_timeout_ms=60000"});
  ASSERT_TRUE(p.started());
  std::unique_ptr<v1::Coordinator::Stub> stub;
  v1::RegisterServerResponse reg = StartWithServer(&p, &stub);
  ASSERT_NE(stub, nullptr);

  p.Signal(SIGINT);  // stops the job; the coordinator lingers
  ASSERT_EQ(BeatUntilStopped(*stub, BeatOf(reg)), v1::JOB_STATE_STOPPED);
  EXPECT_FALSE(p.ExitCode(absl::Milliseconds(500)).has_value()) << "it did not linger";
  const absl::Time signalled = absl::Now();
  p.Signal(SIGTERM);
  EXPECT_EQ(p.ExitCode(absl::Seconds(10)), 0);
  EXPECT_LT(absl::Now() - signalled, absl::Seconds(10));
}

TEST(CoordinatorProcess, ExitsZeroAfterLingeringForAServerThatNeverHears) {
  CoordinatorProcess p({"--servers=1", "--workers=1", "--linger_ms=300"});
  ASSERT_TRUE(p.started());
  std::unique_ptr<v1::Coordinator::Stub> stub;
  StartWithServer(&p, &stub);
  p.Signal(SIGINT);
  EXPECT_EQ(p.ExitCode(absl::Seconds(10)), 0);
}

}  // namespace
}  // namespace grps
