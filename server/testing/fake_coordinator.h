// A fake coordinator for the tests of a shard's life (the grps-server
// binary's, server_main_test; the ShardAgent's, shard_agent_test): it
// registers one server and answers its heartbeats with what the test sets.
#ifndef GRPS_SERVER_TESTING_FAKE_COORDINATOR_H_
#define GRPS_SERVER_TESTING_FAKE_COORDINATOR_H_

#include <cstdint>
#include <functional>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "job/job_config.h"
#include "job/shard_map.h"
#include "proto/grps.grpc.pb.h"

namespace grps {

// Registers one server as shard `shard` (0 unless the test says) and
// answers heartbeats with the job state, shard map and roll-back order the
// test sets; the map when the heartbeat's epoch is older, the order when
// its generation is.
class FakeCoordinator final : public v1::Coordinator::Service {
 public:
  explicit FakeCoordinator(v1::JobConfig config, uint32_t shard = 0)
      : config_(std::move(config)), shard_(shard) {
    map_ = MapOf(config_.num_servers(), 0);
  }

  // The job's chunks placed on `num_shards` shards, at `epoch`.
  v1::ShardMap MapOf(uint32_t num_shards, uint64_t epoch) const {
    v1::ShardMap map = *BuildShardMap(ModelTensors(config_), num_shards, config_.chunk_bytes());
    map.set_epoch(epoch);
    for (v1::ShardEndpoint& e : *map.mutable_shards())
      e.set_address(absl::StrCat("127.0.0.1:", 1000 + e.shard()));
    return map;
  }

  grpc::Status RegisterServer(grpc::ServerContext*,
                              const v1::RegisterServerRequest* request,
                              v1::RegisterServerResponse* response) override {
    if (StandingBy(request->requested_shard())) {
      // As the coordinator does: holds the call a while, then says why.
      absl::SleepFor(absl::Milliseconds(200));
      return grpc::Status(grpc::StatusCode::UNAVAILABLE,
                          absl::StrCat("standby: shard ", request->requested_shard(),
                                       " waits for the job to re-shard"));
    }
    absl::MutexLock lock(&mu_);
    registered_address_ = request->address();
    *response->mutable_restore() = registration_restore_;
    if (request->has_restore_failed()) {
      // As the coordinator does when the only checkpoint is refused: the
      // initial values, in the same generation.
      ++refused_restores_;
      response->mutable_restore()->Clear();
      response->mutable_restore()->set_generation(registration_restore_.generation());
    }
    response->set_shard(shard_);
    response->set_incarnation(7);
    *response->mutable_config() = config_;
    response->mutable_config()->set_num_servers(map_.shards_size());
    *response->mutable_shard_map() = map_;
    return grpc::Status::OK;
  }

  grpc::Status Heartbeat(grpc::ServerContext*,
                         const v1::HeartbeatRequest* request,
                         v1::HeartbeatResponse* response) override {
    absl::MutexLock lock(&mu_);
    // A restoring server's says only that it is alive (as the
    // coordinator takes it).
    if (request->restoring()) {
      ++restoring_heartbeats_;
      response->set_job_state(state_);
      return grpc::Status::OK;
    }
    ++heartbeats_;
    last_status_ = request->shard();
    final_report_ = final_report_ || request->final_report();
    if (taken_over_)
      return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION,
                          "stale incarnation 7 of shard 0");
    response->set_job_state(state_);
    response->add_live_workers(0);
    response->add_live_worker_incarnations(1);
    if (checkpoint_.id() > 0) *response->mutable_checkpoint() = checkpoint_;
    if (request->shard_map_epoch() < map_.epoch()) *response->mutable_shard_map() = map_;
    if (request->generation() < restore_.generation()) *response->mutable_restore() = restore_;
    return grpc::Status::OK;
  }

  // Registrations for a shard past the map's answer "standby: ..." until
  // TakeStandbysIn.
  void AnswerStandbys() {
    absl::MutexLock lock(&mu_);
    answer_standbys_ = true;
  }
  void TakeStandbysIn() {
    absl::MutexLock lock(&mu_);
    answer_standbys_ = false;
  }
  // Heartbeats that said the server is restoring, and the others.
  int restoring_heartbeats() {
    absl::MutexLock lock(&mu_);
    return restoring_heartbeats_;
  }
  int heartbeats() {
    absl::MutexLock lock(&mu_);
    return heartbeats_;
  }
  int standby_answers() {
    absl::MutexLock lock(&mu_);
    return standby_answers_;
  }
  // What a registration's answer orders the shard to restore from (the
  // initial values unless set); a registration that reports the order it
  // could not follow is counted (refused_restores) and answered with the
  // initial values, as if the checkpoint were the job's only one.
  void SetRegistrationRestore(v1::RestoreOrder order) {
    absl::MutexLock lock(&mu_);
    registration_restore_ = std::move(order);
  }
  int refused_restores() {
    absl::MutexLock lock(&mu_);
    return refused_restores_;
  }
  // Publishes `map` and, when it names a generation, roll-back `order`.
  void Reshard(v1::ShardMap map, v1::RestoreOrder order) {
    absl::MutexLock lock(&mu_);
    map_ = std::move(map);
    restore_ = std::move(order);
  }
  bool final_report() {
    absl::MutexLock lock(&mu_);
    return final_report_;
  }
  // Waits until a heartbeat reports `status` true of the shard's status.
  bool WaitForStatus(const std::function<bool(const v1::ShardStatus&)>& status,
                     absl::Duration timeout) {
    absl::MutexLock lock(&mu_);
    auto reported = [&] {
      mu_.AssertHeld();
      return heartbeats_ > 0 && status(last_status_);
    };
    return mu_.AwaitWithTimeout(absl::Condition(&reported), timeout);
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
  v1::ShardMap map() {
    absl::MutexLock lock(&mu_);
    return map_;
  }
  const v1::JobConfig& config() const { return config_; }

 private:
  bool StandingBy(int32_t shard) {
    absl::MutexLock lock(&mu_);
    if (!answer_standbys_ || shard < map_.shards_size()) return false;
    ++standby_answers_;
    return true;
  }

  const v1::JobConfig config_;
  const uint32_t shard_;
  absl::Mutex mu_;
  v1::ShardMap map_ ABSL_GUARDED_BY(mu_);
  v1::RestoreOrder restore_ ABSL_GUARDED_BY(mu_);
  v1::RestoreOrder registration_restore_ ABSL_GUARDED_BY(mu_);
  int refused_restores_ ABSL_GUARDED_BY(mu_) = 0;
  bool answer_standbys_ ABSL_GUARDED_BY(mu_) = false;
  int standby_answers_ ABSL_GUARDED_BY(mu_) = 0;
  bool final_report_ ABSL_GUARDED_BY(mu_) = false;
  std::string registered_address_ ABSL_GUARDED_BY(mu_);
  int heartbeats_ ABSL_GUARDED_BY(mu_) = 0;
  int restoring_heartbeats_ ABSL_GUARDED_BY(mu_) = 0;
  v1::ShardStatus last_status_ ABSL_GUARDED_BY(mu_);
  v1::JobState state_ ABSL_GUARDED_BY(mu_) = v1::JOB_STATE_RUNNING;
  v1::CheckpointRequest checkpoint_ ABSL_GUARDED_BY(mu_);
  bool taken_over_ ABSL_GUARDED_BY(mu_) = false;
};

inline v1::JobConfig SmallJob() {
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

// The job of SmallJob whose servers scale (up to `max_servers`), with
// checkpoints under `dir`.
inline v1::JobConfig ScalingJob(uint32_t num_servers, uint32_t max_servers, const std::string& dir) {
  v1::JobConfig config = SmallJob();
  config.set_num_servers(num_servers);
  config.set_max_servers(max_servers);
  config.set_checkpoint_dir(dir);
  return config;
}

}  // namespace grps

#endif  // GRPS_SERVER_TESTING_FAKE_COORDINATOR_H_
