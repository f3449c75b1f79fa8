#include "server/chunk_optimizer.h"

#include <cstring>

#include "absl/strings/str_cat.h"

namespace grps {

ChunkOptimizer::ChunkOptimizer(const v1::OptimizerConfig& config,
                               Backend* backend, uint64_t num_elements)
    : config_(config), backend_(backend), n_(num_elements) {
  const v1::OptimizerKind kind = config_.kind();
  const size_t bytes = n_ * sizeof(float);
  if (kind == v1::OPTIMIZER_MOMENTUM || kind == v1::OPTIMIZER_NESTEROV ||
      kind == v1::OPTIMIZER_ADAM || kind == v1::OPTIMIZER_ADAGRAD) {
    a_ = DeviceBuffer(backend_, bytes);
    backend_->Fill(a_.f32(), 0.0f, n_);
  }
  if (kind == v1::OPTIMIZER_ADAM) {
    b_ = DeviceBuffer(backend_, bytes);
    backend_->Fill(b_.f32(), 0.0f, n_);
  }
}

void ChunkOptimizer::Apply(float* param, const float* grad, float lr,
                           uint64_t update_index) {
  switch (config_.kind()) {
    case v1::OPTIMIZER_MOMENTUM:
    case v1::OPTIMIZER_NESTEROV: {
      MomentumParams p;
      p.lr = lr;
      p.momentum = config_.momentum();
      p.nesterov = config_.kind() == v1::OPTIMIZER_NESTEROV;
      p.weight_decay = config_.weight_decay();
      backend_->MomentumUpdate(p, param, grad, a_.f32(), n_);
      return;
    }
    case v1::OPTIMIZER_ADAM: {
      AdamParams p;
      p.lr = lr;
      p.beta1 = config_.beta1();
      p.beta2 = config_.beta2();
      p.epsilon = config_.epsilon();
      p.weight_decay = config_.weight_decay();
      p.step = static_cast<int64_t>(update_index + 1);
      backend_->AdamUpdate(p, param, grad, a_.f32(), b_.f32(), n_);
      return;
    }
    case v1::OPTIMIZER_ADAGRAD: {
      AdagradParams p;
      p.lr = lr;
      p.epsilon = config_.epsilon();
      p.weight_decay = config_.weight_decay();
      backend_->AdagradUpdate(p, param, grad, a_.f32(), n_);
      return;
    }
    default: {  // OPTIMIZER_SGD; ValidateJobConfig admits nothing else.
      SgdParams p;
      p.lr = lr;
      p.weight_decay = config_.weight_decay();
      backend_->SgdUpdate(p, param, grad, n_);
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
