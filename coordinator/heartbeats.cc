#include "coordinator/heartbeats.h"

#include <algorithm>
#include <utility>
#include <vector>

#include "spdlog/spdlog.h"

namespace grps {

absl::Status Heartbeats::Record(const v1::HeartbeatRequest& request, bool current_generation,
                                absl::Time now) {
  Membership& membership = *p_.membership;
  bool revived = false;
  if (request.member_case() == v1::HeartbeatRequest::kWorkerRank) {
    absl::Status s = membership.WorkerHeartbeat(
        request.worker_rank(), request.incarnation(),
        request.has_progress() && current_generation ? &request.progress() : nullptr, now,
        &revived);
    if (s.ok() && revived)
      spdlog::info("worker {} is alive again; membership epoch {}", request.worker_rank(),
                   membership.membership_epoch());
    return s;
  }
  absl::Status s = membership.ServerHeartbeat(request.server_shard(), request.incarnation(),
                                              request.shard(), now, &revived);
  if (s.ok() && revived) spdlog::info("server of shard {} is alive again", request.server_shard());
  return s;
}

bool Heartbeats::Adoptable(const v1::HeartbeatRequest& request, const absl::Status& refused) {
  return !refused.ok() && request.incarnation() != 0 &&
         (absl::IsNotFound(refused) || absl::IsFailedPrecondition(refused));
}

absl::Status Heartbeats::Adopt(const v1::HeartbeatRequest& request, absl::Time now) {
  Membership& membership = *p_.membership;
  if (request.incarnation() == 0)
    return absl::InvalidArgumentError("heartbeat without an incarnation");
  if (p_.phase->ended()) return p_.phase->EndedError();
  if (request.member_case() == v1::HeartbeatRequest::kServerShard) {
    if (absl::Status s = membership.AdoptServer(request.server_shard(), request.incarnation(),
                                                request.shard().address(), now);
        !s.ok())
      return s;
    spdlog::info(
        "adopted the server of shard {} at {} (incarnation {}) from its "
        "heartbeat; shard map epoch {}",
        request.server_shard(), request.shard().address(), request.incarnation(),
        membership.shard_map().epoch());
  } else {
    if (absl::Status s =
            membership.AdoptWorker(request.worker_rank(), request.incarnation(), request.finished(),
                                   request.has_progress() ? &request.progress() : nullptr, now);
        !s.ok())
      return s;
    spdlog::info("adopted worker {} (incarnation {}{}) from its heartbeat", request.worker_rank(),
                 request.incarnation(), request.finished() ? ", finished" : "");
  }
  p_.phase->NoteRegistration(now);
  p_.phase->NoteAdoption();
  return absl::OkStatus();
}

bool Heartbeats::ServerReport(const v1::HeartbeatRequest& request, absl::Time now,
                              v1::HeartbeatResponse* response) {
  CheckpointScheduler& checkpoints = *p_.checkpoints;
  const uint32_t shard = request.server_shard();
  bool failed = false;
  if (request.shard().has_checkpoint()) {
    const bool was_pending = checkpoints.pending();
    const uint64_t id = checkpoints.pending_summary().id();
    checkpoints.Report(shard, request.shard().checkpoint(), now);
    if (was_pending && !checkpoints.pending()) {
      spdlog::warn("checkpoint {} failed: {}", id, checkpoints.SummaryOf(id).error());
      failed = true;
    }
  }
  if (std::optional<v1::CheckpointRequest> ask = checkpoints.RequestFor(shard);
      ask.has_value() && !p_.phase->ended())
    *response->mutable_checkpoint() = std::move(*ask);
  return failed;
}

void Heartbeats::WorkerReport(const v1::HeartbeatRequest& request, bool current_generation,
                              absl::Time now) {
  const uint32_t rank = request.worker_rank();
  p_.generations->NoteWorker(rank, request.incarnation(), request.generation());
  if (!request.finished() || !request.has_progress() || !current_generation || p_.phase->ended())
    return;
  // Its WorkerDone reached a coordinator that died before it saved it: the
  // heartbeat says what WorkerDone said.
  const std::vector<uint32_t> finished = p_.membership->RanksInState(v1::MEMBER_STATE_FINISHED);
  if (std::find(finished.begin(), finished.end(), rank) == finished.end() &&
      p_.membership->FinishWorker(rank, request.incarnation(), request.progress(), now).ok())
    spdlog::info("worker {} finished at step {} (said by its heartbeat)", rank,
                 request.progress().step());
}

void Heartbeats::Reply(const v1::HeartbeatRequest& request, const Job& job, absl::Time now,
                       v1::HeartbeatResponse* response) {
  const Membership& membership = *p_.membership;
  const bool worker = request.member_case() == v1::HeartbeatRequest::kWorkerRank;
  const bool ended = p_.phase->ended();
  response->set_job_state(p_.phase->state());
  response->set_generation(p_.generations->current());
  if (job.training_done || ended)
    response->set_next_heartbeat_ms(
        std::min(kEndingHeartbeatMs, p_.config->heartbeat_interval_ms()));
  if (!job.current_generation) *response->mutable_restore() = p_.generations->order();
  Membership::LiveWorkers live = membership.live_workers();
  response->mutable_live_workers()->Add(live.ranks.begin(), live.ranks.end());
  response->mutable_live_worker_incarnations()->Add(live.incarnations.begin(),
                                                    live.incarnations.end());
  const std::vector<uint64_t> counts_from =
      quorum_counts_.CountsFrom(live,
                                {p_.generations->current(), p_.phase->running(),
                                 p_.config->mode() == v1::MODE_SYNC && !job.training_done,
                                 p_.global_step->step().value_or(0)},
                                job.sync_version);
  if (std::any_of(counts_from.begin(), counts_from.end(), [](uint64_t s) { return s > 0; }))
    response->mutable_live_worker_counts_from()->Add(counts_from.begin(), counts_from.end());
  response->set_membership_epoch(membership.membership_epoch());
  if (std::optional<uint32_t> evaluator = p_.ending->Evaluator(ended, job.training_done, now);
      evaluator.has_value() && !ended) {
    response->set_evaluator_rank(*evaluator);
    if (worker && request.worker_rank() == *evaluator && job.training_done &&
        p_.ending->ServersHeardFinalLiveSet()) {
      response->set_evaluate_final(true);
      p_.ending->AskedToEvaluate(*evaluator);
    }
  }
  if (request.shard_map_epoch() < membership.shard_map().epoch())
    *response->mutable_shard_map() = membership.shard_map();
  if (worker && membership.DrainRequested(request.worker_rank())) response->set_drain(true);
  // A worker blocked in a sync step behind one that waits for the limbo
  // would not lease again by itself.
  if (worker && p_.data->ClaimAwaited(request.worker_rank())) response->set_claim_examples(true);
  if (ended) p_.ending->ToldEnd(request);
}

std::optional<v1::HeartbeatResponse> Heartbeats::RetiredReply(
    const v1::HeartbeatRequest& request) const {
  if (!p_.resharding->enabled() || request.member_case() != v1::HeartbeatRequest::kServerShard ||
      request.server_shard() < p_.membership->num_shards())
    return std::nullopt;
  v1::HeartbeatResponse response;
  response.set_job_state(p_.phase->state());
  response.set_generation(p_.generations->current());
  *response.mutable_shard_map() = p_.membership->shard_map();
  return response;
}

}  // namespace grps
