#include "coordinator/job_ending.h"

#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "coordinator/words.h"
#include "spdlog/spdlog.h"

namespace grps {

JobEnding::JobEnding(std::string job_id, const Membership* membership)
    : job_id_(std::move(job_id)), membership_(membership) {}

bool JobEnding::NoteTrainingDone() {
  if (announced_) return false;
  announced_ = true;
  return true;
}

void JobEnding::Reset() {
  announced_ = false;
  acks_.clear();
  asked_.reset();
  final_eval_.reset();
  declined_ = false;
}

std::string JobEnding::TrainingDoneMessage() const {
  const std::vector<uint32_t> dead = membership_->RanksInState(v1::MEMBER_STATE_DEAD);
  const std::vector<uint32_t> left = membership_->RanksInState(v1::MEMBER_STATE_LEFT);
  if (dead.empty() && left.empty()) return "every worker finished";
  std::vector<std::string> gone;
  if (!dead.empty()) gone.push_back(absl::StrCat(Members("worker", dead), " died"));
  if (!left.empty()) gone.push_back(absl::StrCat(Members("worker", left), " left"));
  return absl::StrCat(absl::StrJoin(gone, " and "), " before finishing; the others finished");
}

void JobEnding::NoteServerHeartbeat(uint32_t shard) {
  const uint64_t incarnation = membership_->shard_map().shards(shard).incarnation();
  const uint64_t epoch = membership_->membership_epoch();
  auto it = acks_.find(shard);
  if (it != acks_.end() && it->second.incarnation == incarnation &&
      it->second.membership_epoch == epoch) {
    it->second.heard = true;
    return;
  }
  // This reply is the first to carry the final live set to this server.
  acks_[shard] = {incarnation, epoch, /*heard=*/false};
}

bool JobEnding::ServersHeardFinalLiveSet() const {
  const uint64_t epoch = membership_->membership_epoch();
  for (uint32_t shard : membership_->ShardsInState(v1::MEMBER_STATE_ALIVE)) {
    auto it = acks_.find(shard);
    if (it == acks_.end() || !it->second.heard || it->second.membership_epoch != epoch ||
        it->second.incarnation != membership_->shard_map().shards(shard).incarnation())
      return false;
  }
  return true;
}

std::optional<uint32_t> JobEnding::Evaluator(bool ended, bool training_done,
                                             absl::Time now) const {
  if (ended) {
    if (final_eval_.has_value()) return final_evaluator_;
    return std::nullopt;
  }
  const std::vector<uint32_t> candidates =
      training_done ? membership_->FinishedRanksHeartbeating(now)
                    : membership_->RanksInState(v1::MEMBER_STATE_ALIVE);
  if (candidates.empty()) return std::nullopt;
  return candidates.front();
}

void JobEnding::AskedToEvaluate(uint32_t rank) {
  if (asked_ == rank) return;
  asked_ = rank;
  spdlog::info("job {}: worker {} evaluates the final weights", job_id_, rank);
}

std::string JobEnding::RecordEvaluation(uint32_t rank, const Membership::Evaluation& eval,
                                        bool final) {
  // Only weights read after training was done are final.
  if (final) {
    final_eval_ = eval;
    final_evaluator_ = rank;
  }
  return absl::StrCat(final ? "; final test accuracy "
                            : "; test accuracy (not final: training is not done) ",
                      eval.accuracy, ", loss ", eval.loss);
}

std::optional<std::string> JobEnding::Completion(absl::Time now) const {
  if (final_eval_.has_value()) return TrainingDoneMessage();
  if (declined_)
    return absl::StrCat(TrainingDoneMessage(),
                        "; no final evaluation: the evaluating worker's program has none");
  if (membership_->FinishedRanksHeartbeating(now).empty())
    return absl::StrCat(TrainingDoneMessage(),
                        "; no final evaluation: no finished worker was still heartbeating "
                        "to run it");
  return std::nullopt;
}

void JobEnding::AddTo(v1::JobStatus* status) const {
  status->set_has_final_eval(final_eval_.has_value());
  if (final_eval_.has_value()) {
    status->set_final_test_accuracy(final_eval_->accuracy);
    status->set_final_test_loss(final_eval_->loss);
    if (final_eval_->auc.has_value()) status->set_final_test_auc(*final_eval_->auc);
  }
}

void JobEnding::ToldEnd(const v1::HeartbeatRequest& request) {
  if (request.member_case() == v1::HeartbeatRequest::kWorkerRank)
    ranks_told_end_.insert(request.worker_rank());
  else if (request.final_report())
    shards_told_end_.insert(request.server_shard());
}

bool JobEnding::EveryLiveMemberSawEnd(absl::Time now) const {
  for (uint32_t shard : membership_->ShardsInState(v1::MEMBER_STATE_ALIVE))
    if (shards_told_end_.count(shard) == 0) return false;
  for (uint32_t rank : membership_->RanksInState(v1::MEMBER_STATE_ALIVE))
    if (ranks_told_end_.count(rank) == 0) return false;
  for (uint32_t rank : membership_->FinishedRanksHeartbeating(now))
    if (ranks_told_end_.count(rank) == 0) return false;
  return true;
}

}  // namespace grps
