// SSP(s): bounded staleness (Ho et al. 2013).
//
// Clocks. A worker's clock is its step (PushRequest.step / PullRequest.clock).
// Per rank the chunk keeps the clocks it has applied (one past the newest
// step applied) and finished reading (below). A worker that comes back after
// being declared dead, or restarts as a new incarnation, rejoins at the
// slowest live worker's clock: its own clocks are shifted by an offset fixed
// at its first pull, so that it neither stalls the others while it catches up
// nor races ahead of them.
//
// Pulls. A pull at clock c waits until every live worker has applied clock
// c - s, i.e. the slowest live worker is at most s clocks behind. Workers
// that are dead or finished do not count, so a dead worker stalls nobody
// beyond the heartbeat timeout.
//
// Pushes. A gradient of clock c is applied on arrival as in async (learning
// rate AsyncLearningRate, staleness measured, max_staleness refused and
// counted) once every live worker has finished reading clock c - s; until
// then it is held. A worker has finished reading clock c once it pushes a
// gradient of clock c (computed on what it read) or pulls clock c + 1: it
// reads no clock up to c again. Serving a pull is not enough: its reply can
// be lost on the way (a connection broken mid-reply), and the worker, which
// cannot tell that from a pull the shard never saw, reads the same clock
// again; until it pushes, it gets the same values. So every read at clock c,
// a first one or one again, sees no update of clock c + s or later. With s =
// 0 every worker computes clock c on exactly the weights after clocks
// 0..c-1, which makes ssp(0) with SGD produce the weights of sync; with large
// s it is async. Too-stale is judged on arrival.
#include <algorithm>
#include <deque>
#include <limits>
#include <optional>
#include <vector>

#include "job/job_config.h"
#include "server/consistency_policy.h"

namespace grps {
namespace {

class SspPolicy final : public ChunkPolicy {
 public:
  explicit SspPolicy(const v1::JobConfig& config)
      : config_(config),
        s_(config.staleness_bound()),
        workers_(JobRanks(config)),
        applied_(workers_, 0),
        finished_(workers_, -1),
        offset_(workers_, 0),
        rejoining_(workers_, false),
        was_live_(workers_, true),
        incarnation_(workers_, 0) {}

  GradientFate Accept(const ChunkGradientMeta& g, const GradientRef& grad,
                      UpdateTarget& chunk, const LiveSet& live) override {
    const uint64_t staleness = chunk.version() - g.base_version;  // on arrival
    const int64_t clock = Effective(g.rank, g.clock);
    // Its gradient of `clock` says the rank is done reading it, whatever
    // becomes of the gradient; that may let in others' held gradients.
    Finished(g.rank, clock);
    ReleaseHeld(chunk, live);
    if (TooStale(config_, staleness)) return GradientFate::kTooStale;
    if (!FenceOpen(clock, live)) {
      std::unique_ptr<GradientBuffer> copy = chunk.NewBuffer();
      copy->Add(grad);
      std::optional<v1::OptimizerConfig> optimizer;
      if (g.optimizer != nullptr) optimizer = *g.optimizer;
      held_.push_back(
          Held{g.rank, clock, g.base_version, std::move(copy), std::move(optimizer)});
      return GradientFate::kHeld;
    }
    ApplyOne(g.rank, clock, g.base_version, grad, g.optimizer, chunk);
    return GradientFate::kApplied;
  }

  bool ReadyToServe(uint32_t rank, uint64_t clock, const UpdateTarget& chunk,
                    const LiveSet& live) override {
    if (rejoining_[rank]) {
      rejoining_[rank] = false;
      const int64_t slowest = SlowestApplied(live, rank);
      const int64_t own = static_cast<int64_t>(clock);
      offset_[rank] =
          slowest != kNone && slowest > own ? slowest - own : 0;
      applied_[rank] = std::max(applied_[rank], own + offset_[rank]);
      Finished(rank, own + offset_[rank] - 1);  // it reads nothing older
    }
    const int64_t slowest = SlowestApplied(live, kNobody);
    return slowest == kNone || slowest >= Effective(rank, clock) - s_;
  }

  // A read of clock c finishes the reading of c - 1, not of c: its reply
  // may never reach the worker.
  bool Served(uint32_t rank, uint64_t clock, UpdateTarget& chunk,
              const LiveSet& live) override {
    Finished(rank, Effective(rank, clock) - 1);
    return ReleaseHeld(chunk, live);
  }

  // A read without a clock is no step of the rank's (a final-weights read,
  // a tool's): it finishes nothing.
  bool ServedWithoutClock(uint32_t, UpdateTarget&, const LiveSet&) override { return false; }

  bool LiveSetChanged(UpdateTarget& chunk, const LiveSet& live) override {
    for (uint32_t r = 0; r < workers_; ++r) {
      const bool now_live = live.contains(r);
      const uint64_t inc = r < live.incarnations.size() ? live.incarnations[r] : 0;
      const bool new_incarnation =
          inc != 0 && incarnation_[r] != 0 && inc != incarnation_[r];
      if (now_live && (!was_live_[r] || new_incarnation)) rejoining_[r] = true;
      was_live_[r] = now_live;
      if (inc != 0) incarnation_[r] = inc;
    }
    return ReleaseHeld(chunk, live);
  }

  uint64_t held() const override { return held_.size(); }

  uint64_t NotKept(const UpdateTarget&) const override { return held(); }

  bool Duplicate(const ChunkGradientMeta& g, UpdateTarget& chunk,
                 const LiveSet& live) override {
    const int64_t clock = Effective(g.rank, g.clock);
    Finished(g.rank, clock);
    // Its first copy may still be held: then it is not applied yet.
    const bool held = std::any_of(held_.begin(), held_.end(), [&](const Held& h) {
      return h.rank == g.rank && h.clock <= clock;
    });
    if (!held) applied_[g.rank] = std::max(applied_[g.rank], clock + 1);
    return ReleaseHeld(chunk, live);
  }

  // A held gradient is not in the values: the rank computes it again from
  // its step, and the mark must not say it was applied.
  std::optional<uint64_t> KeepMark(uint32_t rank, const UpdateTarget&,
                                   v1::DedupMark* mark) const override {
    const std::optional<uint64_t> held = LowestHeldStep(rank);
    if (!held.has_value() || !mark->valid() || mark->step() < *held) return std::nullopt;
    if (*held == 0)
      mark->set_valid(false);
    else
      mark->set_step(*held - 1);
    return held;
  }

  // Every rank resumes at its step of the checkpoint, which every shard is
  // told alike: the clocks start there, without offsets, so all shards agree
  // on who waits for whom. (Offsets fixed at each shard's first pull would
  // depend on the order pulls reach that shard; two shards that disagree by
  // more than the bound each wait on the other.) A rank without a resume
  // step rejoins at its first pull.
  void Restored(absl::Span<const uint64_t> resume_steps) override {
    for (uint32_t r = 0; r < workers_; ++r) {
      offset_[r] = 0;
      if (r >= resume_steps.size()) {
        rejoining_[r] = true;
        continue;
      }
      const int64_t step = static_cast<int64_t>(resume_steps[r]);
      rejoining_[r] = false;
      applied_[r] = step;       // clocks 0..step-1 are in the checkpoint
      finished_[r] = step - 1;  // and were computed on what it read before
    }
  }

 private:
  static constexpr int64_t kNone = std::numeric_limits<int64_t>::min();
  static constexpr uint32_t kNobody = std::numeric_limits<uint32_t>::max();

  struct Held {
    uint32_t rank;
    int64_t clock;
    uint64_t base_version;
    std::unique_ptr<GradientBuffer> grad;
    std::optional<v1::OptimizerConfig> optimizer;  // the program's for it, if any
  };

  // The lowest step of `rank`'s held gradients, if any.
  std::optional<uint64_t> LowestHeldStep(uint32_t rank) const {
    std::optional<uint64_t> lowest;
    for (const Held& h : held_) {
      if (h.rank != rank) continue;
      const uint64_t step = static_cast<uint64_t>(std::max<int64_t>(0, h.clock - offset_[rank]));
      if (!lowest.has_value() || step < *lowest) lowest = step;
    }
    return lowest;
  }

  int64_t Effective(uint32_t rank, uint64_t clock) const {
    return static_cast<int64_t>(clock) + offset_[rank];
  }

  bool Counts(uint32_t r, const LiveSet& live) const {
    return live.contains(r) && !rejoining_[r];
  }

  // The lowest applied clock over the live ranks other than `except`, or
  // kNone when there are none.
  int64_t SlowestApplied(const LiveSet& live, uint32_t except) const {
    int64_t slowest = kNone;
    for (uint32_t r = 0; r < workers_; ++r)
      if (r != except && Counts(r, live) &&
          (slowest == kNone || applied_[r] < slowest))
        slowest = applied_[r];
    return slowest;
  }

  void Finished(uint32_t rank, int64_t clock) {
    finished_[rank] = std::max(finished_[rank], clock);
  }

  // Every live worker has finished reading clock `clock - s`.
  bool FenceOpen(int64_t clock, const LiveSet& live) const {
    for (uint32_t r = 0; r < workers_; ++r)
      if (Counts(r, live) && finished_[r] < clock - s_) return false;
    return true;
  }

  void ApplyOne(uint32_t rank, int64_t clock, uint64_t base_version,
                const GradientRef& grad, const v1::OptimizerConfig* optimizer,
                UpdateTarget& chunk) {
    const uint64_t staleness = chunk.version() - base_version;
    const UpdateStep step{AsyncLearningRate(config_, chunk.version(), staleness, optimizer),
                          optimizer};
    chunk.Apply(grad, step, static_cast<int64_t>(staleness));
    applied_[rank] = std::max(applied_[rank], clock + 1);
  }

  bool ReleaseHeld(UpdateTarget& chunk, const LiveSet& live) {
    bool released = false;
    for (auto it = held_.begin(); it != held_.end();) {
      if (!FenceOpen(it->clock, live)) {
        ++it;
        continue;
      }
      ApplyOne(it->rank, it->clock, it->base_version, it->grad->Ref(),
               it->optimizer.has_value() ? &*it->optimizer : nullptr, chunk);
      it = held_.erase(it);
      released = true;
    }
    return released;
  }

  const v1::JobConfig config_;
  const int64_t s_;
  const uint32_t workers_;
  // By rank, in effective clocks (own clock + offset).
  std::vector<int64_t> applied_;
  std::vector<int64_t> finished_;  // the newest clock it reads no more
  std::vector<int64_t> offset_;
  std::vector<bool> rejoining_;  // back in the live set, offset not fixed yet
  std::vector<bool> was_live_;
  std::vector<uint64_t> incarnation_;  // as last reported; 0 = unknown
  std::deque<Held> held_;
};

}  // namespace

std::unique_ptr<ChunkPolicy> MakeSspPolicy(const v1::JobConfig& config) {
  return std::make_unique<SspPolicy>(config);
}

}  // namespace grps
