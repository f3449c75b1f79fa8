// JobPhase: where the job is in its life, as JobStateMachine decides it, and
// the figures of that life; one of the machine's collaborators.
//
//   - the phase: WAITING until every shard and rank registered once, then
//     RUNNING, then COMPLETED, STOPPED or FAILED (final) with a message;
//   - the job's time: from the first registration to the end, plus the time
//     of the coordinators that ran the job before this one;
//   - a take-over: whether this coordinator took the job over (from a state
//     file, or by adopting a member it never registered), and its grace:
//     nobody is declared dead before every member could dial it again;
//   - the workers that left on purpose and the ranks that joined the running
//     job; since when no worker trained or finished (the recovery timeout).
//
// Not thread-safe: every call is made under the machine's mutex.
#ifndef GRPS_COORDINATOR_JOB_PHASE_H_
#define GRPS_COORDINATOR_JOB_PHASE_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "coordinator/membership.h"
#include "proto/grps.pb.h"

namespace grps {

class JobPhase {
 public:
  explicit JobPhase(std::string job_id) : job_id_(std::move(job_id)) {}

  v1::JobState state() const { return state_; }
  bool waiting() const { return state_ == v1::JOB_STATE_WAITING; }
  bool running() const { return state_ == v1::JOB_STATE_RUNNING; }
  // COMPLETED, STOPPED or FAILED.
  bool ended() const;
  // RUNNING, and `membership` has no rank ALIVE and one FINISHED (RUNNING
  // means every rank registered, so the unfinished ones are ALIVE or DEAD).
  bool TrainingDone(const Membership& membership) const {
    return running() && membership.TrainingOver();
  }
  // FAILED_PRECONDITION naming the job's end, for a request an ended job
  // refuses.
  absl::Status EndedError() const;
  // The end's message (or the taken-over state's).
  const std::string& message() const { return message_; }

  // ---- Transitions (the machine decides them) ----
  // A member registered or was adopted: the job's time starts at the first.
  void NoteRegistration(absl::Time now);
  // WAITING becomes RUNNING.
  void Run();
  // The job ends in the final `state`.
  void End(v1::JobState state, std::string message, absl::Time now);
  // Takes over a persisted job (WAITING or RUNNING, checked by the caller):
  // its phase, message, time and counts; nobody is declared dead for
  // `grace` from `now`.
  void TakeOver(const v1::CoordinatorState& state, absl::Time now, absl::Duration grace);
  // A member this coordinator never registered was adopted from its
  // heartbeat: the job was taken over.
  void NoteAdoption() { taken_over_ = true; }

  // ---- Figures ----
  bool taken_over() const { return taken_over_; }
  // Past the take-over's grace (always, without a take-over).
  bool MayDeclareDeaths(absl::Time now) const { return now >= no_deaths_before_; }
  void NoteLeave() { ++worker_leaves_; }
  void NoteJoin() { ++worker_joins_; }
  // How long the job has been without a worker ALIVE or FINISHED at `now`
  // (`none`: it has none now; zero when it has).
  absl::Duration WithoutWorkers(bool none, absl::Time now);
  // The job's time at `now` (frozen at the end).
  double ElapsedSeconds(absl::Time now) const;

  // The phase, message, counts and job time into a persisted state.
  void ExportTo(v1::CoordinatorState* state, absl::Time now) const;
  // The phase, message, counts, job time and take-over into a status.
  void AddTo(v1::JobStatus* status, absl::Time now) const;

 private:
  bool started() const { return started_ != absl::InfinitePast(); }

  const std::string job_id_;
  v1::JobState state_ = v1::JOB_STATE_WAITING;
  std::string message_;
  // First registration (or the take-over) and end of the job
  // (InfinitePast/InfiniteFuture until they happen).
  absl::Time started_ = absl::InfinitePast();
  absl::Time ended_ = absl::InfiniteFuture();
  // Job time before this coordinator took the job over.
  double elapsed_before_ = 0;
  bool taken_over_ = false;
  absl::Time no_deaths_before_ = absl::InfinitePast();
  uint64_t worker_leaves_ = 0;
  uint64_t worker_joins_ = 0;
  absl::Time no_workers_since_ = absl::InfiniteFuture();
};

}  // namespace grps

#endif  // GRPS_COORDINATOR_JOB_PHASE_H_
