// FakeTarget: an UpdateTarget of a few floats for the tests of the
// policies and the store's parts. Apply records each update (the gradient,
// the learning rate, the staleness, the program's optimizer) and adds one to the version; its
// gradient buffers are plain vectors that add in the order they are given.
// Not thread-safe (a policy's caller holds the target's lock).
#ifndef GRPS_SERVER_TESTING_POLICY_TEST_TARGET_H_
#define GRPS_SERVER_TESTING_POLICY_TEST_TARGET_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "job/job_config.h"
#include "proto/grps.pb.h"
#include "server/consistency_policy.h"

namespace grps {

class FakeTarget final : public UpdateTarget {
 public:
  explicit FakeTarget(size_t n, uint64_t version = 0) : n_(n), version_(version) {}

  struct Update {
    std::vector<float> grad;
    float lr = 0;
    int64_t staleness = 0;
    std::optional<v1::OptimizerConfig> optimizer;  // the program's, if it named one
  };
  std::vector<Update> updates;

  uint64_t version() const override { return version_; }
  std::unique_ptr<GradientBuffer> NewBuffer() override { return std::make_unique<Buffer>(n_); }
  void Apply(const GradientRef& grad, const UpdateStep& step, int64_t staleness) override {
    std::optional<v1::OptimizerConfig> optimizer;
    if (step.optimizer != nullptr) optimizer = *step.optimizer;
    updates.push_back(
        Update{{grad.values.begin(), grad.values.end()}, step.lr, staleness, optimizer});
    ++version_;
  }

 private:
  class Buffer final : public GradientBuffer {
   public:
    explicit Buffer(size_t n) : sum_(n, 0.0f) {}
    void Add(const GradientRef& g) override {
      for (size_t i = 0; i < sum_.size(); ++i) sum_[i] += g.values[i];
    }
    void Scale(float factor) override {
      for (float& v : sum_) v *= factor;
    }
    void Clear() override { sum_.assign(sum_.size(), 0.0f); }
    GradientRef Ref() const override { return GradientRef{sum_, {}}; }

   private:
    std::vector<float> sum_;
  };

  const size_t n_;
  uint64_t version_;
};

// A job of `workers` workers in `mode`, plain SGD at a constant learning
// rate of 1.
inline v1::JobConfig PolicyTestConfig(v1::ConsistencyMode mode, uint32_t workers) {
  v1::JobConfig c = DefaultJobConfig();
  c.set_mode(mode);
  c.set_num_workers(workers);
  c.set_num_servers(1);
  c.mutable_optimizer()->set_kind(v1::OPTIMIZER_SGD);
  c.mutable_optimizer()->set_learning_rate(1.0f);
  c.mutable_optimizer()->set_momentum(0.0f);
  c.mutable_optimizer()->set_warmup_steps(0);
  c.mutable_optimizer()->set_decay_steps(0);
  return c;
}

// The gradient `values` of a dense chunk.
inline GradientRef Grad(const std::vector<float>& values) { return GradientRef{values, {}}; }

}  // namespace grps

#endif  // GRPS_SERVER_TESTING_POLICY_TEST_TARGET_H_
