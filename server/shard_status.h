// The status part of a ShardStore: the counters each target keeps, and how
// the targets' counters, versions and tables add up to the shard's
// v1::ShardStatus (what `grpsctl status` and the metrics show).
//
// Accounting unit: one chunk gradient (a sparse push is one). `pushes`
// counts those accepted (duplicates, late and too-stale ones included),
// `duplicates` those recognised as retries, `pulls` the chunks served.
//
// Thread safety: TargetCounters is guarded by its target's mutex;
// AddTargetsStatus takes each target's lock in turn.
#ifndef GRPS_SERVER_SHARD_STATUS_H_
#define GRPS_SERVER_SHARD_STATUS_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "proto/grps.pb.h"

namespace grps {

// Staleness histogram size; the last bucket counts staleness >= its index.
inline constexpr int kStalenessBuckets = 16;

// A target's counters. Those of its state (v1::StateCounters: pushes to
// late_by_worker, not the traffic) are kept by checkpoints and follow the
// state: a restore sets them, a re-sharding moves them with the target.
// Pulls and bytes are this process's traffic and only grow.
struct TargetCounters {
  uint64_t pushes = 0;
  uint64_t duplicates = 0;
  uint64_t updates = 0;
  uint64_t pulls = 0;
  uint64_t bytes_in = 0;
  uint64_t bytes_out = 0;
  uint64_t late_folded = 0;
  uint64_t late_dropped = 0;
  uint64_t too_stale = 0;
  uint64_t staleness_count = 0;
  uint64_t staleness_sum = 0;
  uint64_t staleness_max = 0;
  uint64_t staleness_histogram[kStalenessBuckets] = {};
  std::vector<uint64_t> late_by_worker;  // by rank

  // One update of this staleness (in versions).
  void CountStaleness(uint64_t staleness);
  // Sums (the maximum for staleness_max).
  void Add(const TargetCounters& o);
  // The state's counters, as a checkpoint keeps them.
  void SaveState(v1::StateCounters* out) const;
  // The state's counters from a checkpoint (null: zeros, the initial
  // state's); the traffic is left as it is. late_by_worker keeps its size.
  void LoadState(const v1::StateCounters* saved);
};

class StoreChunk;
class StoreTable;

// Fills the targets' part of `status`: number of chunks and elements, the
// chunks' lowest version (0 without chunks), the counters summed, the held
// gradients, one SparseTableStatus per table. The shard's own fields
// (identity, generation, rejections, checkpoint report, waiting pulls) are
// the store's.
void AddTargetsStatus(const std::vector<std::unique_ptr<StoreChunk>>& chunks,
                      const std::vector<std::unique_ptr<StoreTable>>& tables,
                      v1::ShardStatus* status);

}  // namespace grps

#endif  // GRPS_SERVER_SHARD_STATUS_H_
