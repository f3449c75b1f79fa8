// Sync (BSP), with backup workers and late gradients.
//
// A chunk at version v has step v open. A gradient computed on version b:
//   b == v   added to step v's sum, once per rank (a rank's second gradient
//            for the same step is treated as late). The step completes when
//            the live workers that contributed number at least
//            max(1, live - backup_workers) (with no backup workers: every
//            live worker), or, when no worker is live any more, with
//            whatever it holds (at least one contribution: late gradients
//            alone wait for the step's first). A live worker counts from
//            the step the coordinator names for it (LiveSet.counts_from: a
//            joiner, a restarted rank), the same on every shard; before it,
//            its gradient is in the sum but the step does not wait for it.
//            It is applied once, from the average of
//            everything in its sum, at the step's scheduled learning rate
//            (or with the program's optimizer and learning rate that the
//            lowest contributing rank's gradient named);
//            in an elastic job (max_workers) that rate is scaled by the
//            gradients averaged over num_workers (the linear scaling rule:
//            a step of 4 workers' batches moves the weights as far as 2
//            steps of 2 workers' would, so the live set's size does not
//            change what an epoch does).
//   b <  v   late: its step completed without it (a straggler beyond the
//            quorum, or a worker declared dead that came back). Counted, and
//            with late_gradients = fold added to the open step's sum (it
//            counts in the average, not toward the quorum); with drop, not
//            applied.
//   b >  v   refused: no such version was ever served.
// A rank's gradients must each be computed on a newer version than its last
// (within an incarnation): a worker pulls the step's weights before it
// computes the next gradient, so a second gradient on the same (or an
// older) version is no honest straggler but a replay, and is refused: it
// would otherwise be folded again and again into the average.
// A rank outside the live set may contribute (a restarted worker the
// heartbeat has not reported yet): the average counts it, the quorum not.
//
// A pull from rank r at any clock waits until the step r last contributed
// to has completed; a rank whose last gradient was late, or that has not
// pushed in this incarnation, reads at once and so joins at the open step.
//
// A step's sum is added up in rank order, whatever order its gradients
// arrive in: the contributions by rank, then the folded late gradients by
// rank. Floating-point addition is not associative, so a sum in arrival
// order made two runs of the same job differ with three workers or more;
// in rank order a step's update depends only on who contributed what. A
// contribution of rank r goes into the sum at once when every rank below r
// is in (or gives nothing this step: known only at completion); otherwise it
// waits in a buffer of its rank, added at completion. With at most two
// workers every contribution goes in at once: a + b and b + a are the same
// bits, and the copy into a buffer would cost a step's time for nothing.
#include <algorithm>
#include <optional>

#include "absl/strings/str_cat.h"
#include "job/job_config.h"
#include "server/consistency_policy.h"

namespace grps {
namespace {

class SyncPolicy final : public ChunkPolicy {
 public:
  explicit SyncPolicy(const v1::JobConfig& config)
      : optimizer_(config.optimizer()),
        scale_by_(IsElastic(config) ? std::max<uint32_t>(1, config.num_workers()) : 0),
        backup_workers_(config.backup_workers()),
        fold_(config.late_gradients() != v1::LATE_GRADIENTS_DROP),
        any_order_(JobRanks(config) <= 2),
        contributed_(JobRanks(config), false),
        waiting_(JobRanks(config)),
        folds_(JobRanks(config)),
        awaiting_(JobRanks(config), 0),
        incarnation_(JobRanks(config), 0),
        last_(JobRanks(config)) {}

  absl::Status Check(const ChunkGradientMeta& g,
                     const UpdateTarget& chunk) const override {
    if (absl::Status s = ChunkPolicy::Check(g, chunk); !s.ok()) return s;
    const LastGradient& last = last_[g.rank];
    if (last.valid && last.incarnation == g.incarnation &&
        g.base_version <= last.base_version)
      return absl::FailedPreconditionError(absl::StrCat(
          "worker ", g.rank, " already pushed a gradient computed on version ",
          last.base_version, "; in sync mode its next one must be computed on a "
          "newer version, not on version ", g.base_version));
    return absl::OkStatus();
  }

  GradientFate Accept(const ChunkGradientMeta& g, const GradientRef& grad,
                      UpdateTarget& chunk, const LiveSet& live) override {
    last_[g.rank] = LastGradient{true, g.incarnation, g.base_version};
    if (sum_ == nullptr) sum_ = chunk.NewBuffer();
    if (g.base_version == chunk.version() && !contributed_[g.rank]) {
      if (!step_rank_.has_value() || g.rank < *step_rank_) {
        step_rank_ = g.rank;
        step_optimizer_.reset();
        if (g.optimizer != nullptr) step_optimizer_ = *g.optimizer;
      }
      Contribute(g.rank, grad, chunk);
      awaiting_[g.rank] = chunk.version() + 1;
      MaybeComplete(chunk, live);
      return GradientFate::kAggregated;
    }
    awaiting_[g.rank] = 0;
    if (!fold_) return GradientFate::kLateDropped;
    Held(&folds_, g.rank, chunk).Add(grad);
    ++folded_;
    MaybeComplete(chunk, live);
    return GradientFate::kLateFolded;
  }

  // An aggregated gradient is applied when its step completes.
  uint64_t AckVersion(const ChunkGradientMeta& g, GradientFate fate,
                      const UpdateTarget& chunk) const override {
    return fate == GradientFate::kAggregated ? g.base_version + 1 : chunk.version();
  }

  bool ReadyToServe(uint32_t rank, uint64_t clock, const UpdateTarget& chunk,
                    const LiveSet& live) override {
    return chunk.version() >= awaiting_[rank];
  }

  // Every chunk of every shard is cut at the same step: at the checkpoint's
  // version exactly, inside the update that reaches it.
  CheckpointCut Cut(uint64_t version, const UpdateTarget& chunk) const override {
    if (version == 0 || chunk.version() == version) return CheckpointCut::kNow;
    return chunk.version() > version ? CheckpointCut::kPast : CheckpointCut::kArmed;
  }

  // A push of step >= the chunk's version is in the open step's sum (or
  // folded into it), which the checkpoint does not keep: the mark says no
  // more than step version - 1 was applied.
  std::optional<uint64_t> KeepMark(uint32_t, const UpdateTarget& chunk,
                                   v1::DedupMark* mark) const override {
    const uint64_t version = chunk.version();
    if (!mark->valid() || mark->step() < version) return std::nullopt;
    if (version == 0)
      mark->set_valid(false);
    else
      mark->set_step(version - 1);
    return std::nullopt;
  }

  // The contributions to the open step (not those to the step being
  // completed, when the capture comes inside its update).
  uint64_t NotKept(const UpdateTarget& chunk) const override {
    uint64_t open = 0;
    for (size_t r = 0; r < contributed_.size(); ++r)
      if (contributed_[r] && awaiting_[r] == chunk.version() + 1) ++open;
    return open;
  }

  bool LiveSetChanged(UpdateTarget& chunk, const LiveSet& live) override {
    // A new incarnation that has contributed nothing yet reads at once (the
    // old one's wait is not its own). One that already pushed before the
    // heartbeat told this shard of it (a restarted worker pushes as soon as
    // it registered) keeps waiting for the step it contributed to: reading
    // at once, it would get the version it computed on again, and its next
    // gradient on that version would be refused as a replay.
    for (size_t r = 0; r < awaiting_.size() && r < live.incarnations.size(); ++r) {
      const uint64_t inc = live.incarnations[r];
      if (inc == 0 || inc == incarnation_[r]) continue;
      const bool pushed = last_[r].valid && last_[r].incarnation == inc;
      if (incarnation_[r] != 0 && !pushed) awaiting_[r] = 0;
      incarnation_[r] = inc;
    }
    return MaybeComplete(chunk, live);
  }

 private:
  // A gradient held for the sum, by rank: made at first use, kept across
  // steps (Clear empties it without freeing).
  struct HeldGradient {
    std::unique_ptr<GradientBuffer> buffer;
    bool full = false;
  };
  static GradientBuffer& Held(std::vector<HeldGradient>* by_rank, uint32_t rank,
                              UpdateTarget& chunk) {
    HeldGradient& held = (*by_rank)[rank];
    if (held.buffer == nullptr) held.buffer = chunk.NewBuffer();
    held.full = true;
    return *held.buffer;
  }
  // Adds the held gradient of each rank in [from, to), in rank order, to
  // sum_ and empties it.
  void AddHeld(std::vector<HeldGradient>* by_rank, size_t from, size_t to) {
    for (size_t r = from; r < to; ++r) {
      HeldGradient& held = (*by_rank)[r];
      if (!held.full) continue;
      sum_->Add(held.buffer->Ref());
      held.buffer->Clear();
      held.full = false;
    }
  }

  // Rank `rank`'s gradient for the open step, into the sum in rank order.
  void Contribute(uint32_t rank, const GradientRef& grad, UpdateTarget& chunk) {
    contributed_[rank] = true;
    ++contributors_;
    if (any_order_) {
      sum_->Add(grad);
      return;
    }
    if (rank != summed_below_) {
      Held(&waiting_, rank, chunk).Add(grad);
      return;
    }
    sum_->Add(grad);
    // The ranks above that were waiting for this one follow it.
    for (++summed_below_; summed_below_ < waiting_.size() && waiting_[summed_below_].full;
         ++summed_below_)
      AddHeld(&waiting_, summed_below_, summed_below_ + 1);
  }

  bool MaybeComplete(UpdateTarget& chunk, const LiveSet& live) {
    // A step is one somebody took: late gradients alone (folded into it) wait
    // for its first contribution. At the job's end the live set empties, and
    // a step of one straggler's late gradient there was a step past the end
    // on the shards it reached.
    if (contributors_ == 0) return false;
    // The live ranks that count toward this step (a joiner counts from the
    // step the coordinator named, on every shard alike).
    uint32_t counted = 0, counted_contributors = 0;
    for (uint32_t r = 0; r < live.live.size(); ++r) {
      if (!live.CountsAt(r, chunk.version())) continue;
      ++counted;
      if (r < contributed_.size() && contributed_[r]) ++counted_contributors;
    }
    if (counted > 0) {
      const uint32_t needed = counted > backup_workers_ ? counted - backup_workers_ : 1;
      if (counted_contributors < needed) return false;
    }
    // The contributions of ranks above one that gave nothing, then the
    // folded late gradients, each in rank order.
    AddHeld(&waiting_, summed_below_, waiting_.size());
    AddHeld(&folds_, 0, folds_.size());
    const uint32_t averaged = contributors_ + folded_;
    sum_->Scale(1.0f / static_cast<float>(averaged));
    const v1::OptimizerConfig* program = step_optimizer_.has_value() ? &*step_optimizer_ : nullptr;
    float lr = program != nullptr ? program->learning_rate()
                                  : ScheduledLearningRate(optimizer_, chunk.version());
    if (scale_by_ > 0) lr *= static_cast<float>(averaged) / static_cast<float>(scale_by_);
    chunk.Apply(sum_->Ref(), UpdateStep{lr, program}, -1);
    sum_->Clear();
    step_rank_.reset();
    step_optimizer_.reset();
    std::fill(contributed_.begin(), contributed_.end(), false);
    contributors_ = 0;
    folded_ = 0;
    summed_below_ = 0;
    return true;
  }

  const v1::OptimizerConfig optimizer_;
  // Elastic jobs: the learning rate is scaled by averaged / scale_by_
  // (num_workers); 0 otherwise.
  const uint32_t scale_by_;
  const uint32_t backup_workers_;
  const bool fold_;
  const bool any_order_;  // at most two workers: contributions in any order
  // The open step: the sum of its gradients (made by the chunk at the first
  // gradient), who contributed (by rank), and how many late gradients were
  // folded into it. sum_ holds the contributions of ranks below
  // summed_below_ (each rank below it contributed); higher ranks' wait in
  // waiting_, the late gradients in folds_, until completion.
  std::unique_ptr<GradientBuffer> sum_;
  std::vector<bool> contributed_;
  uint32_t contributors_ = 0;
  uint32_t folded_ = 0;
  uint32_t summed_below_ = 0;
  // The lowest contributing rank of the open step, and the program's
  // optimizer its gradient named (none: the job's), which the step runs.
  std::optional<uint32_t> step_rank_;
  std::optional<v1::OptimizerConfig> step_optimizer_;
  std::vector<HeldGradient> waiting_;
  std::vector<HeldGradient> folds_;
  // By rank: the version a pull waits for (the step it contributed to + 1).
  std::vector<uint64_t> awaiting_;
  std::vector<uint64_t> incarnation_;  // as last reported; 0 = unknown
  // By rank: the version its last accepted gradient was computed on.
  struct LastGradient {
    bool valid = false;
    uint64_t incarnation = 0;
    uint64_t base_version = 0;
  };
  std::vector<LastGradient> last_;
};

}  // namespace

std::unique_ptr<ChunkPolicy> MakeSyncPolicy(const v1::JobConfig& config) {
  return std::make_unique<SyncPolicy>(config);
}

}  // namespace grps
