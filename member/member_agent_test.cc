// MemberAgent against a real CoordinatorService in this process, over real
// gRPC on 127.0.0.1, with the coordinator's and the agent's clock driven by
// the test: register, heartbeat, lose the coordinator and hear a new one,
// be declared dead and come back, wait for a rank whose old incarnation
// still lives.
#include "member/member_agent.h"

#include <atomic>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "coordinator/coordinator_service.h"
#include "coordinator/testing/fake_clock.h"
#include "daemon/daemon.h"
#include "gtest/gtest.h"
#include "job/job_config.h"
#include "job/shard_map.h"

namespace grps {
namespace {

constexpr absl::Duration kInterval = absl::Milliseconds(20);

class MemberAgentTest : public ::testing::Test {
 protected:
  void SetUp() override {
    config_ = DefaultJobConfig();
    config_.set_job_id("member-job");
    config_.set_num_servers(1);
    config_.set_num_workers(2);
    config_.set_heartbeat_interval_ms(20);
    config_.set_heartbeat_timeout_ms(1000);
    ASSERT_TRUE(ValidateJobConfig(config_).ok());
    absl::StatusOr<v1::ShardMap> map =
        BuildShardMap(ModelTensors(config_), 1, config_.chunk_bytes());
    ASSERT_TRUE(map.ok());
    map_ = *map;
    Serve("127.0.0.1:0");
  }
  void TearDown() override { StopServing(); }

  // A coordinator on `address` (port 0: any), new and knowing nobody.
  void Serve(const std::string& address) {
    service_ = std::make_unique<CoordinatorService>(config_, map_,
                                                    [this] { return clock_.Now(); });
    absl::StatusOr<GrpcServer> server = StartGrpcServer(address, {service_.get()});
    // A port given back a moment ago may be another connection's ephemeral
    // port for a moment (the range is shared).
    for (int tries = 0; !server.ok() && tries < 50; ++tries) {
      absl::SleepFor(absl::Milliseconds(100));
      server = StartGrpcServer(address, {service_.get()});
    }
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = std::move(*server);
    address_ = absl::StrCat("127.0.0.1:", server_.port);
    if (stub_ == nullptr) stub_ = v1::Coordinator::NewStub(MakeChannel(address_));
  }
  void StopServing() {
    if (service_ != nullptr) service_->Shutdown();
    if (server_.server != nullptr) server_.server->Shutdown();
    server_ = GrpcServer();
  }

  RegisterOptions Patience(absl::Duration patience) {
    RegisterOptions options;
    options.patience = patience;
    options.attempt_timeout = absl::Milliseconds(300);
    options.max_backoff = absl::Milliseconds(100);
    return options;
  }
  absl::StatusOr<v1::RegisterServerResponse> Server() {
    v1::RegisterServerRequest request;
    request.set_address("127.0.0.1:7000");
    return RegisterServer(stub_.get(), request, Patience(absl::Seconds(5)));
  }
  absl::StatusOr<v1::RegisterWorkerResponse> Worker(int32_t rank,
                                                    absl::Duration patience = absl::Seconds(5)) {
    v1::RegisterWorkerRequest request;
    request.set_requested_rank(rank);
    request.set_host("h");
    request.set_backend("cpu");
    return RegisterWorker(stub_.get(), request, Patience(patience));
  }
  std::unique_ptr<MemberAgent> AgentOf(const v1::RegisterWorkerResponse& r) {
    return std::make_unique<MemberAgent>(
        stub_.get(),
        MemberAgent::Identity{"member-job", MemberKind::kWorker, r.rank(), r.incarnation()},
        kInterval, absl::Seconds(1), [this] { return clock_.Now(); });
  }
  v1::WorkerStatus StatusOf(uint32_t rank) { return service_->Status().workers(rank); }

  // Waits (real time, bounded) until `done`.
  static bool Eventually(const std::function<bool()>& done) {
    const absl::Time give_up = absl::Now() + absl::Seconds(10);
    while (!done()) {
      if (absl::Now() > give_up) return false;
      absl::SleepFor(absl::Milliseconds(5));
    }
    return true;
  }

  FakeClock clock_;
  v1::JobConfig config_;
  v1::ShardMap map_;
  std::unique_ptr<CoordinatorService> service_;
  GrpcServer server_;
  std::string address_;
  std::unique_ptr<v1::Coordinator::Stub> stub_;
};

// Every heartbeat says what the holder fills in; a reply reaches on_reply.
MemberAgent::Handlers Reporting(std::atomic<uint64_t>* step, std::atomic<int>* replies,
                                std::atomic<int>* errors) {
  MemberAgent::Handlers handlers;
  handlers.fill = [step](v1::HeartbeatRequest* request) {
    request->mutable_progress()->set_step(step->load());
  };
  handlers.on_reply = [replies](const v1::HeartbeatResponse&) {
    ++*replies;
    return MemberAgent::Next::kGoOn;
  };
  handlers.on_error = [errors](const grpc::Status&) {
    ++*errors;
    return MemberAgent::Next::kGoOn;
  };
  return handlers;
}

TEST_F(MemberAgentTest, AWorkerRegistersOnceTheShardsHaveAndThenHeartbeats) {
  // The worker's registration waits while the shard is missing (its
  // attempts outlive their deadline and are retried), then gets its rank.
  absl::StatusOr<v1::RegisterWorkerResponse> worker;
  std::thread registering([&] { worker = Worker(1); });
  absl::SleepFor(absl::Milliseconds(500));
  ASSERT_TRUE(Server().ok());
  registering.join();
  ASSERT_TRUE(worker.ok()) << worker.status();
  EXPECT_EQ(worker->rank(), 1u);

  std::atomic<uint64_t> step{41};
  std::atomic<int> replies{0}, errors{0};
  std::unique_ptr<MemberAgent> agent = AgentOf(*worker);
  agent->Start(Reporting(&step, &replies, &errors));
  ASSERT_TRUE(Eventually([&] { return StatusOf(1).progress().step() == 41; }));
  step = 42;
  ASSERT_TRUE(Eventually([&] { return StatusOf(1).progress().step() == 42; }));
  EXPECT_EQ(errors.load(), 0);
  EXPECT_EQ(agent->Silence(), absl::ZeroDuration());  // the clock stood still
  agent->Stop();
  const int after_stop = replies.load();
  absl::SleepFor(kInterval * 5);
  EXPECT_EQ(replies.load(), after_stop);
}

TEST_F(MemberAgentTest, AWorkerDeclaredDeadComesBackWithItsNextHeartbeat) {
  ASSERT_TRUE(Server().ok());
  absl::StatusOr<v1::RegisterWorkerResponse> worker = Worker(0);
  ASSERT_TRUE(worker.ok());
  // What the agent's thread writes outlives the agent (declared first).
  std::atomic<uint64_t> step{7};
  std::atomic<int> replies{0}, errors{0};
  std::unique_ptr<MemberAgent> agent = AgentOf(*worker);
  // Silent past the timeout (the process was stopped, say): dead.
  clock_.Advance(absl::Seconds(2));
  service_->DetectFailures();
  EXPECT_EQ(StatusOf(0).state(), v1::MEMBER_STATE_DEAD);
  EXPECT_EQ(agent->Silence(), absl::Seconds(2));
  // Its heartbeats resume: alive again, and the silence ends.
  agent->Start(Reporting(&step, &replies, &errors));
  ASSERT_TRUE(Eventually([&] { return StatusOf(0).state() == v1::MEMBER_STATE_ALIVE; }));
  ASSERT_TRUE(Eventually([&] { return agent->Silence() == absl::ZeroDuration(); }));
}

TEST_F(MemberAgentTest, LosesTheCoordinatorCountsTheSilenceAndFollowsANewOne) {
  ASSERT_TRUE(Server().ok());
  absl::StatusOr<v1::RegisterWorkerResponse> worker = Worker(0);
  ASSERT_TRUE(worker.ok());
  std::atomic<uint64_t> step{3};
  std::atomic<int> replies{0}, errors{0};
  std::unique_ptr<MemberAgent> agent = AgentOf(*worker);
  agent->Start(Reporting(&step, &replies, &errors));
  ASSERT_TRUE(Eventually([&] { return replies.load() > 0; }));

  const int port = server_.port;
  StopServing();
  ASSERT_TRUE(Eventually([&] { return errors.load() > 2; }));
  clock_.Advance(absl::Seconds(30));
  EXPECT_GE(agent->Silence(), absl::Seconds(30));

  // A new coordinator on the same address learns of the worker from its
  // heartbeats (it adopts the incarnation), and the silence ends.
  Serve(absl::StrCat("127.0.0.1:", port));
  ASSERT_TRUE(Eventually([&] { return agent->Silence() == absl::ZeroDuration(); }));
  ASSERT_TRUE(Eventually([&] {
    const v1::WorkerStatus w = StatusOf(0);
    return w.state() == v1::MEMBER_STATE_ALIVE && w.incarnation() == worker->incarnation();
  }));
}

TEST_F(MemberAgentTest, ARestartedWorkerWaitsUntilItsOldIncarnationIsDeclaredDead) {
  ASSERT_TRUE(Server().ok());
  absl::StatusOr<v1::RegisterWorkerResponse> old = Worker(1);
  ASSERT_TRUE(old.ok());
  absl::StatusOr<v1::RegisterWorkerResponse> fresh;
  std::atomic<bool> done{false};
  std::thread restarted([&] {
    fresh = Worker(1);
    done = true;
  });
  absl::SleepFor(absl::Milliseconds(300));
  EXPECT_FALSE(done.load());  // refused (ALREADY_EXISTS) and retried
  clock_.Advance(absl::Seconds(2));
  service_->DetectFailures();
  restarted.join();
  ASSERT_TRUE(fresh.ok()) << fresh.status();
  EXPECT_EQ(fresh->rank(), 1u);
  EXPECT_GT(fresh->incarnation(), old->incarnation());
}

TEST_F(MemberAgentTest, ARegistrationGivesUpAfterItsPatience) {
  // No shard ever registers: the worker's attempts keep running out.
  const absl::Time start = absl::Now();
  absl::StatusOr<v1::RegisterWorkerResponse> worker = Worker(0, absl::Seconds(1));
  EXPECT_EQ(worker.status().code(), absl::StatusCode::kUnavailable);
  // It says it was not registered, not that the coordinator (which held
  // the registration) was unreachable.
  EXPECT_NE(worker.status().message().find("not registered within 1s; last: no answer"),
            std::string::npos)
      << worker.status();
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
}

TEST_F(MemberAgentTest, StopCancelsAHeartbeatWaitingForAGoneCoordinator) {
  // A coordinator that has exited (the end of a job): the next heartbeat
  // waits for it to listen again, up to its deadline (30 s here). Stop
  // ends that wait, so that the member's exit does not.
  ASSERT_TRUE(Server().ok());
  absl::StatusOr<v1::RegisterWorkerResponse> worker = Worker(0);
  ASSERT_TRUE(worker.ok());
  MemberAgent agent(stub_.get(),
                    MemberAgent::Identity{"member-job", MemberKind::kWorker, worker->rank(),
                                          worker->incarnation()},
                    kInterval, absl::Seconds(30), [this] { return clock_.Now(); });
  std::atomic<uint64_t> step{1};
  std::atomic<int> replies{0}, errors{0};
  agent.Start(Reporting(&step, &replies, &errors));
  ASSERT_TRUE(Eventually([&] { return replies.load() > 0; }));
  StopServing();
  absl::SleepFor(kInterval * 10);  // the next heartbeat is in flight
  const absl::Time start = absl::Now();
  agent.Stop();
  EXPECT_LT(absl::Now() - start, absl::Seconds(2));
  EXPECT_EQ(errors.load(), 0);  // a cancelled heartbeat is no error to report
}

TEST_F(MemberAgentTest, RunEndsWhenAHandlerSaysStop) {
  ASSERT_TRUE(Server().ok());
  absl::StatusOr<v1::RegisterWorkerResponse> worker = Worker(0);
  ASSERT_TRUE(worker.ok());
  std::unique_ptr<MemberAgent> agent = AgentOf(*worker);
  int replies = 0;
  MemberAgent::Handlers handlers;
  handlers.on_reply = [&](const v1::HeartbeatResponse& reply) {
    EXPECT_EQ(reply.job_state(), v1::JOB_STATE_WAITING);  // rank 1 never came
    return ++replies == 3 ? MemberAgent::Next::kStop : MemberAgent::Next::kGoOn;
  };
  handlers.on_error = [](const grpc::Status& status) {
    ADD_FAILURE() << status.error_message();
    return MemberAgent::Next::kStop;
  };
  agent->Run(handlers);
  EXPECT_EQ(replies, 3);
}

TEST_F(MemberAgentTest, WorkerDoneNamesTheMember) {
  ASSERT_TRUE(Server().ok());
  absl::StatusOr<v1::RegisterWorkerResponse> w0 = Worker(0);
  absl::StatusOr<v1::RegisterWorkerResponse> w1 = Worker(1);
  ASSERT_TRUE(w0.ok() && w1.ok());
  std::unique_ptr<MemberAgent> agent = AgentOf(*w1);
  v1::WorkerDoneRequest done;
  done.mutable_progress()->set_step(5);
  v1::WorkerDoneResponse reply;
  const grpc::Status status = agent->WorkerDone(done, &reply, absl::Seconds(5));
  ASSERT_TRUE(status.ok()) << status.error_message();
  EXPECT_EQ(StatusOf(1).state(), v1::MEMBER_STATE_FINISHED);
  EXPECT_EQ(StatusOf(0).state(), v1::MEMBER_STATE_ALIVE);
}

// Answers every heartbeat after moving the test's clock on: the answer
// arrives later than the call was sent.
class SlowAnswerCoordinator final : public v1::Coordinator::Service {
 public:
  SlowAnswerCoordinator(FakeClock* clock, absl::Duration delay) : clock_(clock), delay_(delay) {}
  grpc::Status Heartbeat(grpc::ServerContext*, const v1::HeartbeatRequest*,
                         v1::HeartbeatResponse*) override {
    clock_->Advance(delay_);
    return grpc::Status::OK;
  }

 private:
  FakeClock* const clock_;
  const absl::Duration delay_;
};

TEST(MemberAgentSilenceTest, CountsFromWhenTheAnsweredHeartbeatWasSent) {
  FakeClock clock;
  SlowAnswerCoordinator coordinator(&clock, absl::Seconds(3));
  absl::StatusOr<GrpcServer> server = StartGrpcServer("127.0.0.1:0", {&coordinator});
  ASSERT_TRUE(server.ok()) << server.status();
  std::unique_ptr<v1::Coordinator::Stub> stub =
      v1::Coordinator::NewStub(MakeChannel(absl::StrCat("127.0.0.1:", server->port)));
  MemberAgent agent(stub.get(), MemberAgent::Identity{"member-job", MemberKind::kServer, 0, 1},
                    kInterval, absl::Seconds(5), [&clock] { return clock.Now(); });
  clock.Advance(absl::Seconds(1));

  v1::HeartbeatResponse reply;
  const grpc::Status status = agent.Beat(v1::HeartbeatRequest(), &reply);
  ASSERT_TRUE(status.ok()) << status.error_message();
  // Answered, but sent 3 s ago: a late answer does not hide the wait (nor,
  // arriving after the coordinator went quiet, shorten the quiet).
  EXPECT_EQ(agent.Silence(), absl::Seconds(3));
  server->server->Shutdown();
}

// Answers every server registration as the coordinator answers a standby
// (a shard its map does not have yet), holding each call a moment, until
// `taken_in`.
class StandbyCoordinator final : public v1::Coordinator::Service {
 public:
  grpc::Status RegisterServer(grpc::ServerContext*, const v1::RegisterServerRequest*,
                              v1::RegisterServerResponse* response) override {
    absl::SleepFor(absl::Milliseconds(50));
    if (!taken_in.load()) {
      ++standby_answers;
      return grpc::Status(grpc::StatusCode::UNAVAILABLE,
                          "standby: shard 1 waits for the job to re-shard");
    }
    response->set_shard(1);
    return grpc::Status::OK;
  }

  std::atomic<bool> taken_in{false};
  std::atomic<int> standby_answers{0};
};

class StandbyTest : public ::testing::Test {
 protected:
  void SetUp() override {
    absl::StatusOr<GrpcServer> server = StartGrpcServer("127.0.0.1:0", {&coordinator_});
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = std::move(*server);
    stub_ = v1::Coordinator::NewStub(MakeChannel(absl::StrCat("127.0.0.1:", server_.port)));
  }
  void TearDown() override { server_.server->Shutdown(); }

  absl::StatusOr<v1::RegisterServerResponse> Register(const RegisterOptions& options) {
    v1::RegisterServerRequest request;
    request.set_address("127.0.0.1:7001");
    request.set_requested_shard(1);
    return RegisterServer(stub_.get(), request, options);
  }
  static RegisterOptions Patience(absl::Duration patience) {
    RegisterOptions options;
    options.patience = patience;
    options.attempt_timeout = absl::Milliseconds(300);
    options.max_backoff = absl::Milliseconds(100);
    return options;
  }

  StandbyCoordinator coordinator_;
  GrpcServer server_;
  std::unique_ptr<v1::Coordinator::Stub> stub_;
};

TEST_F(StandbyTest, AStandbyWaitsPastItsPatienceUntilItsShardIsTakenIn) {
  RegisterOptions options = Patience(absl::Milliseconds(300));
  std::vector<std::string> said;
  options.on_standby = [&said](const absl::Status& standby) {
    said.emplace_back(standby.message());
  };
  std::thread take_in([this] {
    absl::SleepFor(absl::Milliseconds(2500));
    coordinator_.taken_in = true;
  });
  absl::StatusOr<v1::RegisterServerResponse> registered = Register(options);
  take_in.join();
  ASSERT_TRUE(registered.ok()) << registered.status();
  EXPECT_EQ(registered->shard(), 1u);
  EXPECT_GE(coordinator_.standby_answers.load(), 2);
  ASSERT_EQ(said.size(), 1u);  // once, however long it stands by
  EXPECT_EQ(said[0], "standby: shard 1 waits for the job to re-shard");
}

TEST_F(StandbyTest, WithoutOnStandbyAStandbyAnswerCountsAgainstPatience) {
  const absl::Time start = absl::Now();
  absl::StatusOr<v1::RegisterServerResponse> registered =
      Register(Patience(absl::Milliseconds(300)));
  EXPECT_EQ(registered.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_NE(registered.status().message().find("standby:"), std::string::npos)
      << registered.status();
  EXPECT_LT(absl::Now() - start, absl::Seconds(2));
}

}  // namespace
}  // namespace grps
