// ElasticData: an elastic job's training data as the coordinator hands it
// out (JobConfig.max_workers; docs/elasticity.md), one of JobStateMachine's
// collaborators. It keeps the ExampleLedger (which blocks of each epoch were
// trained, the leases the live ranks hold), whether that ledger came from
// the checkpoint the job resumed from (a ledger of another shape then starts
// the epochs over), and after a take-over the limbo: the blocks whose fate
// the state file missed, leased again only once every live rank said what
// it holds (its claim) or the take-over's grace is over.
//
// A lease (LeaseExamples) is checked whole before anything changes (Admit),
// then granted (Grant). Not thread-safe (every call is made under the
// machine's mutex).
#ifndef GRPS_COORDINATOR_ELASTIC_DATA_H_
#define GRPS_COORDINATOR_ELASTIC_DATA_H_

#include <cstdint>
#include <set>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "coordinator/example_ledger.h"
#include "proto/grps.pb.h"

namespace grps {

class ElasticData {
 public:
  // ---- Before serving ----
  // The ledger of checkpoint `manifest`, if it has one (a damaged one is
  // logged: the epochs start over).
  void ResumeFrom(const v1::CheckpointManifest& manifest);
  // The ledger of a persisted state, checked (INVALID_ARGUMENT, nothing
  // changed) before the take-over changes anything ...
  static absl::StatusOr<ExampleLedger> Read(const v1::CoordinatorState& state);
  // ... and taken: its limbo is held until each of `live_ranks` claimed.
  void TakeOver(ExampleLedger ledger, const std::vector<uint32_t>& live_ranks);
  void ExportTo(v1::CoordinatorState* state) const;
  void AddTo(v1::JobStatus* status) const;

  // ---- Leases ----
  // LeaseExamples's checks of the ledger (the request of a live rank of a
  // job of `config`): the training set's shape, the blocks it names; a
  // checkpoint's ledger of another shape is dropped here. Sizes the ledger.
  absl::Status Admit(const v1::JobConfig& config, const v1::LeaseExamplesRequest& request);
  // After Admit: records the rank's claim and what it trained, and leases
  // it more (`live_ranks` share the epoch). `grace_over`: the take-over's
  // grace is over (ReleaseLimbo).
  absl::StatusOr<v1::LeaseExamplesResponse> Grant(const v1::LeaseExamplesRequest& request,
                                                  const std::vector<uint32_t>& live_ranks,
                                                  bool grace_over);
  // After a take-over, whether `rank` must say what it holds (its heartbeat
  // reply asks: a worker blocked in a sync step would not lease by itself).
  bool ClaimAwaited(uint32_t rank) const;
  // Lets the limbo go once every one of `live_ranks` claimed, or
  // `grace_over`.
  void ReleaseLimbo(const std::vector<uint32_t>& live_ranks, bool grace_over);

  // ---- Members and roll-backs ----
  // `rank` left, died, finished or registered again: its leases come back.
  void ReturnLeases(uint32_t rank) { ledger_.ReturnLeases(rank); }
  // A roll-back: what was trained after each rank's resume step comes back.
  void RollBack(const std::vector<uint64_t>& resume_steps) { ledger_.RollBack(resume_steps); }
  // The ledger at a checkpoint's cut (what each rank trained before its
  // step in `manifest`), into the manifest.
  void CutInto(v1::CheckpointManifest* manifest) const;

 private:
  ExampleLedger ledger_;
  // The ledger came from the checkpoint the job resumed from, and no worker
  // has leased yet.
  bool from_checkpoint_ = false;
  // After TakeOver: the live ranks whose first lease (their claims) the
  // ledger's limbo waits for.
  std::set<uint32_t> claims_awaited_;
};

}  // namespace grps

#endif  // GRPS_COORDINATOR_ELASTIC_DATA_H_
