// JobStateMachine on a fake clock, without gRPC: requests go in as messages,
// time moves only when a test advances it.
#include "coordinator/job_state_machine.h"

#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "checkpoint/checkpoint.h"
#include "coordinator/testing/fake_clock.h"
#include "coordinator/testing/test_job.h"
#include "daemon/env.h"
#include "gmock/gmock.h"
#include "google/protobuf/util/message_differencer.h"
#include "gtest/gtest.h"
#include "job/job_config.h"
#include "job/shard_map.h"
#include "test/temp_folders.h"

namespace grps {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

class JobStateMachineTest : public ::testing::Test {
 protected:
  // A job of `servers` shards and `workers` ranks, heartbeat timeout 1 s.
  void StartJob(uint32_t servers, uint32_t workers, v1::ConsistencyMode mode = v1::MODE_SYNC,
                const std::string& checkpoint_dir = "") {
    config_ = TestJobConfig(servers, workers, mode, checkpoint_dir);
    absl::StatusOr<v1::ShardMap> map = TestShardMap(config_);
    ASSERT_TRUE(map.ok()) << map.status();
    map_ = *map;
    machine_ = NewMachine();
  }

  std::unique_ptr<JobStateMachine> NewMachine() {
    JobStateMachine::Options options;
    options.reconnect_backoff = absl::Seconds(1);
    return std::make_unique<JobStateMachine>(
        config_, map_, [this] { return clock_.Now(); }, options);
  }

  JobStateMachine::ServerRegistration RegisterServer(int32_t shard, const std::string& address) {
    v1::RegisterServerRequest request;
    request.set_address(address);
    request.set_requested_shard(shard);
    absl::StatusOr<JobStateMachine::ServerRegistration> reg = machine_->RegisterServer(request);
    EXPECT_TRUE(reg.ok()) << reg.status();
    return reg.ok() ? *reg : JobStateMachine::ServerRegistration();
  }

  // Servers for every shard at 127.0.0.1:7000 + shard.
  std::vector<v1::RegisterServerResponse> RegisterAllServers() {
    std::vector<v1::RegisterServerResponse> out;
    for (uint32_t s = 0; s < config_.num_servers(); ++s)
      out.push_back(RegisterServer(s, absl::StrCat("127.0.0.1:", 7000 + s)).response);
    return out;
  }

  absl::StatusOr<v1::RegisterWorkerResponse> RegisterWorker(int32_t rank) {
    v1::RegisterWorkerRequest request;
    request.set_host("worker-host");
    request.set_backend("cpu");
    request.set_requested_rank(rank);
    JobStateMachine::Wait wait;
    wait.deadline = absl::Now() + absl::Seconds(10);
    return machine_->RegisterWorker(request, wait, [](uint64_t) { return false; });
  }

  std::vector<v1::RegisterWorkerResponse> RegisterAllWorkers() {
    std::vector<v1::RegisterWorkerResponse> out;
    for (uint32_t r = 0; r < config_.num_workers(); ++r) {
      absl::StatusOr<v1::RegisterWorkerResponse> reg = RegisterWorker(r);
      EXPECT_TRUE(reg.ok()) << reg.status();
      out.push_back(reg.ok() ? *reg : v1::RegisterWorkerResponse());
    }
    return out;
  }

  static v1::HeartbeatRequest WorkerRequest(uint32_t rank, uint64_t incarnation,
                                            uint64_t generation = 0) {
    v1::HeartbeatRequest request;
    request.set_worker_rank(rank);
    request.set_incarnation(incarnation);
    request.set_generation(generation);
    request.set_shard_map_epoch(~0ull);
    return request;
  }

  static v1::HeartbeatRequest ServerRequest(uint32_t shard, uint64_t incarnation,
                                            uint64_t version = 0, uint64_t generation = 0) {
    v1::HeartbeatRequest request;
    request.set_server_shard(shard);
    request.set_incarnation(incarnation);
    request.set_generation(generation);
    request.set_shard_map_epoch(~0ull);
    request.mutable_shard()->set_version(version);
    request.mutable_shard()->set_num_chunks(1);
    return request;
  }

  absl::Status Beat(const v1::HeartbeatRequest& request, v1::HeartbeatResponse* response) {
    absl::StatusOr<v1::HeartbeatResponse> reply = machine_->Heartbeat(request);
    if (reply.ok()) *response = *reply;
    return reply.status();
  }

  absl::Status WorkerBeat(uint32_t rank, uint64_t incarnation, const v1::WorkerProgress& progress,
                          v1::HeartbeatResponse* response) {
    v1::HeartbeatRequest request = WorkerRequest(rank, incarnation);
    *request.mutable_progress() = progress;
    return Beat(request, response);
  }

  absl::Status ServerBeat(uint32_t shard, uint64_t incarnation, v1::HeartbeatResponse* response,
                          const v1::ShardStatus& status = v1::ShardStatus(),
                          bool final_report = false) {
    v1::HeartbeatRequest request = ServerRequest(shard, incarnation);
    *request.mutable_shard() = status;
    request.set_final_report(final_report);
    return Beat(request, response);
  }

  v1::JobStatus Status() { return machine_->Status(); }

  v1::HeartbeatResponse Beat(const v1::HeartbeatRequest& request) {
    absl::StatusOr<v1::HeartbeatResponse> reply = machine_->Heartbeat(request);
    EXPECT_TRUE(reply.ok()) << reply.status();
    return reply.ok() ? *reply : v1::HeartbeatResponse();
  }

  absl::Status Done(uint32_t rank, uint64_t incarnation, uint64_t step, bool final_eval = false,
                    uint64_t generation = 0) {
    v1::WorkerDoneRequest request;
    request.set_worker_rank(rank);
    request.set_incarnation(incarnation);
    request.set_generation(generation);
    request.mutable_progress()->set_step(step);
    request.mutable_progress()->set_total_steps(step);
    if (final_eval) {
      request.set_has_final_eval(true);
      request.set_final_test_accuracy(0.87f);
      request.set_final_test_loss(0.36f);
    }
    return machine_->WorkerDone(request);
  }

  // 1.6 s pass (the heartbeat timeout is 1 s) in which only rank 0
  // heartbeats, halfway; then failures are detected: every other rank is dead.
  void OnlyRankZeroHeartbeatsPastTheTimeout(uint64_t incarnation) {
    clock_.Advance(absl::Milliseconds(800));
    v1::HeartbeatResponse reply;
    ASSERT_TRUE(WorkerBeat(0, incarnation, v1::WorkerProgress(), &reply).ok());
    clock_.Advance(absl::Milliseconds(800));
    machine_->DetectFailures();
  }

  // The rank leaves on purpose (SIGTERM, a drain) after `step`.
  absl::Status Leave(uint32_t rank, uint64_t incarnation, uint64_t step = 0) {
    v1::WorkerDoneRequest request;
    request.set_worker_rank(rank);
    request.set_incarnation(incarnation);
    request.set_leaving(true);
    request.mutable_progress()->set_step(step);
    return machine_->WorkerDone(request);
  }

  // A fresh empty folder for this test, removed after it.
  std::string TempFolder(const std::string& name) { return temp_.Make("jsm-" + name); }

  // What shard `shard`'s server does for `request`: writes its (small) file
  // and returns the report.
  v1::ShardCheckpoint WriteFakeShard(const v1::CheckpointRequest& request, uint32_t shard,
                                     uint64_t version) {
    const v1::ShardCheckpointFile file = FakeShardFile(map_, request.id(), shard, version);
    absl::StatusOr<v1::ShardCheckpoint> written =
        WriteShardFile(Env::Default(), request.dir(), file);
    EXPECT_TRUE(written.ok()) << written.status();
    if (!written.ok()) return v1::ShardCheckpoint();
    written->set_coordinator_incarnation(request.coordinator_incarnation());
    return *written;
  }

  TempFolders temp_;  // first: its folders go after the machine that writes there
  FakeClock clock_;
  v1::JobConfig config_;
  v1::ShardMap map_;
  std::unique_ptr<JobStateMachine> machine_;
};

TEST_F(JobStateMachineTest, JobRunsOnceEveryShardAndEveryRankRegistered) {
  StartJob(2, 2);
  EXPECT_EQ(machine_->state(), v1::JOB_STATE_WAITING);
  RegisterServer(1, "127.0.0.1:7001");
  EXPECT_EQ(machine_->Status().message(), "waiting for shard 0 and workers 0, 1 to register");
  RegisterServer(0, "127.0.0.1:7000");
  ASSERT_TRUE(RegisterWorker(0).ok());
  EXPECT_EQ(machine_->state(), v1::JOB_STATE_WAITING);
  EXPECT_EQ(machine_->Status().message(), "waiting for worker 1 to register");
  absl::StatusOr<v1::RegisterWorkerResponse> last = RegisterWorker(1);
  ASSERT_TRUE(last.ok()) << last.status();
  EXPECT_EQ(machine_->state(), v1::JOB_STATE_RUNNING);
  EXPECT_EQ(last->rank(), 1u);
  EXPECT_EQ(last->generation(), 1u);
  EXPECT_EQ(last->shard_map().shards(1).address(), "127.0.0.1:7001");
  EXPECT_TRUE(last->member_secret().empty());  // the service's business
}

TEST_F(JobStateMachineTest, ARegistrationWaitsForTheShardsUntilItsDeadline) {
  StartJob(2, 1);
  RegisterServer(0, "127.0.0.1:7000");
  v1::RegisterWorkerRequest request;
  request.set_host("worker-host");
  request.set_backend("cpu");
  JobStateMachine::Wait wait;
  wait.deadline = absl::Now() + absl::Milliseconds(50);
  absl::StatusOr<v1::RegisterWorkerResponse> reg =
      machine_->RegisterWorker(request, wait, [](uint64_t) { return false; });
  EXPECT_TRUE(absl::IsDeadlineExceeded(reg.status())) << reg.status();
  EXPECT_EQ(reg.status().message(), "waiting for shard 1 to register");
  wait.deadline = absl::InfiniteFuture();
  wait.cancelled = [] { return true; };
  EXPECT_TRUE(absl::IsCancelled(
      machine_->RegisterWorker(request, wait, [](uint64_t) { return false; }).status()));
  machine_->ReleaseWaiters();
  wait.cancelled = [] { return false; };
  EXPECT_TRUE(absl::IsUnavailable(
      machine_->RegisterWorker(request, wait, [](uint64_t) { return false; }).status()));
  EXPECT_EQ(machine_->waiting_registrations(), 0);
}

TEST_F(JobStateMachineTest, TrainingDoneThenTheFinalEvaluationCompletesTheJob) {
  StartJob(1, 2);
  std::vector<v1::RegisterServerResponse> s = RegisterAllServers();
  std::vector<v1::RegisterWorkerResponse> w = RegisterAllWorkers();
  ASSERT_TRUE(Done(0, w[0].incarnation(), 100).ok());
  ASSERT_TRUE(Done(1, w[1].incarnation(), 100).ok());
  // Training is done; the job waits for the final evaluation, which rank 0
  // runs once the server has heard the final (empty) live set.
  EXPECT_EQ(machine_->state(), v1::JOB_STATE_RUNNING);
  EXPECT_FALSE(Beat(WorkerRequest(0, w[0].incarnation())).evaluate_final());
  EXPECT_TRUE(Beat(ServerRequest(0, s[0].incarnation())).live_workers().empty());
  Beat(ServerRequest(0, s[0].incarnation()));
  v1::HeartbeatResponse reply = Beat(WorkerRequest(0, w[0].incarnation()));
  EXPECT_EQ(reply.evaluator_rank(), 0u);
  EXPECT_TRUE(reply.evaluate_final());
  EXPECT_FALSE(Beat(WorkerRequest(1, w[1].incarnation())).evaluate_final());

  ASSERT_TRUE(Done(0, w[0].incarnation(), 100, /*final_eval=*/true).ok());
  v1::JobStatus status = machine_->Status();
  EXPECT_EQ(status.state(), v1::JOB_STATE_COMPLETED);
  EXPECT_EQ(status.message(), "every worker finished");
  EXPECT_TRUE(status.has_final_eval());
  EXPECT_FLOAT_EQ(status.final_test_accuracy(), 0.87f);
  EXPECT_TRUE(machine_->WaitForEnd(absl::ZeroDuration()));
  // The end is known to every member once each heard it.
  EXPECT_FALSE(machine_->EveryLiveMemberSawEnd());
  v1::HeartbeatRequest final_report = ServerRequest(0, s[0].incarnation());
  final_report.set_final_report(true);
  EXPECT_EQ(Beat(final_report).job_state(), v1::JOB_STATE_COMPLETED);
  Beat(WorkerRequest(0, w[0].incarnation()));
  EXPECT_FALSE(machine_->EveryLiveMemberSawEnd());
  Beat(WorkerRequest(1, w[1].incarnation()));
  EXPECT_TRUE(machine_->EveryLiveMemberSawEnd());
  EXPECT_TRUE(absl::IsFailedPrecondition(RegisterWorker(-1).status()));
}

TEST_F(JobStateMachineTest, AWorkerWaitingForItsRankHearsTheEndBeforeTheCoordinatorLeaves) {
  StartJob(1, 2, v1::MODE_ASYNC);
  std::vector<v1::RegisterServerResponse> s = RegisterAllServers();
  std::vector<v1::RegisterWorkerResponse> w = RegisterAllWorkers();
  // Rank 1 was killed and started again: its old incarnation still counts
  // as alive, so the new one waits.
  EXPECT_TRUE(absl::IsAlreadyExists(RegisterWorker(1).status()));
  // The old one is declared dead and rank 0 finishes the job before the
  // new one asks again.
  clock_.Advance(absl::Milliseconds(1100));
  Beat(ServerRequest(0, s[0].incarnation()));
  Beat(WorkerRequest(0, w[0].incarnation()));
  machine_->DetectFailures();
  ASSERT_TRUE(Done(0, w[0].incarnation(), 100, /*final_eval=*/true).ok());
  ASSERT_EQ(machine_->state(), v1::JOB_STATE_COMPLETED);
  v1::HeartbeatRequest final_report = ServerRequest(0, s[0].incarnation());
  final_report.set_final_report(true);
  Beat(final_report);
  Beat(WorkerRequest(0, w[0].incarnation()));
  // Every member heard the end, but the waiting worker has not: the
  // coordinator must not leave it retrying a coordinator that is gone.
  EXPECT_FALSE(machine_->EveryLiveMemberSawEnd());
  absl::StatusOr<v1::RegisterWorkerResponse> late = RegisterWorker(1);
  EXPECT_TRUE(absl::IsFailedPrecondition(late.status())) << late.status();
  EXPECT_TRUE(machine_->EveryLiveMemberSawEnd());
}

TEST_F(JobStateMachineTest, ARestartedServerRollsTheJobBackAndRanksResume) {
  StartJob(2, 2);
  std::vector<v1::RegisterServerResponse> s = RegisterAllServers();
  std::vector<v1::RegisterWorkerResponse> w = RegisterAllWorkers();
  ASSERT_TRUE(Done(0, w[0].incarnation(), 50).ok());

  // Shard 1's server comes back at its address while the job runs.
  JobStateMachine::ServerRegistration again = RegisterServer(1, "127.0.0.1:7001");
  EXPECT_TRUE(again.rolled_back);
  EXPECT_EQ(again.response.restore().generation(), 2u);
  EXPECT_EQ(again.response.restore().checkpoint_id(), 0u);  // the initial values
  EXPECT_THAT(again.response.restore().worker_steps(), ElementsAre(0u, 0u));
  EXPECT_EQ(machine_->restore_order().generation(), 2u);
  v1::JobStatus status = machine_->Status();
  EXPECT_EQ(status.generation(), 2u);
  EXPECT_EQ(status.workers(0).state(), v1::MEMBER_STATE_ALIVE);  // trains again

  // Members of generation 1 get the restore order; rank 0's old WorkerDone
  // is refused.
  v1::HeartbeatResponse reply = Beat(ServerRequest(0, s[0].incarnation(), 30, 1));
  EXPECT_EQ(reply.restore().generation(), 2u);
  reply = Beat(WorkerRequest(0, w[0].incarnation(), 1));
  EXPECT_EQ(reply.restore().generation(), 2u);
  EXPECT_THAT(reply.live_workers(), ElementsAre(0u, 1u));
  EXPECT_TRUE(absl::IsAborted(Done(0, w[0].incarnation(), 50, false, /*generation=*/1)));
  // Once it follows, nothing more is said.
  EXPECT_FALSE(Beat(WorkerRequest(0, w[0].incarnation(), 2)).has_restore());
}

TEST_F(JobStateMachineTest, ATakenOverJobGivesItsMembersAGraceBeforeAnyDies) {
  StartJob(1, 2);
  std::vector<v1::RegisterServerResponse> s = RegisterAllServers();
  std::vector<v1::RegisterWorkerResponse> w = RegisterAllWorkers();
  ASSERT_TRUE(Done(1, w[1].incarnation(), 10).ok());
  const v1::CoordinatorState state = machine_->ExportState();
  EXPECT_EQ(state.state(), v1::JOB_STATE_RUNNING);

  clock_.Advance(absl::Seconds(5));
  machine_ = NewMachine();
  ASSERT_TRUE(machine_->TakeOver(state, "the state file").ok());
  v1::JobStatus status = machine_->Status();
  EXPECT_EQ(status.state(), v1::JOB_STATE_RUNNING);
  EXPECT_TRUE(status.coordinator_restarted());
  EXPECT_EQ(status.workers(1).state(), v1::MEMBER_STATE_FINISHED);
  // Past the heartbeat timeout (1 s) but within the grace (1 s + 1 s of
  // reconnection + 100 ms): nobody dies.
  clock_.Advance(absl::Milliseconds(1900));
  machine_->DetectFailures();
  status = machine_->Status();
  EXPECT_EQ(status.shards(0).state(), v1::MEMBER_STATE_ALIVE);
  EXPECT_EQ(status.workers(0).state(), v1::MEMBER_STATE_ALIVE);
  // The server comes back; rank 0 stays silent past the grace: dead.
  Beat(ServerRequest(0, s[0].incarnation()));
  clock_.Advance(absl::Milliseconds(300));
  machine_->DetectFailures();
  status = machine_->Status();
  EXPECT_EQ(status.shards(0).state(), v1::MEMBER_STATE_ALIVE);
  EXPECT_EQ(status.workers(0).state(), v1::MEMBER_STATE_DEAD);

  // Only a waiting or running job of this job id is taken over.
  v1::CoordinatorState ended = state;
  ended.set_state(v1::JOB_STATE_COMPLETED);
  EXPECT_TRUE(absl::IsInvalidArgument(NewMachine()->TakeOver(ended, "f")));
  v1::CoordinatorState other = state;
  other.mutable_config()->set_job_id("other-job");
  EXPECT_TRUE(absl::IsInvalidArgument(NewMachine()->TakeOver(other, "f")));
}

TEST_F(JobStateMachineTest, ACheckpointIsAskedOfEveryShardAndCompletesOnceAllWrote) {
  const std::string dir = TempFolder("checkpoint");
  StartJob(2, 1, v1::MODE_SYNC, dir);
  std::vector<v1::RegisterServerResponse> s = RegisterAllServers();
  RegisterAllWorkers();
  Beat(ServerRequest(0, s[0].incarnation(), 7));
  Beat(ServerRequest(1, s[1].incarnation(), 8));
  absl::StatusOr<v1::CheckpointSummary> asked =
      machine_->CheckpointJob(/*wait_for_it=*/false, JobStateMachine::Wait());
  ASSERT_TRUE(asked.ok()) << asked.status();
  EXPECT_EQ(asked->state(), v1::CHECKPOINT_STATE_PENDING);

  const v1::CheckpointRequest request = Beat(ServerRequest(0, s[0].incarnation(), 8)).checkpoint();
  EXPECT_EQ(request.id(), asked->id());
  EXPECT_GT(request.version(), 8u);  // ahead of every shard
  EXPECT_EQ(Beat(ServerRequest(1, s[1].incarnation(), 8)).checkpoint().id(), request.id());

  // Shard 0 wrote its file: no manifest yet, and it is no longer asked.
  v1::HeartbeatRequest beat0 = ServerRequest(0, s[0].incarnation(), request.version());
  *beat0.mutable_shard()->mutable_checkpoint() = WriteFakeShard(request, 0, request.version());
  EXPECT_FALSE(Beat(beat0).has_checkpoint());
  machine_->WriteReadyManifest();
  EXPECT_FALSE(ReadManifest(Env::Default(), request.dir()).ok());
  EXPECT_EQ(machine_->Status().pending_checkpoint().state(), v1::CHECKPOINT_STATE_PENDING);

  v1::HeartbeatRequest beat1 = ServerRequest(1, s[1].incarnation(), request.version());
  *beat1.mutable_shard()->mutable_checkpoint() = WriteFakeShard(request, 1, request.version());
  Beat(beat1);
  machine_->WriteReadyManifest();
  absl::StatusOr<v1::CheckpointManifest> manifest = ReadManifest(Env::Default(), request.dir());
  ASSERT_TRUE(manifest.ok()) << manifest.status();
  EXPECT_EQ(manifest->id(), request.id());
  EXPECT_EQ(manifest->step(), request.version());
  v1::JobStatus status = machine_->Status();
  EXPECT_EQ(status.last_checkpoint().id(), request.id());
  EXPECT_EQ(status.last_checkpoint().state(), v1::CHECKPOINT_STATE_COMPLETE);
  EXPECT_EQ(status.checkpoints_completed(), 1u);
  // The completed checkpoint is what a coordinator that takes over knows.
  EXPECT_EQ(machine_->ExportState().last_checkpoint().id(), request.id());
}

TEST_F(JobStateMachineTest, ACheckpointNeedsACheckpointDirARunningJobAndEveryShardAlive) {
  StartJob(1, 1);
  EXPECT_TRUE(
      absl::IsFailedPrecondition(machine_->CheckpointJob(false, JobStateMachine::Wait()).status()));
  StartJob(2, 1, v1::MODE_SYNC, TempFolder("refused"));
  EXPECT_TRUE(
      absl::IsFailedPrecondition(machine_->CheckpointJob(false, JobStateMachine::Wait()).status()));
  std::vector<v1::RegisterServerResponse> s = RegisterAllServers();
  std::vector<v1::RegisterWorkerResponse> w = RegisterAllWorkers();
  clock_.Advance(absl::Milliseconds(800));
  Beat(ServerRequest(0, s[0].incarnation()));
  Beat(WorkerRequest(0, w[0].incarnation()));
  clock_.Advance(absl::Milliseconds(800));
  machine_->DetectFailures();  // shard 1 dead
  absl::StatusOr<v1::CheckpointSummary> asked =
      machine_->CheckpointJob(false, JobStateMachine::Wait());
  EXPECT_TRUE(absl::IsUnavailable(asked.status())) << asked.status();
}

// The coordinator-mid-move drill's defect: a coordinator that took a sync
// job over asked for its first cut at step 4 (0 + the margin) while the
// shards were at ~400, before any had said where it was.
TEST_F(JobStateMachineTest, AfterATakeOverASyncCutIsAskedAheadOfTheShardsVersionsHeardSince) {
  const std::string dir = TempFolder("takeover-cut");
  StartJob(2, 1, v1::MODE_SYNC, dir);
  std::vector<v1::RegisterServerResponse> s = RegisterAllServers();
  RegisterAllWorkers();
  Beat(ServerRequest(0, s[0].incarnation(), 7));
  Beat(ServerRequest(1, s[1].incarnation(), 7));
  const v1::CoordinatorState state = machine_->ExportState();

  clock_.Advance(absl::Seconds(2));
  machine_ = NewMachine();
  ASSERT_TRUE(machine_->TakeOver(state, "the state file").ok());
  absl::StatusOr<v1::CheckpointSummary> asked =
      machine_->CheckpointJob(false, JobStateMachine::Wait());
  EXPECT_TRUE(absl::IsUnavailable(asked.status())) << asked.status();
  EXPECT_THAT(asked.status().message(), HasSubstr("waiting for the version of shards 0, 1"));

  // The shards trained on meanwhile; one has said so.
  Beat(ServerRequest(0, s[0].incarnation(), 400));
  asked = machine_->CheckpointJob(false, JobStateMachine::Wait());
  EXPECT_THAT(asked.status().message(), HasSubstr("waiting for the version of shard 1"));
  Beat(ServerRequest(1, s[1].incarnation(), 401));
  // Both heard, the step moving: its rate is measured first, over a whole
  // window (a first estimate of 100 ms is not enough).
  asked = machine_->CheckpointJob(false, JobStateMachine::Wait());
  EXPECT_TRUE(absl::IsUnavailable(asked.status())) << asked.status();
  clock_.Advance(absl::Milliseconds(200));
  Beat(ServerRequest(0, s[0].incarnation(), 410));
  Beat(ServerRequest(1, s[1].incarnation(), 411));
  asked = machine_->CheckpointJob(false, JobStateMachine::Wait());
  EXPECT_THAT(asked.status().message(), HasSubstr("measuring the step rate"));
  // The first whole window (400 -> 440 of the highest version) may have
  // begun where the step stood: the rate is measured by the next one.
  clock_.Advance(absl::Milliseconds(300));
  Beat(ServerRequest(0, s[0].incarnation(), 440));
  Beat(ServerRequest(1, s[1].incarnation(), 441));
  asked = machine_->CheckpointJob(false, JobStateMachine::Wait());
  EXPECT_THAT(asked.status().message(), HasSubstr("measuring the step rate"));
  clock_.Advance(absl::Milliseconds(500));
  Beat(ServerRequest(0, s[0].incarnation(), 480));
  Beat(ServerRequest(1, s[1].incarnation(), 481));
  asked = machine_->CheckpointJob(false, JobStateMachine::Wait());
  ASSERT_TRUE(asked.ok()) << asked.status();
  const v1::CheckpointRequest request =
      Beat(ServerRequest(0, s[0].incarnation(), 481)).checkpoint();
  EXPECT_EQ(request.id(), asked->id());
  // Ahead of every shard by more than the bare margin (4 steps, what the
  // 100 ms first estimate gave): the highest version went 440 -> 480 over
  // the 500 ms window, 80 steps a second, 8 an interval: 3 x 8 and 2.
  EXPECT_EQ(request.version(), 481u + 26u);
}

// The python_worker drill's failed cuts: the rate measured last (a slow
// spell after a worker's restart) left a margin of 4 steps, and the job,
// back at speed, passed the cut before the shards heard of it.
TEST_F(JobStateMachineTest, ASyncCutsMarginFollowsTheHighestRecentStepRate) {
  StartJob(1, 1, v1::MODE_SYNC, TempFolder("rate"));
  std::vector<v1::RegisterServerResponse> s = RegisterAllServers();
  RegisterAllWorkers();
  Beat(ServerRequest(0, s[0].incarnation(), 0));
  clock_.Advance(absl::Milliseconds(500));
  Beat(ServerRequest(0, s[0].incarnation(), 50));  // 100 steps a second
  clock_.Advance(absl::Milliseconds(500));
  Beat(ServerRequest(0, s[0].incarnation(), 50));  // a stall
  clock_.Advance(absl::Milliseconds(500));
  Beat(ServerRequest(0, s[0].incarnation(), 52));  // 4 steps a second
  ASSERT_TRUE(machine_->CheckpointJob(false, JobStateMachine::Wait()).ok());
  const v1::CheckpointRequest request = Beat(ServerRequest(0, s[0].incarnation(), 52)).checkpoint();
  // Three heartbeat intervals at 100 steps a second, and 2 of slack.
  EXPECT_EQ(request.version(), 52u + 32u);
}

// A sync job whose shards ended a step apart (a joiner trained one step
// behind on one of them): the final cut at the last step cannot complete,
// and the job does not wait the checkpoint's minute for it.
TEST_F(JobStateMachineTest, AFinalCutThatASplitShardNeverReachesFailsAtOnce) {
  StartJob(2, 1, v1::MODE_SYNC, TempFolder("split"));
  std::vector<v1::RegisterServerResponse> s = RegisterAllServers();
  std::vector<v1::RegisterWorkerResponse> w = RegisterAllWorkers();
  ASSERT_TRUE(Done(0, w[0].incarnation(), 10).ok());
  // Each server hears the final live set, then says so (a second beat).
  for (int round = 0; round < 2; ++round) {
    Beat(ServerRequest(0, s[0].incarnation(), 9));
    Beat(ServerRequest(1, s[1].incarnation(), 10));
  }
  machine_->DetectFailures();
  const v1::JobStatus status = Status();
  EXPECT_EQ(status.pending_checkpoint().state(), v1::CHECKPOINT_STATE_FAILED);
  EXPECT_THAT(status.pending_checkpoint().error(),
              HasSubstr("the sync shards ended at different versions (9, 10)"));
}

TEST_F(JobStateMachineTest, StopJobIsFinalAndMayBeRepeated) {
  StartJob(1, 1);
  RegisterAllServers();
  RegisterAllWorkers();
  ASSERT_TRUE(machine_->StopJob("enough").ok());
  EXPECT_EQ(machine_->state(), v1::JOB_STATE_STOPPED);
  EXPECT_EQ(machine_->Status().message(), "enough");
  EXPECT_TRUE(machine_->StopJob("again").ok());
  EXPECT_EQ(machine_->Status().message(), "enough");
  v1::RegisterServerRequest late;
  late.set_address("127.0.0.1:7005");
  EXPECT_TRUE(absl::IsFailedPrecondition(machine_->RegisterServer(late).status()));
}

TEST_F(JobStateMachineTest, SilentWorkerIsDeclaredDeadAndLeavesTheLiveSet) {
  StartJob(1, 2);
  std::vector<v1::RegisterServerResponse> s = RegisterAllServers();
  std::vector<v1::RegisterWorkerResponse> w = RegisterAllWorkers();
  v1::HeartbeatResponse reply;
  ASSERT_TRUE(ServerBeat(0, s[0].incarnation(), &reply).ok());
  const uint64_t epoch = reply.membership_epoch();

  clock_.Advance(absl::Milliseconds(600));
  ASSERT_TRUE(WorkerBeat(0, w[0].incarnation(), v1::WorkerProgress(), &reply).ok());
  ASSERT_TRUE(ServerBeat(0, s[0].incarnation(), &reply).ok());
  clock_.Advance(absl::Milliseconds(600));  // worker 1 silent for 1.2 s > 1 s
  machine_->DetectFailures();

  ASSERT_TRUE(ServerBeat(0, s[0].incarnation(), &reply).ok());
  EXPECT_THAT(reply.live_workers(), ElementsAre(0u));
  EXPECT_THAT(reply.live_worker_incarnations(), ElementsAre(w[0].incarnation()));
  EXPECT_GT(reply.membership_epoch(), epoch);
  v1::JobStatus status = Status();
  EXPECT_EQ(status.workers(1).state(), v1::MEMBER_STATE_DEAD);
  EXPECT_EQ(status.workers(0).state(), v1::MEMBER_STATE_ALIVE);
  EXPECT_EQ(status.membership_epoch(), reply.membership_epoch());
  EXPECT_EQ(status.state(), v1::JOB_STATE_RUNNING);
}

TEST_F(JobStateMachineTest, DeadWorkerDoesNotKeepTheJobFromCompleting) {
  StartJob(1, 2);
  RegisterAllServers();
  std::vector<v1::RegisterWorkerResponse> w = RegisterAllWorkers();
  OnlyRankZeroHeartbeatsPastTheTimeout(w[0].incarnation());  // worker 1 dead
  EXPECT_EQ(Status().state(), v1::JOB_STATE_RUNNING);
  ASSERT_TRUE(Done(0, w[0].incarnation(), 100).ok());
  EXPECT_EQ(Status().state(), v1::JOB_STATE_RUNNING);  // the final evaluation
  ASSERT_TRUE(Done(0, w[0].incarnation(), 100, /*final_eval=*/true).ok());
  v1::JobStatus status = Status();
  EXPECT_EQ(status.state(), v1::JOB_STATE_COMPLETED);
  EXPECT_EQ(status.message(), "worker 1 died before finishing; the others finished");
}

TEST_F(JobStateMachineTest, ADrainedWorkerIsToldSoAndLeavesTheLiveSetAtOnce) {
  StartJob(1, 3);
  std::vector<v1::RegisterServerResponse> s = RegisterAllServers();
  std::vector<v1::RegisterWorkerResponse> w = RegisterAllWorkers();
  v1::HeartbeatResponse reply;
  ASSERT_TRUE(WorkerBeat(1, w[1].incarnation(), v1::WorkerProgress(), &reply).ok());
  EXPECT_FALSE(reply.drain());
  EXPECT_EQ(machine_->DrainWorker(3).code(), absl::StatusCode::kNotFound);
  ASSERT_TRUE(machine_->DrainWorker(1).ok());
  ASSERT_TRUE(WorkerBeat(1, w[1].incarnation(), v1::WorkerProgress(), &reply).ok());
  EXPECT_TRUE(reply.drain());
  ASSERT_TRUE(WorkerBeat(0, w[0].incarnation(), v1::WorkerProgress(), &reply).ok());
  EXPECT_FALSE(reply.drain()) << "only the drained rank is told";
  const uint64_t epoch = reply.membership_epoch();

  // It leaves after its step: no heartbeat timeout, no time passes.
  ASSERT_TRUE(Leave(1, w[1].incarnation(), 57).ok());
  ASSERT_TRUE(Leave(1, w[1].incarnation(), 57).ok());  // a retry counts once
  ASSERT_TRUE(ServerBeat(0, s[0].incarnation(), &reply).ok());
  EXPECT_THAT(reply.live_workers(), ElementsAre(0u, 2u));
  EXPECT_EQ(reply.membership_epoch(), epoch + 1);
  v1::JobStatus status = Status();
  EXPECT_EQ(status.workers(1).state(), v1::MEMBER_STATE_LEFT);
  EXPECT_EQ(status.workers(1).progress().step(), 57u);
  EXPECT_EQ(status.worker_leaves(), 1u);
  EXPECT_EQ(status.worker_joins(), 0u);
  EXPECT_EQ(machine_->DrainWorker(1).code(), absl::StatusCode::kFailedPrecondition);

  // A worker started for the rank joins the running job at the rank's step.
  absl::StatusOr<v1::RegisterWorkerResponse> back = RegisterWorker(1);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->start_step(), 57u);
  EXPECT_EQ(Status().worker_joins(), 1u);
  ASSERT_TRUE(WorkerBeat(1, back->incarnation(), v1::WorkerProgress(), &reply).ok());
  EXPECT_FALSE(reply.drain()) << "the drain was spent by the leave";
}

TEST_F(JobStateMachineTest, ATakenOverJobKeepsWhoLeftAndTheCounts) {
  StartJob(1, 3);
  RegisterAllServers();
  std::vector<v1::RegisterWorkerResponse> w = RegisterAllWorkers();
  ASSERT_TRUE(Leave(2, w[2].incarnation(), 12).ok());
  ASSERT_TRUE(Leave(1, w[1].incarnation(), 12).ok());
  ASSERT_TRUE(RegisterWorker(1).ok());  // a join
  const v1::CoordinatorState state = machine_->ExportState();

  machine_ = NewMachine();
  ASSERT_TRUE(machine_->TakeOver(state, "the state file").ok());
  v1::JobStatus status = machine_->Status();
  EXPECT_EQ(status.workers(2).state(), v1::MEMBER_STATE_LEFT);
  EXPECT_EQ(status.workers(1).state(), v1::MEMBER_STATE_ALIVE);
  EXPECT_EQ(status.worker_leaves(), 2u);
  EXPECT_EQ(status.worker_joins(), 1u);
  // The left rank is not waited for, nor declared dead.
  clock_.Advance(absl::Seconds(10));
  machine_->DetectFailures();
  EXPECT_EQ(machine_->Status().workers(2).state(), v1::MEMBER_STATE_LEFT);
  absl::StatusOr<v1::RegisterWorkerResponse> back = RegisterWorker(2);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->start_step(), 12u);
}

TEST_F(JobStateMachineTest, WorkersThatLeftDoNotKeepTheJobFromCompleting) {
  StartJob(1, 2);
  RegisterAllServers();
  std::vector<v1::RegisterWorkerResponse> w = RegisterAllWorkers();
  // Rank 1 was slow enough to be declared dead, then leaves: a leave too.
  OnlyRankZeroHeartbeatsPastTheTimeout(w[0].incarnation());
  ASSERT_EQ(Status().workers(1).state(), v1::MEMBER_STATE_DEAD);
  ASSERT_TRUE(Leave(1, w[1].incarnation()).ok());
  EXPECT_EQ(Status().workers(1).state(), v1::MEMBER_STATE_LEFT);
  EXPECT_EQ(Status().worker_leaves(), 1u);
  EXPECT_EQ(Status().state(), v1::JOB_STATE_RUNNING);
  ASSERT_TRUE(Done(0, w[0].incarnation(), 100).ok());
  ASSERT_TRUE(Done(0, w[0].incarnation(), 100, /*final_eval=*/true).ok());
  v1::JobStatus status = Status();
  EXPECT_EQ(status.state(), v1::JOB_STATE_COMPLETED);
  EXPECT_EQ(status.message(), "worker 1 left before finishing; the others finished");
  // Draining needs a running job.
  EXPECT_EQ(machine_->DrainWorker(0).code(), absl::StatusCode::kFailedPrecondition);
}

TEST_F(JobStateMachineTest, FinishedWorkerKeepsHeartbeatingAndStaysFinished) {
  StartJob(1, 2);
  RegisterAllServers();
  std::vector<v1::RegisterWorkerResponse> w = RegisterAllWorkers();
  ASSERT_TRUE(Done(0, w[0].incarnation(), 100).ok());
  clock_.Advance(absl::Milliseconds(800));
  v1::HeartbeatResponse reply;
  ASSERT_TRUE(WorkerBeat(0, w[0].incarnation(), v1::WorkerProgress(), &reply).ok());
  ASSERT_TRUE(WorkerBeat(1, w[1].incarnation(), v1::WorkerProgress(), &reply).ok());
  EXPECT_EQ(reply.job_state(), v1::JOB_STATE_RUNNING);
  EXPECT_THAT(reply.live_workers(), ElementsAre(1u));
  clock_.Advance(absl::Milliseconds(800));
  machine_->DetectFailures();
  v1::JobStatus status = Status();
  EXPECT_EQ(status.workers(0).state(), v1::MEMBER_STATE_FINISHED);
  EXPECT_EQ(status.workers(0).last_heartbeat_ms_ago(), 800u);
}

TEST_F(JobStateMachineTest, EvaluatorIsLowestAliveRankWhileTraining) {
  StartJob(1, 3);
  RegisterAllServers();
  std::vector<v1::RegisterWorkerResponse> w = RegisterAllWorkers();
  v1::HeartbeatResponse reply;
  ASSERT_TRUE(WorkerBeat(2, w[2].incarnation(), v1::WorkerProgress(), &reply).ok());
  ASSERT_TRUE(reply.has_evaluator_rank());
  EXPECT_EQ(reply.evaluator_rank(), 0u);
  EXPECT_FALSE(reply.evaluate_final());
  EXPECT_EQ(Status().evaluator_rank(), 0u);

  // Rank 0 dies: rank 1 evaluates; rank 1 finishes: rank 2 does.
  clock_.Advance(absl::Milliseconds(800));
  ASSERT_TRUE(WorkerBeat(1, w[1].incarnation(), v1::WorkerProgress(), &reply).ok());
  ASSERT_TRUE(WorkerBeat(2, w[2].incarnation(), v1::WorkerProgress(), &reply).ok());
  clock_.Advance(absl::Milliseconds(800));
  machine_->DetectFailures();
  ASSERT_TRUE(WorkerBeat(2, w[2].incarnation(), v1::WorkerProgress(), &reply).ok());
  EXPECT_EQ(reply.evaluator_rank(), 1u);
  EXPECT_EQ(Status().evaluator_rank(), 1u);
  ASSERT_TRUE(Done(1, w[1].incarnation(), 100).ok());
  ASSERT_TRUE(WorkerBeat(1, w[1].incarnation(), v1::WorkerProgress(), &reply).ok());
  EXPECT_EQ(reply.evaluator_rank(), 2u);
  EXPECT_FALSE(reply.evaluate_final());
}

TEST_F(JobStateMachineTest, AnEndingJobAsksItsMembersForQuickHeartbeats) {
  StartJob(1, 2);
  RegisterAllServers();
  std::vector<v1::RegisterWorkerResponse> w = RegisterAllWorkers();
  v1::HeartbeatResponse reply;
  ASSERT_TRUE(WorkerBeat(1, w[1].incarnation(), v1::WorkerProgress(), &reply).ok());
  EXPECT_EQ(reply.next_heartbeat_ms(), 0u);  // training: the job's interval
  ASSERT_TRUE(Done(0, w[0].incarnation(), 100).ok());
  ASSERT_TRUE(WorkerBeat(1, w[1].incarnation(), v1::WorkerProgress(), &reply).ok());
  EXPECT_EQ(reply.next_heartbeat_ms(), 0u);  // one worker still trains
  ASSERT_TRUE(Done(1, w[1].incarnation(), 100).ok());
  // Training is done: the final evaluation and the end should be heard at
  // once, not an interval later.
  ASSERT_TRUE(WorkerBeat(0, w[0].incarnation(), v1::WorkerProgress(), &reply).ok());
  EXPECT_GT(reply.next_heartbeat_ms(), 0u);
  EXPECT_LE(reply.next_heartbeat_ms(), 50u);
}

TEST_F(JobStateMachineTest, FinalEvaluatorIsLowestFinishedRankStillHeartbeating) {
  StartJob(1, 3);
  RegisterAllServers();
  std::vector<v1::RegisterWorkerResponse> w = RegisterAllWorkers();
  for (uint32_t r = 0; r < 3; ++r) ASSERT_TRUE(Done(r, w[r].incarnation(), 100).ok());
  EXPECT_EQ(Status().state(), v1::JOB_STATE_RUNNING);
  EXPECT_EQ(Status().evaluator_rank(), 0u);

  clock_.Advance(absl::Milliseconds(800));
  v1::HeartbeatResponse reply;
  ASSERT_TRUE(WorkerBeat(2, w[2].incarnation(), v1::WorkerProgress(), &reply).ok());
  ASSERT_TRUE(WorkerBeat(1, w[1].incarnation(), v1::WorkerProgress(), &reply).ok());
  clock_.Advance(absl::Milliseconds(800));  // rank 0 silent for 1.6 s
  ASSERT_TRUE(WorkerBeat(2, w[2].incarnation(), v1::WorkerProgress(), &reply).ok());
  ASSERT_TRUE(reply.has_evaluator_rank());
  EXPECT_EQ(reply.evaluator_rank(), 1u);
  EXPECT_FALSE(reply.evaluate_final());  // not its role
  EXPECT_EQ(Status().evaluator_rank(), 1u);
  EXPECT_EQ(Status().workers(0).state(), v1::MEMBER_STATE_FINISHED);
}

TEST_F(JobStateMachineTest, EvaluateFinalWaitsUntilServersHeardTheFinalLiveSet) {
  StartJob(2, 2);
  std::vector<v1::RegisterServerResponse> s = RegisterAllServers();
  std::vector<v1::RegisterWorkerResponse> w = RegisterAllWorkers();
  v1::HeartbeatResponse reply;
  ASSERT_TRUE(Done(0, w[0].incarnation(), 100).ok());
  // Heard before training was done: these do not count.
  ASSERT_TRUE(ServerBeat(0, s[0].incarnation(), &reply).ok());
  ASSERT_TRUE(ServerBeat(0, s[0].incarnation(), &reply).ok());
  EXPECT_THAT(reply.live_workers(), ElementsAre(1u));
  ASSERT_TRUE(Done(1, w[1].incarnation(), 100).ok());

  auto evaluate_final = [&] {
    v1::HeartbeatResponse r;
    EXPECT_TRUE(WorkerBeat(0, w[0].incarnation(), v1::WorkerProgress(), &r).ok());
    EXPECT_EQ(r.evaluator_rank(), 0u);
    return r.evaluate_final();
  };
  EXPECT_FALSE(evaluate_final());
  ASSERT_TRUE(ServerBeat(0, s[0].incarnation(), &reply).ok());
  EXPECT_TRUE(reply.live_workers().empty());  // the final live set
  EXPECT_FALSE(evaluate_final());
  ASSERT_TRUE(ServerBeat(0, s[0].incarnation(), &reply).ok());  // applied it
  EXPECT_FALSE(evaluate_final());                               // shard 1 has not
  ASSERT_TRUE(ServerBeat(1, s[1].incarnation(), &reply).ok());
  EXPECT_FALSE(evaluate_final());
  ASSERT_TRUE(ServerBeat(1, s[1].incarnation(), &reply).ok());
  EXPECT_TRUE(evaluate_final());
  ASSERT_TRUE(WorkerBeat(1, w[1].incarnation(), v1::WorkerProgress(), &reply).ok());
  EXPECT_EQ(reply.evaluator_rank(), 0u);
  EXPECT_FALSE(reply.evaluate_final());
  EXPECT_EQ(Status().state(), v1::JOB_STATE_RUNNING);
}

TEST_F(JobStateMachineTest, EvaluateFinalDoesNotWaitForADeadServer) {
  StartJob(2, 1);
  std::vector<v1::RegisterServerResponse> s = RegisterAllServers();
  std::vector<v1::RegisterWorkerResponse> w = RegisterAllWorkers();
  ASSERT_TRUE(Done(0, w[0].incarnation(), 100).ok());
  v1::HeartbeatResponse reply;
  clock_.Advance(absl::Milliseconds(800));
  ASSERT_TRUE(ServerBeat(0, s[0].incarnation(), &reply).ok());
  ASSERT_TRUE(ServerBeat(0, s[0].incarnation(), &reply).ok());
  ASSERT_TRUE(WorkerBeat(0, w[0].incarnation(), v1::WorkerProgress(), &reply).ok());
  EXPECT_FALSE(reply.evaluate_final());
  clock_.Advance(absl::Milliseconds(800));
  machine_->DetectFailures();  // shard 1 dead
  ASSERT_TRUE(WorkerBeat(0, w[0].incarnation(), v1::WorkerProgress(), &reply).ok());
  EXPECT_TRUE(reply.evaluate_final());
}

TEST_F(JobStateMachineTest, FinalEvaluationPassesToNextWhenEvaluatorGoesSilent) {
  StartJob(1, 2);
  std::vector<v1::RegisterServerResponse> s = RegisterAllServers();
  std::vector<v1::RegisterWorkerResponse> w = RegisterAllWorkers();
  ASSERT_TRUE(Done(0, w[0].incarnation(), 100).ok());
  ASSERT_TRUE(Done(1, w[1].incarnation(), 100).ok());
  v1::HeartbeatResponse reply;
  ASSERT_TRUE(ServerBeat(0, s[0].incarnation(), &reply).ok());
  ASSERT_TRUE(ServerBeat(0, s[0].incarnation(), &reply).ok());
  ASSERT_TRUE(WorkerBeat(0, w[0].incarnation(), v1::WorkerProgress(), &reply).ok());
  EXPECT_TRUE(reply.evaluate_final());

  // Rank 0 dies while evaluating; rank 1 keeps heartbeating.
  clock_.Advance(absl::Milliseconds(800));
  ASSERT_TRUE(WorkerBeat(1, w[1].incarnation(), v1::WorkerProgress(), &reply).ok());
  EXPECT_EQ(reply.evaluator_rank(), 0u);
  EXPECT_FALSE(reply.evaluate_final());
  clock_.Advance(absl::Milliseconds(800));
  ASSERT_TRUE(ServerBeat(0, s[0].incarnation(), &reply).ok());
  machine_->DetectFailures();
  EXPECT_EQ(Status().state(), v1::JOB_STATE_RUNNING);
  ASSERT_TRUE(WorkerBeat(1, w[1].incarnation(), v1::WorkerProgress(), &reply).ok());
  EXPECT_EQ(reply.evaluator_rank(), 1u);
  EXPECT_TRUE(reply.evaluate_final());

  ASSERT_TRUE(Done(1, w[1].incarnation(), 100, /*final_eval=*/true).ok());
  v1::JobStatus status = Status();
  EXPECT_EQ(status.state(), v1::JOB_STATE_COMPLETED);
  EXPECT_EQ(status.message(), "every worker finished");
  EXPECT_TRUE(status.has_final_eval());
  EXPECT_EQ(status.evaluator_rank(), 1u);
}

TEST_F(JobStateMachineTest, JobCompletesWithoutFinalEvalWhenNoFinishedWorkerRemains) {
  StartJob(1, 2);
  std::vector<v1::RegisterServerResponse> s = RegisterAllServers();
  std::vector<v1::RegisterWorkerResponse> w = RegisterAllWorkers();
  clock_.Advance(absl::Milliseconds(800));
  v1::HeartbeatResponse reply;
  ASSERT_TRUE(WorkerBeat(0, w[0].incarnation(), v1::WorkerProgress(), &reply).ok());
  ASSERT_TRUE(ServerBeat(0, s[0].incarnation(), &reply).ok());
  clock_.Advance(absl::Milliseconds(800));
  ASSERT_TRUE(ServerBeat(0, s[0].incarnation(), &reply).ok());
  machine_->DetectFailures();  // worker 1 dead
  ASSERT_TRUE(Done(0, w[0].incarnation(), 100).ok());
  machine_->DetectFailures();
  EXPECT_EQ(Status().state(), v1::JOB_STATE_RUNNING);

  clock_.Advance(absl::Milliseconds(1001));  // worker 0 silent past the timeout
  ASSERT_TRUE(ServerBeat(0, s[0].incarnation(), &reply).ok());
  machine_->DetectFailures();
  v1::JobStatus status = Status();
  EXPECT_EQ(status.state(), v1::JOB_STATE_COMPLETED);
  EXPECT_EQ(status.message(),
            "worker 1 died before finishing; the others finished; no final "
            "evaluation: no finished worker was still heartbeating to run it");
  EXPECT_FALSE(status.has_final_eval());
  EXPECT_FALSE(status.has_evaluator_rank());
  // The silent finished worker is not waited for; the live server is.
  EXPECT_FALSE(machine_->EveryLiveMemberSawEnd());
  ASSERT_TRUE(ServerBeat(0, s[0].incarnation(), &reply, v1::ShardStatus(), true).ok());
  EXPECT_TRUE(machine_->EveryLiveMemberSawEnd());
}

TEST_F(JobStateMachineTest, JobCompletesWhenTheFinalEvaluationArrives) {
  StartJob(1, 2);
  std::vector<v1::RegisterServerResponse> s = RegisterAllServers();
  std::vector<v1::RegisterWorkerResponse> w = RegisterAllWorkers();
  // An evaluation before training is done is the latest, not the final one.
  ASSERT_TRUE(Done(0, w[0].incarnation(), 100, /*final_eval=*/true).ok());
  v1::JobStatus status = Status();
  EXPECT_EQ(status.state(), v1::JOB_STATE_RUNNING);
  EXPECT_FALSE(status.has_final_eval());
  EXPECT_FLOAT_EQ(status.test_accuracy(), 0.87f);
  ASSERT_TRUE(Done(1, w[1].incarnation(), 100).ok());
  EXPECT_EQ(Status().state(), v1::JOB_STATE_RUNNING);

  // Taken from any finished rank, not only the designated one (rank 0).
  ASSERT_TRUE(Done(1, w[1].incarnation(), 100, /*final_eval=*/true).ok());
  status = Status();
  EXPECT_EQ(status.state(), v1::JOB_STATE_COMPLETED);
  EXPECT_EQ(status.message(), "every worker finished");
  EXPECT_TRUE(status.has_final_eval());
  EXPECT_FLOAT_EQ(status.final_test_accuracy(), 0.87f);
  EXPECT_EQ(status.evaluator_rank(), 1u);

  // Both finished workers still heartbeat, so both must hear the end.
  v1::HeartbeatResponse reply;
  ASSERT_TRUE(ServerBeat(0, s[0].incarnation(), &reply, v1::ShardStatus(), true).ok());
  ASSERT_TRUE(WorkerBeat(1, w[1].incarnation(), v1::WorkerProgress(), &reply).ok());
  EXPECT_EQ(reply.job_state(), v1::JOB_STATE_COMPLETED);
  EXPECT_FALSE(reply.evaluate_final());
  EXPECT_FALSE(machine_->EveryLiveMemberSawEnd());
  ASSERT_TRUE(WorkerBeat(0, w[0].incarnation(), v1::WorkerProgress(), &reply).ok());
  EXPECT_TRUE(machine_->EveryLiveMemberSawEnd());
}

TEST_F(JobStateMachineTest, JobWhoseWorkersAllDiedKeepsRunningUntilTheRecoveryTimeoutThenFails) {
  StartJob(1, 2);
  std::vector<v1::RegisterServerResponse> s = RegisterAllServers();
  RegisterAllWorkers();
  clock_.Advance(absl::Seconds(2));
  v1::HeartbeatResponse reply;
  ASSERT_TRUE(ServerBeat(0, s[0].incarnation(), &reply).ok());
  machine_->DetectFailures();
  machine_->DetectFailures();
  v1::JobStatus status = Status();
  EXPECT_EQ(status.state(), v1::JOB_STATE_RUNNING);
  EXPECT_FALSE(status.has_evaluator_rank());

  // A restarted worker may still come within the recovery timeout (30 s).
  for (int i = 0; i < 29; ++i) {
    clock_.Advance(absl::Seconds(1));
    ASSERT_TRUE(ServerBeat(0, s[0].incarnation(), &reply).ok());
    machine_->DetectFailures();
  }
  EXPECT_EQ(Status().state(), v1::JOB_STATE_RUNNING);
  clock_.Advance(absl::Seconds(1));
  ASSERT_TRUE(ServerBeat(0, s[0].incarnation(), &reply).ok());
  machine_->DetectFailures();
  status = Status();
  EXPECT_EQ(status.state(), v1::JOB_STATE_FAILED);
  EXPECT_NE(status.message().find("every worker died before finishing"), std::string::npos)
      << status.message();
}

TEST_F(JobStateMachineTest, ShardDeadPastTheRecoveryTimeoutFailsTheJob) {
  StartJob(2, 1);
  std::vector<v1::RegisterServerResponse> s = RegisterAllServers();
  std::vector<v1::RegisterWorkerResponse> w = RegisterAllWorkers();
  v1::HeartbeatResponse reply;
  auto beat_others = [&] {
    ASSERT_TRUE(Beat(ServerRequest(0, s[0].incarnation(), 5), &reply).ok());
    ASSERT_TRUE(WorkerBeat(0, w[0].incarnation(), v1::WorkerProgress(), &reply).ok());
  };
  for (int i = 0; i < 30; ++i) {  // 1 s timeout + 29 s dead
    clock_.Advance(absl::Seconds(1));
    beat_others();
    machine_->DetectFailures();
  }
  EXPECT_EQ(Status().state(), v1::JOB_STATE_RUNNING);
  EXPECT_EQ(Status().shards(1).state(), v1::MEMBER_STATE_DEAD);
  clock_.Advance(absl::Seconds(2));
  beat_others();
  machine_->DetectFailures();
  v1::JobStatus status = Status();
  EXPECT_EQ(status.state(), v1::JOB_STATE_FAILED);
  EXPECT_NE(status.message().find("shard 1 has been dead for"), std::string::npos)
      << status.message();
  ASSERT_TRUE(Beat(ServerRequest(0, s[0].incarnation(), 5), &reply).ok());
  EXPECT_EQ(reply.job_state(), v1::JOB_STATE_FAILED);
}

TEST_F(JobStateMachineTest, AServerThatSaysItIsRestoringStaysAliveAndKeepsItsLastStatus) {
  StartJob(2, 1);
  std::vector<v1::RegisterServerResponse> s = RegisterAllServers();
  std::vector<v1::RegisterWorkerResponse> w = RegisterAllWorkers();
  v1::HeartbeatResponse reply;
  ASSERT_TRUE(Beat(ServerRequest(1, s[1].incarnation(), 5), &reply).ok());
  v1::HeartbeatRequest restoring;
  restoring.set_server_shard(1);
  restoring.set_incarnation(s[1].incarnation());
  restoring.set_restoring(true);
  // 40 s of a restore (the heartbeat timeout is 1 s, the recovery one 30 s).
  for (int i = 0; i < 40; ++i) {
    clock_.Advance(absl::Seconds(1));
    ASSERT_TRUE(Beat(ServerRequest(0, s[0].incarnation(), 5), &reply).ok());
    ASSERT_TRUE(WorkerBeat(0, w[0].incarnation(), v1::WorkerProgress(), &reply).ok());
    ASSERT_TRUE(Beat(restoring, &reply).ok());
    EXPECT_EQ(reply.job_state(), v1::JOB_STATE_RUNNING);
    EXPECT_FALSE(reply.has_checkpoint());
    machine_->DetectFailures();
  }
  v1::JobStatus status = Status();
  EXPECT_EQ(status.state(), v1::JOB_STATE_RUNNING);
  EXPECT_EQ(status.shards(1).state(), v1::MEMBER_STATE_ALIVE);
  EXPECT_EQ(status.shards(1).version(), 5u);  // the last status it sent
  // One declared dead meanwhile is alive again at its next one.
  clock_.Advance(absl::Seconds(2));
  machine_->DetectFailures();
  ASSERT_EQ(Status().shards(1).state(), v1::MEMBER_STATE_DEAD);
  ASSERT_TRUE(Beat(restoring, &reply).ok());
  EXPECT_EQ(Status().shards(1).state(), v1::MEMBER_STATE_ALIVE);
  // Only a server restores, and only the one registered.
  restoring.set_incarnation(s[1].incarnation() + 1);
  EXPECT_EQ(Beat(restoring, &reply).code(), absl::StatusCode::kFailedPrecondition);
  v1::HeartbeatRequest worker = WorkerRequest(0, w[0].incarnation());
  worker.set_restoring(true);
  EXPECT_EQ(Beat(worker, &reply).code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace grps

namespace grps {
namespace {

// ---- A user model (MODEL_USER): the first worker defines the layout ----

class UserModelTest : public JobStateMachineTest {
 protected:
  void StartUserJob(const std::string& checkpoint_dir = "") {
    config_ = TestJobConfig(2, 2, v1::MODE_SYNC, checkpoint_dir);
    config_.set_model(v1::MODEL_USER);
    absl::StatusOr<v1::ShardMap> map = TestShardMap(config_);
    ASSERT_TRUE(map.ok()) << map.status();
    map_ = *map;
    machine_ = NewMachine();
  }
};

TEST_F(UserModelTest, ServersRegisterOnlyOnceTheFirstWorkerDefinedTheModel) {
  StartUserJob();
  v1::RegisterServerRequest early;
  early.set_address("127.0.0.1:7000");
  absl::StatusOr<JobStateMachine::ServerRegistration> refused = machine_->RegisterServer(early);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(refused.status().message(), HasSubstr("model is not defined yet"));

  absl::StatusOr<bool> defined = machine_->DefineModel(TestUserModel(4));
  ASSERT_TRUE(defined.ok()) << defined.status();
  EXPECT_TRUE(*defined);
  std::vector<v1::RegisterServerResponse> servers = RegisterAllServers();
  // The layout is the model's: its tensors in order, cut into chunks.
  const v1::ShardMap& map = servers[0].shard_map();
  ASSERT_EQ(map.tensors_size(), 3);
  EXPECT_EQ(map.tensors(0).name(), "fc.weight");
  EXPECT_EQ(map.tensors(2).shape_size(), 0);  // the scalar
  EXPECT_EQ(map.chunks_size(), 3);
  EXPECT_EQ(servers[1].config().model_tensors_size(), 3);
  std::vector<v1::RegisterWorkerResponse> workers = RegisterAllWorkers();
  EXPECT_EQ(workers[1].shard_map().chunks_size(), 3);
  EXPECT_EQ(Status().state(), v1::JOB_STATE_RUNNING);
}

TEST_F(UserModelTest, AnEqualOfferIsTakenAndAnotherModelIsRefusedNamingTheTensor) {
  StartUserJob();
  ASSERT_TRUE(machine_->DefineModel(TestUserModel(4)).ok());
  absl::StatusOr<bool> again = machine_->DefineModel(TestUserModel(4));
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_FALSE(*again);
  absl::StatusOr<bool> other = machine_->DefineModel(TestUserModel(5));
  EXPECT_TRUE(IsModelMismatch(other.status())) << other.status();
  EXPECT_THAT(other.status().message(),
              HasSubstr("tensor 0 'fc.weight' has shape [5, 8], the job's [4, 8]"));
  // Nothing changed: the job's layout is the first model's.
  EXPECT_EQ(machine_->shard_map().tensors(0).shape(0), 4);
  EXPECT_EQ(machine_->JobConfig().model_tensors(0).shape(0), 4);
}

TEST_F(UserModelTest, ABuiltInModelAndABadModelAreRefused) {
  StartJob(2, 2);  // the default model, an MLP
  EXPECT_EQ(machine_->DefineModel(TestUserModel(4)).status().code(),
            absl::StatusCode::kFailedPrecondition);
  StartUserJob();
  TensorSpecs bad = TestUserModel(4);
  bad.Mutable(1)->set_name("fc.weight");
  absl::StatusOr<bool> twice = machine_->DefineModel(bad);
  EXPECT_EQ(twice.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(twice.status().message(), HasSubstr("appears twice"));
  EXPECT_EQ(machine_->shard_map().tensors_size(), 0);
}

TEST_F(UserModelTest, TheDefiningOfferSetsTheOptimizerKindItsServersKeepStateFor) {
  StartUserJob();  // the flags' optimizer: momentum
  ASSERT_TRUE(machine_->DefineModel(TestUserModel(4), v1::OPTIMIZER_ADAM).ok());
  EXPECT_EQ(machine_->JobConfig().optimizer().kind(), v1::OPTIMIZER_ADAM);
  // A later offer's kind changes nothing (its program is refused by grps.torch).
  EXPECT_FALSE(*machine_->DefineModel(TestUserModel(4), v1::OPTIMIZER_ADAGRAD));
  std::vector<v1::RegisterServerResponse> servers = RegisterAllServers();
  EXPECT_EQ(servers[0].config().optimizer().kind(), v1::OPTIMIZER_ADAM);
  // A coordinator that takes over keeps it.
  const v1::CoordinatorState state = machine_->ExportState();
  machine_ = NewMachine();
  ASSERT_TRUE(machine_->TakeOver(state, "state").ok());
  EXPECT_EQ(machine_->JobConfig().optimizer().kind(), v1::OPTIMIZER_ADAM);
  StartUserJob();
  EXPECT_EQ(
      machine_->DefineModel(TestUserModel(4), static_cast<v1::OptimizerKind>(42)).status().code(),
      absl::StatusCode::kInvalidArgument);
}

TEST_F(UserModelTest, AnOptimizerOnTheWorkersNeedsAJobWithoutSparseTables) {
  StartUserJob();
  ASSERT_TRUE(machine_->DefineModel(TestUserModel(4), v1::OPTIMIZER_WORKERS).ok());
  EXPECT_EQ(machine_->JobConfig().optimizer().kind(), v1::OPTIMIZER_WORKERS);
  StartUserJob();
  v1::SparseTableSpec* table = config_.add_sparse_tables();
  table->set_name("emb");
  table->set_dim(4);
  table->set_rows(100);
  machine_ = NewMachine();
  absl::StatusOr<bool> refused = machine_->DefineModel(TestUserModel(4), v1::OPTIMIZER_WORKERS);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(refused.status().message(), HasSubstr("has sparse tables"));
}

TEST_F(UserModelTest, ATakenOverJobKeepsTheDefinedModel) {
  StartUserJob();
  ASSERT_TRUE(machine_->DefineModel(TestUserModel(4)).ok());
  RegisterAllServers();
  RegisterAllWorkers();
  const v1::CoordinatorState state = machine_->ExportState();
  EXPECT_EQ(state.config().model_tensors_size(), 3);
  machine_ = NewMachine();  // a coordinator started again, with the flags' config
  ASSERT_TRUE(machine_->TakeOver(state, "state").ok());
  EXPECT_EQ(machine_->shard_map().chunks_size(), 3);
  EXPECT_FALSE(*machine_->DefineModel(TestUserModel(4)));
  EXPECT_TRUE(IsModelMismatch(machine_->DefineModel(TestUserModel(6)).status()));
}

}  // namespace
}  // namespace grps

namespace grps {
namespace {

using ::google::protobuf::util::MessageDifferencer;

// ---- An elastic job (max_workers): ranks join while it runs; the data is
// leased from the coordinator's example ledger ----

class ElasticJobTest : public JobStateMachineTest {
 protected:
  // One shard; `workers` ranks start the job, up to `max_workers` may be.
  void StartElasticJob(uint32_t workers, uint32_t max_workers, uint32_t min_workers = 0) {
    config_ = TestJobConfig(1, workers, v1::MODE_SYNC, "");
    config_.set_max_workers(max_workers);
    config_.set_min_workers(min_workers);
    absl::StatusOr<v1::ShardMap> map = TestShardMap(config_);
    ASSERT_TRUE(map.ok()) << map.status();
    map_ = *map;
    machine_ = NewMachine();
  }

  // Ten blocks of one step's examples (batch 64) an epoch; three epochs
  // (the test job's default): 30 blocks.
  static constexpr uint64_t kTrainExamples = 64 * 10;

  absl::StatusOr<v1::LeaseExamplesResponse> Lease(
      uint32_t rank, uint64_t incarnation, uint32_t want,
      const std::vector<std::pair<uint64_t, uint64_t>>& trained = {}, uint64_t generation = 0,
      uint64_t train_examples = kTrainExamples) {
    v1::LeaseExamplesRequest request;
    request.set_job_id("test-job");
    request.set_worker_rank(rank);
    request.set_incarnation(incarnation);
    request.set_generation(generation);
    request.set_want(want);
    request.set_train_examples(train_examples);
    for (const auto& [block, step] : trained) {
      v1::TrainedBlock* t = request.add_trained();
      t->set_block(block);
      t->set_step(step);
    }
    return machine_->LeaseExamples(request);
  }

  // The blocks leased to `rank`, expecting the lease to succeed.
  std::vector<uint64_t> Blocks(uint32_t rank, uint64_t incarnation, uint32_t want,
                               const std::vector<std::pair<uint64_t, uint64_t>>& trained = {}) {
    absl::StatusOr<v1::LeaseExamplesResponse> leased = Lease(rank, incarnation, want, trained);
    EXPECT_TRUE(leased.ok()) << leased.status();
    if (!leased.ok()) return {};
    return {leased->blocks().begin(), leased->blocks().end()};
  }

  static v1::WorkerProgress AtStep(uint64_t step) {
    v1::WorkerProgress progress;
    progress.set_step(step);
    return progress;
  }
};

TEST_F(ElasticJobTest, AnElasticJobRunsOnceItsStartingRanksRegisteredNotItsSpareOnes) {
  StartElasticJob(2, 4);
  RegisterAllServers();
  ASSERT_TRUE(RegisterWorker(0).ok());
  EXPECT_EQ(machine_->state(), v1::JOB_STATE_WAITING);
  EXPECT_EQ(Status().message(), "waiting for worker 1 to register");
  absl::StatusOr<v1::RegisterWorkerResponse> last = RegisterWorker(1);
  ASSERT_TRUE(last.ok()) << last.status();
  EXPECT_EQ(machine_->state(), v1::JOB_STATE_RUNNING);
  v1::JobStatus status = Status();
  ASSERT_EQ(status.workers_size(), 4);  // every rank that may join is shown
  EXPECT_EQ(status.workers(3).state(), v1::MEMBER_STATE_UNSPECIFIED);
  EXPECT_EQ(status.worker_joins(), 0u);
  EXPECT_FALSE(status.has_data());  // no worker leased yet
  EXPECT_THAT(Beat(WorkerRequest(1, last->incarnation())).live_workers(), ElementsAre(0u, 1u));
}

TEST_F(ElasticJobTest, ARankJoiningARunningJobEntersTheLiveSetAtItsFirstLease) {
  StartElasticJob(2, 4);
  RegisterAllServers();
  std::vector<v1::RegisterWorkerResponse> w = RegisterAllWorkers();
  v1::HeartbeatResponse reply;
  ASSERT_TRUE(WorkerBeat(0, w[0].incarnation(), AtStep(40), &reply).ok());
  ASSERT_TRUE(WorkerBeat(1, w[1].incarnation(), AtStep(25), &reply).ok());

  absl::StatusOr<v1::RegisterWorkerResponse> joined = RegisterWorker(3);
  ASSERT_TRUE(joined.ok()) << joined.status();
  EXPECT_EQ(joined->rank(), 3u);
  EXPECT_EQ(joined->start_step(), 25u);  // the slowest live rank's step
  EXPECT_EQ(Status().worker_joins(), 1u);
  EXPECT_EQ(Status().workers(3).state(), v1::MEMBER_STATE_ALIVE);
  // Loading its data: alive, but out of the quorum.
  ASSERT_TRUE(WorkerBeat(0, w[0].incarnation(), AtStep(41), &reply).ok());
  EXPECT_THAT(reply.live_workers(), ElementsAre(0u, 1u));
  const uint64_t epoch = reply.membership_epoch();

  ASSERT_FALSE(Blocks(3, joined->incarnation(), 1).empty());
  ASSERT_TRUE(WorkerBeat(0, w[0].incarnation(), AtStep(42), &reply).ok());
  EXPECT_THAT(reply.live_workers(), ElementsAre(0u, 1u, 3u));
  EXPECT_THAT(reply.live_worker_incarnations(),
              ElementsAre(w[0].incarnation(), w[1].incarnation(), joined->incarnation()));
  EXPECT_EQ(reply.membership_epoch(), epoch + 1);
  // Only the first lease makes it ready.
  ASSERT_FALSE(Blocks(3, joined->incarnation(), 1).empty());
  EXPECT_EQ(Status().membership_epoch(), epoch + 1);
  EXPECT_EQ(Status().worker_joins(), 1u);
}

// A joiner counts toward the sync steps' quorum from one step that every
// shard hears before it gets there (ahead of the shards, as a cut is);
// before, each shard counted it from the heartbeat that told it, and a
// shard that heard a step before another waited for a gradient the other
// did without: the joiner trained a step behind there for good.
TEST_F(ElasticJobTest, AJoinerCountsTowardTheSyncQuorumFromAStepAheadOfTheShards) {
  StartElasticJob(2, 3);
  std::vector<v1::RegisterServerResponse> s = RegisterAllServers();
  std::vector<v1::RegisterWorkerResponse> w = RegisterAllWorkers();
  v1::HeartbeatResponse reply = Beat(ServerRequest(0, s[0].incarnation(), 40));
  EXPECT_EQ(reply.live_worker_counts_from_size(), 0);  // the starting ranks count at once
  absl::StatusOr<v1::RegisterWorkerResponse> joined = RegisterWorker(2);
  ASSERT_TRUE(joined.ok()) << joined.status();
  ASSERT_FALSE(Blocks(2, joined->incarnation(), 1).empty());

  reply = Beat(ServerRequest(0, s[0].incarnation(), 41));
  EXPECT_THAT(reply.live_workers(), ElementsAre(0u, 1u, 2u));
  ASSERT_EQ(reply.live_worker_counts_from_size(), 3);
  EXPECT_EQ(reply.live_worker_counts_from(0), 0u);
  EXPECT_EQ(reply.live_worker_counts_from(1), 0u);
  const uint64_t from = reply.live_worker_counts_from(2);
  EXPECT_GE(from, 41u + 4);  // at least the cut's margin ahead
  // Every later reply names the same step.
  EXPECT_EQ(Beat(ServerRequest(0, s[0].incarnation(), 43)).live_worker_counts_from(2), from);
  EXPECT_EQ(Beat(WorkerRequest(2, joined->incarnation())).live_worker_counts_from(2), from);
}

TEST_F(JobStateMachineTest, TheRanksThatStartASyncJobCountFromItsFirstStep) {
  // The servers heartbeat while the job waits; the last rank's registration
  // starts it: no rank that starts the job counts from a later step.
  StartJob(2, 2);
  std::vector<v1::RegisterServerResponse> s = RegisterAllServers();
  Beat(ServerRequest(0, s[0].incarnation(), 0));
  ASSERT_TRUE(RegisterWorker(0).ok());
  Beat(ServerRequest(1, s[1].incarnation(), 0));
  ASSERT_TRUE(RegisterWorker(1).ok());
  ASSERT_EQ(machine_->state(), v1::JOB_STATE_RUNNING);
  for (int beat = 0; beat < 2; ++beat) {
    const v1::HeartbeatResponse reply = Beat(ServerRequest(0, s[0].incarnation(), 0));
    EXPECT_THAT(reply.live_workers(), ElementsAre(0u, 1u));
    EXPECT_EQ(reply.live_worker_counts_from_size(), 0);
  }
}

TEST_F(ElasticJobTest, ARankStillLoadingItsDataDoesNotHoldBackTheNextJoinersStartStep) {
  StartElasticJob(2, 4);
  RegisterAllServers();
  std::vector<v1::RegisterWorkerResponse> w = RegisterAllWorkers();
  v1::HeartbeatResponse reply;
  ASSERT_TRUE(WorkerBeat(0, w[0].incarnation(), AtStep(30), &reply).ok());
  ASSERT_TRUE(WorkerBeat(1, w[1].incarnation(), AtStep(30), &reply).ok());
  absl::StatusOr<v1::RegisterWorkerResponse> first = RegisterWorker(3);
  ASSERT_TRUE(first.ok()) << first.status();
  ASSERT_TRUE(WorkerBeat(3, first->incarnation(), AtStep(0), &reply).ok());
  // Rank 3 reports step 0 but is not live yet: rank 2 starts at 30.
  absl::StatusOr<v1::RegisterWorkerResponse> second = RegisterWorker(2);
  ASSERT_TRUE(second.ok()) << second.status();
  EXPECT_EQ(second->start_step(), 30u);
  EXPECT_EQ(Status().worker_joins(), 2u);
}

TEST_F(ElasticJobTest, ARankRegisteredBeforeTheJobRunsIsNoJoinAndIsLiveAtOnce) {
  StartElasticJob(2, 4);
  RegisterAllServers();
  absl::StatusOr<v1::RegisterWorkerResponse> spare = RegisterWorker(3);
  ASSERT_TRUE(spare.ok()) << spare.status();
  ASSERT_TRUE(RegisterWorker(0).ok());
  absl::StatusOr<v1::RegisterWorkerResponse> last = RegisterWorker(1);
  ASSERT_TRUE(last.ok()) << last.status();
  ASSERT_EQ(machine_->state(), v1::JOB_STATE_RUNNING);
  EXPECT_EQ(Status().worker_joins(), 0u);
  EXPECT_THAT(Beat(WorkerRequest(1, last->incarnation())).live_workers(), ElementsAre(0u, 1u, 3u));
}

TEST_F(ElasticJobTest, LeasesAreCappedByAFairShareOfWhatIsLeftOverTheLiveWorkers) {
  StartElasticJob(2, 4);
  RegisterAllServers();
  std::vector<v1::RegisterWorkerResponse> w = RegisterAllWorkers();
  absl::StatusOr<v1::LeaseExamplesResponse> leased = Lease(0, w[0].incarnation(), 64);
  ASSERT_TRUE(leased.ok()) << leased.status();
  EXPECT_EQ(leased->blocks_size(), 15);  // 30 blocks over 2 live workers
  EXPECT_EQ(leased->blocks_per_epoch(), 10u);
  EXPECT_FALSE(leased->exhausted());
  // A joiner shares what is left with both (it counts itself once ready).
  absl::StatusOr<v1::RegisterWorkerResponse> joined = RegisterWorker(2);
  ASSERT_TRUE(joined.ok()) << joined.status();
  EXPECT_EQ(Blocks(2, joined->incarnation(), 64).size(), 5u);  // 15 over 3
  v1::DataProgress data = Status().data();
  EXPECT_EQ(data.total_blocks(), 30u);
  EXPECT_EQ(data.blocks_per_epoch(), 10u);
  EXPECT_EQ(data.leased(), 20u);
}

TEST_F(ElasticJobTest, LeaseExamplesIsRefusedInAJobThatIsNotElastic) {
  StartJob(1, 2);
  RegisterAllServers();
  std::vector<v1::RegisterWorkerResponse> w = RegisterAllWorkers();
  absl::StatusOr<v1::LeaseExamplesResponse> leased = Lease(0, w[0].incarnation(), 1);
  EXPECT_EQ(leased.status().code(), absl::StatusCode::kFailedPrecondition) << leased.status();
  EXPECT_THAT(leased.status().message(), HasSubstr("not elastic"));
  EXPECT_FALSE(Status().has_data());
}

TEST_F(ElasticJobTest, LeaseExamplesIsRefusedToAnIncarnationThatIsNotLive) {
  StartElasticJob(2, 4);
  RegisterAllServers();
  std::vector<v1::RegisterWorkerResponse> w = RegisterAllWorkers();
  auto code = [&](uint32_t rank, uint64_t incarnation) {
    return Lease(rank, incarnation, 1).status().code();
  };
  EXPECT_EQ(code(0, w[0].incarnation() + 1000), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(code(2, w[0].incarnation()),
            absl::StatusCode::kFailedPrecondition);  // never registered
  EXPECT_EQ(code(9, w[0].incarnation()), absl::StatusCode::kFailedPrecondition);  // out of range
  ASSERT_TRUE(Leave(1, w[1].incarnation(), 3).ok());
  EXPECT_EQ(code(1, w[1].incarnation()), absl::StatusCode::kFailedPrecondition);  // left
  EXPECT_FALSE(Status().has_data()) << "a refused lease sizes nothing";
  // A new incarnation of the rank may; its old one still may not.
  absl::StatusOr<v1::RegisterWorkerResponse> back = RegisterWorker(1);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_TRUE(Lease(1, back->incarnation(), 1).ok());
  EXPECT_EQ(code(1, w[1].incarnation()), absl::StatusCode::kFailedPrecondition);
}

TEST_F(ElasticJobTest, AWorkerWithAnotherTrainingSetIsRefusedItsLease) {
  StartElasticJob(2, 4);
  RegisterAllServers();
  std::vector<v1::RegisterWorkerResponse> w = RegisterAllWorkers();
  ASSERT_TRUE(Lease(0, w[0].incarnation(), 1).ok());
  absl::StatusOr<v1::LeaseExamplesResponse> other =
      Lease(1, w[1].incarnation(), 1, {}, 0, kTrainExamples * 2);
  EXPECT_EQ(other.status().code(), absl::StatusCode::kFailedPrecondition) << other.status();
  EXPECT_EQ(Status().data().leased(), 1u);
  EXPECT_EQ(Status().data().total_blocks(), 30u);
}

TEST_F(ElasticJobTest, AfterARollBackAnOlderGenerationsLeaseIsAbortedAndLaterWorkComesBack) {
  StartElasticJob(2, 4);
  RegisterAllServers();
  std::vector<v1::RegisterWorkerResponse> w = RegisterAllWorkers();
  EXPECT_THAT(Blocks(0, w[0].incarnation(), 3), ElementsAre(0u, 1u, 2u));
  EXPECT_THAT(Blocks(1, w[1].incarnation(), 1), ElementsAre(3u));
  ASSERT_TRUE(Lease(0, w[0].incarnation(), 0, {{0, 1}, {1, 2}}, /*generation=*/1).ok());
  ASSERT_EQ(Status().data().consumed(), 2u);

  // The shard's server restarts: back to the initial values (step 0).
  JobStateMachine::ServerRegistration again = RegisterServer(0, "127.0.0.1:7000");
  ASSERT_TRUE(again.rolled_back);
  ASSERT_EQ(machine_->restore_order().generation(), 2u);
  absl::StatusOr<v1::LeaseExamplesResponse> stale =
      Lease(0, w[0].incarnation(), 1, {{2, 3}}, /*generation=*/1);
  EXPECT_EQ(stale.status().code(), absl::StatusCode::kAborted) << stale.status();
  v1::DataProgress data = Status().data();
  EXPECT_EQ(data.consumed(), 0u);  // trained after the resume step: again
  EXPECT_EQ(data.leased(), 0u);    // the workers drop their leases
  EXPECT_EQ(data.refused_reports(), 0u);
  // Once it follows the restore order, it leases the lowest blocks again.
  EXPECT_THAT(Blocks(0, w[0].incarnation(), 2), ElementsAre(0u, 1u));
  absl::StatusOr<v1::LeaseExamplesResponse> current =
      Lease(1, w[1].incarnation(), 1, {}, /*generation=*/2);
  ASSERT_TRUE(current.ok()) << current.status();
  EXPECT_THAT(current->blocks(), ElementsAre(2u));
}

TEST_F(ElasticJobTest, AWorkerThatLeavesHoldingLeasesHasThemLeasedToTheNextCallerFirst) {
  StartElasticJob(2, 4);
  RegisterAllServers();
  std::vector<v1::RegisterWorkerResponse> w = RegisterAllWorkers();
  EXPECT_THAT(Blocks(0, w[0].incarnation(), 3), ElementsAre(0u, 1u, 2u));
  EXPECT_THAT(Blocks(1, w[1].incarnation(), 2), ElementsAre(3u, 4u));
  ASSERT_TRUE(Lease(0, w[0].incarnation(), 0, {{0, 1}}).ok());

  ASSERT_TRUE(Leave(0, w[0].incarnation(), 1).ok());
  v1::DataProgress data = Status().data();
  EXPECT_EQ(data.returned(), 2u);  // blocks 1 and 2, untrained
  EXPECT_EQ(data.leased(), 2u);
  EXPECT_EQ(data.consumed(), 1u);
  // Rank 1 reports its two and gets the returned ones before any new one.
  EXPECT_THAT(Blocks(1, w[1].incarnation(), 3, {{3, 1}, {4, 2}}), ElementsAre(1u, 2u, 5u));
  data = Status().data();
  EXPECT_EQ(data.consumed(), 3u);
  EXPECT_EQ(data.leased(), 3u);
  EXPECT_EQ(data.refused_reports(), 0u);
}

TEST_F(ElasticJobTest, LeasesComeBackWhenTheirWorkerDiesFinishesOrRegistersAgain) {
  StartElasticJob(3, 4);
  RegisterAllServers();
  std::vector<v1::RegisterWorkerResponse> w = RegisterAllWorkers();
  ASSERT_EQ(Blocks(0, w[0].incarnation(), 2).size(), 2u);
  ASSERT_EQ(Blocks(1, w[1].incarnation(), 3).size(), 3u);
  ASSERT_EQ(Blocks(2, w[2].incarnation(), 4).size(), 4u);

  // Rank 2 registers again, proving it holds its live incarnation.
  v1::RegisterWorkerRequest request;
  request.set_host("worker-host");
  request.set_backend("cpu");
  request.set_requested_rank(2);
  JobStateMachine::Wait wait;
  wait.deadline = absl::Now() + absl::Seconds(10);
  absl::StatusOr<v1::RegisterWorkerResponse> again = machine_->RegisterWorker(
      request, wait, [&](uint64_t incarnation) { return incarnation == w[2].incarnation(); });
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(Status().data().returned(), 4u);
  EXPECT_EQ(Status().data().leased(), 5u);

  // Rank 1 finishes.
  ASSERT_TRUE(Done(1, w[1].incarnation(), 10).ok());
  EXPECT_EQ(Status().data().returned(), 7u);
  EXPECT_EQ(Status().data().leased(), 2u);

  // Rank 0 goes silent past the heartbeat timeout.
  clock_.Advance(absl::Milliseconds(800));
  Beat(WorkerRequest(2, again->incarnation()));
  clock_.Advance(absl::Milliseconds(800));
  machine_->DetectFailures();
  ASSERT_EQ(Status().workers(0).state(), v1::MEMBER_STATE_DEAD);
  v1::DataProgress data = Status().data();
  EXPECT_EQ(data.returned(), 9u);
  EXPECT_EQ(data.leased(), 0u);
  EXPECT_EQ(data.consumed(), 0u);
}

TEST_F(ElasticJobTest, ADrainThatWouldLeaveFewerThanMinWorkersLiveIsRefused) {
  StartElasticJob(2, 4, /*min_workers=*/2);
  RegisterAllServers();
  std::vector<v1::RegisterWorkerResponse> w = RegisterAllWorkers();
  absl::Status refused = machine_->DrainWorker(1);
  EXPECT_EQ(refused.code(), absl::StatusCode::kFailedPrecondition) << refused;
  EXPECT_THAT(refused.message(), HasSubstr("min_workers (2)"));
  EXPECT_FALSE(Beat(WorkerRequest(1, w[1].incarnation())).drain());

  // A joiner counts once it is ready to train.
  absl::StatusOr<v1::RegisterWorkerResponse> joined = RegisterWorker(3);
  ASSERT_TRUE(joined.ok()) << joined.status();
  EXPECT_EQ(machine_->DrainWorker(1).code(), absl::StatusCode::kFailedPrecondition);
  ASSERT_TRUE(Lease(3, joined->incarnation(), 1).ok());
  ASSERT_TRUE(machine_->DrainWorker(1).ok());
  EXPECT_TRUE(Beat(WorkerRequest(1, w[1].incarnation())).drain());
  EXPECT_TRUE(machine_->DrainWorker(1).ok()) << "asking again changes nothing";
  // Rank 1 has not left yet, but it will: draining rank 0 too would leave
  // one live worker.
  EXPECT_EQ(machine_->DrainWorker(0).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_FALSE(Beat(WorkerRequest(0, w[0].incarnation())).drain());
  ASSERT_TRUE(Leave(1, w[1].incarnation(), 5).ok());
  EXPECT_EQ(machine_->DrainWorker(0).code(), absl::StatusCode::kFailedPrecondition);
}

TEST_F(ElasticJobTest, WithoutMinWorkersTheLastLiveWorkerIsNotDrained) {
  StartElasticJob(2, 4);
  RegisterAllServers();
  std::vector<v1::RegisterWorkerResponse> w = RegisterAllWorkers();
  ASSERT_TRUE(machine_->DrainWorker(0).ok());
  EXPECT_EQ(machine_->DrainWorker(1).code(), absl::StatusCode::kFailedPrecondition);
}

TEST_F(ElasticJobTest, ATakenOverJobKeepsItsExampleLedger) {
  StartElasticJob(2, 4);
  RegisterAllServers();
  std::vector<v1::RegisterWorkerResponse> w = RegisterAllWorkers();
  EXPECT_THAT(Blocks(0, w[0].incarnation(), 3), ElementsAre(0u, 1u, 2u));
  EXPECT_THAT(Blocks(1, w[1].incarnation(), 3, {}), ElementsAre(3u, 4u, 5u));
  ASSERT_TRUE(Lease(1, w[1].incarnation(), 0, {{3, 1}, {9, 1}}).ok());  // 9: not its own
  ASSERT_TRUE(Leave(0, w[0].incarnation(), 1).ok());
  const v1::JobStatus before = Status();
  ASSERT_EQ(before.data().returned(), 3u);
  ASSERT_EQ(before.data().refused_reports(), 1u);
  const v1::CoordinatorState state = machine_->ExportState();

  machine_ = NewMachine();
  ASSERT_TRUE(machine_->TakeOver(state, "the state file").ok());
  EXPECT_TRUE(MessageDifferencer::Equals(Status().data(), before.data()))
      << Status().data().DebugString() << " vs " << before.data().DebugString();
  // Rank 1 still holds blocks 4 and 5; the returned ones are leased first.
  // The blocks past the state's last lease are in limbo (the state may have
  // missed leases): none is leased before every live worker claimed.
  EXPECT_THAT(Blocks(1, w[1].incarnation(), 4, {{4, 2}, {5, 3}}), ElementsAre(0u, 1u, 2u));
  v1::DataProgress data = Status().data();
  EXPECT_EQ(data.consumed(), 3u);
  EXPECT_EQ(data.refused_reports(), 1u);
}

TEST_F(ElasticJobTest, AfterATakeOverTheHeartbeatAsksForClaimsAndTheyReleaseTheLimbo) {
  StartElasticJob(2, 4);
  RegisterAllServers();
  std::vector<v1::RegisterWorkerResponse> w = RegisterAllWorkers();
  EXPECT_THAT(Blocks(0, w[0].incarnation(), 2), ElementsAre(0u, 1u));
  EXPECT_THAT(Blocks(1, w[1].incarnation(), 2), ElementsAre(2u, 3u));
  const v1::CoordinatorState state = machine_->ExportState();
  // Unsaved: rank 0 is leased 4 and 5 and trains 4.
  EXPECT_THAT(Blocks(0, w[0].incarnation(), 2), ElementsAre(4u, 5u));

  machine_ = NewMachine();
  ASSERT_TRUE(machine_->TakeOver(state, "the state file").ok());
  EXPECT_TRUE(Beat(WorkerRequest(1, w[1].incarnation())).claim_examples());
  // Rank 1 wants more: nothing is free, the rest is in limbo, held.
  absl::StatusOr<v1::LeaseExamplesResponse> none = Lease(1, w[1].incarnation(), 2, {{2, 0}});
  ASSERT_TRUE(none.ok()) << none.status();
  EXPECT_THAT(none->blocks(), ::testing::IsEmpty());
  EXPECT_FALSE(none->exhausted()) << "more will come once every worker claimed";
  // The claims (as the heartbeat asked): rank 0 trained 4 and holds 5.
  for (uint32_t rank : {0u, 1u}) {
    v1::LeaseExamplesRequest claim;
    claim.set_job_id("test-job");
    claim.set_worker_rank(rank);
    claim.set_incarnation(w[rank].incarnation());
    claim.set_train_examples(kTrainExamples);
    claim.set_claim(true);
    if (rank == 0) {
      v1::TrainedBlock* t = claim.add_trained();
      t->set_block(4);
      t->set_step(2);
      claim.add_held(5);
    }
    ASSERT_TRUE(machine_->LeaseExamples(claim).ok());
  }
  EXPECT_FALSE(Beat(WorkerRequest(1, w[1].incarnation())).claim_examples());
  // 4 and 5 are rank 0's; the others are leased now, lowest first.
  EXPECT_THAT(Blocks(1, w[1].incarnation(), 2), ElementsAre(6u, 7u));
  EXPECT_EQ(Status().data().consumed(), 2u);  // 2 and 4
  EXPECT_EQ(Status().data().refused_reports(), 0u);
}

// ---- Re-sharding (max_servers) ----

class ReshardTest : public JobStateMachineTest {
 protected:
  // `servers` shards start the job, up to `max_servers` may serve it; 1 worker.
  void StartScalableJob(uint32_t servers, uint32_t max_servers) {
    dir_ = TempFolder("reshard");
    config_ = TestJobConfig(servers, 1, v1::MODE_SYNC, dir_);
    config_.set_max_servers(max_servers);
    absl::StatusOr<v1::ShardMap> map = TestShardMap(config_);
    ASSERT_TRUE(map.ok()) << map.status();
    map_ = *map;
    machine_ = NewMachine();
    servers_ = RegisterAllServers();
    workers_ = RegisterAllWorkers();
    ASSERT_EQ(machine_->state(), v1::JOB_STATE_RUNNING);
  }

  // A standby's registration for `shard`, waiting up to `patience`.
  absl::StatusOr<JobStateMachine::ServerRegistration> Standby(uint32_t shard,
                                                              absl::Duration patience) {
    v1::RegisterServerRequest request;
    request.set_address(absl::StrCat("127.0.0.1:", 7000 + shard));
    request.set_requested_shard(static_cast<int32_t>(shard));
    JobStateMachine::Wait wait;
    wait.deadline = absl::Now() + patience;
    return machine_->RegisterServer(request, wait);
  }

  // Every shard of the current map at `version`; the cut's request, once
  // each one's heartbeat carries it. A cut is asked for once every shard
  // has said its version, at the coordinator's next tick (DetectFailures).
  v1::CheckpointRequest CutAskedOf(uint32_t shards, uint64_t version) {
    v1::CheckpointRequest asked;
    for (uint32_t s = 0; s < shards; ++s)
      Beat(ServerRequest(s, servers_[s].incarnation(), version));
    machine_->DetectFailures();
    for (uint32_t s = 0; s < shards; ++s)
      asked = Beat(ServerRequest(s, servers_[s].incarnation(), version)).checkpoint();
    return asked;
  }

  // The shards write the cut (as their old map has it) and the manifest is
  // written.
  void WriteCut(const v1::CheckpointRequest& cut, uint32_t shards) {
    for (uint32_t s = 0; s < shards; ++s) {
      v1::HeartbeatRequest beat = ServerRequest(s, servers_[s].incarnation(), cut.version());
      *beat.mutable_shard()->mutable_checkpoint() = WriteFakeShard(cut, s, cut.version());
      Beat(beat);
    }
    machine_->WriteReadyManifest();
  }

  std::string dir_;
  std::vector<v1::RegisterServerResponse> servers_;
  std::vector<v1::RegisterWorkerResponse> workers_;
};

TEST_F(ReshardTest, ScaleServersNeedsMaxServersAndACountInRange) {
  StartJob(2, 1);
  RegisterAllServers();
  RegisterAllWorkers();
  EXPECT_TRUE(absl::IsFailedPrecondition(machine_->ScaleServers(3).status()));
  StartScalableJob(2, 3);
  EXPECT_TRUE(absl::IsInvalidArgument(machine_->ScaleServers(0).status()));
  EXPECT_TRUE(absl::IsInvalidArgument(machine_->ScaleServers(4).status()));
  absl::StatusOr<v1::ReshardProgress> same = machine_->ScaleServers(2);
  ASSERT_TRUE(same.ok()) << same.status();
  EXPECT_EQ(same->target_servers(), 0u);  // nothing to do
}

TEST_F(ReshardTest, AStandbyWaitsUntilTheJobScalesAndAShardPastMaxServersIsRefused) {
  StartScalableJob(2, 3);
  absl::StatusOr<JobStateMachine::ServerRegistration> early = Standby(2, absl::Milliseconds(400));
  ASSERT_TRUE(absl::IsUnavailable(early.status())) << early.status();
  EXPECT_THAT(early.status().message(), HasSubstr("standby:"));
  EXPECT_THAT(early.status().message(), HasSubstr("grpsctl scale --servers 3"));
  EXPECT_TRUE(absl::IsInvalidArgument(Standby(3, absl::Milliseconds(400)).status()));
  // The job did not change.
  EXPECT_EQ(Status().config().num_servers(), 2u);
}

TEST_F(ReshardTest, ScalingUpCutsACheckpointThenPublishesTheMapWithARollBackToTheCut) {
  StartScalableJob(2, 3);
  const uint64_t epoch = Status().map_epoch();
  absl::StatusOr<v1::ReshardProgress> asked = machine_->ScaleServers(3);
  ASSERT_TRUE(asked.ok()) << asked.status();
  EXPECT_EQ(asked->target_servers(), 3u);
  EXPECT_EQ(asked->phase(), "waiting for a server of shard 2 to register");

  absl::StatusOr<JobStateMachine::ServerRegistration> taken_in;
  std::thread standby([&] { taken_in = Standby(2, absl::Seconds(20)); });
  // The standby's arrival cuts the checkpoint.
  v1::CheckpointRequest cut;
  for (int i = 0; i < 200 && cut.id() == 0; ++i) {
    cut = CutAskedOf(2, 10);
    if (cut.id() == 0) absl::SleepFor(absl::Milliseconds(10));
  }
  ASSERT_GT(cut.id(), 0u);
  EXPECT_EQ(Status().reshard().phase(), absl::StrCat("cutting at checkpoint ", cut.id()));
  EXPECT_EQ(Status().config().num_servers(), 2u);  // not before the cut is written

  WriteCut(cut, 2);
  standby.join();
  ASSERT_TRUE(taken_in.ok()) << taken_in.status();
  const v1::RegisterServerResponse& joined = taken_in->response;
  EXPECT_EQ(joined.shard(), 2u);
  EXPECT_EQ(joined.shard_map().shards_size(), 3);
  EXPECT_EQ(joined.config().num_servers(), 3u);
  EXPECT_EQ(joined.restore().checkpoint_id(), cut.id());
  EXPECT_EQ(joined.restore().generation(), 2u);
  EXPECT_EQ(joined.shard_map().chunks_size(), map_.chunks_size());  // the same chunks

  // A kept shard hears the new map and the roll-back in one reply.
  v1::HeartbeatRequest server = ServerRequest(0, servers_[0].incarnation(), 12, 1);
  server.set_shard_map_epoch(epoch);
  const v1::HeartbeatResponse kept = Beat(server);
  EXPECT_EQ(kept.restore().generation(), 2u);
  EXPECT_EQ(kept.restore().checkpoint_id(), cut.id());
  EXPECT_EQ(kept.shard_map().shards_size(), 3);
  // So does a worker, back to its step at the cut.
  v1::HeartbeatRequest worker = WorkerRequest(0, workers_[0].incarnation(), 1);
  worker.set_shard_map_epoch(epoch);
  const v1::HeartbeatResponse heard = Beat(worker);
  EXPECT_EQ(heard.restore().generation(), 2u);
  EXPECT_EQ(heard.shard_map().epoch(), epoch + 1);

  const v1::JobStatus status = Status();
  EXPECT_EQ(status.config().num_servers(), 3u);
  EXPECT_EQ(status.shards_size(), 3);
  EXPECT_EQ(status.map_epoch(), epoch + 1);
  EXPECT_EQ(status.reshard().target_servers(), 0u);
  EXPECT_EQ(status.reshard().completed(), 1u);
  EXPECT_EQ(status.reshard().last_from(), 2u);
  EXPECT_EQ(status.reshard().last_to(), 3u);
  EXPECT_EQ(status.reshard().last_step(), cut.version());
}

TEST_F(ReshardTest, ScalingDownRetiresTheShardsPastTheNewCount) {
  StartScalableJob(2, 2);
  ASSERT_TRUE(machine_->ScaleServers(1).ok());
  const v1::CheckpointRequest cut = CutAskedOf(2, 10);
  ASSERT_GT(cut.id(), 0u);
  WriteCut(cut, 2);
  EXPECT_EQ(Status().config().num_servers(), 1u);
  // Shard 1's server is told, by the map, that the job has one shard.
  v1::HeartbeatRequest retiring = ServerRequest(1, servers_[1].incarnation(), 12, 1);
  retiring.set_shard_map_epoch(0);
  v1::HeartbeatResponse retired;
  ASSERT_TRUE(Beat(retiring, &retired).ok());
  EXPECT_EQ(retired.shard_map().shards_size(), 1);
  // The next checkpoint needs shard 0 alone.
  absl::StatusOr<v1::CheckpointSummary> next = machine_->CheckpointJob(false, {});
  ASSERT_TRUE(next.ok()) << next.status();
  const v1::CheckpointRequest again =
      Beat(ServerRequest(0, servers_[0].incarnation(), 20, 2)).checkpoint();
  ASSERT_EQ(again.id(), next->id());
  v1::HeartbeatRequest beat = ServerRequest(0, servers_[0].incarnation(), again.version(), 2);
  *beat.mutable_shard()->mutable_checkpoint() = WriteFakeShard(again, 0, again.version());
  Beat(beat);
  machine_->WriteReadyManifest();
  EXPECT_EQ(Status().last_checkpoint().id(), again.id());
}

TEST_F(ReshardTest, AskedBackToTheCountItHasWhileTheCutIsTakenItDoesNotRollBack) {
  StartScalableJob(2, 2);
  ASSERT_TRUE(machine_->ScaleServers(1).ok());
  const v1::CheckpointRequest cut = CutAskedOf(2, 10);
  ASSERT_GT(cut.id(), 0u);
  ASSERT_TRUE(machine_->ScaleServers(2).ok());
  WriteCut(cut, 2);
  const v1::JobStatus status = Status();
  EXPECT_EQ(status.config().num_servers(), 2u);
  EXPECT_EQ(status.generation(), 1u);  // no roll-back
  EXPECT_EQ(status.reshard().target_servers(), 0u);
  EXPECT_EQ(status.reshard().completed(), 0u);
  EXPECT_EQ(status.last_checkpoint().id(), cut.id());  // a checkpoint all the same
}

TEST_F(ReshardTest, AFailedCutIsCutAgain) {
  StartScalableJob(2, 2);
  ASSERT_TRUE(machine_->ScaleServers(1).ok());
  const v1::CheckpointRequest cut = CutAskedOf(2, 10);
  ASSERT_GT(cut.id(), 0u);
  v1::HeartbeatRequest failed = ServerRequest(0, servers_[0].incarnation(), 10);
  v1::ShardCheckpoint* report = failed.mutable_shard()->mutable_checkpoint();
  report->set_id(cut.id());
  report->set_shard(0);
  report->set_state(v1::CHECKPOINT_STATE_FAILED);
  report->set_error("disk full");
  report->set_coordinator_incarnation(cut.coordinator_incarnation());
  Beat(failed);
  machine_->DetectFailures();
  const v1::CheckpointRequest again = CutAskedOf(2, 11);
  EXPECT_GT(again.id(), cut.id());
  EXPECT_EQ(Status().reshard().phase(), absl::StrCat("cutting at checkpoint ", again.id()));
}

TEST_F(ReshardTest, ACoordinatorThatTakesOverKeepsTheNewShardCountAndTheAskedOne) {
  StartScalableJob(2, 3);
  ASSERT_TRUE(machine_->ScaleServers(1).ok());
  WriteCut(CutAskedOf(2, 10), 2);
  ASSERT_TRUE(machine_->ScaleServers(3).ok());  // waits for standbys
  const v1::CoordinatorState state = machine_->ExportState();
  EXPECT_EQ(state.shards_size(), 1);
  EXPECT_EQ(state.reshard_target(), 3u);

  machine_ = NewMachine();
  ASSERT_TRUE(machine_->TakeOver(state, "state file").ok());
  const v1::JobStatus status = Status();
  EXPECT_EQ(status.config().num_servers(), 1u);
  EXPECT_EQ(status.shards_size(), 1);
  EXPECT_EQ(status.shards(0).address(), "127.0.0.1:7000");
  EXPECT_EQ(status.reshard().target_servers(), 3u);
  EXPECT_EQ(status.reshard().completed(), 1u);
  EXPECT_EQ(machine_->shard_map().shards_size(), 1);
}

}  // namespace
}  // namespace grps
