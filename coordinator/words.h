// How the coordinator's messages name members and durations, the same in
// every collaborator of the job machine.
#ifndef GRPS_COORDINATOR_WORDS_H_
#define GRPS_COORDINATOR_WORDS_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace grps {

// "30s", "1m5s": a duration in whole seconds; under a second, in whole
// milliseconds ("250ms", not "0").
inline std::string WholeSeconds(absl::Duration d) {
  if (d < absl::Seconds(1))
    return absl::FormatDuration(absl::Milliseconds(absl::ToInt64Milliseconds(d)));
  return absl::FormatDuration(absl::Seconds(absl::ToInt64Seconds(d)));
}

// "shard 1" or "shards 0, 1".
inline std::string Members(absl::string_view noun, const std::vector<uint32_t>& v) {
  return absl::StrCat(noun, v.size() == 1 ? " " : "s ", absl::StrJoin(v, ", "));
}

}  // namespace grps

#endif  // GRPS_COORDINATOR_WORDS_H_
