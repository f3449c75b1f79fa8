#include "coordinator/worker_requests.h"

#include <algorithm>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "coordinator/words.h"
#include "job/job_config.h"
#include "spdlog/spdlog.h"

namespace grps {

absl::StatusOr<v1::RegisterWorkerResponse> WorkerRequests::Register(
    absl::Mutex* mu, const v1::RegisterWorkerRequest& request, const JobWait& wait,
    const std::function<bool(uint64_t incarnation)>& proves) {
  // Unset: any free rank (a request that says nothing must not take over
  // rank 0).
  const int32_t requested_rank = request.has_requested_rank() ? request.requested_rank() : -1;
  if (absl::Status s =
          p_.membership->ValidateWorkerRequest(requested_rank, request.host(), request.backend());
      !s.ok())
    return s;
  // Take no rank before the map is complete: a worker that gives up waiting
  // must not hold one.
  if (absl::Status s = p_.waits->UntilDone(
          mu, wait, [&] { return p_.membership->AllShardsRegistered() || p_.phase->ended(); },
          [&] {
            return absl::DeadlineExceededError(
                absl::StrCat("waiting for ", Members("shard", p_.membership->UnregisteredShards()),
                             " to register"));
          },
          &waiting_);
      !s.ok())
    return s;
  if (p_.phase->ended()) {
    if (requested_rank >= 0) ranks_awaited_.erase(requested_rank);
    return p_.phase->EndedError();
  }
  const absl::Time now = p_.clock();
  const std::optional<uint64_t> live =
      requested_rank < 0 ? std::nullopt : p_.membership->LiveIncarnation(requested_rank);
  // A rank that joins a running elastic job enters the quorum once it is
  // ready to train (its first lease), not while it loads its data.
  const bool joining = IsElastic(config()) && p_.phase->running();
  absl::StatusOr<Membership::Registration> reg =
      p_.membership->RegisterWorker(requested_rank, request.host(), request.backend(), now,
                                    live.has_value() && proves(*live), joining);
  if (absl::IsAlreadyExists(reg.status())) ranks_awaited_.insert(requested_rank);
  if (!reg.ok()) return reg.status();
  ranks_awaited_.erase(reg->slot);
  p_.phase->NoteRegistration(now);
  const bool joins = p_.phase->running() && (reg->rejoined || reg->slot >= config().num_workers());
  if (joins) p_.phase->NoteJoin();
  // An earlier incarnation's leases come back; a rank that joins an elastic
  // job runs no older clock than the slowest live rank (its data is leased,
  // not tied to its step).
  p_.data->ReturnLeases(reg->slot);
  if (joins && IsElastic(config()))
    reg->start_step = std::max(reg->start_step, SlowestLiveStep(reg->slot));
  spdlog::info(
      "worker on {} ({}) {} rank {} (incarnation {}, start step {}); membership "
      "epoch {}",
      request.host(), request.backend(), reg->rejoined ? "re-registered" : "registered", reg->slot,
      reg->incarnation, reg->start_step, p_.membership->membership_epoch());
  v1::RegisterWorkerResponse response;
  response.set_rank(reg->slot);
  response.set_incarnation(reg->incarnation);
  response.set_start_step(reg->start_step);
  response.set_generation(p_.generations->current());
  *response.mutable_config() = p_.model->MemberConfig(p_.membership->num_shards());
  *response.mutable_shard_map() = p_.membership->shard_map();
  return response;
}

absl::Status WorkerRequests::Done(const v1::WorkerDoneRequest& request, absl::Time now) {
  // A rank that finished in an older generation finished training the job
  // rolled back from: it trains again.
  if (p_.generations->StaleWorkerDone(request))
    return absl::AbortedError(absl::StrCat(
        "job rolled back to checkpoint ", p_.generations->order().checkpoint_id(), " (generation ",
        p_.generations->current(), "); resume from the restore order"));
  if (request.leaving()) return Leave(request, now);
  if (absl::Status s = p_.membership->FinishWorker(request.worker_rank(), request.incarnation(),
                                                   request.progress(), now);
      !s.ok())
    return s;
  p_.data->ReturnLeases(request.worker_rank());
  std::string eval_note;
  if (request.has_final_eval() && !p_.phase->ended()) {
    Membership::Evaluation eval{request.final_test_accuracy(), request.final_test_loss(),
                                std::nullopt};
    if (request.has_final_test_auc()) eval.auc = request.final_test_auc();
    p_.membership->RecordEvaluation(eval);
    eval_note = p_.ending->RecordEvaluation(request.worker_rank(), eval,
                                            p_.phase->TrainingDone(*p_.membership));
  } else if (request.no_final_eval() && !p_.phase->ended() &&
             p_.phase->TrainingDone(*p_.membership)) {
    p_.ending->Decline();
    eval_note = "; its program has no final evaluation";
  }
  spdlog::info("worker {} finished at step {}{}", request.worker_rank(), request.progress().step(),
               eval_note);
  return absl::OkStatus();
}

absl::Status WorkerRequests::Leave(const v1::WorkerDoneRequest& request, absl::Time now) {
  const bool drained = p_.membership->DrainRequested(request.worker_rank());
  const std::vector<uint32_t> left = p_.membership->RanksInState(v1::MEMBER_STATE_LEFT);
  const bool said_before = std::find(left.begin(), left.end(), request.worker_rank()) != left.end();
  if (absl::Status s = p_.membership->LeaveWorker(request.worker_rank(), request.incarnation(),
                                                  request.progress(), now);
      !s.ok())
    return s;
  if (said_before) return absl::OkStatus();  // a retry
  p_.phase->NoteLeave();
  p_.data->ReturnLeases(request.worker_rank());
  const Membership::LiveWorkers live = p_.membership->live_workers();
  spdlog::info(
      "worker {} left the job after step {} ({}); live workers: {}; membership "
      "epoch {}",
      request.worker_rank(), request.progress().step(), drained ? "drained" : "on its own",
      live.ranks.empty() ? "none" : absl::StrJoin(live.ranks, ", "),
      p_.membership->membership_epoch());
  return absl::OkStatus();
}

uint64_t WorkerRequests::SlowestLiveStep(uint32_t except) const {
  const std::vector<v1::WorkerStatus> workers = p_.membership->WorkerStatuses(p_.clock());
  std::optional<uint64_t> slowest;
  for (uint32_t rank : p_.membership->live_workers().ranks) {
    const uint64_t step = workers[rank].progress().step();
    if (rank != except) slowest = std::min(slowest.value_or(step), step);
  }
  return slowest.value_or(0);
}

absl::StatusOr<v1::LeaseExamplesResponse> WorkerRequests::Lease(
    const v1::LeaseExamplesRequest& request) {
  if (!IsElastic(config()))
    return absl::FailedPreconditionError(
        absl::StrCat("job ", config().job_id(),
                     " is not elastic (no max_workers): its workers split the "
                     "training set by rank"));
  if (p_.phase->ended()) return p_.phase->EndedError();
  if (p_.generations->IsOlder(request.generation()))
    return absl::AbortedError(absl::StrCat("job rolled back to generation ",
                                           p_.generations->current(),
                                           "; lease again once the restore order is followed"));
  const std::optional<uint64_t> live = p_.membership->LiveIncarnation(request.worker_rank());
  if (!live.has_value() || *live != request.incarnation())
    return absl::FailedPreconditionError(
        absl::StrCat("worker rank ", request.worker_rank(), " incarnation ", request.incarnation(),
                     " is not a live incarnation: it leases no examples"));
  // A refused request leaves the ledger, the rank's readiness and the
  // membership epoch as they were.
  if (absl::Status s = p_.data->Admit(config(), request); !s.ok()) return s;
  if (p_.membership->MarkReady(request.worker_rank()))
    spdlog::info("worker {} is ready to train: it joins the live set; membership epoch {}",
                 request.worker_rank(), p_.membership->membership_epoch());
  return p_.data->Grant(request, p_.membership->live_workers().ranks,
                        p_.phase->MayDeclareDeaths(p_.clock()));
}

absl::Status WorkerRequests::Drain(uint32_t rank) {
  if (!p_.phase->running())
    return absl::FailedPreconditionError(absl::StrCat("the job is ",
                                                      JobStateName(p_.phase->state()),
                                                      ": workers are drained from a running job"));
  // The live workers that stay: a rank drained already leaves too, even if
  // it has not yet (it finishes its step first).
  size_t staying = 0;
  for (uint32_t r : p_.membership->live_workers().ranks)
    if (r != rank && !p_.membership->DrainRequested(r)) ++staying;
  const uint32_t min_workers = std::max<uint32_t>(1, config().min_workers());
  if (IsElastic(config()) && staying < min_workers &&
      p_.membership->LiveIncarnation(rank).has_value() && !p_.membership->DrainRequested(rank))
    return absl::FailedPreconditionError(
        absl::StrCat("draining worker ", rank, " would leave ", staying,
                     " live workers, fewer than the job's ", "min_workers (", min_workers, ")"));
  if (absl::Status s = p_.membership->RequestDrain(rank); !s.ok()) return s;
  spdlog::info("worker {} drained by an operator: it leaves after its step in progress", rank);
  return absl::OkStatus();
}

}  // namespace grps
