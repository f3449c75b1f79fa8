// Heartbeats as a specification, over real collaborators and a fixed clock:
// a heartbeat records a worker's progress only in the current generation,
// and revives a dead member; an unknown or newer incarnation is adopted
// (the job counts as taken over) unless the job ended; a server is asked
// for the pending checkpoint until it reports, and a failed report fails
// it; a worker's heartbeat saying it finished finishes its rank; the reply
// carries the job's state, the restore order for a member behind, the live
// set, the map when the member's is older, a drain, the final evaluation
// once the servers heard the final live set, a shorter interval while the
// job ends; a server of a shard re-sharded away hears the map.
#include "coordinator/heartbeats.h"

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "coordinator/testing/job_parts.h"
#include "coordinator/testing/test_job.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "job/job_config.h"

namespace grps {
namespace {

using ::testing::ElementsAre;
using ::testing::ElementsAreArray;
using ::testing::HasSubstr;

const absl::Time kT0 = absl::FromUnixSeconds(1'700'000'000);

// A sync job of two shards and two ranks (heartbeat every 100 ms, timeout
// 1 s) that may checkpoint. The collaborators are JobStateMachine's, built
// from the config as it builds them.
class HeartbeatsTest : public ::testing::Test {
 protected:
  virtual v1::JobConfig Config() const {
    return TestJobConfig(2, 2, v1::MODE_SYNC, "/nowhere/checkpoints");
  }

  void SetUp() override {
    config_ = Config();
    absl::StatusOr<v1::ShardMap> map = TestShardMap(config_);
    ASSERT_TRUE(map.ok()) << map.status();
    parts_ = std::make_unique<TestJobParts>(config_, *map);
    heartbeats_ = std::make_unique<Heartbeats>(Heartbeats::Parts{
        .config = &config_,
        .phase = &parts_->phase,
        .membership = &parts_->membership,
        .generations = &parts_->generations,
        .checkpoints = &parts_->checkpoints,
        .ending = &parts_->ending,
        .data = &parts_->data,
        .global_step = &parts_->global_step,
        .resharding = &parts_->resharding});
  }

  static std::string Address(uint32_t shard) {
    return "10.0.0." + std::to_string(shard) + ":5000";
  }
  // Every shard and rank registered (incarnations by shard and rank).
  void RegisterAll() {
    for (uint32_t s = 0; s < config_.num_servers(); ++s) {
      absl::StatusOr<Membership::Registration> r =
          parts_->membership.RegisterServer(s, Address(s), now_);
      ASSERT_TRUE(r.ok()) << r.status();
      shards_.push_back(r->incarnation);
    }
    for (uint32_t rank = 0; rank < config_.num_workers(); ++rank) {
      absl::StatusOr<Membership::Registration> r =
          parts_->membership.RegisterWorker(rank, "host", "cpu", now_, /*holds_live_rank=*/false);
      ASSERT_TRUE(r.ok()) << r.status();
      ranks_.push_back(r->incarnation);
    }
  }
  void StartJob() {
    RegisterAll();
    parts_->phase.Run();
  }

  // A heartbeat of a registered rank / shard (of one never registered:
  // incarnation 0).
  v1::HeartbeatRequest WorkerBeat(uint32_t rank) const {
    v1::HeartbeatRequest request;
    request.set_job_id(config_.job_id());
    request.set_worker_rank(rank);
    if (rank < ranks_.size()) request.set_incarnation(ranks_[rank]);
    request.set_generation(parts_->generations.current());
    return request;
  }
  v1::HeartbeatRequest ServerBeat(uint32_t shard) const {
    v1::HeartbeatRequest request;
    request.set_job_id(config_.job_id());
    request.set_server_shard(shard);
    if (shard < shards_.size()) request.set_incarnation(shards_[shard]);
    request.set_generation(parts_->generations.current());
    request.mutable_shard()->set_address(Address(shard));
    return request;
  }
  static v1::HeartbeatRequest WithProgress(v1::HeartbeatRequest request, uint64_t step) {
    request.mutable_progress()->set_step(step);
    return request;
  }
  // What the machine says of the job in a reply (a joining rank would count
  // from step 100).
  static Heartbeats::Job Job(bool training_done, bool current_generation = true) {
    Heartbeats::Job job;
    job.training_done = training_done;
    job.current_generation = current_generation;
    job.sync_version = [] { return uint64_t{100}; };
    return job;
  }
  v1::HeartbeatResponse Reply(const v1::HeartbeatRequest& request,
                              const Heartbeats::Job& job = Job(false)) {
    v1::HeartbeatResponse response;
    heartbeats_->Reply(request, job, now_, &response);
    return response;
  }
  uint64_t ProgressStep(uint32_t rank) const {
    return parts_->membership.WorkerStatuses(now_)[rank].progress().step();
  }
  void Finish(uint32_t rank) {
    v1::WorkerProgress progress;
    progress.set_step(10);
    ASSERT_TRUE(parts_->membership.FinishWorker(rank, ranks_[rank], progress, now_).ok());
  }
  // A shard's report of checkpoint `id`.
  static v1::ShardCheckpoint Written(uint64_t id, uint32_t shard) {
    v1::ShardCheckpoint report;
    report.set_id(id);
    report.set_state(v1::CHECKPOINT_STATE_WRITTEN);
    report.set_file("shard-" + std::to_string(shard) + ".ckpt");
    return report;
  }
  static v1::ShardCheckpoint Failed(uint64_t id, const std::string& error) {
    v1::ShardCheckpoint report;
    report.set_id(id);
    report.set_state(v1::CHECKPOINT_STATE_FAILED);
    report.set_error(error);
    return report;
  }

  absl::Time now_ = kT0;
  v1::JobConfig config_;
  std::unique_ptr<TestJobParts> parts_;
  std::unique_ptr<Heartbeats> heartbeats_;
  std::vector<uint64_t> shards_;  // incarnations by shard, as registered
  std::vector<uint64_t> ranks_;   // incarnations by rank, as registered
};

// A job that may re-shard up to four shards.
class ReshardingHeartbeatsTest : public HeartbeatsTest {
 protected:
  v1::JobConfig Config() const override {
    v1::JobConfig config = HeartbeatsTest::Config();
    config.set_max_servers(4);
    return config;
  }
};

// ---- Record ----

TEST_F(HeartbeatsTest, AWorkersProgressIsRecordedOnlyWhenItRunsInTheCurrentGeneration) {
  StartJob();
  ASSERT_TRUE(heartbeats_->Record(WithProgress(WorkerBeat(0), 7), /*current_generation=*/false,
                                  now_)
                  .ok());
  EXPECT_EQ(ProgressStep(0), 0u);  // progress of a state the job left
  ASSERT_TRUE(heartbeats_->Record(WithProgress(WorkerBeat(0), 7), /*current_generation=*/true,
                                  now_)
                  .ok());
  EXPECT_EQ(ProgressStep(0), 7u);
}

TEST_F(HeartbeatsTest, AHeartbeatOfAnUnknownMemberIsNotFoundAndOneOfADeadMemberRevivesIt) {
  EXPECT_TRUE(absl::IsNotFound(heartbeats_->Record(WorkerBeat(0), true, now_)));
  EXPECT_TRUE(absl::IsNotFound(heartbeats_->Record(ServerBeat(0), true, now_)));
  StartJob();
  now_ += absl::Seconds(2);
  parts_->membership.DetectFailures(now_);
  ASSERT_THAT(parts_->membership.ShardsInState(v1::MEMBER_STATE_DEAD), ElementsAre(0u, 1u));
  ASSERT_THAT(parts_->membership.RanksInState(v1::MEMBER_STATE_DEAD), ElementsAre(0u, 1u));

  v1::HeartbeatRequest server = ServerBeat(1);
  server.mutable_shard()->set_version(9);
  EXPECT_TRUE(heartbeats_->Record(server, true, now_).ok());
  EXPECT_TRUE(heartbeats_->Record(WorkerBeat(1), true, now_).ok());
  EXPECT_THAT(parts_->membership.ShardsInState(v1::MEMBER_STATE_ALIVE), ElementsAre(1u));
  EXPECT_THAT(parts_->membership.RanksInState(v1::MEMBER_STATE_ALIVE), ElementsAre(1u));
  EXPECT_EQ(parts_->membership.ShardStatuses(now_)[1].version(), 9u);
}

// ---- Adopt ----

TEST(HeartbeatsAdoptable, OnlyAMemberWithAnIncarnationRefusedAsUnknownOrStaleIsAdopted) {
  v1::HeartbeatRequest request;
  request.set_worker_rank(0);
  request.set_incarnation(5);
  EXPECT_TRUE(Heartbeats::Adoptable(request, absl::NotFoundError("never registered")));
  EXPECT_TRUE(Heartbeats::Adoptable(request, absl::FailedPreconditionError("stale")));
  EXPECT_FALSE(Heartbeats::Adoptable(request, absl::InvalidArgumentError("bad progress")));
  EXPECT_FALSE(Heartbeats::Adoptable(request, absl::OkStatus()));
  request.set_incarnation(0);  // a client that does not say: nothing to adopt
  EXPECT_FALSE(Heartbeats::Adoptable(request, absl::NotFoundError("never registered")));
}

TEST_F(HeartbeatsTest, AdoptingAMemberTakesItInWithItsIncarnationAndTheJobCountsAsTakenOver) {
  v1::HeartbeatRequest server = ServerBeat(1);
  server.set_incarnation(500);
  server.mutable_shard()->set_address("10.0.0.9:5000");
  v1::HeartbeatRequest worker = WithProgress(WorkerBeat(0), 12);
  worker.set_incarnation(600);
  worker.set_finished(true);

  ASSERT_TRUE(heartbeats_->Adopt(server, now_).ok());
  ASSERT_TRUE(heartbeats_->Adopt(worker, now_).ok());
  EXPECT_EQ(parts_->membership.shard_map().shards(1).address(), "10.0.0.9:5000");
  EXPECT_EQ(parts_->membership.shard_map().shards(1).incarnation(), 500u);
  EXPECT_THAT(parts_->membership.RanksInState(v1::MEMBER_STATE_FINISHED), ElementsAre(0u));
  EXPECT_EQ(ProgressStep(0), 12u);
  EXPECT_TRUE(parts_->phase.taken_over());
  EXPECT_DOUBLE_EQ(parts_->phase.ElapsedSeconds(now_ + absl::Seconds(5)), 5.0);  // its time starts
  // Its heartbeats are recorded from now on.
  EXPECT_TRUE(heartbeats_->Record(server, true, now_).ok());
}

TEST_F(HeartbeatsTest, NoMemberIsAdoptedWithoutAnIncarnationOrOnceTheJobEnded) {
  v1::HeartbeatRequest server = ServerBeat(1);
  EXPECT_TRUE(absl::IsInvalidArgument(heartbeats_->Adopt(server, now_)));
  server.set_incarnation(500);
  parts_->phase.End(v1::JOB_STATE_STOPPED, "stopped by an operator", now_);
  const absl::Status ended = heartbeats_->Adopt(server, now_);
  EXPECT_TRUE(absl::IsFailedPrecondition(ended)) << ended;
  EXPECT_THAT(ended.message(), HasSubstr("ended"));
  EXPECT_EQ(parts_->membership.shard_map().shards(1).incarnation(), 0u);
  EXPECT_FALSE(parts_->phase.taken_over());
}

// ---- ServerReport ----

TEST_F(HeartbeatsTest, AServerIsAskedForThePendingCheckpointUntilItReportsIt) {
  StartJob();
  const uint64_t id = parts_->checkpoints.Start(0, {}, 0, now_).id();
  v1::HeartbeatResponse asked;
  EXPECT_FALSE(heartbeats_->ServerReport(ServerBeat(0), now_, &asked));
  EXPECT_EQ(asked.checkpoint().id(), id);

  v1::HeartbeatRequest reported = ServerBeat(0);
  *reported.mutable_shard()->mutable_checkpoint() = Written(id, 0);
  v1::HeartbeatResponse after_report;
  EXPECT_FALSE(heartbeats_->ServerReport(reported, now_, &after_report));
  EXPECT_FALSE(after_report.has_checkpoint());
  EXPECT_TRUE(parts_->checkpoints.pending());  // shard 1 has not reported

  // Once the job ended no shard is asked any more.
  parts_->phase.End(v1::JOB_STATE_STOPPED, "stopped by an operator", now_);
  v1::HeartbeatResponse ended;
  EXPECT_FALSE(heartbeats_->ServerReport(ServerBeat(1), now_, &ended));
  EXPECT_FALSE(ended.has_checkpoint());
}

TEST_F(HeartbeatsTest, AFailedReportFailsThePendingCheckpointAndSaysSoOnce) {
  StartJob();
  const uint64_t id = parts_->checkpoints.Start(0, {}, 0, now_).id();
  v1::HeartbeatRequest failed = ServerBeat(1);
  *failed.mutable_shard()->mutable_checkpoint() = Failed(id, "disk full");
  v1::HeartbeatResponse response;
  EXPECT_TRUE(heartbeats_->ServerReport(failed, now_, &response));
  EXPECT_FALSE(parts_->checkpoints.pending());
  EXPECT_THAT(parts_->checkpoints.SummaryOf(id).error(), HasSubstr("disk full"));
  EXPECT_FALSE(response.has_checkpoint());
  // The same report again (its reply was lost): nothing pending to fail.
  v1::HeartbeatResponse again;
  EXPECT_FALSE(heartbeats_->ServerReport(failed, now_, &again));
}

// ---- WorkerReport ----

TEST_F(HeartbeatsTest, AHeartbeatSayingTheWorkerFinishedFinishesItsRankInTheCurrentGenerationOnly) {
  StartJob();
  v1::HeartbeatRequest finished = WithProgress(WorkerBeat(0), 10);
  finished.set_finished(true);
  heartbeats_->WorkerReport(finished, /*current_generation=*/false, now_);
  EXPECT_THAT(parts_->membership.RanksInState(v1::MEMBER_STATE_ALIVE), ElementsAre(0u, 1u));
  v1::HeartbeatRequest without_progress = WorkerBeat(0);
  without_progress.set_finished(true);
  heartbeats_->WorkerReport(without_progress, /*current_generation=*/true, now_);
  EXPECT_THAT(parts_->membership.RanksInState(v1::MEMBER_STATE_ALIVE), ElementsAre(0u, 1u));

  heartbeats_->WorkerReport(finished, /*current_generation=*/true, now_);
  EXPECT_THAT(parts_->membership.RanksInState(v1::MEMBER_STATE_FINISHED), ElementsAre(0u));
  EXPECT_EQ(ProgressStep(0), 10u);
}

TEST_F(HeartbeatsTest, AWorkersReportedGenerationMarksItsWorkerDoneWithoutOneAsStale) {
  StartJob();
  heartbeats_->WorkerReport(WorkerBeat(0), true, now_);  // generation 1
  parts_->generations.Next(v1::RestoreOrder());          // a roll-back: generation 2
  v1::WorkerDoneRequest done;
  done.set_worker_rank(0);
  done.set_incarnation(ranks_[0]);
  EXPECT_TRUE(parts_->generations.StaleWorkerDone(done));
}

// ---- Reply ----

TEST_F(HeartbeatsTest, AReplyCarriesTheJobsStateTheLiveSetAndTheMapWhenTheMembersIsOlder) {
  StartJob();
  const v1::HeartbeatResponse reply = Reply(WorkerBeat(1));
  EXPECT_EQ(reply.job_state(), v1::JOB_STATE_RUNNING);
  EXPECT_EQ(reply.generation(), 1u);
  EXPECT_FALSE(reply.has_restore());
  EXPECT_EQ(reply.next_heartbeat_ms(), 0u);  // the job's interval
  EXPECT_THAT(reply.live_workers(), ElementsAre(0u, 1u));
  EXPECT_THAT(reply.live_worker_incarnations(), ElementsAreArray(ranks_));
  EXPECT_EQ(reply.membership_epoch(), parts_->membership.membership_epoch());
  ASSERT_TRUE(reply.has_evaluator_rank());
  EXPECT_EQ(reply.evaluator_rank(), 0u);  // the lowest live rank
  EXPECT_FALSE(reply.drain());
  ASSERT_TRUE(reply.has_shard_map());  // the member knows epoch 0
  EXPECT_EQ(reply.shard_map().epoch(), parts_->membership.shard_map().epoch());
  EXPECT_EQ(reply.shard_map().shards(1).address(), Address(1));

  v1::HeartbeatRequest current = WorkerBeat(1);
  current.set_shard_map_epoch(parts_->membership.shard_map().epoch());
  EXPECT_FALSE(Reply(current).has_shard_map());
}

TEST_F(HeartbeatsTest, AMemberBehindTheCurrentGenerationIsToldTheOrderToRestore) {
  StartJob();
  v1::RestoreOrder order;
  order.set_checkpoint_id(3);
  order.set_step(30);
  parts_->generations.Next(order);
  const v1::HeartbeatResponse behind =
      Reply(WorkerBeat(0), Job(false, /*current_generation=*/false));
  EXPECT_EQ(behind.generation(), 2u);
  EXPECT_EQ(behind.restore().generation(), 2u);
  EXPECT_EQ(behind.restore().checkpoint_id(), 3u);
  EXPECT_EQ(behind.restore().step(), 30u);
  EXPECT_FALSE(Reply(WorkerBeat(0), Job(false, /*current_generation=*/true)).has_restore());
}

TEST_F(HeartbeatsTest, MembersHeartbeatSoonerOnceTrainingIsDoneOrTheJobEnded) {
  StartJob();
  EXPECT_EQ(Reply(WorkerBeat(0), Job(/*training_done=*/true)).next_heartbeat_ms(),
            Heartbeats::kEndingHeartbeatMs);
  // Never later than the job's own interval.
  config_.set_heartbeat_interval_ms(30);
  EXPECT_EQ(Reply(ServerBeat(0), Job(/*training_done=*/true)).next_heartbeat_ms(), 30u);
  config_.set_heartbeat_interval_ms(100);
  parts_->phase.End(v1::JOB_STATE_STOPPED, "stopped by an operator", now_);
  EXPECT_EQ(Reply(ServerBeat(0)).next_heartbeat_ms(), Heartbeats::kEndingHeartbeatMs);
}

TEST_F(HeartbeatsTest, OnlyTheDrainedWorkerIsToldToDrain) {
  StartJob();
  ASSERT_TRUE(parts_->membership.RequestDrain(0).ok());
  EXPECT_TRUE(Reply(WorkerBeat(0)).drain());
  EXPECT_FALSE(Reply(WorkerBeat(1)).drain());
  EXPECT_FALSE(Reply(ServerBeat(0)).drain());
}

TEST_F(HeartbeatsTest, TheEvaluatorIsAskedForTheFinalEvaluationOnceTheServersHeardTheFinalLiveSet) {
  StartJob();
  Finish(0);
  Finish(1);
  const Heartbeats::Job done = Job(/*training_done=*/true);
  v1::HeartbeatResponse early = Reply(WorkerBeat(0), done);
  EXPECT_EQ(early.evaluator_rank(), 0u);  // the lowest finished rank still heartbeating
  EXPECT_FALSE(early.evaluate_final());
  // Each live server heard the empty live set and heartbeated again.
  for (int beat = 0; beat < 2; ++beat)
    for (uint32_t shard = 0; shard < 2; ++shard) parts_->ending.NoteServerHeartbeat(shard);
  ASSERT_TRUE(parts_->ending.ServersHeardFinalLiveSet());

  EXPECT_TRUE(Reply(WorkerBeat(0), done).evaluate_final());
  v1::HeartbeatResponse other = Reply(WorkerBeat(1), done);
  EXPECT_EQ(other.evaluator_rank(), 0u);
  EXPECT_FALSE(other.evaluate_final());
}

TEST_F(HeartbeatsTest, OnceTheJobEndedEachReplySaysSoAndNotesThatItsMemberHeardTheEnd) {
  StartJob();
  parts_->phase.End(v1::JOB_STATE_STOPPED, "stopped by an operator", now_);
  EXPECT_EQ(Reply(WorkerBeat(0)).job_state(), v1::JOB_STATE_STOPPED);
  Reply(WorkerBeat(1));
  v1::HeartbeatRequest final_report = ServerBeat(0);
  final_report.set_final_report(true);
  Reply(final_report);
  EXPECT_FALSE(parts_->ending.EveryLiveMemberSawEnd(now_));  // shard 1 sent no final report
  final_report.set_server_shard(1);
  Reply(final_report);
  EXPECT_TRUE(parts_->ending.EveryLiveMemberSawEnd(now_));
}

// ---- RetiredReply ----

TEST_F(HeartbeatsTest, AJobThatNeverReshardsHasNoRetiredServers) {
  StartJob();
  EXPECT_FALSE(heartbeats_->RetiredReply(ServerBeat(5)).has_value());
}

TEST_F(ReshardingHeartbeatsTest, AServerOfAShardPastTheMapHearsTheMapInstead) {
  StartJob();
  const std::optional<v1::HeartbeatResponse> retired = heartbeats_->RetiredReply(ServerBeat(2));
  ASSERT_TRUE(retired.has_value());
  EXPECT_EQ(retired->job_state(), v1::JOB_STATE_RUNNING);
  EXPECT_EQ(retired->generation(), 1u);
  EXPECT_EQ(retired->shard_map().shards_size(), 2);
  EXPECT_EQ(retired->shard_map().epoch(), parts_->membership.shard_map().epoch());
  EXPECT_FALSE(heartbeats_->RetiredReply(ServerBeat(1)).has_value());
}

}  // namespace
}  // namespace grps
