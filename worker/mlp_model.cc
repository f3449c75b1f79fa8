#include "worker/mlp_model.h"

#include <algorithm>
#include <cassert>

namespace grps {

MlpModel::MlpModel(Backend* backend, std::vector<int64_t> widths, int max_batch)
    : backend_(backend), widths_(std::move(widths)), max_batch_(max_batch) {
  assert(widths_.size() >= 2 && max_batch_ > 0);
  const size_t layers = widths_.size() - 1;
  for (size_t l = 0; l < layers; ++l) {
    weight_offset_.push_back(num_params_);
    num_params_ += widths_[l] * widths_[l + 1];
    bias_offset_.push_back(num_params_);
    num_params_ += widths_[l + 1];
  }
  params_ = DeviceBuffer(backend_, num_params_ * sizeof(float));
  grads_ = DeviceBuffer(backend_, num_params_ * sizeof(float));
  labels_ = DeviceBuffer(backend_, max_batch_ * sizeof(int32_t));
  for (size_t l = 0; l <= layers; ++l)
    activations_.emplace_back(backend_, max_batch_ * widths_[l] * sizeof(float));
  for (size_t l = 0; l < layers; ++l)
    deltas_.emplace_back(backend_, max_batch_ * widths_[l + 1] * sizeof(float));
  backend_->Fill(params_.f32(), 0.0f, num_params_);
}

void MlpModel::SetParameters(const float* host_params) {
  backward_batch_ = 0;
  backend_->CopyToDevice(params_.data(), host_params, num_params_ * sizeof(float));
  Round(params_.f32(), num_params_);
}

void MlpModel::Round(float* x, size_t n) {
  if (compute_dtype_ != DType::kF32) backend_->RoundTo(compute_dtype_, x, n);
}

void MlpModel::GetParameters(float* host_params) {
  backend_->CopyToHost(host_params, params_.data(), num_params_ * sizeof(float));
}

void MlpModel::GetGradients(float* host_grads) {
  backend_->CopyToHost(host_grads, grads_.data(), num_params_ * sizeof(float));
}

void MlpModel::AccumulateGradients(bool first) {
  if (grad_sum_.data() == nullptr)
    grad_sum_ = DeviceBuffer(backend_, num_params_ * sizeof(float));
  if (first)
    backend_->CopyOnDevice(grad_sum_.data(), grads_.data(), num_params_ * sizeof(float));
  else
    backend_->Axpy(1.0f, grads_.f32(), grad_sum_.f32(), num_params_);
}

void MlpModel::GetMeanGradients(float* host_grads, int count) {
  assert(grad_sum_.data() != nullptr && count > 0);
  if (count > 1) backend_->Scale(1.0f / static_cast<float>(count), grad_sum_.f32(), num_params_);
  backend_->CopyToHost(host_grads, grad_sum_.data(), num_params_ * sizeof(float));
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
  backend_->Gemm(false, true, backward_batch_, in, out, 1.0f, deltas_[0].f32(),
                 out, params_.f32() + weight_offset_[0], out, 0.0f,
                 input_grad_.f32(), in);
  backend_->CopyToHost(host_dx, input_grad_.data(),
                       static_cast<size_t>(backward_batch_) * in * sizeof(float));
}

float MlpModel::ForwardBackward(const float* host_x, const int32_t* host_labels,
                                int batch, int64_t* correct, float loss_scale) {
  assert(batch > 0 && batch <= max_batch_);
  backend_->CopyToDevice(activations_[0].data(), host_x,
                         static_cast<size_t>(batch) * widths_[0] * sizeof(float));
  backend_->CopyToDevice(labels_.data(), host_labels, batch * sizeof(int32_t));
  const float loss = Run(batch, /*backward=*/true, correct, loss_scale);
  backward_batch_ = batch;
  return loss;
}

EvalResult MlpModel::Evaluate(const float* host_x, const int32_t* host_labels,
                              int64_t count) {
  EvalResult result;
  double loss_sum = 0;
  int64_t hits = 0;
  for (int64_t first = 0; first < count; first += max_batch_) {
    const int batch = static_cast<int>(std::min<int64_t>(max_batch_, count - first));
    backend_->CopyToDevice(activations_[0].data(), host_x + first * widths_[0],
                           static_cast<size_t>(batch) * widths_[0] * sizeof(float));
    backend_->CopyToDevice(labels_.data(), host_labels + first,
                           batch * sizeof(int32_t));
    int64_t correct = 0;
    loss_sum += static_cast<double>(Run(batch, /*backward=*/false, &correct)) * batch;
    hits += correct;
  }
  result.examples = count;
  if (count > 0) {
    result.loss = loss_sum / count;
    result.accuracy = static_cast<double>(hits) / count;
  }
  return result;
}

float MlpModel::Run(int batch, bool backward, int64_t* correct, float loss_scale) {
  const size_t layers = widths_.size() - 1;
  float* p = params_.f32();
  Round(activations_[0].f32(), static_cast<size_t>(batch) * widths_[0]);
  // Forward: z = h W + b; h' = relu(z) except after the last layer.
  for (size_t l = 0; l < layers; ++l) {
    const int in = static_cast<int>(widths_[l]);
    const int out = static_cast<int>(widths_[l + 1]);
    float* h = activations_[l].f32();
    float* z = activations_[l + 1].f32();
    backend_->Gemm(false, false, batch, out, in, 1.0f, h, in, p + weight_offset_[l],
                   out, 0.0f, z, out);
    backend_->BiasAdd(z, p + bias_offset_[l], batch, out);
    Round(z, static_cast<size_t>(batch) * out);
    if (l + 1 < layers) backend_->Relu(z, z, static_cast<size_t>(batch) * out);
  }
  const int classes = static_cast<int>(widths_.back());
  float loss = backend_->SoftmaxCrossEntropy(
      activations_[layers].f32(), labels_.i32(), batch, classes,
      backward ? deltas_[layers - 1].f32() : nullptr, correct);
  if (!backward) return loss;
  const int rows_out = batch * classes;
  if (loss_scale != 1.0f) backend_->Scale(loss_scale, deltas_[layers - 1].f32(), rows_out);
  Round(deltas_[layers - 1].f32(), rows_out);
  // Backward: dW = h^T dz, db = colsum(dz), dh = dz W^T, dz_prev = relu'(dh).
  float* g = grads_.f32();
  for (size_t l = layers; l-- > 0;) {
    const int in = static_cast<int>(widths_[l]);
    const int out = static_cast<int>(widths_[l + 1]);
    float* dz = deltas_[l].f32();
    backend_->Gemm(true, false, in, out, batch, 1.0f, activations_[l].f32(), in,
                   dz, out, 0.0f, g + weight_offset_[l], out);
    backend_->BiasGrad(dz, g + bias_offset_[l], batch, out);
    Round(g + weight_offset_[l], static_cast<size_t>(in) * out + out);  // dW, then db
    if (l > 0) {
      float* dh = deltas_[l - 1].f32();
      backend_->Gemm(false, true, batch, in, out, 1.0f, dz, out,
                     p + weight_offset_[l], out, 0.0f, dh, in);
      Round(dh, static_cast<size_t>(batch) * in);
      backend_->ReluGrad(activations_[l].f32(), dh, dh,
                         static_cast<size_t>(batch) * in);
    }
  }
  if (loss_scale != 1.0f) backend_->Scale(1.0f / loss_scale, g, num_params_);
  return loss;
}

}  // namespace grps
