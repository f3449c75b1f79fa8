// CheckpointCuts: where and when the job's checkpoints are cut, one of
// JobStateMachine's collaborators. CheckpointScheduler keeps the checkpoint
// in flight and the record; this decides the cut from what Membership and
// GlobalStep know: a sync cut a margin ahead of every shard (the finished
// workers' step once training is done), async and ssp at the workers'
// steps; the periodic trigger and the timeout; and the final checkpoint
// once training is done, waited for at most CheckpointScheduler::kTimeout.
//
// It reads the membership and the global step it is given and changes only
// the scheduler and its own state; not thread-safe (every call is made under
// the machine's mutex, which guards all four).
#ifndef GRPS_COORDINATOR_CHECKPOINT_CUTS_H_
#define GRPS_COORDINATOR_CHECKPOINT_CUTS_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "coordinator/checkpoint_scheduler.h"
#include "coordinator/global_step.h"
#include "coordinator/membership.h"
#include "proto/grps.pb.h"

namespace grps {

class CheckpointCuts {
 public:
  // The job as a cut sees it now.
  struct Job {
    // RUNNING, no rank ALIVE and one FINISHED.
    bool training_done = false;
    // A coordinator that took the job over (its step rate is measured anew).
    bool taken_over = false;
    // Training is done and every live server heard the final live set: the
    // shards' versions are final.
    bool versions_final = false;
  };

  // The three outlive this; `config` must be valid.
  CheckpointCuts(const v1::JobConfig& config, CheckpointScheduler* scheduler,
                 const Membership* membership, const GlobalStep* global_step);

  // Asks for a checkpoint now (none may be pending; `why` is logged).
  // UNAVAILABLE while a shard is not alive, and in sync while training,
  // before every live shard said its version or while the step rate since
  // a take-over is not measured yet.
  absl::StatusOr<v1::CheckpointRequest> Start(const Job& job, absl::Time now,
                                              absl::string_view why) {
    return StartAt(job, now, why, 0);
  }
  // The pending checkpoint's id, or, with none pending, the id of one asked
  // for now (Start's refusals).
  absl::StatusOr<uint64_t> Join(const Job& job, absl::Time now, absl::string_view why);
  // The version a sync checkpoint asked for now should have.
  uint64_t SyncVersion(const Job& job) const;
  // Fails a pending checkpoint past its timeout (true if so) and, while the
  // job trains (`training`), asks for a periodic one when it is due. A sync
  // one by steps is asked for early enough to be cut exactly
  // checkpoint_every_steps past the last cut, unless the shards are already
  // too close to that step (a job that does that many steps faster than a
  // checkpoint is cut and written): then it is cut as soon as it can be, a
  // margin ahead of them. No periodic sync cut is asked for while the step
  // moves at a rate not measured yet (as the job starts), before a shard
  // has passed the last cut (nothing new to save), nor at the last step
  // (the final checkpoint is cut there).
  bool Tick(const Job& job, bool training, absl::Time now);

  // Training is done: the final checkpoint has completed, failed, was not
  // possible, or has been waited for long enough (it is asked for here).
  bool FinalSettled(const Job& job, absl::Time now);
  // Training is not done any more (a roll-back, a rank back): the final
  // checkpoint is forgotten.
  void ForgetFinal();

 private:
  // Start's work; a sync cut while training is at `not_before` when that is
  // further than SyncVersion (the caller keeps it below the last step).
  absl::StatusOr<v1::CheckpointRequest> StartAt(const Job& job, absl::Time now,
                                                absl::string_view why, uint64_t not_before);
  // The highest version a live shard reported.
  uint64_t HighestShardVersion() const;
  // The steps the job may do in a heartbeat interval, at the fastest rate
  // measured lately.
  double StepsPerHeartbeat() const;
  // Sync with final versions that differ: why no cut at `step` can
  // complete; "" otherwise.
  std::string SplitShards(const Job& job, uint64_t step) const;
  // The highest total_steps / step any worker reported.
  uint64_t MaxWorkerTotal() const;
  uint64_t MaxWorkerStep() const;

  const std::string job_id_;
  const v1::ConsistencyMode mode_;
  const uint32_t heartbeat_interval_ms_;
  CheckpointScheduler* const scheduler_;
  const Membership* const membership_;
  const GlobalStep* const global_step_;
  // The final checkpoint: asked for (its id), settled, and the deadline of
  // the wait for it (InfiniteFuture until training is done).
  uint64_t final_id_ = 0;
  bool final_settled_ = false;
  absl::Time final_deadline_ = absl::InfiniteFuture();
  // No final checkpoint is asked for again before this (one failed, with
  // final_error_).
  absl::Time final_retry_at_ = absl::InfinitePast();
  std::string final_error_;
};

}  // namespace grps

#endif  // GRPS_COORDINATOR_CHECKPOINT_CUTS_H_
