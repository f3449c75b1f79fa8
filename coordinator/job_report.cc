#include "coordinator/job_report.h"

#include <algorithm>
#include <optional>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "coordinator/job_summary.h"
#include "coordinator/words.h"

namespace grps {

v1::JobConfig JobReport::MemberConfig() const {
  return p_.model->MemberConfig(p_.membership->num_shards());
}

v1::JobStatus JobReport::Status(bool training_done, absl::Time now) const {
  const Membership& membership = *p_.membership;
  v1::JobStatus status;
  status.set_job_id(p_.config->job_id());
  p_.phase->AddTo(&status, now);
  status.set_mode(p_.config->mode());
  *status.mutable_config() = MemberConfig();
  for (v1::WorkerStatus& w : membership.WorkerStatuses(now)) *status.add_workers() = std::move(w);
  for (v1::ShardStatus& s : membership.ShardStatuses(now)) *status.add_shards() = std::move(s);
  SummarizeJobStatus(&status);
  if (std::optional<uint32_t> evaluator =
          p_.ending->Evaluator(p_.phase->ended(), training_done, now);
      evaluator.has_value())
    status.set_evaluator_rank(*evaluator);
  std::optional<Membership::Evaluation> eval = membership.latest_evaluation();
  status.set_test_accuracy(eval.has_value() ? eval->accuracy : -1);
  status.set_test_loss(eval.has_value() ? eval->loss : -1);
  if (eval.has_value() && eval->auc.has_value()) status.set_test_auc(*eval->auc);
  p_.ending->AddTo(&status);
  p_.checkpoints->AddTo(&status);
  status.set_generation(p_.generations->current());
  if (p_.phase->running() && p_.global_step->moved() != absl::InfinitePast())
    status.set_global_step_idle_seconds(
        std::max(0.0, absl::ToDoubleSeconds(now - p_.global_step->moved())));
  p_.data->AddTo(&status);
  AddCompletionWarnings(&status);
  if (p_.phase->waiting()) status.set_message(WaitingMessage());
  status.set_membership_epoch(membership.membership_epoch());
  status.set_map_epoch(membership.shard_map().epoch());
  if (p_.resharding->enabled()) *status.mutable_reshard() = p_.resharding->Progress();
  return status;
}

v1::CoordinatorState JobReport::State(bool training_done, absl::Time now) const {
  v1::CoordinatorState state;
  *state.mutable_config() = MemberConfig();
  p_.phase->ExportTo(&state, now);
  p_.generations->ExportTo(&state);
  p_.checkpoints->ExportTo(&state);
  p_.data->ExportTo(&state);
  p_.resharding->ExportTo(&state);
  p_.membership->ExportTo(&state);
  state.set_unix_time_ms(static_cast<uint64_t>(std::max<int64_t>(0, absl::ToUnixMillis(now))));
  if (p_.phase->ended()) *state.mutable_final_status() = Status(training_done, now);
  return state;
}

std::string JobReport::WaitingMessage() const {
  std::vector<std::string> missing;
  const std::vector<uint32_t> shards = p_.membership->UnregisteredShards();
  const std::vector<uint32_t> ranks = p_.membership->UnregisteredRanks();
  if (!shards.empty()) missing.push_back(Members("shard", shards));
  if (!ranks.empty()) missing.push_back(Members("worker", ranks));
  return absl::StrCat("waiting for ", absl::StrJoin(missing, " and "), " to register");
}

}  // namespace grps
