// ConsistencyPolicy: every rule of a consistency mode, in one place per mode.
// A policy decides, for one target (a dense chunk, or a sparse table's part
// on a shard: both are "chunks" below), what a gradient becomes (added to a sync
// step, applied now, held, late, too stale), with which learning rate, when
// a pull from a worker at a given clock may be answered, and how a
// checkpoint cuts the chunk (at which version, and what of the dedup marks
// it keeps). The ShardStore around it owns the chunk's values, lock and
// counters, deduplicates retried pushes and keeps the waiting pulls; it asks
// the policy and does as told, and branches on no mode itself.
//
//   sync_policy.cc   BSP, with backup workers and late gradients (fold/drop)
//   async_policy.cc  ASP: every gradient applied on arrival
//   ssp_policy.cc    SSP(s): applied on arrival, clocks at most s apart
//
// One ChunkPolicy exists per chunk. Thread safety: every method is called
// with the chunk's mutex held (the ShardStore's contract), so a ChunkPolicy
// needs no lock of its own.
#ifndef GRPS_SERVER_CONSISTENCY_POLICY_H_
#define GRPS_SERVER_CONSISTENCY_POLICY_H_

#include <cstdint>
#include <optional>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "proto/grps.pb.h"

namespace grps {

// The workers that count, as the coordinator last reported them.
struct LiveSet {
  std::vector<bool> live;                // by rank
  std::vector<uint64_t> incarnations;    // by rank; 0 = unknown
  uint32_t count = 0;                    // number of live ranks
  // By rank (missing: 0): sync counts a live rank toward the quorum of the
  // step at a chunk's version from this version on.
  std::vector<uint64_t> counts_from;

  // Ranks [0, live) of num_workers live (all of them by default): before
  // the coordinator's first word, the ranks that start the job.
  static LiveSet All(uint32_t num_workers);
  static LiveSet First(uint32_t num_workers, uint32_t live);
  bool contains(uint32_t rank) const { return rank < live.size() && live[rank]; }
  // Live, and counted toward the quorum of the step open at `version`.
  bool CountsAt(uint32_t rank, uint64_t version) const {
    return contains(rank) && (rank >= counts_from.size() || counts_from[rank] <= version);
  }
};

// One gradient as a policy sees it: a dense chunk's num_elements values, or
// a sparse table's rows (`ids`, distinct, with ids.size() x dim values).
struct GradientRef {
  absl::Span<const float> values;
  absl::Span<const int64_t> ids;  // empty for a dense chunk
};

// A gradient a policy keeps past the call that brought it: the sum of an
// open sync step, or an ssp gradient held back. Made by the target it
// belongs to (UpdateTarget::NewBuffer), in that target's shape.
class GradientBuffer {
 public:
  virtual ~GradientBuffer() = default;
  virtual void Add(const GradientRef& g) = 0;  // this += g
  virtual void Scale(float factor) = 0;        // this *= factor
  virtual void Clear() = 0;                    // back to zero (empty)
  // Valid until the buffer next changes.
  virtual GradientRef Ref() const = 0;
};

// What one update runs: the program's optimizer for it (its kind and
// hyperparameters, PushRequest.optimizers; valid for the Apply call) or,
// when null, the job's, at learning rate `lr` (already the schedule's or
// the program's, as the mode scales it).
struct UpdateStep {
  float lr = 0;
  const v1::OptimizerConfig* optimizer = nullptr;
};

// What a policy updates: a dense chunk or a sparse table (its part on this
// shard). The caller holds the target's lock.
class UpdateTarget {
 public:
  virtual ~UpdateTarget() = default;
  virtual uint64_t version() const = 0;
  // A zero gradient of this target's shape.
  virtual std::unique_ptr<GradientBuffer> NewBuffer() = 0;
  // One optimizer update from `grad` as `step` says: version + 1, and
  // pulls are re-examined. `staleness` is recorded in the shard's
  // histogram when the mode measures it (< 0: not).
  virtual void Apply(const GradientRef& grad, const UpdateStep& step, int64_t staleness) = 0;
};

// One gradient of one chunk, past deduplication.
struct ChunkGradientMeta {
  uint32_t rank = 0;
  uint64_t incarnation = 0;
  uint64_t clock = 0;         // the worker's step (PushRequest.step)
  uint64_t base_version = 0;  // the chunk version it was computed on
  // The program's optimizer for the update (PushRequest.optimizers, valid
  // for the call: a policy that keeps it copies it); null: the job's.
  const v1::OptimizerConfig* optimizer = nullptr;
};

// What became of an accepted gradient.
enum class GradientFate {
  kAggregated,   // sync: added to the open step
  kApplied,      // async / ssp: applied now
  kHeld,         // ssp: applied once every live worker has finished reading its clock - s
  kLateFolded,   // sync: its step completed; added to the open step
  kLateDropped,  // sync: its step completed; counted only
  kTooStale,     // async / ssp: staler than max_staleness; counted only
};

bool IsLate(GradientFate fate);

// How a chunk joins a checkpoint (ChunkPolicy::Cut).
enum class CheckpointCut {
  kNow,    // its state as it is now
  kArmed,  // its state the moment an update brings it to the cut version
  kPast,   // it is past the cut version: the checkpoint fails
};

class ChunkPolicy {
 public:
  virtual ~ChunkPolicy() = default;

  // Whether the gradient can be taken at all. A refusal (FAILED_PRECONDITION)
  // changes nothing. The store checks every chunk of a push before it accepts
  // any, so a push is all-or-nothing. Every mode refuses a gradient computed
  // on a version the chunk never had; that is the default.
  virtual absl::Status Check(const ChunkGradientMeta& g,
                             const UpdateTarget& chunk) const;

  // Takes a checked gradient (`grad` lives for the call only) and says what
  // became of it; may apply updates through `chunk`.
  virtual GradientFate Accept(const ChunkGradientMeta& g, const GradientRef& grad,
                              UpdateTarget& chunk, const LiveSet& live) = 0;

  // Whether a pull from `rank` at `clock` may be answered now. May note the
  // rank's rejoin (ssp), hence not const.
  virtual bool ReadyToServe(uint32_t rank, uint64_t clock,
                            const UpdateTarget& chunk, const LiveSet& live) = 0;

  // The chunk's values were just read by `rank` at `clock`. May apply held
  // updates (ssp); returns true if it did.
  virtual bool Served(uint32_t rank, uint64_t clock, UpdateTarget& chunk,
                      const LiveSet& live) {
    return false;
  }

  // The chunk's values were just read by `rank` in a pull without a clock
  // (a plain read: a tool's, a final-weights read). No mode counts it as a
  // step's read today (ssp finishes nothing with it: its pushes do). Returns
  // true if it applied held updates.
  virtual bool ServedWithoutClock(uint32_t rank, UpdateTarget& chunk,
                                  const LiveSet& live) {
    return false;
  }

  // A push of `g` was recognised as one already applied (the chunk's mark;
  // after a restore, a step the checkpoint holds and the worker computed
  // again). ssp counts its clock as applied unless the gradient is still
  // held. Returns true if that applied held updates.
  virtual bool Duplicate(const ChunkGradientMeta& g, UpdateTarget& chunk,
                         const LiveSet& live) {
    return false;
  }

  // The live set changed (a worker died, finished, came back or restarted).
  // May complete a step or apply held updates; returns true if it did.
  virtual bool LiveSetChanged(UpdateTarget& chunk, const LiveSet& live) = 0;

  // The chunk version a pusher is told for a gradient that became `fate`:
  // by default the chunk's version now (sync: the version at which the
  // gradient's step completes).
  virtual uint64_t AckVersion(const ChunkGradientMeta& g, GradientFate fate,
                              const UpdateTarget& chunk) const {
    return chunk.version();
  }

  // Gradients accepted but not yet applied, right now (ssp's held ones).
  virtual uint64_t held() const { return 0; }

  // ---- Checkpoints ----

  // How the chunk joins a checkpoint asked for at `version` (0: no version
  // named). Default (async, ssp): each chunk as it is now.
  virtual CheckpointCut Cut(uint64_t version, const UpdateTarget& chunk) const {
    return CheckpointCut::kNow;
  }

  // What a checkpoint of the chunk as it is now keeps of `rank`'s dedup
  // mark; `mark` comes with the rank's newest accepted push. A push whose
  // gradient the values do not hold yet (in sync's open step, or held by
  // ssp) must be taken again after a roll-back to this checkpoint, so the
  // mark is moved back before it. Returns the step from which the rank must
  // compute again, if the mode knows one (ssp). Default: the mark as it is.
  virtual std::optional<uint64_t> KeepMark(uint32_t rank, const UpdateTarget& chunk,
                                           v1::DedupMark* mark) const {
    return std::nullopt;
  }

  // How many accepted gradients a checkpoint of the chunk as it is now does
  // not hold, and their ranks push again after a restore (KeepMark keeps
  // their marks before them): sync's contributions to the open step, ssp's
  // held gradients. The checkpoint's push count leaves them out, so that
  // they are not counted twice. Default: none.
  virtual uint64_t NotKept(const UpdateTarget& chunk) const { return 0; }

  // The policy is new on a chunk that was restored or rolled back: rank r
  // resumes at step resume_steps[r], not at clock 0. A rank without an
  // entry resumes where it says at its first pull.
  virtual void Restored(absl::Span<const uint64_t> resume_steps) {}
};

// Async and ssp: whether a gradient of this staleness is refused by the
// job's max_staleness (0 = no limit).
bool TooStale(const v1::JobConfig& config, uint64_t staleness);

// The policy of `config`'s mode for one target (a chunk or a sparse table).
// `config` must be valid.
std::unique_ptr<ChunkPolicy> MakeChunkPolicy(const v1::JobConfig& config);

// The modes, for tests and for MakeChunkPolicy.
std::unique_ptr<ChunkPolicy> MakeSyncPolicy(const v1::JobConfig& config);
std::unique_ptr<ChunkPolicy> MakeAsyncPolicy(const v1::JobConfig& config);
std::unique_ptr<ChunkPolicy> MakeSspPolicy(const v1::JobConfig& config);

}  // namespace grps

#endif  // GRPS_SERVER_CONSISTENCY_POLICY_H_
