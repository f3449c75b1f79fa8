// MlpModel: a multi-layer perceptron classifier (softmax regression when it
// has no hidden layer) whose forward and backward passes run on a Backend.
#ifndef GRPS_WORKER_MLP_MODEL_H_
#define GRPS_WORKER_MLP_MODEL_H_

#include <cstdint>
#include <vector>

#include "tensor/backend.h"

namespace grps {

// Loss and accuracy over a set of examples.
struct EvalResult {
  double loss = 0;      // mean softmax cross-entropy
  double accuracy = 0;  // fraction of argmax == label
  int64_t examples = 0;
};

// Parameters live in one flat f32 array in the order of ModelTensors():
// for each layer l, weight [in_l, out_l] then bias [out_l]. Gradients use the
// same layout. The model owns backend buffers for parameters, gradients and
// the activations of up to `max_batch` examples.
//
// Thread safety: one thread at a time (like the Backend it runs on).
class MlpModel {
 public:
  // widths: input, hidden..., classes (at least two entries).
  // *backend must outlive the model.
  MlpModel(Backend* backend, std::vector<int64_t> widths, int max_batch);

  int64_t num_parameters() const { return num_params_; }
  const std::vector<int64_t>& widths() const { return widths_; }

  // Mixed precision: with kF16 or kBF16 the passes compute as 16-bit
  // hardware does, on f32 buffers: the weights (set by SetParameters), the
  // input, every layer's output and every gradient are rounded to the
  // dtype (Backend::RoundTo), the products accumulate in f32, and the
  // softmax and its loss stay f32. The weights the caller holds (the
  // servers' f32 master weights) are not touched. Default kF32.
  void set_compute_dtype(DType dtype) { compute_dtype_ = dtype; }
  DType compute_dtype() const { return compute_dtype_; }

  // Copies host parameters (num_parameters() floats) into the model.
  void SetParameters(const float* host_params);
  // Copies the model's parameters to host memory.
  void GetParameters(float* host_params);

  // Forward and backward over `batch` examples (row-major x[batch, input],
  // labels in [0, classes)); leaves d(mean loss)/d(params) in the gradient
  // buffer and returns the mean loss. *correct (if not null) counts hits.
  // loss_scale: the backward pass runs on the loss times this (so that
  // small f16 gradients do not flush to zero) and the gradient is divided
  // by it again in f32; a value the compute dtype cannot hold becomes inf
  // (the caller checks the gradient and lowers the scale).
  float ForwardBackward(const float* host_x, const int32_t* host_labels,
                        int batch, int64_t* correct, float loss_scale = 1.0f);
  // Copies the gradient of the last ForwardBackward to host memory.
  void GetGradients(float* host_grads);
  // Gradient accumulation, in backend memory: AccumulateGradients adds the
  // gradient of the last ForwardBackward to a sum (`first`: starts a new
  // sum with it); GetMeanGradients writes sum / count to host memory.
  void AccumulateGradients(bool first);
  void GetMeanGradients(float* host_grads, int count);
  // Writes d(mean loss)/d(input) of the last ForwardBackward to host memory:
  // batch x widths()[0] floats, row-major like host_x. Computed on demand
  // (one Gemm) from the parameters of that pass, so it requires that a
  // ForwardBackward ran and no SetParameters came since (Evaluate may), in
  // f32 at loss scale 1.
  void GetInputGradient(float* host_dx);

  // Forward only, in batches of at most max_batch.
  EvalResult Evaluate(const float* host_x, const int32_t* host_labels,
                      int64_t count);

 private:
  // Runs the forward pass over `batch` rows already in input_; returns the
  // loss and, if backward, fills the gradient buffer.
  float Run(int batch, bool backward, int64_t* correct, float loss_scale = 1.0f);
  // Rounds x to the compute dtype (nothing in f32).
  void Round(float* x, size_t n);

  Backend* backend_;
  std::vector<int64_t> widths_;
  int max_batch_;
  DType compute_dtype_ = DType::kF32;
  int64_t num_params_ = 0;
  std::vector<int64_t> weight_offset_;  // per layer, into the flat arrays
  std::vector<int64_t> bias_offset_;
  DeviceBuffer params_;
  DeviceBuffer grads_;
  DeviceBuffer labels_;
  // activations_[0] is the input; activations_[l + 1] the output of layer l
  // (post-ReLU for hidden layers, logits for the last).
  std::vector<DeviceBuffer> activations_;
  std::vector<DeviceBuffer> deltas_;  // d loss / d pre-activation, per layer
  // The batch of the last ForwardBackward whose deltas_ and params_ are still
  // current; 0 when there is none (GetInputGradient's precondition).
  int backward_batch_ = 0;
  DeviceBuffer input_grad_;  // max_batch x widths[0], allocated on first use
  DeviceBuffer grad_sum_;    // AccumulateGradients' sum, allocated on first use
};

}  // namespace grps

#endif  // GRPS_WORKER_MLP_MODEL_H_
