// WorkerRequests as a specification, over real collaborators and a fake
// clock: a registration waits for every shard (and takes no rank if it gives
// up), a rank refused because it is alive is awaited until it registers, a
// rank joining a running elastic job starts no earlier than the slowest live
// rank; WorkerDone finishes or retires a rank (a leave counted once), a
// final evaluation is final only while training is done; leases are an
// elastic job's, for a live incarnation of the current generation; a drain
// needs a running job and keeps an elastic job's min_workers live.
#include "coordinator/worker_requests.h"

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "coordinator/testing/job_parts.h"
#include "coordinator/testing/test_job.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "job/job_config.h"

namespace grps {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

const absl::Time kT0 = absl::FromUnixSeconds(1'700'000'000);
// Ten blocks of one step's examples (batch 64) an epoch.
constexpr uint64_t kTrainExamples = 64 * 10;

// A fixed job of two shards and two ranks (heartbeat timeout 1 s). The
// collaborators are JobStateMachine's, built from the config as it builds
// them; every call is made under mu_, as the machine makes it.
class WorkerRequestsTest : public ::testing::Test {
 protected:
  virtual v1::JobConfig Config() const { return TestJobConfig(2, 2, v1::MODE_SYNC, ""); }

  void SetUp() override {
    config_ = Config();
    absl::StatusOr<v1::ShardMap> map = TestShardMap(config_);
    ASSERT_TRUE(map.ok()) << map.status();
    parts_ = std::make_unique<TestJobParts>(config_, *map);
    workers_ = std::make_unique<WorkerRequests>(WorkerRequests::Parts{
        .config = &config_,
        .clock = [this] { return now_; },
        .phase = &parts_->phase,
        .membership = &parts_->membership,
        .generations = &parts_->generations,
        .model = &parts_->model,
        .data = &parts_->data,
        .ending = &parts_->ending,
        .waits = &parts_->waits});
  }

  static std::string Address(uint32_t shard) {
    return "10.0.0." + std::to_string(shard) + ":5000";
  }
  void RegisterShards(uint32_t shards) {
    for (uint32_t s = 0; s < shards; ++s) {
      absl::MutexLock lock(&mu_);
      absl::StatusOr<Membership::Registration> r =
          parts_->membership.RegisterServer(s, Address(s), now_);
      ASSERT_TRUE(r.ok()) << r.status();
    }
  }
  // A worker asks for `rank` (-1: any); `proves` says whether it proved it
  // is the given live incarnation (its member secret).
  absl::StatusOr<v1::RegisterWorkerResponse> Register(
      int32_t rank, const JobWait& wait = {},
      std::function<bool(uint64_t)> proves = [](uint64_t) { return false; }) {
    v1::RegisterWorkerRequest request;
    request.set_job_id(config_.job_id());
    request.set_host("host");
    request.set_backend("cpu");
    if (rank >= 0) request.set_requested_rank(rank);
    absl::MutexLock lock(&mu_);
    return workers_->Register(&mu_, request, wait, proves);
  }
  // Every shard and every starting rank registered (incarnations_ by rank),
  // and the job RUNNING.
  void StartJob() {
    RegisterShards(config_.num_servers());
    for (uint32_t rank = 0; rank < config_.num_workers(); ++rank) {
      absl::StatusOr<v1::RegisterWorkerResponse> r = Register(static_cast<int32_t>(rank));
      ASSERT_TRUE(r.ok()) << r.status();
      incarnations_.push_back(r->incarnation());
    }
    absl::MutexLock lock(&mu_);
    parts_->phase.Run();
  }
  // Rank `rank` heartbeats at `step`.
  void Beat(uint32_t rank, uint64_t step) {
    v1::WorkerProgress progress;
    progress.set_step(step);
    bool revived = false;
    absl::MutexLock lock(&mu_);
    ASSERT_TRUE(
        parts_->membership.WorkerHeartbeat(rank, incarnations_[rank], &progress, now_, &revived)
            .ok());
  }

  v1::WorkerDoneRequest DoneRequest(uint32_t rank) const {
    v1::WorkerDoneRequest request;
    request.set_job_id(config_.job_id());
    request.set_worker_rank(rank);
    request.set_incarnation(incarnations_[rank]);
    request.mutable_progress()->set_step(10);
    return request;
  }
  v1::WorkerDoneRequest LeaveRequest(uint32_t rank) const {
    v1::WorkerDoneRequest request = DoneRequest(rank);
    request.set_leaving(true);
    return request;
  }
  absl::Status Done(const v1::WorkerDoneRequest& request) {
    absl::MutexLock lock(&mu_);
    return workers_->Done(request, now_);
  }

  v1::LeaseExamplesRequest LeaseRequest(uint32_t rank) const {
    v1::LeaseExamplesRequest request;
    request.set_job_id(config_.job_id());
    request.set_worker_rank(rank);
    request.set_incarnation(incarnations_[rank]);
    request.set_generation(parts_->generations.current());
    request.set_want(2);
    request.set_train_examples(kTrainExamples);
    return request;
  }
  absl::StatusOr<v1::LeaseExamplesResponse> Lease(const v1::LeaseExamplesRequest& request) {
    absl::MutexLock lock(&mu_);
    return workers_->Lease(request);
  }

  absl::Status Drain(uint32_t rank) {
    absl::MutexLock lock(&mu_);
    return workers_->Drain(rank);
  }

  // The job's figures as a status shows them: phase, final evaluation, data.
  v1::JobStatus Status() {
    absl::MutexLock lock(&mu_);
    v1::JobStatus status;
    parts_->phase.AddTo(&status, now_);
    parts_->ending.AddTo(&status);
    parts_->data.AddTo(&status);
    return status;
  }
  std::vector<uint32_t> Ranks(v1::MemberState state) {
    absl::MutexLock lock(&mu_);
    return parts_->membership.RanksInState(state);
  }
  bool RanksAwaited() {
    absl::MutexLock lock(&mu_);
    return workers_->ranks_awaited();
  }
  int Waiting() {
    absl::MutexLock lock(&mu_);
    return workers_->waiting();
  }

  absl::Mutex mu_;
  absl::Time now_ = kT0;
  v1::JobConfig config_;
  std::unique_ptr<TestJobParts> parts_;
  std::unique_ptr<WorkerRequests> workers_;
  std::vector<uint64_t> incarnations_;  // by rank, as registered
};

// An elastic job: three ranks start it, a fourth may join; a drain keeps
// two live.
class ElasticWorkerRequestsTest : public WorkerRequestsTest {
 protected:
  v1::JobConfig Config() const override {
    v1::JobConfig config = TestJobConfig(2, 3, v1::MODE_SYNC, "");
    config.set_max_workers(4);
    config.set_min_workers(2);
    return config;
  }
};

// ---- Register ----

TEST_F(WorkerRequestsTest, ARegistrationWaitsForTheLastShardBeforeItTakesARank) {
  RegisterShards(1);
  std::thread last_shard([this] {
    absl::MutexLock lock(&mu_);
    // Bounded so that a registration that never waits fails the test
    // instead of hanging it.
    EXPECT_TRUE(mu_.AwaitWithTimeout(
        absl::Condition(+[](WorkerRequests* w) { return w->waiting() > 0; }, workers_.get()),
        absl::Seconds(30)))
        << "no registration waited for the shards";
    ASSERT_TRUE(parts_->membership.RegisterServer(1, Address(1), now_).ok());
    parts_->waits.Changed();
  });
  absl::StatusOr<v1::RegisterWorkerResponse> r = Register(-1);
  last_shard.join();
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->rank(), 0u);
  EXPECT_EQ(Waiting(), 0);
}

TEST_F(WorkerRequestsTest, ARegistrationPastItsDeadlineNamesTheMissingShardAndTakesNoRank) {
  RegisterShards(1);
  absl::StatusOr<v1::RegisterWorkerResponse> r =
      Register(-1, {.deadline = absl::Now() + absl::Milliseconds(50)});
  EXPECT_EQ(r.status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_THAT(r.status().message(), HasSubstr("waiting for shard 1 to register"));
  EXPECT_EQ(Waiting(), 0);
  absl::MutexLock lock(&mu_);
  EXPECT_THAT(parts_->membership.UnregisteredRanks(), ElementsAre(0u, 1u));
}

TEST_F(WorkerRequestsTest,
       ARegistrationWaitingForTheShardsEndsWhenItsCallerLeavesOrTheCoordinatorShutsDown) {
  RegisterShards(1);
  EXPECT_EQ(Register(-1, {.cancelled = [] { return true; }}).status().code(),
            absl::StatusCode::kCancelled);
  EXPECT_EQ(Waiting(), 0);
  {
    absl::MutexLock lock(&mu_);
    parts_->waits.Release();
  }
  EXPECT_EQ(Register(-1).status().code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(Waiting(), 0);
  absl::MutexLock lock(&mu_);
  EXPECT_THAT(parts_->membership.UnregisteredRanks(), ElementsAre(0u, 1u));
}

TEST_F(WorkerRequestsTest, ARegisteredWorkerGetsItsRankWithTheJobConfigAndTheShardMap) {
  RegisterShards(2);
  absl::StatusOr<v1::RegisterWorkerResponse> r = Register(1);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->rank(), 1u);
  EXPECT_EQ(r->start_step(), 0u);
  EXPECT_EQ(r->generation(), 1u);
  EXPECT_EQ(r->config().job_id(), "test-job");
  EXPECT_EQ(r->config().num_servers(), 2u);
  ASSERT_EQ(r->shard_map().shards_size(), 2);
  EXPECT_EQ(r->shard_map().shards(1).address(), Address(1));
  absl::MutexLock lock(&mu_);
  EXPECT_EQ(parts_->membership.LiveIncarnation(1), std::optional<uint64_t>(r->incarnation()));
}

TEST_F(WorkerRequestsTest, ARankRefusedBecauseItIsAliveIsAwaitedUntilItRegisters) {
  StartJob();
  EXPECT_FALSE(RanksAwaited());
  EXPECT_EQ(Register(0).status().code(), absl::StatusCode::kAlreadyExists);
  EXPECT_TRUE(RanksAwaited());
  // The old incarnation is silent past the heartbeat timeout: declared dead.
  now_ += absl::Seconds(2);
  Beat(1, 5);
  {
    absl::MutexLock lock(&mu_);
    parts_->membership.DetectFailures(now_);
  }
  absl::StatusOr<v1::RegisterWorkerResponse> r = Register(0);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->rank(), 0u);
  EXPECT_FALSE(RanksAwaited());
}

TEST_F(WorkerRequestsTest, AWorkerThatProvesItIsTheLiveIncarnationTakesItsRankBack) {
  StartJob();
  absl::StatusOr<v1::RegisterWorkerResponse> r =
      Register(0, {}, [&](uint64_t live) { return live == incarnations_[0]; });
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->rank(), 0u);
  EXPECT_GT(r->incarnation(), incarnations_[0]);
  EXPECT_FALSE(RanksAwaited());
}

TEST_F(WorkerRequestsTest, ARankAwaitedWhenTheJobEndsIsToldSoAndNoLongerAwaited) {
  StartJob();
  EXPECT_EQ(Register(0).status().code(), absl::StatusCode::kAlreadyExists);
  {
    absl::MutexLock lock(&mu_);
    parts_->phase.End(v1::JOB_STATE_STOPPED, "stopped by an operator", now_);
  }
  absl::Status again = Register(0).status();
  EXPECT_EQ(again.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(again.message(), HasSubstr("has ended"));
  EXPECT_FALSE(RanksAwaited());
}

TEST_F(ElasticWorkerRequestsTest, ARankJoiningARunningJobStartsAtTheSlowestLiveRanksStep) {
  StartJob();
  Beat(0, 30);
  Beat(1, 20);
  Beat(2, 25);
  absl::StatusOr<v1::RegisterWorkerResponse> r = Register(-1);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->rank(), 3u);
  EXPECT_EQ(r->start_step(), 20u);
  EXPECT_EQ(Status().worker_joins(), 1u);
  // It enters the quorum with its first lease, not while it loads its data.
  absl::MutexLock lock(&mu_);
  EXPECT_THAT(parts_->membership.live_workers().ranks, ElementsAre(0u, 1u, 2u));
}

TEST_F(ElasticWorkerRequestsTest, ARankRegisteredAgainGivesBackItsEarlierIncarnationsLeases) {
  StartJob();
  ASSERT_TRUE(Lease(LeaseRequest(0)).ok());
  EXPECT_EQ(Status().data().leased(), 2u);
  // Its worker restarted and proves it holds the rank.
  ASSERT_TRUE(Register(0, {}, [&](uint64_t live) { return live == incarnations_[0]; }).ok());
  EXPECT_EQ(Status().data().leased(), 0u);
  EXPECT_EQ(Status().data().returned(), 2u);
}

// ---- Done ----

TEST_F(ElasticWorkerRequestsTest, AFinishedRankIsFinishedAndItsLeasesComeBack) {
  StartJob();
  ASSERT_TRUE(Lease(LeaseRequest(0)).ok());
  EXPECT_EQ(Status().data().leased(), 2u);
  EXPECT_TRUE(Done(DoneRequest(0)).ok());
  EXPECT_THAT(Ranks(v1::MEMBER_STATE_FINISHED), ElementsAre(0u));
  EXPECT_EQ(Status().data().leased(), 0u);
  EXPECT_EQ(Status().data().returned(), 2u);
}

TEST_F(WorkerRequestsTest, AWorkerDoneFromBeforeARollBackIsAbortedAndChangesNothing) {
  StartJob();
  {
    absl::MutexLock lock(&mu_);
    parts_->generations.Next(v1::RestoreOrder());  // generation 2
  }
  v1::WorkerDoneRequest request = DoneRequest(0);
  request.set_generation(1);
  EXPECT_EQ(Done(request).code(), absl::StatusCode::kAborted);
  request.set_leaving(true);
  EXPECT_EQ(Done(request).code(), absl::StatusCode::kAborted);
  EXPECT_THAT(Ranks(v1::MEMBER_STATE_ALIVE), ElementsAre(0u, 1u));
}

TEST_F(ElasticWorkerRequestsTest, ALeavingRankIsLeftAndCountedOnceThoughItsWorkerDoneIsRetried) {
  StartJob();
  ASSERT_TRUE(Lease(LeaseRequest(1)).ok());
  EXPECT_TRUE(Done(LeaveRequest(1)).ok());
  EXPECT_THAT(Ranks(v1::MEMBER_STATE_LEFT), ElementsAre(1u));
  EXPECT_EQ(Status().worker_leaves(), 1u);
  EXPECT_EQ(Status().data().leased(), 0u);
  EXPECT_TRUE(Done(LeaveRequest(1)).ok());  // its reply was lost
  EXPECT_EQ(Status().worker_leaves(), 1u);
  {
    absl::MutexLock lock(&mu_);
    EXPECT_THAT(parts_->membership.live_workers().ranks, ElementsAre(0u, 2u));
  }
}

TEST_F(WorkerRequestsTest, AnEvaluationIsTheJobsFinalOnlyWhenMadeWhileTrainingIsDone) {
  StartJob();
  v1::WorkerDoneRequest first = DoneRequest(0);
  first.set_has_final_eval(true);
  first.set_final_test_accuracy(0.5f);
  first.set_final_test_loss(1.0f);
  EXPECT_TRUE(Done(first).ok());
  EXPECT_FALSE(Status().has_final_eval());  // rank 1 still trains
  v1::WorkerDoneRequest last = DoneRequest(1);
  last.set_has_final_eval(true);
  last.set_final_test_accuracy(0.75f);
  last.set_final_test_loss(0.5f);
  EXPECT_TRUE(Done(last).ok());
  const v1::JobStatus status = Status();
  EXPECT_TRUE(status.has_final_eval());
  EXPECT_FLOAT_EQ(status.final_test_accuracy(), 0.75f);
  EXPECT_FLOAT_EQ(status.final_test_loss(), 0.5f);
  absl::MutexLock lock(&mu_);
  ASSERT_TRUE(parts_->membership.latest_evaluation().has_value());
  EXPECT_FLOAT_EQ(parts_->membership.latest_evaluation()->accuracy, 0.75f);
}

TEST_F(WorkerRequestsTest, AWorkerWithoutAFinalEvaluationDeclinesItOnlyWhenTrainingIsDone) {
  StartJob();
  v1::WorkerDoneRequest early = DoneRequest(0);
  early.set_no_final_eval(true);
  EXPECT_TRUE(Done(early).ok());  // rank 1 still trains: not the evaluator's word
  EXPECT_TRUE(Done(DoneRequest(1)).ok());
  {
    absl::MutexLock lock(&mu_);
    EXPECT_EQ(parts_->ending.Completion(now_), std::nullopt);  // rank 1 may still evaluate
  }
  v1::WorkerDoneRequest again = DoneRequest(1);
  again.set_no_final_eval(true);
  EXPECT_TRUE(Done(again).ok());
  absl::MutexLock lock(&mu_);
  EXPECT_EQ(parts_->ending.Completion(now_),
            std::optional<std::string>("every worker finished; no final evaluation: the "
                                       "evaluating worker's program has none"));
}

// ---- Lease ----

TEST_F(WorkerRequestsTest, ALeaseInAJobThatIsNotElasticIsRefused) {
  StartJob();
  absl::StatusOr<v1::LeaseExamplesResponse> r = Lease(LeaseRequest(0));
  EXPECT_EQ(r.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(r.status().message(), HasSubstr("is not elastic"));
}

TEST_F(ElasticWorkerRequestsTest, ALeaseIsRefusedToAnIncarnationThatIsNotLive) {
  StartJob();
  v1::LeaseExamplesRequest stale = LeaseRequest(0);
  stale.set_incarnation(incarnations_[0] - 1);
  EXPECT_EQ(Lease(stale).status().code(), absl::StatusCode::kFailedPrecondition);
  ASSERT_TRUE(Done(LeaveRequest(1)).ok());
  EXPECT_EQ(Lease(LeaseRequest(1)).status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(Status().data().leased(), 0u);
}

TEST_F(ElasticWorkerRequestsTest, ALeaseFromBeforeARollBackIsAborted) {
  StartJob();
  v1::LeaseExamplesRequest request = LeaseRequest(0);  // generation 1
  {
    absl::MutexLock lock(&mu_);
    parts_->generations.Next(v1::RestoreOrder());  // generation 2
  }
  EXPECT_EQ(Lease(request).status().code(), absl::StatusCode::kAborted);
  EXPECT_EQ(Status().data().leased(), 0u);
  EXPECT_TRUE(Lease(LeaseRequest(0)).ok());
}

TEST_F(ElasticWorkerRequestsTest, AJoiningRanksFirstLeaseBringsItIntoTheLiveSet) {
  StartJob();
  absl::StatusOr<v1::RegisterWorkerResponse> joined = Register(-1);
  ASSERT_TRUE(joined.ok()) << joined.status();
  incarnations_.push_back(joined->incarnation());
  absl::StatusOr<v1::LeaseExamplesResponse> r = Lease(LeaseRequest(3));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->blocks_size(), 2);
  absl::MutexLock lock(&mu_);
  EXPECT_THAT(parts_->membership.live_workers().ranks, ElementsAre(0u, 1u, 2u, 3u));
}

// ---- Drain ----

TEST_F(WorkerRequestsTest, AWorkerIsDrainedOnlyFromARunningJob) {
  RegisterShards(2);
  ASSERT_TRUE(Register(0).ok());
  EXPECT_EQ(Drain(0).code(), absl::StatusCode::kFailedPrecondition);  // WAITING
  {
    absl::MutexLock lock(&mu_);
    parts_->phase.Run();
  }
  EXPECT_TRUE(Drain(0).ok());
  {
    absl::MutexLock lock(&mu_);
    EXPECT_TRUE(parts_->membership.DrainRequested(0));
    parts_->phase.End(v1::JOB_STATE_STOPPED, "stopped by an operator", now_);
  }
  EXPECT_EQ(Drain(0).code(), absl::StatusCode::kFailedPrecondition);
}

TEST_F(WorkerRequestsTest, AFixedJobMayBeDrainedOfEveryWorker) {
  StartJob();
  EXPECT_TRUE(Drain(0).ok());
  EXPECT_TRUE(Drain(1).ok());
}

TEST_F(ElasticWorkerRequestsTest, ADrainThatWouldLeaveFewerThanMinWorkersLiveIsRefused) {
  StartJob();
  EXPECT_TRUE(Drain(0).ok());  // ranks 1 and 2 stay
  absl::Status refused = Drain(1);  // rank 0 leaves too: one would stay
  EXPECT_EQ(refused.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(refused.message(), HasSubstr("fewer than the job's min_workers (2)"));
  {
    absl::MutexLock lock(&mu_);
    EXPECT_FALSE(parts_->membership.DrainRequested(1));
  }
  // Rank 2 dies: rank 1 alone stays. Rank 0 was leaving already, so asking
  // for its drain again takes nobody more away.
  now_ += absl::Seconds(2);
  Beat(0, 5);
  Beat(1, 5);
  {
    absl::MutexLock lock(&mu_);
    parts_->membership.DetectFailures(now_);
  }
  EXPECT_TRUE(Drain(0).ok());
}

}  // namespace
}  // namespace grps
