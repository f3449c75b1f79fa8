#include "worker/worker_metrics.h"

#include <string>

#include "absl/strings/str_cat.h"
#include "daemon/metrics.h"
#include "prometheus/family.h"

namespace grps {
namespace {

prometheus::Counter& CounterOf(const char* name, const char* help, const std::string& rank) {
  return prometheus::BuildCounter().Name(name).Help(help).Register(*ProcessMetrics()).Add(
      {{"rank", rank}});
}

prometheus::Gauge& GaugeOf(const char* name, const char* help, const std::string& rank) {
  return prometheus::BuildGauge().Name(name).Help(help).Register(*ProcessMetrics()).Add(
      {{"rank", rank}});
}

}  // namespace

WorkerMetrics::WorkerMetrics(uint32_t rank)
    : step_seconds(prometheus::BuildHistogram()
                       .Name("grps_worker_step_seconds")
                       .Help("a training step: pull, compute, push")
                       .Register(*ProcessMetrics())
                       .Add({{"rank", absl::StrCat(rank)}}, DurationBuckets())),
      steps(CounterOf("grps_worker_steps_total", "training steps done", absl::StrCat(rank))),
      samples(CounterOf("grps_worker_samples_total", "training samples processed",
                        absl::StrCat(rank))),
      samples_per_second(GaugeOf("grps_worker_samples_per_second",
                                 "training samples per second, over the last second or so",
                                 absl::StrCat(rank))),
      loss(GaugeOf("grps_worker_loss", "recent training loss (smoothed)", absl::StrCat(rank))),
      pushed_bytes(CounterOf("grps_worker_pushed_bytes_total", "gradient payload bytes pushed",
                             absl::StrCat(rank))),
      pulled_bytes(CounterOf("grps_worker_pulled_bytes_total", "weight payload bytes pulled",
                             absl::StrCat(rank))),
      lane_bytes(CounterOf("grps_worker_lane_bytes_total",
                           "of the bytes pushed and pulled, those that went through "
                           "shared-memory lanes (a shard on the same machine)",
                           absl::StrCat(rank))),
      late_pushes(CounterOf("grps_worker_late_pushes_total",
                            "sync: pushes that a shard counted as after their step",
                            absl::StrCat(rank))),
      too_stale_pushes(CounterOf("grps_worker_too_stale_pushes_total",
                                 "async and ssp: pushes a shard refused as too stale",
                                 absl::StrCat(rank))),
      clipped_steps(CounterOf("grps_worker_clipped_steps_total",
                              "steps whose gradient was clipped (clip_norm, clip_value)",
                              absl::StrCat(rank))),
      gradient_norm(GaugeOf("grps_worker_gradient_norm",
                            "global L2 norm of the gradient before clipping (smoothed; "
                            "only when the job clips)",
                            absl::StrCat(rank))),
      loss_scale(GaugeOf("grps_worker_loss_scale",
                         "f16 compute: the dynamic loss scale now", absl::StrCat(rank))),
      overflow_steps(CounterOf("grps_worker_overflow_steps_total",
                               "f16 compute: gradients that overflowed and were skipped "
                               "(computed again at half the scale)",
                               absl::StrCat(rank))) {}

}  // namespace grps
