// CheckpointScheduler: the coordinator's side of one checkpoint at a time
// (docs/durability.md). It decides when a periodic checkpoint is due, hands
// out the CheckpointRequest that heartbeat replies carry to each shard until
// that shard reports, collects the shards' reports, and builds the manifest
// once every shard's file is WRITTEN. The caller writes the manifest (file
// I/O, outside its lock) and reports how that went.
//
// Life of a checkpoint: Start -> PENDING; every shard WRITTEN ->
// TakeManifestToWrite (now "writing": no further report changes it) ->
// FinishWrite OK -> COMPLETE, or an error -> FAILED. Any shard FAILED,
// Fail() (a roll-back, a timeout) -> FAILED. After a failure the next
// periodic trigger comes at once, after further failures after a back-off
// that doubles per failure, and
// consecutive_failures() tells the caller to ask with a larger margin.
//
// Time is passed in. Not thread-safe: JobStateMachine serializes calls.
#ifndef GRPS_COORDINATOR_CHECKPOINT_SCHEDULER_H_
#define GRPS_COORDINATOR_CHECKPOINT_SCHEDULER_H_

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "proto/grps.pb.h"

namespace grps {

class CheckpointScheduler {
 public:
  // A checkpoint not complete this long after it was asked for fails.
  static constexpr absl::Duration kTimeout = absl::Seconds(60);
  // After the first failure the next periodic checkpoint may be asked for at
  // once; after the n-th failure in a row (n >= 2), not sooner than
  // kRetryBackoff * 2^(n-2) (at most 64 times).
  static constexpr absl::Duration kRetryBackoff = absl::Seconds(1);

  // `config` gives checkpoint_dir (empty: disabled), the periodic rules and
  // the mode; `num_shards` the shards that must report.
  CheckpointScheduler(const v1::JobConfig& config, uint32_t num_shards);

  bool enabled() const { return !root_.empty(); }
  // The job re-sharded: later checkpoints need `num_shards` reports.
  // Requires none pending.
  void set_num_shards(uint32_t num_shards) { num_shards_ = num_shards; }

  // The newest complete checkpoint is `manifest` (in `dir`): a job resumed
  // from it, or a coordinator that took the job back. Periodic rules count
  // from its step.
  void SetNewestComplete(const v1::CheckpointManifest& manifest, const std::string& dir,
                         uint64_t completed);
  // The asking coordinator's incarnation, put in every request; a report
  // that names another is not an answer to this coordinator's request.
  void set_coordinator_incarnation(uint64_t incarnation) { coordinator_incarnation_ = incarnation; }
  // Ids below this are never handed out (folders that exist already).
  void SetNextId(uint64_t id);
  uint64_t next_id() const { return next_id_; }

  // A periodic checkpoint is due: enabled, none pending, and `step` has
  // reached NextStepDue(), or checkpoint_every_seconds have passed since the
  // last one was asked for (or since the first call). In async and ssp mode
  // `step` is the global step; in sync mode it is the furthest step a cut
  // asked for now may be at, so that the cut can be asked for before the
  // shards pass NextStepDue() and be at exactly that step.
  bool Due(uint64_t step, absl::Time now);
  // The step the next checkpoint by steps is due at (0: not by steps):
  // checkpoint_every_steps past the last one asked for (or the resumed
  // checkpoint) — past its cut in sync mode, past the global step it was
  // asked at in async and ssp mode.
  uint64_t NextStepDue() const { return every_steps_ > 0 ? last_step_ + every_steps_ : 0; }
  // The step the periodic rule counts from: the last checkpoint's cut (sync)
  // or global step (async, ssp) when it was asked for, or the resumed one.
  uint64_t last_step() const { return last_step_; }

  // Asks for checkpoint next_id() at `version` (sync: a step boundary;
  // async/ssp: 0) with the workers' resume steps. Requires enabled() and
  // none pending. The periodic rule counts from `version` in sync mode and
  // from `global_step` otherwise.
  v1::CheckpointRequest Start(uint64_t version, std::vector<uint64_t> worker_steps,
                              uint64_t global_step, absl::Time now);

  bool pending() const { return pending_.has_value(); }
  // The pending request, for a shard that has not reported it yet.
  std::optional<v1::CheckpointRequest> RequestFor(uint32_t shard) const;

  // A shard's report (ShardStatus.checkpoint). Reports of other ids, or of
  // shards that already reported, are ignored. A FAILED report fails the
  // checkpoint. Malformed reports (a file name with a path) fail it too.
  void Report(uint32_t shard, const v1::ShardCheckpoint& report, absl::Time now);

  // When every shard has reported WRITTEN and no one is writing it yet: the
  // manifest to write (the checkpoint is then "writing"). `shard_map` and
  // `config` are recorded in it.
  std::optional<v1::CheckpointManifest> TakeManifestToWrite(const v1::ShardMap& shard_map,
                                                            const v1::JobConfig& config,
                                                            absl::Time now);
  // The manifest write of checkpoint `id` ended with `status`.
  void FinishWrite(uint64_t id, const absl::Status& status, absl::Time now);

  // Fails the pending checkpoint (unless it is being written) with `error`.
  void Fail(absl::string_view error, absl::Time now);
  // The pending checkpoint is older than kTimeout and not being written.
  bool TimedOut(absl::Time now) const;

  // A warning the job's status carries from now on, and a coordinator that
  // takes the job over: what the job's resume refused.
  void AddWarning(std::string warning) { warnings_.push_back(std::move(warning)); }
  // Why the job ends without its final checkpoint ("" once it has one, or
  // may still get one): a warning while set, which names the newest
  // complete checkpoint, if any.
  void set_final_missing(std::string why) { final_missing_ = std::move(why); }

  // Summaries for JobStatus: the newest complete one (id 0 if none), the
  // pending one or else the last failed one (id 0 if none).
  const v1::CheckpointSummary& last_complete() const { return last_complete_; }
  v1::CheckpointSummary pending_summary() const;
  // Worker steps of the newest complete checkpoint (by rank).
  const std::vector<uint64_t>& last_complete_worker_steps() const {
    return last_complete_worker_steps_;
  }
  uint64_t completed() const { return completed_; }
  uint32_t consecutive_failures() const { return consecutive_failures_; }
  // The pending checkpoint's id, or of the last that ended (0 if none).
  uint64_t latest_id() const { return next_id_ - 1; }
  // The state of checkpoint `id` as far as this scheduler knows.
  v1::CheckpointSummary SummaryOf(uint64_t id) const;

  // What ExportTo wrote: the next id, and the newest complete checkpoint
  // from its manifest (`newest`, nullopt when it cannot be read).
  void TakeOver(const v1::CoordinatorState& state,
                const std::optional<v1::CheckpointManifest>& newest);
  // The newest complete, the pending (or last failed) checkpoint, the count
  // completed and the warnings into a status.
  void AddTo(v1::JobStatus* status) const;
  // The next id, the newest complete checkpoint and the count completed
  // into a persisted state (what SetNextId and SetNewestComplete take).
  void ExportTo(v1::CoordinatorState* state) const;

 private:
  struct Pending {
    v1::CheckpointRequest request;
    std::vector<uint64_t> worker_steps;
    absl::Time started;
    std::map<uint32_t, v1::ShardCheckpoint> reports;  // by shard
    bool writing = false;
  };
  void EndFailed(std::string error, absl::Time now);
  // The step the pending checkpoint holds: the version asked for in sync
  // mode; else the lowest version at which a shard holding any state was
  // cut.
  uint64_t CutStep() const;

  const std::string root_;
  const v1::ConsistencyMode mode_;
  const uint64_t every_steps_;
  const absl::Duration every_;
  uint32_t num_shards_;
  std::string job_id_;

  uint64_t next_id_ = 1;
  uint64_t coordinator_incarnation_ = 0;
  std::optional<Pending> pending_;
  v1::CheckpointSummary last_complete_;
  std::vector<uint64_t> last_complete_worker_steps_;
  v1::CheckpointSummary last_failed_;
  uint64_t completed_ = 0;
  uint32_t consecutive_failures_ = 0;
  std::vector<std::string> warnings_;
  std::string final_missing_;
  // Periodic rule anchors: the step (sync: the cut) and time of the last
  // checkpoint asked for; no periodic checkpoint before retry_after_.
  uint64_t last_step_ = 0;
  absl::Time last_time_ = absl::InfinitePast();
  absl::Time retry_after_ = absl::InfinitePast();
};

}  // namespace grps

#endif  // GRPS_COORDINATOR_CHECKPOINT_SCHEDULER_H_
