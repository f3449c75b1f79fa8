// QuorumCounts: from which step each live rank counts toward a sync step's
// quorum, as every heartbeat reply tells the shards
// (HeartbeatResponse.live_worker_counts_from). A rank counts at once (0)
// when the job starts, in the coordinator's first answer and after a
// roll-back (every rank resumes at the restore order's step). A rank that
// joins a running sync job while others count (a restarted worker, a new
// one, one that left and came back) counts only from the step a sync
// checkpoint would be cut at then, ahead of every shard, so that all shards
// count it from the same step; until then the others complete steps
// without it. The record is kept
// per rank and incarnation: a rank keeps the step it was given for as long
// as the same incarnation lives. One of JobStateMachine's collaborators;
// not thread-safe (it is used under the machine's mutex).
#ifndef GRPS_COORDINATOR_QUORUM_COUNTS_H_
#define GRPS_COORDINATOR_QUORUM_COUNTS_H_

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <vector>

#include "coordinator/membership.h"

namespace grps {

class QuorumCounts {
 public:
  // What the job is at when a reply is made.
  struct Job {
    uint64_t generation = 0;
    bool running = false;  // JOB_STATE_RUNNING
    // A sync job still training: only then does a joining rank wait.
    bool sync_training = false;
    uint64_t global_step = 0;  // GlobalStep's, 0 when unknown
  };

  // For each rank of `live` (in its order), the step it counts from. `cut`
  // is the step a joining rank counts from (a sync checkpoint's version:
  // ahead of every shard), asked only when a rank joins.
  std::vector<uint64_t> CountsFrom(const Membership::LiveWorkers& live, const Job& job,
                                   const std::function<uint64_t()>& cut);

 private:
  struct Counted {
    uint64_t incarnation = 0;
    uint64_t counts_from = 0;
  };
  // Each live rank's incarnation and the step it counts from, as of the
  // generation noted (none before the first reply).
  std::map<uint32_t, Counted> live_;
  std::optional<uint64_t> generation_;
  // The record was made while the job ran (the ranks that start the job,
  // the last of which registers as it starts, count at once).
  bool while_running_ = false;
};

}  // namespace grps

#endif  // GRPS_COORDINATOR_QUORUM_COUNTS_H_
