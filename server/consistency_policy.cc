#include "server/consistency_policy.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace grps {

LiveSet LiveSet::All(uint32_t num_workers) { return First(num_workers, num_workers); }

LiveSet LiveSet::First(uint32_t num_workers, uint32_t live) {
  live = std::min(live, num_workers);
  LiveSet s;
  s.live.assign(num_workers, false);
  std::fill(s.live.begin(), s.live.begin() + live, true);
  s.incarnations.assign(num_workers, 0);
  s.count = live;
  return s;
}

bool IsLate(GradientFate fate) {
  return fate == GradientFate::kLateFolded || fate == GradientFate::kLateDropped;
}

absl::Status ChunkPolicy::Check(const ChunkGradientMeta& g,
                                const UpdateTarget& chunk) const {
  if (g.base_version > chunk.version())
    return absl::FailedPreconditionError(absl::StrCat(
        "gradient computed on version ", g.base_version,
        " but the chunk is only at version ", chunk.version()));
  return absl::OkStatus();
}

bool TooStale(const v1::JobConfig& config, uint64_t staleness) {
  return config.max_staleness() > 0 && staleness > config.max_staleness();
}

std::unique_ptr<ChunkPolicy> MakeChunkPolicy(const v1::JobConfig& config) {
  switch (config.mode()) {
    case v1::MODE_ASYNC:
      return MakeAsyncPolicy(config);
    case v1::MODE_SSP:
      return MakeSspPolicy(config);
    default:  // MODE_SYNC; ValidateJobConfig admits nothing else.
      return MakeSyncPolicy(config);
  }
}

}  // namespace grps
