#include "server/shard_agent.h"

#include <memory>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "daemon/security.h"
#include "job/job_config.h"
#include "job/shard_map.h"
#include "spdlog/spdlog.h"

namespace grps {
namespace {

// RegisterServer, retried by the member agent while the coordinator is
// unreachable or not ready, for up to the options' patience, and without a
// limit while it answers that the shard stands by (a shard the job's map
// does not have yet, until the job scales to it). CANCELLED if a signal
// arrived. `restore_failed`: the order of the previous registration could
// not be followed (the coordinator then answers with the checkpoint before).
absl::StatusOr<v1::RegisterServerResponse> Register(
    v1::Coordinator::StubInterface& coordinator, const ShardRegistration& r, int32_t shard,
    const v1::ShardCheckpoint* restore_failed = nullptr) {
  v1::RegisterServerRequest request;
  request.set_address(r.address);
  request.set_requested_shard(shard);
  if (restore_failed != nullptr) *request.mutable_restore_failed() = *restore_failed;
  RegisterOptions options = r.options;
  options.on_standby = [shard](const absl::Status& standby) {
    spdlog::info("shard {} stands by: {}", shard, std::string(standby.message()));
  };
  return RegisterServer(&coordinator, request, options);
}

// Why a registration ends the process, or nothing when it is one to use.
std::optional<int> RegistrationFailure(
    const absl::StatusOr<v1::RegisterServerResponse>& registration, const ShardRegistration& r) {
  if (!registration.ok()) {
    if (absl::IsCancelled(registration.status())) return 0;
    if (IsJobEnded(registration.status())) {  // started after the job ended
      spdlog::info("{}: nothing to serve", std::string(registration.status().message()));
      return 0;
    }
    spdlog::error("cannot register with the coordinator at {}: {}", r.coordinator_address,
                  std::string(registration.status().message()));
    return 1;
  }
  if (absl::Status valid = ValidateShardMap(registration->shard_map()); !valid.ok()) {
    spdlog::error("invalid job from the coordinator: {}", std::string(valid.message()));
    return 1;
  }
  if (!PerShardStorage(registration->config()) && !r.own_checkpoint_dir.empty() &&
      r.own_checkpoint_dir != registration->config().checkpoint_dir()) {
    spdlog::error("--checkpoint_dir={} is for per-shard checkpoint storage; this job keeps "
                  "every shard's files in the coordinator's {}",
                  r.own_checkpoint_dir, registration->config().checkpoint_dir());
    return 2;
  }
  return std::nullopt;
}

// Whether `map` places `shard`'s chunks otherwise than `before` (a
// re-sharding), rather than only naming other endpoints.
bool PlacedOtherwise(const v1::ShardMap& map, const v1::ShardMap& before, uint32_t shard) {
  return map.shards_size() != before.shards_size() ||
         ChunksOfShard(map, shard) != ChunksOfShard(before, shard);
}

}  // namespace

std::optional<RegisteredShard> RegisterAndLoad(v1::Coordinator::StubInterface& coordinator,
                                               const ShardRegistration& r, int* exit_code) {
  absl::StatusOr<v1::RegisterServerResponse> registration =
      Register(coordinator, r, r.requested_shard);
  for (int refusals = 0;; ++refusals) {
    if (std::optional<int> failed = RegistrationFailure(registration, r)) {
      *exit_code = *failed;
      return std::nullopt;
    }
    const v1::RestoreOrder& order = registration->restore();
    // Heard while it loads, with the secret of this registration.
    SetMemberSecret(registration->member_secret());
    auto heard = std::make_unique<RestoringHeartbeats>(&coordinator, ServerIdentity(*registration),
                                                       registration->config());
    absl::StatusOr<ShardState> loaded =
        LoadRestore(order, registration->config(), registration->shard_map(),
                    registration->shard(), r.own_checkpoint_dir);
    if (loaded.ok())
      return RegisteredShard{std::move(*registration), std::move(*loaded), std::move(heard)};
    heard.reset();
    spdlog::error("cannot restore shard {} from checkpoint {} in {}: {}", registration->shard(),
                  order.checkpoint_id(),
                  OwnCheckpointFolder(registration->config(), order.checkpoint_id(), order.dir(),
                                      r.own_checkpoint_dir),
                  std::string(loaded.status().message()));
    if (order.checkpoint_id() == 0 || refusals == kMaxRestoreRefusals) {
      *exit_code = 1;
      return std::nullopt;
    }
    const v1::ShardCheckpoint failed =
        RestoreFailure(order, registration->shard(), loaded.status());
    registration =
        Register(coordinator, r, static_cast<int32_t>(registration->shard()), &failed);
  }
}

ShardStore::Options StoreOptionsOf(const v1::RegisterServerResponse& registration,
                                   const std::string& address) {
  ShardStore::Options options;
  options.config = registration.config();
  options.shard_map = registration.shard_map();
  options.shard = registration.shard();
  options.incarnation = registration.incarnation();
  options.address = address;
  return options;
}

ShardAgent::ShardAgent(MemberAgent& agent, ShardStores& stores, Options options)
    : agent_(agent),
      stores_(stores),
      options_(std::move(options)),
      coordinator_timeout_(absl::Milliseconds(store().config().coordinator_timeout_ms() > 0
                                                  ? store().config().coordinator_timeout_ms()
                                                  : 60000)),
      checkpointer_(std::make_unique<ShardCheckpointer>(&store(), options_.own_checkpoint_dir)),
      map_(store().shard_map()) {}

ShardEnding ShardAgent::Run() {
  MemberAgent::Handlers handlers;
  handlers.fill = [this](v1::HeartbeatRequest* request) { Fill(request); };
  handlers.on_error = [this](const grpc::Status& status) { return OnError(status); };
  handlers.on_reply = [this](const v1::HeartbeatResponse& r) { return OnReply(r); };
  agent_.Run(handlers);
  return ending_;
}

void ShardAgent::Fill(v1::HeartbeatRequest* request) const {
  *request->mutable_shard() = options_.status(store());
  if (restore_failed_.has_value())
    *request->mutable_shard()->mutable_restore_failed() = *restore_failed_;
  request->set_shard_map_epoch(map_.epoch());
  request->set_generation(store().generation());
}

MemberAgent::Next ShardAgent::OnError(const grpc::Status& status) {
  if (status.error_code() == grpc::StatusCode::FAILED_PRECONDITION) {
    // Our incarnation is stale: another server has taken this shard.
    ending_ = {1, absl::StrCat("shard ", store().shard(), " was taken over by another server (",
                               status.error_message(), ")")};
    return MemberAgent::Next::kStop;
  }
  // Training goes on without the coordinator; keep trying, for a while.
  if (failures_++ % 20 == 0)
    spdlog::warn("heartbeat to {} failed ({}); still serving", options_.coordinator_address,
                 status.error_message());
  if (agent_.Silence() > coordinator_timeout_) {
    ending_ = {1, absl::StrCat("no answer from the coordinator for ",
                               absl::FormatDuration(coordinator_timeout_))};
    return MemberAgent::Next::kStop;
  }
  return MemberAgent::Next::kGoOn;
}

MemberAgent::Next ShardAgent::OnReply(const v1::HeartbeatResponse& response) {
  if (failures_ > 0) spdlog::info("coordinator reachable again");
  failures_ = 0;
  const v1::JobState state = response.job_state();
  if (state == v1::JOB_STATE_COMPLETED || state == v1::JOB_STATE_STOPPED) {
    ending_.reason = absl::StrCat("job ", JobStateName(state));
    SendFinalReport();
    return MemberAgent::Next::kStop;
  }
  if (state == v1::JOB_STATE_FAILED) {
    ending_ = {1, "job failed"};
    return MemberAgent::Next::kStop;
  }
  if (std::optional<ShardEnding> end = FollowMap(response)) {
    ending_ = *std::move(end);
    return MemberAgent::Next::kStop;
  }
  if (response.has_checkpoint()) checkpointer_->MaybeStart(response.checkpoint());
  // Until the job runs, every rank counts toward a step's quorum, so an
  // early worker cannot complete step 0 alone.
  if (state == v1::JOB_STATE_RUNNING)
    store().SetLiveWorkers(std::vector<uint32_t>(response.live_workers().begin(),
                                                 response.live_workers().end()),
                           std::vector<uint64_t>(response.live_worker_incarnations().begin(),
                                                 response.live_worker_incarnations().end()),
                           std::vector<uint64_t>(response.live_worker_counts_from().begin(),
                                                 response.live_worker_counts_from().end()));
  return MemberAgent::Next::kGoOn;
}

void ShardAgent::SendFinalReport() {
  v1::HeartbeatRequest last;
  Fill(&last);
  last.set_final_report(true);
  v1::HeartbeatResponse ignored;
  agent_.Beat(std::move(last), &ignored, absl::Seconds(2)).IgnoreError();
}

std::optional<ShardEnding> ShardAgent::FollowMap(const v1::HeartbeatResponse& response) {
  if (response.has_shard_map() && response.shard_map().epoch() > map_.epoch()) {
    if (absl::Status valid = ValidateShardMap(response.shard_map()); !valid.ok())
      return ShardEnding{
          1, absl::StrCat("invalid shard map from the coordinator: ", valid.message())};
    map_ = response.shard_map();
  }
  if (store().shard() >= static_cast<uint32_t>(map_.shards_size())) return Retire();
  if (!response.has_restore() || response.restore().generation() <= store().generation())
    return std::nullopt;
  if (PlacedOtherwise(map_, store().shard_map(), store().shard()))
    return Reshard(response.restore());
  return RollBack(response.restore());
}

// A roll-back order for the shard's chunks as they are placed now: restores
// the store in place, or refuses the order.
std::optional<ShardEnding> ShardAgent::RollBack(const v1::RestoreOrder& order) {
  absl::Status restored;
  {
    RestoringHeartbeats heard(agent_.coordinator(), agent_.identity(), store().config());
    absl::StatusOr<ShardState> states = LoadRestore(order, store().config(), store().shard_map(),
                                                    store().shard(), options_.own_checkpoint_dir);
    restored = states.ok() ? store().Restore(order.generation(), order.checkpoint_id(),
                                             states->chunks, order.worker_steps(), states->tables)
                           : states.status();
  }
  if (!restored.ok()) return RefuseRestore(order, restored);
  restore_failed_.reset();
  spdlog::info("shard {} rolled back to checkpoint {} at step {} (generation {})",
               store().shard(), order.checkpoint_id(), order.step(), order.generation());
  return std::nullopt;
}

std::optional<ShardEnding> ShardAgent::RefuseRestore(const v1::RestoreOrder& order,
                                                     const absl::Status& why) {
  if (order.checkpoint_id() == 0)
    return ShardEnding{
        1, absl::StrCat("cannot roll back to the initial values: ", why.message())};
  if (!restore_failed_.has_value() || restore_failed_->id() != order.checkpoint_id())
    spdlog::error("shard {} cannot roll back to checkpoint {}: {}; reported", store().shard(),
                  order.checkpoint_id(), std::string(why.message()));
  restore_failed_ = RestoreFailure(order, store().shard(), why);
  return std::nullopt;
}

// The map has no place for this shard any more: the shard leaves, as at
// the end of the job.
ShardEnding ShardAgent::Retire() {
  SendFinalReport();
  return ShardEnding{0, absl::StrCat("shard ", store().shard(), " retired: the job re-sharded to ",
                                     map_.shards_size(), " shards")};
}

// A roll-back into map_, which places this shard's chunks otherwise: the
// state for them is loaded (a checkpoint restores into any shard count
// with shared storage) into a new store, which replaces the current one.
std::optional<ShardEnding> ShardAgent::Reshard(const v1::RestoreOrder& order) {
  const uint32_t shard = store().shard();
  ShardStore::Options options;
  options.config = store().config();
  options.config.set_num_servers(static_cast<uint32_t>(map_.shards_size()));
  options.shard_map = map_;
  options.shard = shard;
  options.incarnation = agent_.identity().incarnation;
  options.address = options_.address;
  absl::StatusOr<std::unique_ptr<ShardStore>> next = absl::UnknownError("not loaded");
  {
    RestoringHeartbeats heard(agent_.coordinator(), agent_.identity(), options.config);
    absl::StatusOr<ShardState> loaded =
        LoadRestore(order, options.config, map_, shard, options_.own_checkpoint_dir);
    next = loaded.ok() ? CreateStore(std::move(options), order, *std::move(loaded))
                       : absl::StatusOr<std::unique_ptr<ShardStore>>(loaded.status());
  }
  if (!next.ok()) return RefuseRestore(order, next.status());
  restore_failed_.reset();
  const v1::ShardStatus restored = (*next)->ShardStatus();
  Replace(*std::move(next));
  spdlog::info("shard {} re-sharded: {} shards (map epoch {}), {} chunks from checkpoint {} at "
               "step {} (generation {}); counts restored: {}",
               shard, map_.shards_size(), map_.epoch(), store().chunk_ids().size(),
               order.checkpoint_id(), order.step(), order.generation(), StateCounts(restored));
  return std::nullopt;
}

// Serves `next` in place of the current store: attached first, then the
// old store is shut down (its waiting pulls fail UNAVAILABLE, and the
// workers retry on the new one; a capture in progress ends) and kept, and
// its checkpointer is joined.
void ShardAgent::Replace(std::unique_ptr<ShardStore> next) {
  options_.attach(*next);
  std::unique_ptr<ShardStore> old = std::exchange(stores_.current, std::move(next));
  old->Shutdown();
  checkpointer_->Join();
  checkpointer_ = std::make_unique<ShardCheckpointer>(&store(), options_.own_checkpoint_dir,
                                                      checkpointer_.get());
  stores_.retired.push_back(std::move(old));
}

}  // namespace grps
