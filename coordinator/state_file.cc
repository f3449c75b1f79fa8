#include "coordinator/state_file.h"

#include <utility>

namespace grps {
namespace {

// The state without what moves by itself: the clock, and the workers'
// progress but for their steps.
v1::CoordinatorState Material(v1::CoordinatorState state) {
  state.clear_elapsed_seconds();
  state.clear_unix_time_ms();
  for (v1::WorkerStatus& w : *state.mutable_workers()) {
    const uint64_t step = w.progress().step();
    w.clear_progress();
    w.mutable_progress()->set_step(step);
  }
  return state;
}

}  // namespace

absl::Status StateFile::Write(const std::function<v1::CoordinatorState()>& current,
                              absl::Time now, bool force) {
  if (path_.empty()) return absl::OkStatus();
  absl::MutexLock lock(&mu_);
  v1::CoordinatorState state = current();
  std::string material = Material(state).SerializeAsString();
  state.clear_unix_time_ms();
  state.clear_elapsed_seconds();
  std::string full = state.SerializeAsString();
  const bool material_changed = material != material_;
  if (!material_changed && full == full_) return absl::OkStatus();
  if (!force) {
    const absl::Duration since = now - written_at_;
    if (!(material_changed && since >= kMaterialEvery) && !(since >= kProgressEvery))
      return absl::OkStatus();
  }
  if (absl::Status s = WriteFileAtomically(env_, path_, current().SerializeAsString()); !s.ok())
    return s;
  material_ = std::move(material);
  full_ = std::move(full);
  written_at_ = now;
  return absl::OkStatus();
}

}  // namespace grps
