#include "client/job_client.h"

#include <sys/socket.h>
#include <netinet/in.h>
#include <unistd.h>

#include <algorithm>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "daemon/daemon.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace grps {
namespace {

using ::testing::HasSubstr;

// A coordinator that serves canned answers: GetJobStatus returns `status`,
// WatchJobStatus streams `stream` (then repeats its last entry until the
// client leaves), StopJob records the reason.
class FakeCoordinator final : public v1::Coordinator::Service {
 public:
  grpc::Status GetJobStatus(grpc::ServerContext*, const v1::GetJobStatusRequest*,
                            v1::JobStatus* reply) override {
    absl::MutexLock lock(&mu_);
    *reply = status_;
    return grpc::Status::OK;
  }

  grpc::Status WatchJobStatus(grpc::ServerContext* context,
                              const v1::WatchJobStatusRequest* request,
                              grpc::ServerWriter<v1::JobStatus>* writer) override {
    std::vector<v1::JobStatus> stream;
    {
      absl::MutexLock lock(&mu_);
      stream = stream_;
      watch_interval_ms_ = request->interval_ms();
    }
    for (size_t i = 0; !context->IsCancelled(); ++i) {
      if (!writer->Write(stream[std::min(i, stream.size() - 1)])) break;
      absl::SleepFor(absl::Milliseconds(request->interval_ms()));
    }
    return grpc::Status::OK;
  }

  grpc::Status GetShardMap(grpc::ServerContext*, const v1::GetShardMapRequest*,
                           v1::ShardMap* reply) override {
    reply->set_epoch(7);
    reply->add_shards()->set_address("127.0.0.1:1234");
    return grpc::Status::OK;
  }

  grpc::Status StopJob(grpc::ServerContext*, const v1::StopJobRequest* request,
                       v1::StopJobResponse*) override {
    absl::MutexLock lock(&mu_);
    stop_reason_ = request->reason();
    return grpc::Status::OK;
  }

  // Without a checkpoint_dir (the default) FAILED_PRECONDITION; else a
  // complete checkpoint 3 when asked to wait, a pending one otherwise.
  grpc::Status CheckpointJob(grpc::ServerContext*,
                             const v1::CheckpointJobRequest* request,
                             v1::CheckpointJobResponse* reply) override {
    absl::MutexLock lock(&mu_);
    if (!checkpoints_)
      return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION,
                          "job has no checkpoint_dir");
    reply->mutable_checkpoint()->set_id(3);
    reply->mutable_checkpoint()->set_state(request->wait()
                                               ? v1::CHECKPOINT_STATE_COMPLETE
                                               : v1::CHECKPOINT_STATE_PENDING);
    return grpc::Status::OK;
  }
  void EnableCheckpoints() {
    absl::MutexLock lock(&mu_);
    checkpoints_ = true;
  }

  void SetStatus(v1::JobStatus s) {
    absl::MutexLock lock(&mu_);
    status_ = std::move(s);
  }
  void SetStream(std::vector<v1::JobStatus> s) {
    absl::MutexLock lock(&mu_);
    stream_ = std::move(s);
  }
  std::string stop_reason() {
    absl::MutexLock lock(&mu_);
    return stop_reason_;
  }
  uint32_t watch_interval_ms() {
    absl::MutexLock lock(&mu_);
    return watch_interval_ms_;
  }

 private:
  absl::Mutex mu_;
  v1::JobStatus status_ ABSL_GUARDED_BY(mu_);
  std::vector<v1::JobStatus> stream_ ABSL_GUARDED_BY(mu_);
  std::string stop_reason_ ABSL_GUARDED_BY(mu_);
  uint32_t watch_interval_ms_ ABSL_GUARDED_BY(mu_) = 0;
  bool checkpoints_ ABSL_GUARDED_BY(mu_) = false;
};

v1::JobStatus WithState(v1::JobState state, uint64_t step) {
  v1::JobStatus s;
  s.set_job_id("job-under-test");
  s.set_state(state);
  s.set_global_step(step);
  return s;
}

class JobClientTest : public ::testing::Test {
 protected:
  void SetUp() override {
    absl::StatusOr<GrpcServer> server = StartGrpcServer("127.0.0.1:0", {&fake_});
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = std::move(*server);
    target_ = absl::StrCat("127.0.0.1:", server_.port);
  }
  void TearDown() override {
    if (server_.server) server_.server->Shutdown(absl::ToChronoTime(absl::Now()));
  }

  FakeCoordinator fake_;
  GrpcServer server_;
  std::string target_;
};

TEST_F(JobClientTest, GetStatusReturnsTheCoordinatorsSnapshot) {
  fake_.SetStatus(WithState(v1::JOB_STATE_RUNNING, 42));
  JobClient client(target_);
  absl::StatusOr<v1::JobStatus> status = client.GetStatus();
  ASSERT_TRUE(status.ok()) << status.status();
  EXPECT_EQ(status->job_id(), "job-under-test");
  EXPECT_EQ(status->global_step(), 42u);
}

TEST_F(JobClientTest, WatchDeliversSnapshotsUntilOneShowsTheJobEnded) {
  fake_.SetStream({WithState(v1::JOB_STATE_RUNNING, 1),
                   WithState(v1::JOB_STATE_RUNNING, 2),
                   WithState(v1::JOB_STATE_COMPLETED, 3)});
  JobClient client(target_);
  std::vector<uint64_t> steps;
  absl::Status s = client.Watch(absl::Milliseconds(20), [&](const v1::JobStatus& st) {
    steps.push_back(st.global_step());
    return true;
  });
  EXPECT_TRUE(s.ok()) << s;
  EXPECT_EQ(steps, (std::vector<uint64_t>{1, 2, 3}));
  EXPECT_EQ(fake_.watch_interval_ms(), 20u);
}

TEST_F(JobClientTest, WatchStopsWhenTheCallbackReturnsFalse) {
  fake_.SetStream({WithState(v1::JOB_STATE_RUNNING, 1)});  // never ends
  JobClient client(target_);
  int calls = 0;
  absl::Status s = client.Watch(absl::Milliseconds(10), [&](const v1::JobStatus&) {
    return ++calls < 3;
  });
  EXPECT_TRUE(s.ok()) << s;
  EXPECT_EQ(calls, 3);
}

TEST_F(JobClientTest, WatchReportsACoordinatorThatGoesAwayMidStream) {
  fake_.SetStream({WithState(v1::JOB_STATE_RUNNING, 1)});
  JobClient client(target_);
  int calls = 0;
  absl::Status s = client.Watch(absl::Milliseconds(10), [&](const v1::JobStatus&) {
    if (++calls == 2) {
      server_.server->Shutdown(absl::ToChronoTime(absl::Now()));
    }
    return true;
  });
  EXPECT_FALSE(s.ok());
  EXPECT_THAT(std::string(s.message()), HasSubstr(target_));
  EXPECT_GE(calls, 2);
}

TEST_F(JobClientTest, GetShardMapReturnsTheMap) {
  JobClient client(target_);
  absl::StatusOr<v1::ShardMap> map = client.GetShardMap();
  ASSERT_TRUE(map.ok()) << map.status();
  EXPECT_EQ(map->epoch(), 7u);
  EXPECT_EQ(map->shards(0).address(), "127.0.0.1:1234");
}

TEST_F(JobClientTest, StopCarriesTheReason) {
  JobClient client(target_);
  ASSERT_TRUE(client.Stop("operator says so").ok());
  EXPECT_EQ(fake_.stop_reason(), "operator says so");
}

// A loopback port with nothing listening on it.
int UnusedPort() {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr = {};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
  socklen_t len = sizeof(addr);
  getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  close(fd);
  return ntohs(addr.sin_port);
}

TEST_F(JobClientTest, CheckpointWaitsWhenAskedAndReportsAJobWithoutCheckpoints) {
  JobClient client(target_);
  absl::StatusOr<v1::CheckpointSummary> c = client.Checkpoint(/*wait=*/true);
  EXPECT_EQ(c.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(c.status().message(), HasSubstr("checkpoint_dir"));
  fake_.EnableCheckpoints();
  c = client.Checkpoint(/*wait=*/true);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->id(), 3u);
  EXPECT_EQ(c->state(), v1::CHECKPOINT_STATE_COMPLETE);
  c = client.Checkpoint(/*wait=*/false);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->state(), v1::CHECKPOINT_STATE_PENDING);
}

TEST(JobClient, UnreachableCoordinatorFailsFastWithUnavailableNamingTheTarget) {
  std::string target = absl::StrCat("127.0.0.1:", UnusedPort());
  JobClient client(target, absl::Seconds(30));
  absl::Time start = absl::Now();
  absl::StatusOr<v1::JobStatus> status = client.GetStatus();
  ASSERT_FALSE(status.ok());
  EXPECT_EQ(status.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(std::string(status.status().message()), HasSubstr(target));
  EXPECT_LT(absl::Now() - start, absl::Seconds(10));  // not the 30 s deadline
  EXPECT_FALSE(client.Stop("x").ok());
  EXPECT_FALSE(client.Watch(absl::Seconds(1), [](const v1::JobStatus&) {
                       return true;
                     }).ok());
}

// Two scales at once: the later one's count is where the move goes. The
// earlier caller was told "GetJobStatus ...: CANCELLED" or waited out its
// --wait_s; it is told that another scale superseded it.
TEST(JobClient, AScaleWaitSeesItsMoveDoneAskedBackOrSupersededByAnother) {
  v1::JobStatus s;
  s.mutable_config()->set_num_servers(2);
  s.mutable_reshard()->set_target_servers(3);
  using Wait = JobClient::ScaleWait;
  EXPECT_EQ(JobClient::JudgeScaleWait(s, 3, 0).outcome, Wait::kUnderWay);
  Wait other = JobClient::JudgeScaleWait(s, 1, 0);  // asked for 1; another asked for 3
  EXPECT_EQ(other.outcome, Wait::kSuperseded);
  EXPECT_EQ(other.other, 3u);
  s.mutable_reshard()->set_target_servers(0);
  s.mutable_reshard()->set_completed(1);
  s.mutable_config()->set_num_servers(3);
  EXPECT_EQ(JobClient::JudgeScaleWait(s, 3, 0).outcome, Wait::kDone);
  other = JobClient::JudgeScaleWait(s, 1, 0);  // the job moved to 3
  EXPECT_EQ(other.outcome, Wait::kSuperseded);
  EXPECT_EQ(other.other, 3u);
  // Asked back to where the job was: no move was made.
  EXPECT_EQ(JobClient::JudgeScaleWait(s, 3, 1).outcome, Wait::kAskedBack);
}

TEST(JobClient, JobEndedOnlyForTerminalStates) {
  EXPECT_FALSE(JobEnded(v1::JOB_STATE_WAITING));
  EXPECT_FALSE(JobEnded(v1::JOB_STATE_RUNNING));
  EXPECT_TRUE(JobEnded(v1::JOB_STATE_COMPLETED));
  EXPECT_TRUE(JobEnded(v1::JOB_STATE_FAILED));
  EXPECT_TRUE(JobEnded(v1::JOB_STATE_STOPPED));
}

}  // namespace
}  // namespace grps
