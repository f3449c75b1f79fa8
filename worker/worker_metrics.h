// A worker's Prometheus metrics (daemon/metrics.h), in ProcessMetrics(),
// each with the label rank="<rank>". The trainer updates them once per step.
//
//   grps_worker_step_seconds           a training step, pull to push (histogram)
//   grps_worker_steps_total, grps_worker_samples_total
//   grps_worker_samples_per_second     over the last second or so (gauge)
//   grps_worker_loss                   recent training loss, smoothed (gauge)
//   grps_worker_pushed_bytes_total     gradient payload bytes pushed
//   grps_worker_pulled_bytes_total     weight payload bytes pulled
//   grps_worker_lane_bytes_total       of those, bytes through shared-memory
//                                      lanes (both ways)
//   grps_worker_late_pushes_total      pushes a shard counted late (sync)
//   grps_worker_too_stale_pushes_total pushes a shard refused as too stale
//   grps_worker_clipped_steps_total    steps whose gradient was clipped
//   grps_worker_gradient_norm          gradient norm before clipping, smoothed
//                                      (only when the job clips)
//   grps_worker_loss_scale             f16 compute: the loss scale now
//   grps_worker_overflow_steps_total   f16 gradients that overflowed, skipped
#ifndef GRPS_WORKER_WORKER_METRICS_H_
#define GRPS_WORKER_WORKER_METRICS_H_

#include <cstdint>

#include "prometheus/counter.h"
#include "prometheus/gauge.h"
#include "prometheus/histogram.h"

namespace grps {

struct WorkerMetrics {
  explicit WorkerMetrics(uint32_t rank);

  prometheus::Histogram& step_seconds;
  prometheus::Counter& steps;
  prometheus::Counter& samples;
  prometheus::Gauge& samples_per_second;
  prometheus::Gauge& loss;
  prometheus::Counter& pushed_bytes;
  prometheus::Counter& pulled_bytes;
  prometheus::Counter& lane_bytes;
  prometheus::Counter& late_pushes;
  prometheus::Counter& too_stale_pushes;
  prometheus::Counter& clipped_steps;
  prometheus::Gauge& gradient_norm;
  prometheus::Gauge& loss_scale;
  prometheus::Counter& overflow_steps;
};

}  // namespace grps

#endif  // GRPS_WORKER_WORKER_METRICS_H_
