// ExampleLeases: an elastic job's worker's share of the training set,
// leased from the coordinator's example ledger (coordinator/example_ledger.h)
// a few blocks at a time, instead of a partition fixed by rank.
//
// Each step trains one block: BlockFor(step) gives it (the same one again
// when asked twice for a step, as BatchLoader may), Examples(block) its
// example indices, and Trained(step) marks it trained once its gradient is
// pushed. The trained blocks are reported with the next lease, or by Flush
// before the worker finishes or leaves; the coordinator takes back whatever
// else the worker held. Every call also carries the last kResent blocks
// reported before and the blocks held untrained, so that a coordinator
// that took the job over from a state file a little behind learns them.
//
// Thread safety: BlockFor and Examples are called by one thread at a time
// (the batch source: BatchLoader's loader thread or the training thread);
// Trained, SkipTo, Flush and Reset by the training thread. The lease call is made
// outside the lock, so Trained never waits for the coordinator.
#ifndef GRPS_WORKER_EXAMPLE_LEASES_H_
#define GRPS_WORKER_EXAMPLE_LEASES_H_

#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <optional>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "proto/grps.pb.h"

namespace grps {

class ExampleLeases {
 public:
  // Reports sent again with every call.
  static constexpr size_t kResent = 256;
  // How long BlockFor waits before it asks again after a lease of no block
  // that was not exhausted.
  static constexpr absl::Duration kRetryEmpty = absl::Milliseconds(50);

  // The coordinator's LeaseExamples (WorkerSession::LeaseExamples: job,
  // rank, incarnation and generation are set there).
  using LeaseCall =
      std::function<absl::StatusOr<v1::LeaseExamplesResponse>(v1::LeaseExamplesRequest)>;

  // `train_examples` sizes the ledger (every worker loads the whole set),
  // `step_examples` examples per block (StepExamples), `seed` the job's:
  // block b is positions [(b % per epoch) x step_examples, + step_examples)
  // of EpochShuffler(seed, [0, train_examples)).Order(b / per epoch).
  // `per_lease` blocks are leased at a time.
  ExampleLeases(LeaseCall call, uint64_t train_examples, uint64_t step_examples,
                uint64_t seed, uint32_t per_lease = 8);

  // The block `step` trains: the one assigned to it already, else the next
  // one held, leasing more (with the reports) when none is. OUT_OF_RANGE
  // once the ledger has no block left; the call's error otherwise.
  absl::StatusOr<uint64_t> BlockFor(uint64_t step) ABSL_LOCKS_EXCLUDED(mu_);
  // The block's example indices, valid until the next Examples call.
  absl::Span<const int64_t> Examples(uint64_t block) ABSL_LOCKS_EXCLUDED(mu_);
  // The epoch block `block` belongs to (0 before the first lease).
  uint64_t EpochOf(uint64_t block) const ABSL_LOCKS_EXCLUDED(mu_);

  // `step`'s block was trained (no-op for a step with none).
  void Trained(uint64_t step) ABSL_LOCKS_EXCLUDED(mu_);
  // The training thread goes on at `step` and never trains the steps
  // before it that it has not trained (a joiner that skips steps to join
  // the others): their blocks go back to the front of the held ones, to be
  // trained first, and BlockFor for such a step (the loader preparing
  // ahead) assigns none (FAILED_PRECONDITION).
  void SkipTo(uint64_t step) ABSL_LOCKS_EXCLUDED(mu_);
  // Reports the blocks trained since the last report.
  absl::Status Flush() ABSL_LOCKS_EXCLUDED(mu_);
  // A call of want 0 whatever is pending: the recent reports and the held
  // blocks (a coordinator that took the job over asks for them). Any thread.
  absl::Status Claim() ABSL_LOCKS_EXCLUDED(mu_);
  // Forgets every lease and assignment, reported or not (a roll-back: the
  // coordinator took back the leases and what was trained after the
  // rank's resume step).
  void Reset() ABSL_LOCKS_EXCLUDED(mu_);

 private:
  // Sends the pending reports and asks for `want` blocks; on error the
  // reports stay pending.
  absl::StatusOr<v1::LeaseExamplesResponse> Call(uint32_t want, bool claim = false)
      ABSL_LOCKS_EXCLUDED(mu_);

  const LeaseCall call_;
  const uint64_t train_examples_;
  const uint64_t step_examples_;
  const uint64_t seed_;
  const uint32_t per_lease_;
  mutable absl::Mutex mu_;
  uint64_t blocks_per_epoch_ ABSL_GUARDED_BY(mu_) = 0;
  std::deque<uint64_t> held_ ABSL_GUARDED_BY(mu_);           // leased, not assigned
  std::map<uint64_t, uint64_t> assigned_ ABSL_GUARDED_BY(mu_);  // step -> block
  std::vector<v1::TrainedBlock> unreported_ ABSL_GUARDED_BY(mu_);
  std::deque<v1::TrainedBlock> reported_ ABSL_GUARDED_BY(mu_);  // the last kResent
  bool exhausted_ ABSL_GUARDED_BY(mu_) = false;
  uint64_t reset_count_ ABSL_GUARDED_BY(mu_) = 0;  // Reset calls, to drop a lease in flight
  uint64_t skipped_below_ ABSL_GUARDED_BY(mu_) = 0;  // SkipTo's step
  // The batch source's: the order of the epoch last asked for.
  std::optional<uint64_t> order_epoch_;
  std::vector<int64_t> order_;
};

}  // namespace grps

#endif  // GRPS_WORKER_EXAMPLE_LEASES_H_
