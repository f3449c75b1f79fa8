#include "server/push_admission.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"

namespace grps {

PushAdmission::PushAdmission(uint32_t num_workers, uint32_t start_workers)
    : num_workers_(num_workers) {
  absl::MutexLock lock(&mu_);
  live_ = std::make_shared<const LiveSet>(LiveSet::First(num_workers_, start_workers));
}

std::shared_ptr<const LiveSet> PushAdmission::live() const {
  absl::MutexLock lock(&mu_);
  return live_;
}

absl::Status PushAdmission::CheckIncarnation(const Pusher& p, uint64_t gradients) const {
  absl::MutexLock lock(&mu_);
  const uint64_t known = live_->incarnations[p.rank];
  if (p.incarnation >= known) return absl::OkStatus();
  rejected_.fetch_add(gradients);
  return absl::FailedPreconditionError(absl::StrCat("stale incarnation: worker ", p.rank,
                                                    " pushed as incarnation ", p.incarnation,
                                                    " but incarnation ", known, " is current"));
}

void PushAdmission::RaiseIncarnation(const Pusher& p) {
  absl::MutexLock lock(&mu_);
  if (p.incarnation <= live_->incarnations[p.rank]) return;
  auto updated = std::make_shared<LiveSet>(*live_);
  updated->incarnations[p.rank] = p.incarnation;
  live_ = std::move(updated);
}

std::shared_ptr<const LiveSet> PushAdmission::SetLiveWorkers(
    absl::Span<const uint32_t> ranks, absl::Span<const uint64_t> incarnations,
    absl::Span<const uint64_t> counts_from) {
  absl::MutexLock lock(&mu_);
  auto updated = std::make_shared<LiveSet>(*live_);
  updated->live.assign(num_workers_, false);
  updated->counts_from.assign(num_workers_, 0);
  updated->count = 0;
  for (size_t i = 0; i < ranks.size(); ++i) {
    const uint32_t r = ranks[i];
    if (r >= num_workers_ || updated->live[r]) continue;
    updated->live[r] = true;
    ++updated->count;
    if (i < incarnations.size())
      updated->incarnations[r] = std::max(updated->incarnations[r], incarnations[i]);
    if (i < counts_from.size()) updated->counts_from[r] = counts_from[i];
  }
  live_ = updated;
  return updated;
}

absl::Status PushAdmission::Decide(const Pusher& p, absl::Span<const TargetGradient> grads,
                                   std::vector<bool>* duplicate) {
  duplicate->assign(grads.size(), false);
  for (size_t i = 0; i < grads.size(); ++i) {
    StoreTarget& t = *grads[i].target;
    t.mu.AssertHeld();
    const AcceptedMark& mark = t.marks[p.rank];
    if (mark.valid && p.incarnation < mark.incarnation) {
      rejected_.fetch_add(grads.size());
      return absl::FailedPreconditionError(absl::StrCat(
          "stale incarnation: worker ", p.rank, " pushed as incarnation ", p.incarnation,
          " but incarnation ", mark.incarnation, " already pushed to ", t.name));
    }
    // A step of the rank this target has applied already, from this
    // incarnation (a retry) or an earlier one (a restarted worker resumes
    // from its rank's last reported step, which may be behind its last
    // push): acknowledged, not applied again.
    if (mark.valid && p.step <= mark.step) {
      (*duplicate)[i] = true;
      continue;
    }
    const ChunkGradientMeta meta{p.rank, p.incarnation, p.step, grads[i].base_version,
                                 grads[i].optimizer};
    if (absl::Status s = t.policy->Check(meta, t); !s.ok()) {
      rejected_.fetch_add(grads.size());
      return absl::Status(s.code(), absl::StrCat(t.name, ": ", s.message()));
    }
  }
  return absl::OkStatus();
}

std::vector<PushAdmission::Outcome> PushAdmission::Accept(
    const Pusher& p, absl::Span<const TargetGradient> grads, const std::vector<bool>& duplicate,
    const LiveSet& live) {
  std::vector<Outcome> outcomes(grads.size());
  for (size_t i = 0; i < grads.size(); ++i) {
    StoreTarget& t = *grads[i].target;
    t.mu.AssertHeld();
    Outcome& o = outcomes[i];
    const ChunkGradientMeta meta{p.rank, p.incarnation, p.step, grads[i].base_version,
                                 grads[i].optimizer};
    ++t.counters.pushes;
    t.counters.bytes_in += grads[i].wire_bytes;
    if (duplicate[i]) {
      ++t.counters.duplicates;
      o.duplicate = true;
      t.policy->Duplicate(meta, t, live);
      o.version = t.version();
      continue;
    }
    // Marked before Accept: an update it applies may be captured by a
    // checkpoint, which must know this push as applied.
    t.marks[p.rank] = AcceptedMark{true, p.incarnation, p.step};
    const GradientFate fate = t.policy->Accept(meta, grads[i].grad, t, live);
    if (fate == GradientFate::kLateFolded) ++t.counters.late_folded;
    if (fate == GradientFate::kLateDropped) ++t.counters.late_dropped;
    if (fate == GradientFate::kTooStale) {
      ++t.counters.too_stale;
      o.too_stale = true;
      rejected_.fetch_add(1);
    }
    if (IsLate(fate)) {
      ++t.counters.late_by_worker[p.rank];
      o.late = true;
    }
    o.version = t.policy->AckVersion(meta, fate, t);
  }
  return outcomes;
}

}  // namespace grps
