#include "coordinator/job_phase.h"

#include <algorithm>
#include <utility>

#include "job/job_config.h"

namespace grps {

bool JobPhase::ended() const {
  return state_ == v1::JOB_STATE_COMPLETED || state_ == v1::JOB_STATE_STOPPED ||
         state_ == v1::JOB_STATE_FAILED;
}

absl::Status JobPhase::EndedError() const { return JobEndedError(job_id_, state_); }

void JobPhase::NoteRegistration(absl::Time now) {
  if (!started()) started_ = now;
}

void JobPhase::Run() { state_ = v1::JOB_STATE_RUNNING; }

void JobPhase::End(v1::JobState state, std::string message, absl::Time now) {
  state_ = state;
  message_ = std::move(message);
  ended_ = now;
}

void JobPhase::TakeOver(const v1::CoordinatorState& state, absl::Time now, absl::Duration grace) {
  state_ = state.state();
  message_ = state.message();
  taken_over_ = true;
  no_deaths_before_ = now + grace;
  elapsed_before_ = std::max(0.0, state.elapsed_seconds());
  worker_leaves_ = state.worker_leaves();
  worker_joins_ = state.worker_joins();
  started_ = now;
}

absl::Duration JobPhase::WithoutWorkers(bool none, absl::Time now) {
  if (!none) {
    no_workers_since_ = absl::InfiniteFuture();
    return absl::ZeroDuration();
  }
  if (no_workers_since_ == absl::InfiniteFuture()) no_workers_since_ = now;
  return now - no_workers_since_;
}

double JobPhase::ElapsedSeconds(absl::Time now) const {
  if (!started()) return 0;
  return elapsed_before_ + std::max(0.0, absl::ToDoubleSeconds(std::min(now, ended_) - started_));
}

void JobPhase::ExportTo(v1::CoordinatorState* state, absl::Time now) const {
  state->set_state(state_);
  state->set_message(message_);
  state->set_worker_leaves(worker_leaves_);
  state->set_worker_joins(worker_joins_);
  if (started()) state->set_elapsed_seconds(ElapsedSeconds(now));
}

void JobPhase::AddTo(v1::JobStatus* status, absl::Time now) const {
  status->set_state(state_);
  status->set_message(message_);
  if (started()) status->set_elapsed_seconds(ElapsedSeconds(now));
  status->set_coordinator_restarted(taken_over_);
  status->set_worker_leaves(worker_leaves_);
  status->set_worker_joins(worker_joins_);
}

}  // namespace grps
