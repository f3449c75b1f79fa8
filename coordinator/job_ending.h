// JobEnding: how a job that is done training comes to its end, one of
// JobStateMachine's collaborators. Training is done when no rank is ALIVE
// and one FINISHED; then:
//
//   - the final live set: every live server must hear a heartbeat reply
//     that carries it (the empty live set after training) and heartbeat
//     again, so that its version is final, before the evaluator is asked;
//   - the evaluator: while training, the lowest ALIVE rank; once training
//     is done, the lowest FINISHED rank still heartbeating, told
//     evaluate_final once the servers heard the final live set. Only an
//     evaluation made after training was done is final;
//   - the job completes (Completion) with the final evaluation, with its
//     program's word that it has none, or once no finished worker is left
//     to run one;
//   - and once ended, the coordinator lingers until every live member heard
//     the end (EveryLiveMemberSawEnd).
//
// A roll-back or a rank that comes back makes training not done: Reset.
// Reads the membership it is given; not thread-safe (every call is made
// under the machine's mutex, which guards both).
#ifndef GRPS_COORDINATOR_JOB_ENDING_H_
#define GRPS_COORDINATOR_JOB_ENDING_H_

#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <string>

#include "absl/time/time.h"
#include "coordinator/membership.h"
#include "proto/grps.pb.h"

namespace grps {

class JobEnding {
 public:
  // `membership` outlives this.
  JobEnding(std::string job_id, const Membership* membership);

  // ---- Training done ----
  // Training is done: true the first time since the last Reset (the caller
  // announces it).
  bool NoteTrainingDone();
  // Since the last Reset, training was done.
  bool training_was_done() const { return announced_; }
  // Training is not done any more: the final live set and evaluation start
  // over.
  void Reset();
  // "every worker finished" or "worker 1 died before finishing; ...".
  std::string TrainingDoneMessage() const;

  // ---- The final live set ----
  // A heartbeat of `shard`'s server while training is done (its reply
  // carries the final live set).
  void NoteServerHeartbeat(uint32_t shard);
  // Every live server heard the final live set and heartbeated again.
  bool ServersHeardFinalLiveSet() const;

  // ---- The evaluation ----
  // The evaluator now, nullopt when there is none. Once `ended`, the rank
  // that made the final evaluation, if any.
  std::optional<uint32_t> Evaluator(bool ended, bool training_done, absl::Time now) const;
  // `rank` is told evaluate_final (logged the first time).
  void AskedToEvaluate(uint32_t rank);
  // A finished rank's evaluation, `final` when it was made after training
  // was done. The note for the log.
  std::string RecordEvaluation(uint32_t rank, const Membership::Evaluation& eval, bool final);
  // The evaluator's program has no final evaluation to give.
  void Decline() { declined_ = true; }
  // With the final checkpoint settled: the job's completion message, or
  // nullopt while a finished worker may still give the final evaluation.
  std::optional<std::string> Completion(absl::Time now) const;
  // JobStatus's final evaluation fields.
  void AddTo(v1::JobStatus* status) const;

  // ---- The end ----
  // A heartbeat reply carried the final state to the member of `request`
  // (a server's counts once it sent its final report).
  void ToldEnd(const v1::HeartbeatRequest& request);
  // Every live server, live worker and finished worker still heartbeating
  // got the final state.
  bool EveryLiveMemberSawEnd(absl::Time now) const;

 private:
  const std::string job_id_;
  const Membership* const membership_;
  // Logged once per training-done phase.
  bool announced_ = false;
  std::optional<Membership::Evaluation> final_eval_;
  uint32_t final_evaluator_ = 0;
  bool declined_ = false;
  // The last rank told evaluate_final (for logging it once).
  std::optional<uint32_t> asked_;
  // The final-live-set handshake, by shard: a reply after training was done
  // went to this server incarnation at this membership epoch (the live set
  // it carried), and `heard` once a later heartbeat of the same incarnation
  // arrived at the same epoch. Counted in heartbeats, not time, so two
  // heartbeats within one clock tick still order.
  struct FinalLiveSetAck {
    uint64_t incarnation = 0;
    uint64_t membership_epoch = 0;
    bool heard = false;
  };
  std::map<uint32_t, FinalLiveSetAck> acks_;
  // Members that received a heartbeat reply with the final state.
  std::set<uint32_t> shards_told_end_;
  std::set<uint32_t> ranks_told_end_;
};

}  // namespace grps

#endif  // GRPS_COORDINATOR_JOB_ENDING_H_
