// JobStateMachine's re-sharding (JobConfig.max_servers; docs/elasticity.md):
// a running job moves to another shard count through a checkpoint cut.
//
//   1. ScaleServers(K) records the target.
//   2. Every new shard (K above the count) needs a standby: a server that
//      asked to register for it (RegisterServer waits for it).
//   3. A checkpoint is cut (or the pending one adopted): in sync at one step
//      for the whole model, in async and ssp each chunk as it is.
//   4. Once its manifest is written, under one lock: the map of K shards
//      (the same chunks, placed again; epoch + 1), the standbys' endpoints,
//      and a roll-back of a new generation to the cut. Every member hears
//      both in its next heartbeat reply: the kept shards rebuild their store
//      from the cut for the new map, the standbys' calls are answered with
//      it, the shards past K are told they are retired, and the workers go
//      back to their steps at the cut with clients of the new map.
//
// A cut that fails is cut again; a coordinator that takes the job over cuts
// again too (the target is in its state file). What a move costs: the steps
// since the cut are computed again (the cut is a few steps ahead of the
// fastest shard when it is asked for), plus the rebuild.
#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "coordinator/job_state_machine.h"
#include "job/shard_map.h"
#include "spdlog/spdlog.h"

namespace grps {

namespace {

// How often a waiting standby's call looks at its caller.
constexpr absl::Duration kStandbyPoll = absl::Milliseconds(100);
// A standby's call is answered this long before its deadline (a shard
// handed to a caller that already gave up would be held by nobody).
constexpr absl::Duration kStandbyAnswerMargin = absl::Milliseconds(300);

}  // namespace

absl::StatusOr<v1::ReshardProgress> JobStateMachine::ScaleServers(uint32_t num_servers) {
  const absl::Time now = clock_();
  absl::MutexLock lock(&mu_);
  if (config_.max_servers() == 0)
    return absl::FailedPreconditionError(absl::StrCat(
        "job ", config_.job_id(),
        " has a fixed shard count (start the coordinator with --max_servers to scale it)"));
  if (num_servers == 0 || num_servers > config_.max_servers())
    return absl::InvalidArgumentError(absl::StrCat(
        "--servers must be in [1, ", config_.max_servers(), "] (the job's max_servers), got ",
        num_servers));
  if (state_ != v1::JOB_STATE_RUNNING || TrainingDoneLocked())
    return absl::FailedPreconditionError(
        absl::StrCat("job ", config_.job_id(), " is ",
                     TrainingDoneLocked() ? "done training" : JobStateName(state_),
                     "; only a training job re-shards"));
  if (num_servers == membership_.num_shards() && reshard_target_ == 0)
    return ReshardProgressLocked();
  if (reshard_target_ != num_servers)
    spdlog::info("job {}: re-sharding from {} to {} shards asked for", config_.job_id(),
                 membership_.num_shards(), num_servers);
  reshard_target_ = num_servers;
  TickReshardLocked(now);
  changed_.SignalAll();
  return ReshardProgressLocked();
}

void JobStateMachine::TickReshardLocked(absl::Time now) {
  if (reshard_target_ == 0) return;
  if (EndedLocked()) {
    reshard_target_ = 0;
    reshard_checkpoint_ = 0;
    reshard_phase_.clear();
    return;
  }
  const uint32_t from = membership_.num_shards();
  if (reshard_target_ == from && reshard_checkpoint_ == 0) {
    reshard_target_ = 0;  // asked back to where it is
    reshard_phase_.clear();
    return;
  }
  if (state_ != v1::JOB_STATE_RUNNING || TrainingDoneLocked()) {
    reshard_phase_ = "waits for a training job";
    return;
  }
  if (reshard_checkpoint_ != 0) {
    const v1::CheckpointSummary cut = checkpoints_.SummaryOf(reshard_checkpoint_);
    if (cut.state() == v1::CHECKPOINT_STATE_PENDING) return;
    if (cut.state() == v1::CHECKPOINT_STATE_COMPLETE) return;  // published when written
    spdlog::warn("re-sharding to {} shards: cut {} failed ({}); cutting again",
                 reshard_target_, reshard_checkpoint_, cut.error());
    reshard_checkpoint_ = 0;
  }
  std::vector<uint32_t> missing;
  const std::map<uint32_t, Membership::Endpoint> standbys = FreshStandbysLocked();
  for (uint32_t s = from; s < reshard_target_; ++s)
    if (standbys.count(s) == 0) missing.push_back(s);
  if (!missing.empty()) {
    reshard_phase_ = absl::StrCat("waiting for a server of shard",
                                  missing.size() == 1 ? " " : "s ",
                                  absl::StrJoin(missing, ", "), " to register");
    return;
  }
  if (reshard_asked_ == absl::InfiniteFuture()) reshard_asked_ = now;
  if (checkpoints_.pending()) {
    // The pending checkpoint is as good a cut as a new one.
    reshard_checkpoint_ = checkpoints_.pending_summary().id();
  } else {
    absl::StatusOr<v1::CheckpointRequest> cut = StartCheckpointLocked(
        now, absl::StrCat("the cut of re-sharding to ", reshard_target_, " shards"));
    if (!cut.ok()) {
      reshard_phase_ = absl::StrCat("cannot cut yet: ", cut.status().message());
      return;
    }
    reshard_checkpoint_ = cut->id();
  }
  reshard_phase_ = absl::StrCat("cutting at checkpoint ", reshard_checkpoint_);
}

bool JobStateMachine::PublishReshardLocked(const v1::CheckpointManifest& manifest,
                                           const std::string& dir, absl::Time now) {
  if (reshard_target_ == 0 || manifest.id() != reshard_checkpoint_) return false;
  reshard_checkpoint_ = 0;
  const uint32_t from = membership_.num_shards();
  const uint32_t to = reshard_target_;
  if (to == from) {  // asked back to where it is while the cut was taken
    reshard_target_ = 0;
    reshard_phase_.clear();
    reshard_asked_ = absl::InfiniteFuture();
    return false;
  }
  const v1::ShardMap& old_map = membership_.shard_map();
  absl::StatusOr<v1::ShardMap> built =
      BuildShardMap({old_map.tensors().begin(), old_map.tensors().end()}, to,
                    config_.chunk_bytes());
  if (!built.ok()) {
    spdlog::error("re-sharding to {} shards: {}; not re-sharded", to,
                  std::string(built.status().message()));
    reshard_target_ = 0;
    return false;
  }
  absl::StatusOr<std::map<uint32_t, uint64_t>> dropped =
      membership_.Reshard(*built, FreshStandbysLocked(), now);
  if (!dropped.ok()) {
    // A standby left meanwhile: wait for one again, then cut again.
    spdlog::warn("re-sharding to {} shards: {}; waiting for it", to,
                 std::string(dropped.status().message()));
    TickReshardLocked(now);
    return false;
  }
  checkpoints_.set_num_shards(to);
  reshard_target_ = 0;
  reshard_phase_.clear();
  reshard_done_.set_completed(reshard_done_.completed() + 1);
  reshard_done_.set_last_from(from);
  reshard_done_.set_last_to(to);
  reshard_done_.set_last_step(manifest.step());
  reshard_done_.set_last_seconds(
      reshard_asked_ == absl::InfiniteFuture()
          ? 0
          : std::max(0.0, absl::ToDoubleSeconds(now - reshard_asked_)));
  reshard_asked_ = absl::InfiniteFuture();
  RollBackToLocked(generations_.OrderFor(manifest, dir),
                   absl::StrCat("re-sharded from ", from, " to ", to,
                                " shards (shard map epoch ", membership_.shard_map().epoch(),
                                ")"),
                   now);
  if (!dropped->empty())
    spdlog::info("job {}: shard{} {} retired", config_.job_id(),
                 dropped->size() == 1 ? "" : "s",
                 absl::StrJoin(*dropped, ", ", absl::PairFormatter(absl::AlphaNumFormatter(),
                                                                    " incarnation ",
                                                                    absl::AlphaNumFormatter())));
  changed_.SignalAll();
  return true;
}

absl::StatusOr<JobStateMachine::ServerRegistration> JobStateMachine::RegisterStandbyLocked(
    const v1::RegisterServerRequest& request, uint32_t shard, const Wait& wait) {
  if (shard >= config_.max_servers())
    return absl::InvalidArgumentError(absl::StrCat(
        "requested shard ", shard, " is out of range; the job may have up to ",
        config_.max_servers(), " shards (max_servers)"));
  Standby& standby = standbys_[shard];
  if (standby.endpoint.address != request.address() || standby.endpoint.incarnation == 0) {
    // A new server for the shard takes the place (an older standby that
    // still waits is told so below).
    standby.endpoint.address = request.address();
    standby.endpoint.incarnation = membership_.ReserveIncarnation(clock_());
    spdlog::info("server {} stands by for shard {} (incarnation {}); the job has {} shards",
                 request.address(), shard, standby.endpoint.incarnation,
                 membership_.num_shards());
  }
  const uint64_t incarnation = standby.endpoint.incarnation;
  ++standby.calls_waiting;
  TickReshardLocked(clock_());
  changed_.SignalAll();
  absl::Status outcome = absl::OkStatus();
  while (true) {
    if (shard < membership_.num_shards() &&
        membership_.shard_map().shards(shard).incarnation() == incarnation)
      break;  // taken in
    if (EndedLocked()) {
      outcome = EndedErrorLocked();
      break;
    }
    if (standbys_[shard].endpoint.incarnation != incarnation) {
      outcome = absl::FailedPreconditionError(
          absl::StrCat("another server stands by for shard ", shard, " now"));
      break;
    }
    if (releasing_waiters_) {
      outcome = absl::UnavailableError("coordinator is shutting down");
      break;
    }
    if (wait.cancelled()) {
      outcome = absl::CancelledError("client cancelled");
      break;
    }
    const absl::Time real_now = absl::Now();
    if (real_now >= wait.deadline - kStandbyAnswerMargin) {
      outcome = absl::UnavailableError(absl::StrCat(
          "standby: shard ", shard, " waits for the job to re-shard (it has ",
          membership_.num_shards(), "; grpsctl scale --servers ", shard + 1, " takes it in)"));
      break;
    }
    changed_.WaitWithDeadline(
        &mu_, std::min(wait.deadline - kStandbyAnswerMargin, real_now + kStandbyPoll));
  }
  auto it = standbys_.find(shard);
  if (it != standbys_.end() && it->second.endpoint.incarnation == incarnation) {
    --it->second.calls_waiting;
    it->second.last_call = absl::Now();
    if (outcome.ok() || absl::IsCancelled(outcome)) standbys_.erase(it);
  }
  if (!outcome.ok()) return outcome;
  spdlog::info("server {} takes shard {} (incarnation {}); shard map epoch {}",
               request.address(), shard, incarnation, membership_.shard_map().epoch());
  return ServerAnswerLocked(shard, incarnation);
}

std::map<uint32_t, Membership::Endpoint> JobStateMachine::FreshStandbysLocked() const {
  std::map<uint32_t, Membership::Endpoint> out;
  const absl::Time real_now = absl::Now();
  for (const auto& [shard, standby] : standbys_)
    if (standby.calls_waiting > 0 || real_now - standby.last_call <= kStandbyFresh)
      out[shard] = standby.endpoint;
  return out;
}

std::optional<v1::HeartbeatResponse> JobStateMachine::RetiredServerReplyLocked(
    const v1::HeartbeatRequest& request) const {
  if (config_.max_servers() == 0 ||
      request.member_case() != v1::HeartbeatRequest::kServerShard ||
      request.server_shard() < membership_.num_shards())
    return std::nullopt;
  v1::HeartbeatResponse response;
  response.set_job_state(state_);
  response.set_generation(generations_.current());
  *response.mutable_shard_map() = membership_.shard_map();
  return response;
}

v1::ReshardProgress JobStateMachine::ReshardProgressLocked() const {
  v1::ReshardProgress progress = reshard_done_;
  progress.set_target_servers(reshard_target_);
  progress.set_phase(reshard_target_ == 0 ? std::string() : reshard_phase_);
  progress.set_checkpoint_id(reshard_checkpoint_);
  return progress;
}

absl::Status JobStateMachine::AdoptShardCountLocked(const v1::CoordinatorState& state,
                                                    absl::Time now) {
  const uint32_t count = static_cast<uint32_t>(state.shards_size());
  if (count == membership_.num_shards() || config_.max_servers() == 0) return absl::OkStatus();
  if (count == 0 || count > config_.max_servers())
    return absl::InvalidArgumentError(absl::StrCat(
        "the state has ", count, " shards; the job may have 1 to ", config_.max_servers()));
  const v1::ShardMap& map = membership_.shard_map();
  absl::StatusOr<v1::ShardMap> built = BuildShardMap(
      {map.tensors().begin(), map.tensors().end()}, count, config_.chunk_bytes());
  if (!built.ok()) return built.status();
  std::map<uint32_t, Membership::Endpoint> servers;
  for (const v1::ShardEndpoint& e : state.shards())
    servers[e.shard()] = Membership::Endpoint{e.address(), e.incarnation()};
  if (absl::StatusOr<std::map<uint32_t, uint64_t>> dropped =
          membership_.Reshard(*built, servers, now);
      !dropped.ok())
    return dropped.status();
  checkpoints_.set_num_shards(count);
  return absl::OkStatus();
}

}  // namespace grps
