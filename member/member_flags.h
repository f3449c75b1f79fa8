// The member side's flags, declared once for grps-server and grps-worker.
#ifndef GRPS_MEMBER_MEMBER_FLAGS_H_
#define GRPS_MEMBER_MEMBER_FLAGS_H_

#include <cstdint>

#include "absl/flags/declare.h"
#include "member/member_agent.h"

ABSL_DECLARE_FLAG(int32_t, register_timeout_s);

namespace grps {

// How this process registers: RegisterOptions with --register_timeout_s
// (at least a second) as its patience.
RegisterOptions RegisterOptionsFromFlags();

}  // namespace grps

#endif  // GRPS_MEMBER_MEMBER_FLAGS_H_
