#include "server/chunk_optimizer.h"

#include <cstring>

#include "absl/strings/str_cat.h"

namespace grps {

ChunkOptimizer::ChunkOptimizer(const v1::OptimizerConfig& config, v1::ConsistencyMode mode,
                               Backend* backend, uint64_t num_elements)
    : config_(config), mode_(mode), backend_(backend), n_(num_elements) {
  const uint32_t slots = OptimizerStateSlots(config_.kind());
  const size_t bytes = n_ * sizeof(float);
  if (slots >= 1) {
    a_ = DeviceBuffer(backend_, bytes);
    backend_->Fill(a_.f32(), 0.0f, n_);
  }
  if (slots >= 2) {
    b_ = DeviceBuffer(backend_, bytes);
    backend_->Fill(b_.f32(), 0.0f, n_);
  }
}

void ChunkOptimizer::Apply(float* param, const float* grad, const UpdateStep& step,
                           uint64_t update_index) {
  if (config_.kind() == v1::OPTIMIZER_WORKERS) {
    if (mode_ == v1::MODE_SYNC) {
      backend_->CopyOnDevice(param, grad, n_ * sizeof(float));
    } else {
      backend_->Axpy(1.0f, grad, param, n_);
    }
    return;
  }
  ApplyOptimizerStep(step.optimizer != nullptr ? *step.optimizer : config_, *backend_, step.lr,
                     static_cast<int64_t>(update_index + 1), param, grad, a_.f32(), b_.f32(), n_);
}

void ApplyOptimizerStep(const v1::OptimizerConfig& config, Backend& backend, float lr,
                        int64_t step, float* param, const float* grad, float* a, float* b,
                        uint64_t n) {
  switch (config.kind()) {
    case v1::OPTIMIZER_MOMENTUM:
    case v1::OPTIMIZER_NESTEROV: {
      MomentumParams p;
      p.lr = lr;
      p.momentum = config.momentum();
      p.nesterov = config.kind() == v1::OPTIMIZER_NESTEROV;
      p.weight_decay = config.weight_decay();
      backend.MomentumUpdate(p, param, grad, a, n);
      return;
    }
    case v1::OPTIMIZER_ADAM: {
      AdamParams p;
      p.lr = lr;
      p.beta1 = config.beta1();
      p.beta2 = config.beta2();
      p.epsilon = config.epsilon();
      p.weight_decay = config.weight_decay();
      p.decoupled_weight_decay = config.decoupled_weight_decay();
      p.step = step;
      backend.AdamUpdate(p, param, grad, a, b, n);
      return;
    }
    case v1::OPTIMIZER_ADAGRAD: {
      AdagradParams p;
      p.lr = lr;
      p.epsilon = config.epsilon();
      p.weight_decay = config.weight_decay();
      backend.AdagradUpdate(p, param, grad, a, n);
      return;
    }
    default: {  // OPTIMIZER_SGD; ValidateJobConfig admits nothing else here (no
                // sparse tables with OPTIMIZER_WORKERS, which ChunkOptimizer runs).
      SgdParams p;
      p.lr = lr;
      p.weight_decay = config.weight_decay();
      backend.SgdUpdate(p, param, grad, n);
      return;
    }
  }
}

}  // namespace grps

namespace grps {

std::vector<std::string> ChunkOptimizer::SaveState() const {
  std::vector<std::string> slots;
  for (const DeviceBuffer* b : {&a_, &b_})
    if (b->f32() != nullptr)
      slots.emplace_back(reinterpret_cast<const char*>(b->f32()), n_ * sizeof(float));
  return slots;
}

absl::Status ChunkOptimizer::CheckState(const std::vector<const std::string*>& slots) const {
  const size_t want = (a_.f32() != nullptr ? 1 : 0) + (b_.f32() != nullptr ? 1 : 0);
  if (slots.size() != want)
    return absl::InvalidArgumentError(absl::StrCat(
        slots.size(), " optimizer state slots, the job's optimizer has ", want));
  for (const std::string* slot : slots)
    if (slot->size() != n_ * sizeof(float))
      return absl::InvalidArgumentError(absl::StrCat(
          "an optimizer state slot of ", slot->size(), " bytes for ", n_, " elements"));
  return absl::OkStatus();
}

void ChunkOptimizer::LoadState(const std::vector<const std::string*>& slots) {
  size_t i = 0;
  for (DeviceBuffer* b : {&a_, &b_})
    if (b->f32() != nullptr) std::memcpy(b->f32(), slots[i++]->data(), n_ * sizeof(float));
}

void ChunkOptimizer::Reset() {
  for (DeviceBuffer* b : {&a_, &b_})
    if (b->f32() != nullptr) backend_->Fill(b->f32(), 0.0f, n_);
}

}  // namespace grps
