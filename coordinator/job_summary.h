// The job-wide figures of a JobStatus, derived from its per-worker and
// per-shard entries. Pure functions of the message; no clock, no locking.
#ifndef GRPS_COORDINATOR_JOB_SUMMARY_H_
#define GRPS_COORDINATOR_JOB_SUMMARY_H_

#include <cstdint>
#include <vector>

#include "proto/grps.pb.h"

namespace grps {


// Fills, from status->workers() and status->shards():
// - global_step: the lowest version over live shards that hold chunks; the
//   highest worker step while no such shard has reported;
// - total_steps: the highest total_steps any worker reported;
// - samples_per_sec: the sum over live workers;
// - loss: the mean over live workers that reported progress, or over every
//   worker that did when none is live (a finished job keeps its last loss);
// - each worker's straggler flag (see IsStraggler);
// - late_gradients and too_stale: sums over every shard;
// - each worker's late_gradients: the sum over shards of
//   late_by_worker[i] for the i-th worker entry (entries are by rank).
// Leaves every other field alone.
void SummarizeJobStatus(v1::JobStatus* status);

// When status->state() is COMPLETED, adds to status->warnings() what went
// wrong without failing the job: in sync, shards holding chunks that ended
// at different versions (status->shards(): their steps differ); from the
// job's example ledger (status->data(), an elastic job's), blocks of the
// epochs never trained, and reports of blocks trained by a rank that did
// not hold them (trained twice). Leaves a running, stopped or failed job's
// status alone.
void AddCompletionWarnings(v1::JobStatus* status);

// The median of `steps` (the mean of the two middle values for an even
// count); 0 for none.
double MedianStep(std::vector<uint64_t> steps);

// A live worker is a straggler when its step is more than
// max(3, 10% of the median) behind the median step of the live workers.
bool IsStraggler(uint64_t step, double median_step);

}  // namespace grps

#endif  // GRPS_COORDINATOR_JOB_SUMMARY_H_
