// Async (ASP). Every gradient is applied on arrival. Its staleness is the
// chunk's version minus the version it was computed on, recorded for every
// update; with max_staleness > 0 a staler gradient is counted as too stale
// and not applied. The learning rate is AsyncLearningRate (lr / workers, the
// schedule advancing once per `workers` updates, and with
// staleness_aware_lr divided by 1 + staleness); the program's optimizer a
// push names (PushRequest.optimizers) runs its update, at its learning rate
// over the workers. Pulls never wait.
#include "job/job_config.h"
#include "server/consistency_policy.h"

namespace grps {
namespace {

class AsyncPolicy final : public ChunkPolicy {
 public:
  explicit AsyncPolicy(const v1::JobConfig& config) : config_(config) {}

  GradientFate Accept(const ChunkGradientMeta& g, const GradientRef& grad,
                      UpdateTarget& chunk, const LiveSet& live) override {
    const uint64_t staleness = chunk.version() - g.base_version;
    if (TooStale(config_, staleness))
      return GradientFate::kTooStale;
    const UpdateStep step{AsyncLearningRate(config_, chunk.version(), staleness, g.optimizer),
                          g.optimizer};
    chunk.Apply(grad, step, static_cast<int64_t>(staleness));
    return GradientFate::kApplied;
  }

  bool ReadyToServe(uint32_t, uint64_t, const UpdateTarget&,
                    const LiveSet&) override {
    return true;
  }

  bool LiveSetChanged(UpdateTarget&, const LiveSet&) override { return false; }

 private:
  const v1::JobConfig config_;
};

}  // namespace

std::unique_ptr<ChunkPolicy> MakeAsyncPolicy(const v1::JobConfig& config) {
  return std::make_unique<AsyncPolicy>(config);
}

}  // namespace grps
