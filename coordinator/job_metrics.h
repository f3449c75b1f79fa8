// The job's Prometheus metrics, as the coordinator sees it, from the
// JobStatus it keeps for `grpsctl status` (daemon/metrics.h): built when
// Prometheus scrapes.
//
//   grps_job_state{state}                     1 for the job's state
//   grps_job_global_step, grps_job_total_steps
//   grps_job_samples_per_second               sum over live workers
//   grps_job_loss                             mean recent loss of live workers
//   grps_job_test_accuracy                    latest evaluation (once there is one)
//   grps_job_test_auc                         its AUC (two-class models)
//   grps_job_late_gradients_total, grps_job_too_stale_total   over the shards
//   grps_job_members{role, state}             workers and servers by state
//   grps_job_checkpoints_completed_total
//   grps_job_last_checkpoint_seconds          request to manifest, newest complete
//   grps_job_last_checkpoint_step
//   grps_job_worker_step{rank}, grps_job_worker_samples_per_second{rank},
//   grps_job_worker_loss{rank}, grps_job_worker_straggler{rank}
//                                             as each worker's heartbeat said
#ifndef GRPS_COORDINATOR_JOB_METRICS_H_
#define GRPS_COORDINATOR_JOB_METRICS_H_

#include <vector>

#include "prometheus/metric_family.h"
#include "proto/grps.pb.h"

namespace grps {

std::vector<prometheus::MetricFamily> JobMetricFamilies(const v1::JobStatus& status);

}  // namespace grps

#endif  // GRPS_COORDINATOR_JOB_METRICS_H_
