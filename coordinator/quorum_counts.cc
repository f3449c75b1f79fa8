#include "coordinator/quorum_counts.h"

#include <utility>

#include "spdlog/spdlog.h"

namespace grps {

std::vector<uint64_t> QuorumCounts::CountsFrom(const Membership::LiveWorkers& live,
                                               const Job& job,
                                               const std::function<uint64_t()>& cut) {
  // A coordinator's first answer, the first since the job runs, or one
  // after a roll-back: every live rank counts.
  const bool fresh =
      !generation_.has_value() || *generation_ != job.generation || !while_running_;
  generation_ = job.generation;
  while_running_ = job.running;
  bool others_count = false;
  for (size_t i = 0; i < live.ranks.size(); ++i) {
    auto it = live_.find(live.ranks[i]);
    if (it != live_.end() && it->second.incarnation == live.incarnations[i] &&
        it->second.counts_from <= job.global_step)
      others_count = true;
  }
  const bool later = !fresh && others_count && job.running && job.sync_training;
  std::map<uint32_t, Counted> now_live;
  std::vector<uint64_t> out;
  for (size_t i = 0; i < live.ranks.size(); ++i) {
    const uint32_t rank = live.ranks[i];
    auto it = live_.find(rank);
    Counted counted{live.incarnations[i], 0};
    if (it != live_.end() && it->second.incarnation == counted.incarnation) {
      counted = it->second;
    } else if (later) {
      counted.counts_from = cut();
      spdlog::info("worker {} (incarnation {}) counts toward the sync steps from step {}", rank,
                   counted.incarnation, counted.counts_from);
    }
    now_live[rank] = counted;
    out.push_back(counted.counts_from);
  }
  live_ = std::move(now_live);
  return out;
}

}  // namespace grps
