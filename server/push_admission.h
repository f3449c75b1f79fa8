// PushAdmission: what a ShardStore decides about a well-formed push before
// and as it takes it, the same for dense chunks and sparse tables: whether
// the pusher's incarnation is current, which targets have the step already
// (deduplication), whether the mode's policy takes each gradient, and what
// became of each (the counters and the outcome the pusher is told). It also
// keeps the live set (ranks and incarnations) the policies decide by.
//
// Deduplication (every mode): per target and rank, the newest (incarnation,
// step) accepted. A push of a step not newer than that, from that
// incarnation or a newer one, is a retry (or a restarted worker's step that
// its previous incarnation had pushed): acknowledged, not applied again. A
// push from an older incarnation is refused. Exactly once across
// incarnations, per target: a step that reached one shard and not another
// before the worker died is applied where it was missing.
//
// Every refusal (here, or at the network edge: CountRejected) adds to one
// counter; a too-stale gradient counts there too.
//
// Thread safety: Decide and Accept are called with every named target's
// lock held (TargetLocks); the rest may be called from any thread. Lock
// order: a target's mutex before the live set's.
#ifndef GRPS_SERVER_PUSH_ADMISSION_H_
#define GRPS_SERVER_PUSH_ADMISSION_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/types/span.h"
#include "server/consistency_policy.h"
#include "server/store_targets.h"

namespace grps {

class PushAdmission {
 public:
  // Ranks below num_workers may push; the first start_workers count as
  // live until SetLiveWorkers.
  PushAdmission(uint32_t num_workers, uint32_t start_workers);

  // Who pushes, for every target of one push.
  struct Pusher {
    uint32_t rank = 0;  // < num_workers (the caller checks)
    uint64_t incarnation = 0;
    uint64_t step = 0;
  };
  // One target's gradient in a push.
  struct TargetGradient {
    StoreTarget* target = nullptr;
    GradientRef grad;
    uint64_t base_version = 0;  // the target version it was computed on
    uint64_t wire_bytes = 0;    // for bytes_in
    const v1::OptimizerConfig* optimizer = nullptr;  // the program's, or null: the job's
  };
  // What became of one target's gradient.
  struct Outcome {
    uint64_t version = 0;  // as the policy's AckVersion says
    bool duplicate = false;
    bool late = false;
    bool too_stale = false;
  };

  // FAILED_PRECONDITION (counted, per gradient of the push) when the
  // pusher's incarnation is older than the one known for the rank.
  absl::Status CheckIncarnation(const Pusher& p, uint64_t gradients) const
      ABSL_LOCKS_EXCLUDED(mu_);
  // With every target's lock held: whether the push can be taken (all or
  // nothing: a refusal is counted once per gradient and changes nothing),
  // and which targets have its step already (`duplicate`, by position).
  absl::Status Decide(const Pusher& p, absl::Span<const TargetGradient> grads,
                      std::vector<bool>* duplicate);
  // With the same locks held, after Decide said OK: marks and hands each
  // gradient to its target's policy (a duplicate is acknowledged only), and
  // counts what became of it.
  std::vector<Outcome> Accept(const Pusher& p, absl::Span<const TargetGradient> grads,
                              const std::vector<bool>& duplicate, const LiveSet& live);
  // Records a newer incarnation of the rank, once a push of it was taken
  // (a refused push must not lock the rank's real incarnation out).
  void RaiseIncarnation(const Pusher& p) ABSL_LOCKS_EXCLUDED(mu_);

  // Replaces the live workers with `ranks` (ranks >= num_workers ignored),
  // raises their incarnations to `incarnations` (0 = unknown; a known
  // incarnation never goes back) and sets the steps they count from
  // (`counts_from`, parallel; missing: 0). Returns the new set.
  std::shared_ptr<const LiveSet> SetLiveWorkers(absl::Span<const uint32_t> ranks,
                                                absl::Span<const uint64_t> incarnations,
                                                absl::Span<const uint64_t> counts_from = {})
      ABSL_LOCKS_EXCLUDED(mu_);
  // The live set now (immutable; a change makes a new one).
  std::shared_ptr<const LiveSet> live() const ABSL_LOCKS_EXCLUDED(mu_);

  void CountRejected(uint64_t gradients) const { rejected_.fetch_add(gradients); }
  uint64_t rejected() const { return rejected_.load(); }

 private:
  const uint32_t num_workers_;
  mutable absl::Mutex mu_;
  std::shared_ptr<const LiveSet> live_ ABSL_GUARDED_BY(mu_);
  // Rare, so one shared counter.
  mutable std::atomic<uint64_t> rejected_{0};
};

}  // namespace grps

#endif  // GRPS_SERVER_PUSH_ADMISSION_H_
