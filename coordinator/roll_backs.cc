#include "coordinator/roll_backs.h"

#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "coordinator/words.h"
#include "spdlog/spdlog.h"

namespace grps {

void RollBacks::Back(absl::string_view why, absl::Time now) {
  To(p_.generations->NewestVerified(), why, now);
}

void RollBacks::To(v1::RestoreOrder next, absl::string_view why, absl::Time now) {
  const v1::RestoreOrder& order = p_.generations->Next(std::move(next));
  p_.checkpoints->Fail(absl::StrCat("the job rolled back (generation ", order.generation(), ")"),
                       now);
  const std::vector<uint64_t> resume_steps(order.worker_steps().begin(),
                                           order.worker_steps().end());
  const std::vector<uint32_t> revived = p_.membership->ResetResumeSteps(resume_steps, now);
  p_.data->RollBack(resume_steps);
  ForgetTrainingDone();
  p_.global_step->Forget(now);
  spdlog::warn(
      "{}: job {} rolls back to {} (step {}), generation {}{}", std::string(why), p_.job_id,
      order.checkpoint_id() == 0 ? std::string("the initial values")
                                 : absl::StrCat("checkpoint ", order.checkpoint_id()),
      order.step(), order.generation(),
      revived.empty() ? std::string()
                      : absl::StrCat("; finished ", Members("worker", revived), " train again"));
}

void RollBacks::Follow(uint64_t generation, absl::Time now) {
  const uint64_t was = p_.generations->current();
  if (!p_.generations->JumpTo(generation)) return;
  Back(absl::StrCat("a member runs in generation ", generation, ", this coordinator was at ", was),
       now);
}

void RollBacks::ForgetTrainingDone() {
  p_.ending->Reset();
  p_.cuts->ForgetFinal();
}

}  // namespace grps
