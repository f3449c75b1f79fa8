// Heartbeats: what a member's heartbeat records and what its reply carries,
// one of JobStateMachine's collaborators. The machine orders a heartbeat's
// events (adopt, follow a newer generation, roll back for a checkpoint a
// shard cannot restore, re-derive the phase: JobStateMachine::Heartbeat);
// this class makes each step's record:
//
//   - Record: the heartbeat in Membership (a worker's progress only when it
//     runs in the current generation);
//   - Adopt: a member this coordinator never registered (it took the job
//     over), or a newer incarnation of one it knows;
//   - ServerReport: a server's checkpoint report, and the checkpoint it is
//     asked to write;
//   - WorkerReport: a worker's generation, and its end when its heartbeat
//     says it finished (its WorkerDone was lost with a coordinator);
//   - Reply: the job's state and generation, the restore order for a member
//     behind, the live set and the step each live rank counts from in a
//     sync step (QuorumCounts, the one state of its own), the evaluator,
//     the map, a drain, a claim for examples; and who heard the end;
//   - RetiredReply: a server whose shard the job no longer has hears the
//     map instead.
//
// Not thread-safe: every call is made under the machine's mutex, which
// guards the collaborators too.
#ifndef GRPS_COORDINATOR_HEARTBEATS_H_
#define GRPS_COORDINATOR_HEARTBEATS_H_

#include <cstdint>
#include <functional>
#include <optional>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "coordinator/checkpoint_scheduler.h"
#include "coordinator/elastic_data.h"
#include "coordinator/generations.h"
#include "coordinator/global_step.h"
#include "coordinator/job_ending.h"
#include "coordinator/job_phase.h"
#include "coordinator/membership.h"
#include "coordinator/quorum_counts.h"
#include "coordinator/resharding.h"
#include "proto/grps.pb.h"

namespace grps {

class Heartbeats {
 public:
  // The heartbeat interval asked of members while the job is ending.
  static constexpr uint32_t kEndingHeartbeatMs = 50;

  // The collaborators it reads and records in (they outlive it).
  struct Parts {
    const v1::JobConfig* config = nullptr;
    JobPhase* phase = nullptr;
    Membership* membership = nullptr;
    Generations* generations = nullptr;
    CheckpointScheduler* checkpoints = nullptr;
    JobEnding* ending = nullptr;
    ElasticData* data = nullptr;
    const GlobalStep* global_step = nullptr;
    const Resharding* resharding = nullptr;
  };
  // What a reply says of the job beyond its collaborators.
  struct Job {
    bool training_done = false;
    // The member has followed the current restore order.
    bool current_generation = true;
    // The step a rank that joins a sync job counts from (a sync cut's
    // version), asked only when one joins.
    std::function<uint64_t()> sync_version;
  };

  explicit Heartbeats(Parts parts) : p_(std::move(parts)) {}

  // Records the heartbeat of a member Membership knows: NOT_FOUND for one
  // it does not, FAILED_PRECONDITION for another incarnation.
  absl::Status Record(const v1::HeartbeatRequest& request, bool current_generation,
                      absl::Time now);
  // Whether a member whose heartbeat Record refused with `refused` is one
  // to adopt (then Record again).
  static bool Adoptable(const v1::HeartbeatRequest& request, const absl::Status& refused);
  // Takes in the member of `request` with its incarnation (INVALID_ARGUMENT
  // without one; FAILED_PRECONDITION once the job ended; Membership's
  // refusals); the job counts as taken over.
  absl::Status Adopt(const v1::HeartbeatRequest& request, absl::Time now);

  // A server's checkpoint report, and the checkpoint it is asked for into
  // `response`; true if the report failed the pending checkpoint.
  bool ServerReport(const v1::HeartbeatRequest& request, absl::Time now,
                    v1::HeartbeatResponse* response);
  // A worker's generation, and its end said by its heartbeat.
  void WorkerReport(const v1::HeartbeatRequest& request, bool current_generation,
                    absl::Time now);

  // The reply to a recorded heartbeat. Once the job ended, notes that the
  // member heard it (the caller tells the waits).
  void Reply(const v1::HeartbeatRequest& request, const Job& job, absl::Time now,
             v1::HeartbeatResponse* response);
  // A heartbeat of a server whose shard the job no longer has (re-sharded
  // away): the reply that tells it (the map); nullopt for a shard the job
  // has.
  std::optional<v1::HeartbeatResponse> RetiredReply(const v1::HeartbeatRequest& request) const;

 private:
  const Parts p_;
  // From which step each live rank counts toward a sync step's quorum.
  QuorumCounts quorum_counts_;
};

}  // namespace grps

#endif  // GRPS_COORDINATOR_HEARTBEATS_H_
