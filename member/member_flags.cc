#include "member/member_flags.h"

#include <algorithm>

#include "absl/flags/flag.h"
#include "absl/time/time.h"

ABSL_FLAG(int32_t, register_timeout_s,
          static_cast<int32_t>(absl::ToInt64Seconds(grps::kRegisterTimeout)),
          "how long to keep registering while the coordinator is unreachable or not "
          "ready for this member (a worker's registration waits for every shard; a "
          "user model's job takes servers once its first worker defined the model), "
          "then exit 1; a standby server (a shard the job has not scaled to yet) waits "
          "without a limit");

namespace grps {

RegisterOptions RegisterOptionsFromFlags() {
  RegisterOptions options;
  options.patience = absl::Seconds(std::max(1, absl::GetFlag(FLAGS_register_timeout_s)));
  return options;
}

}  // namespace grps
