#include "worker/mlp_model.h"

#include <algorithm>
#include <cassert>
#include <cstring>

#include "tensor/host_memory.h"
#include "worker/binary_auc.h"

namespace grps {

MlpModel::MlpModel(Backend* backend, std::vector<int64_t> widths, int max_batch)
    : backend_(backend), widths_(std::move(widths)), max_batch_(max_batch) {
  assert(widths_.size() >= 2 && max_batch_ > 0);
  for (size_t l = 0; l < layers(); ++l) {
    weight_offset_.push_back(num_params_);
    num_params_ += widths_[l] * widths_[l + 1];
    bias_offset_.push_back(num_params_);
    num_params_ += widths_[l + 1];
  }
  params_ = DeviceBuffer(backend_, num_params_ * sizeof(float));
  grads_ = DeviceBuffer(backend_, num_params_ * sizeof(float));
  const size_t input = static_cast<size_t>(max_batch_) * widths_[0];
  for (InputSlot& slot : slots_) {
    slot.x = HostArray<float>(backend_, input);
    slot.labels = HostArray<int32_t>(backend_, max_batch_);
    slot.device_x = DeviceBuffer(backend_, input * sizeof(float));
    slot.device_labels = DeviceBuffer(backend_, max_batch_ * sizeof(int32_t));
    slot.uploaded = backend_->CreateEvent();
    slot.released = backend_->CreateEvent();
  }
  for (size_t l = 0; l < layers(); ++l) {
    outputs_.emplace_back(backend_, max_batch_ * widths_[l + 1] * sizeof(float));
    deltas_.emplace_back(backend_, max_batch_ * widths_[l + 1] * sizeof(float));
    layer_uploaded_.push_back(backend_->CreateEvent());
  }
  layers_awaited_ = layers();
  params_released_ = backend_->CreateEvent();
  layer_grads_ready_ = backend_->CreateEvent();
  grads_downloaded_ = backend_->CreateEvent();
  sync_loss_ = HostArray<LossOutput>(backend_, 1);
  backend_->Fill(params_.f32(), 0.0f, num_params_);
  // The first upload goes over the zeros, not under them.
  backend_->Record(Queue::kCompute, params_released_.get());
}

void MlpModel::UseParameters(const float* host_params) {
  if (backend_->IsCuda() || compute_dtype_ != DType::kF32) {
    SetParameters(host_params);
    return;
  }
  // The passes read the caller's array where it is: nothing to upload or
  // round, no pass of the model is still running (FinishStep, Evaluate and
  // ForwardBackward wait for theirs).
  backward_batch_ = 0;
  backend_->WaitOnHost(*params_released_);
  used_params_ = host_params;
  for (size_t l = 0; l < layers(); ++l) backend_->Record(Queue::kCopy, layer_uploaded_[l].get());
  layers_awaited_ = 0;
}

const float* MlpModel::Params() const {
  return used_params_ != nullptr ? used_params_ : params_.f32();
}

void MlpModel::SetParameters(const float* host_params) {
  used_params_ = nullptr;
  backward_batch_ = 0;
  // Not over weights that enqueued passes still read.
  backend_->Wait(Queue::kCopy, *params_released_);
  for (size_t l = 0; l < layers(); ++l) {
    backend_->CopyToDeviceAsync(params_.f32() + weight_offset_[l],
                                host_params + weight_offset_[l], LayerSize(l) * sizeof(float));
    backend_->Record(Queue::kCopy, layer_uploaded_[l].get());
  }
  layers_awaited_ = 0;
}

void MlpModel::AwaitLayers(size_t l) {
  for (; layers_awaited_ <= l; ++layers_awaited_) {
    backend_->Wait(Queue::kCompute, *layer_uploaded_[layers_awaited_]);
    Round(params_.f32() + weight_offset_[layers_awaited_], LayerSize(layers_awaited_));
  }
}

void MlpModel::Round(float* x, size_t n) {
  if (compute_dtype_ != DType::kF32) backend_->RoundTo(compute_dtype_, x, n);
}

void MlpModel::GetParameters(float* host_params) {
  AwaitLayers(layers() - 1);
  backend_->CopyToHost(host_params, Params(), num_params_ * sizeof(float));
}

void MlpModel::GetGradients(float* host_grads) {
  backend_->CopyToHost(host_grads, grads_.data(), num_params_ * sizeof(float));
}

MlpModel::InputSlot& MlpModel::Stage(std::optional<uint64_t> tag, const float* host_x,
                                     const int32_t* host_labels, int batch) {
  CheckOrDie(batch > 0 && batch <= max_batch_, "MlpModel", "a batch larger than max_batch");
  InputSlot* slot = &slots_[next_slot_];
  if (slot->tag.has_value()) slot = &slots_[1 - next_slot_];
  CheckOrDie(!slot->tag.has_value(), "MlpModel", "a third batch staged");
  next_slot_ = static_cast<int>(slot - slots_.data()) == 0 ? 1 : 0;
  // The staging memory is free once its last upload is done, and the device
  // buffer once the passes that read it are.
  backend_->WaitOnHost(*slot->uploaded);
  const size_t x_bytes = static_cast<size_t>(batch) * widths_[0] * sizeof(float);
  std::memcpy(slot->x.data(), host_x, x_bytes);
  std::memcpy(slot->labels.data(), host_labels, batch * sizeof(int32_t));
  backend_->Wait(Queue::kCopy, *slot->released);
  backend_->CopyToDeviceAsync(slot->device_x.data(), slot->x.data(), x_bytes);
  backend_->CopyToDeviceAsync(slot->device_labels.data(), slot->labels.data(),
                              batch * sizeof(int32_t));
  backend_->Record(Queue::kCopy, slot->uploaded.get());
  slot->tag = tag;
  slot->batch = batch;
  return *slot;
}

void MlpModel::StageBatch(uint64_t tag, const float* host_x, const int32_t* host_labels,
                          int batch) {
  CheckOrDie(!IsStaged(tag), "MlpModel", "a batch staged twice");
  Stage(tag, host_x, host_labels, batch);
}

bool MlpModel::IsStaged(uint64_t tag) const {
  return std::any_of(slots_.begin(), slots_.end(),
                     [tag](const InputSlot& s) { return s.tag == tag; });
}

void MlpModel::DropStaged() {
  for (InputSlot& slot : slots_) slot.tag.reset();
}

void MlpModel::ComputeStaged(uint64_t tag, int pass, int passes, float loss_scale,
                             float* host_grads) {
  CheckOrDie(passes > 0 && pass >= 0 && pass < passes, "MlpModel", "pass out of range");
  CheckOrDie(host_grads != nullptr, "MlpModel", "a step's gradients need a destination");
  auto slot = std::find_if(slots_.begin(), slots_.end(),
                           [tag](const InputSlot& s) { return s.tag == tag; });
  CheckOrDie(slot != slots_.end(), "MlpModel", "computing a batch that is not staged");
  slot->tag.reset();
  if (pass == 0) {
    CheckOrDie(!step_open_, "MlpModel", "a step begun before FinishStep of the one before");
    if (step_losses_.size() < static_cast<size_t>(passes)) {
      backend_->Synchronize();  // no loss is still being written
      step_losses_ = HostArray<LossOutput>(backend_, passes);
    }
    step_passes_ = 0;
    step_total_passes_ = passes;
    step_open_ = true;
  }
  CheckOrDie(step_open_ && pass == step_passes_ && passes == step_total_passes_, "MlpModel",
             "a step's passes out of order");
  Run(*slot, /*backward=*/true, &step_losses_[step_passes_++], loss_scale,
      {pass, passes, host_grads});
}

float MlpModel::FinishStep(int64_t* correct) {
  CheckOrDie(step_open_ && step_passes_ == step_total_passes_, "MlpModel",
             "FinishStep before the step's last pass");
  step_open_ = false;
  backend_->WaitOnHost(*grads_downloaded_);
  double loss = 0;
  int64_t hits = 0;
  for (int i = 0; i < step_passes_; ++i) {
    int64_t pass_hits = 0;
    loss += CheckedMean(step_losses_[i], &pass_hits);
    hits += pass_hits;
  }
  if (correct != nullptr) *correct = hits;
  return step_passes_ > 0 ? static_cast<float>(loss / step_passes_) : 0.0f;
}

float MlpModel::CheckedMean(const LossOutput& loss, int64_t* correct) {
  CheckOrDie(loss.bad_label == 0, "MlpModel", "a label outside [0, classes)");
  if (correct != nullptr) *correct = static_cast<int64_t>(loss.correct);
  return loss.mean_loss();
}

void MlpModel::GetInputGradient(float* host_dx) {
  assert(backward_batch_ > 0);
  if (input_grad_.data() == nullptr) {
    input_grad_ = DeviceBuffer(backend_, static_cast<size_t>(max_batch_) *
                                             widths_[0] * sizeof(float));
  }
  // dx = dz_0 W_0^T, with dz_0 = d loss / d pre-activation of the first layer.
  const int in = static_cast<int>(widths_[0]);
  const int out = static_cast<int>(widths_[1]);
  backend_->GemmIn(compute_dtype_, false, true, backward_batch_, in, out, 1.0f,
                   deltas_[0].f32(), out, Params() + weight_offset_[0], out, 0.0f,
                   input_grad_.f32(), in);
  backend_->CopyToHost(host_dx, input_grad_.data(),
                       static_cast<size_t>(backward_batch_) * in * sizeof(float));
}

float MlpModel::ForwardBackward(const float* host_x, const int32_t* host_labels,
                                int batch, int64_t* correct, float loss_scale) {
  InputSlot& slot = Stage(std::nullopt, host_x, host_labels, batch);
  Run(slot, /*backward=*/true, sync_loss_.data(), loss_scale, {});
  backend_->Synchronize();
  return CheckedMean(sync_loss_[0], correct);
}

EvalResult MlpModel::Evaluate(const float* host_x, const int32_t* host_labels, int64_t count,
                              std::vector<float>* class1_scores) {
  EvalResult result;
  double loss_sum = 0;
  int64_t hits = 0;
  const bool binary = widths_.back() == 2;
  std::vector<float> scores, logits;
  auto stage = [&](int64_t first) -> InputSlot& {
    const int batch = static_cast<int>(std::min<int64_t>(max_batch_, count - first));
    return Stage(std::nullopt, host_x + first * widths_[0], host_labels + first, batch);
  };
  if (count > 0) {
    InputSlot* slot = &stage(0);
    for (int64_t first = 0; first < count; first += max_batch_) {
      const int batch = slot->batch;
      Run(*slot, /*backward=*/false, sync_loss_.data(), 1.0f, {});
      // The next batch uploads while this one computes.
      if (first + max_batch_ < count) slot = &stage(first + max_batch_);
      backend_->Synchronize();
      int64_t correct = 0;
      loss_sum += static_cast<double>(CheckedMean(sync_loss_[0], &correct)) * batch;
      hits += correct;
      if (binary) {
        logits.resize(2 * static_cast<size_t>(batch));
        backend_->CopyToHost(logits.data(), outputs_.back().f32(), logits.size() * sizeof(float));
        for (int i = 0; i < batch; ++i) scores.push_back(logits[2 * i + 1] - logits[2 * i]);
      }
    }
  }
  result.examples = count;
  if (count > 0) {
    result.loss = loss_sum / count;
    result.accuracy = static_cast<double>(hits) / count;
  }
  if (binary) {
    result.auc = BinaryAuc(scores, absl::MakeConstSpan(host_labels, static_cast<size_t>(count)));
    if (class1_scores != nullptr)
      class1_scores->insert(class1_scores->end(), scores.begin(), scores.end());
  }
  return result;
}

void MlpModel::Run(InputSlot& slot, bool backward, LossOutput* loss, float loss_scale,
                   const PassPlan& plan) {
  const int batch = slot.batch;
  const float* p = Params();
  float* input = slot.device_x.f32();
  backend_->Wait(Queue::kCompute, *slot.uploaded);
  slot.tag.reset();
  Round(input, static_cast<size_t>(batch) * widths_[0]);
  // Forward: z = h W + b; h' = relu(z) except after the last layer.
  for (size_t l = 0; l < layers(); ++l) {
    const int in = static_cast<int>(widths_[l]);
    const int out = static_cast<int>(widths_[l + 1]);
    const float* h = l == 0 ? input : outputs_[l - 1].f32();
    float* z = outputs_[l].f32();
    AwaitLayers(l);
    backend_->GemmIn(compute_dtype_, false, false, batch, out, in, 1.0f, h, in,
                     p + weight_offset_[l], out, 0.0f, z, out);
    backend_->BiasAdd(z, p + bias_offset_[l], batch, out);
    Round(z, static_cast<size_t>(batch) * out);
    if (l + 1 < layers()) backend_->Relu(z, z, static_cast<size_t>(batch) * out);
  }
  const int classes = static_cast<int>(widths_.back());
  float* dlogits = backward ? deltas_.back().f32() : nullptr;
  backend_->EnqueueSoftmaxCrossEntropy(outputs_.back().f32(), slot.device_labels.i32(),
                                       batch, classes, dlogits, loss);
  if (backward) {
    backward_batch_ = batch;
    const size_t rows_out = static_cast<size_t>(batch) * classes;
    if (loss_scale != 1.0f) backend_->Scale(loss_scale, dlogits, rows_out);
    Round(dlogits, rows_out);
    // Not over gradients that the copy queue is still downloading (the
    // synchronous calls right after a step whose FinishStep has not come).
    backend_->Wait(Queue::kCompute, *grads_downloaded_);
    // Backward: dW = h^T dz, db = colsum(dz), dh = dz W^T, dz_prev = relu'(dh).
    // On the CPU a one-pass step's gradients are written where the caller
    // wants them: there is no device to download them from.
    float* g = plan.host_grads != nullptr && plan.passes == 1 && !backend_->IsCuda()
                   ? plan.host_grads
                   : grads_.f32();
    for (size_t l = layers(); l-- > 0;) {
      const int in = static_cast<int>(widths_[l]);
      const int out = static_cast<int>(widths_[l + 1]);
      const float* h = l == 0 ? input : outputs_[l - 1].f32();
      float* dz = deltas_[l].f32();
      backend_->GemmIn(compute_dtype_, true, false, in, out, batch, 1.0f, h, in, dz, out,
                       0.0f, g + weight_offset_[l], out);
      backend_->BiasGrad(dz, g + bias_offset_[l], batch, out);
      Round(g + weight_offset_[l], LayerSize(l));  // dW, then db
      if (l > 0) {
        float* dh = deltas_[l - 1].f32();
        backend_->GemmIn(compute_dtype_, false, true, batch, in, out, 1.0f, dz, out,
                         p + weight_offset_[l], out, 0.0f, dh, in);
        Round(dh, static_cast<size_t>(batch) * in);
        backend_->ReluGrad(outputs_[l - 1].f32(), dh, dh, static_cast<size_t>(batch) * in);
      }
      FinishLayerGradient(l, g, loss_scale, plan);
    }
    if (plan.pass + 1 == plan.passes && plan.host_grads != nullptr)
      backend_->Record(Queue::kCopy, grads_downloaded_.get());
  }
  backend_->Record(Queue::kCompute, slot.released.get());
  backend_->Record(Queue::kCompute, params_released_.get());
}

void MlpModel::FinishLayerGradient(size_t l, float* grads, float loss_scale,
                                   const PassPlan& plan) {
  const size_t n = LayerSize(l);
  float* result = grads + weight_offset_[l];
  if (loss_scale != 1.0f) backend_->Scale(1.0f / loss_scale, result, n);
  if (plan.passes > 1) {
    if (grad_sum_.data() == nullptr)
      grad_sum_ = DeviceBuffer(backend_, num_params_ * sizeof(float));
    float* sum = grad_sum_.f32() + weight_offset_[l];
    if (plan.pass == 0) backend_->CopyOnDevice(sum, result, n * sizeof(float));
    else backend_->Axpy(1.0f, result, sum, n);
    if (plan.pass + 1 == plan.passes) backend_->Scale(1.0f / plan.passes, sum, n);
    result = sum;
  }
  if (plan.pass + 1 < plan.passes || plan.host_grads == nullptr) return;
  // The download of this layer overlaps the backward pass of the ones below
  // (a gradient written in place needs none, but FinishStep still waits
  // for the pass through the copy queue).
  backend_->Record(Queue::kCompute, layer_grads_ready_.get());
  backend_->Wait(Queue::kCopy, *layer_grads_ready_);
  if (result == plan.host_grads + weight_offset_[l]) return;
  backend_->CopyToHostAsync(plan.host_grads + weight_offset_[l], result, n * sizeof(float));
}

}  // namespace grps
