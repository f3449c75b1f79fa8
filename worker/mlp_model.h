// MlpModel: a multi-layer perceptron classifier (softmax regression when it
// has no hidden layer) whose forward and backward passes run on a Backend.
#ifndef GRPS_WORKER_MLP_MODEL_H_
#define GRPS_WORKER_MLP_MODEL_H_

#include <array>
#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "tensor/backend.h"

namespace grps {

// Loss and accuracy over a set of examples.
struct EvalResult {
  double loss = 0;      // mean softmax cross-entropy (for two classes: the log loss)
  double accuracy = 0;  // fraction of argmax == label
  int64_t examples = 0;
  // Two classes: the area under the ROC curve of class 1's score
  // (worker/binary_auc.h); -1 otherwise, or without both classes.
  double auc = -1;
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

  // Starts copying host parameters (num_parameters() floats) into the
  // model, layer by layer on the backend's copy queue: the forward pass of a
  // layer waits for that layer's weights only, so the upload of the next
  // layers overlaps it. host_params (page-locked, from a HostArray, for the
  // copy to be asynchronous) must stay unchanged until one of FinishStep,
  // ForwardBackward, Evaluate or GetParameters has returned (each waits for
  // the uploads).
  void SetParameters(const float* host_params);
  // As SetParameters, except that on the CPU in f32 the passes read
  // `host_params` in place instead of a copy: the caller keeps it alive and
  // unchanged until the next SetParameters or UseParameters (the trainer's
  // weights, which change only between steps). Elsewhere it is
  // SetParameters.
  void UseParameters(const float* host_params);
  // Copies the model's parameters to host memory.
  void GetParameters(float* host_params);

  // ---- the pipelined step (the trainer's) ----
  // A step is `passes` passes (gradient accumulation), each over a batch
  // staged ahead: StageBatch copies the batch into one of two page-locked
  // slots and starts its upload on the copy queue, so that the upload of the
  // next batch overlaps the compute of the current one. ComputeStaged
  // enqueues a pass and returns without waiting for the device. The passes'
  // gradients are averaged on the backend, and during the last pass each
  // layer's mean gradient starts its download into host_grads as soon as the
  // backward pass has made it, while the layers below are still computed.
  // FinishStep waits for the download and returns the mean loss.
  //
  // At most two batches are staged at once (a third StageBatch is a bug);
  // DropStaged forgets them (a step computed again). `tag` names a staged
  // batch; host_x and host_labels may be reused once StageBatch returns.
  void StageBatch(uint64_t tag, const float* host_x, const int32_t* host_labels,
                  int batch);
  bool IsStaged(uint64_t tag) const;
  void DropStaged();
  // Pass `pass` of `passes` over the staged batch `tag`. loss_scale as in
  // ForwardBackward. host_grads (num_parameters() floats, page-locked) is
  // written by the last pass, and must not be read until FinishStep.
  void ComputeStaged(uint64_t tag, int pass, int passes, float loss_scale,
                     float* host_grads);
  // Waits until the last pass's gradients are in host_grads; returns the
  // mean loss of the step's passes. *correct (if not null) counts the hits
  // of all its passes.
  float FinishStep(int64_t* correct = nullptr);

  // ---- synchronous passes (tests, the embedding model's head) ----
  // Forward and backward over `batch` examples (row-major x[batch, input],
  // labels in [0, classes)); leaves d(mean loss)/d(params) in the gradient
  // buffer and returns the mean loss. *correct (if not null) counts hits.
  // loss_scale: the backward pass runs on the loss times this (so that
  // small f16 gradients do not flush to zero) and the gradient is divided
  // by it again in f32; a value the compute dtype cannot hold becomes inf
  // (the caller checks the gradient and lowers the scale). Needs a free
  // input slot: at most one batch staged.
  float ForwardBackward(const float* host_x, const int32_t* host_labels,
                        int batch, int64_t* correct, float loss_scale = 1.0f);
  // Copies the gradient of the last ForwardBackward to host memory.
  void GetGradients(float* host_grads);
  // Writes d(mean loss)/d(input) of the last backward pass (ForwardBackward
  // or ComputeStaged) to host memory: batch x widths()[0] floats, row-major
  // like host_x. Computed on demand (one Gemm) from the parameters of that
  // pass, so it requires that a backward pass ran and no SetParameters came
  // since (Evaluate may), at loss scale 1.
  void GetInputGradient(float* host_dx);

  // Forward only, in batches of at most max_batch. A model of two classes
  // also gives the AUC, and appends each example's score of class 1 (its
  // logit less class 0's) to `class1_scores` when given.
  EvalResult Evaluate(const float* host_x, const int32_t* host_labels, int64_t count,
                      std::vector<float>* class1_scores = nullptr);

 private:
  // An input buffer on the device with its page-locked staging copy.
  struct InputSlot {
    HostArray<float> x;
    HostArray<int32_t> labels;
    DeviceBuffer device_x;
    DeviceBuffer device_labels;
    std::unique_ptr<BackendEvent> uploaded;  // copy queue: after the upload
    std::unique_ptr<BackendEvent> released;  // compute: after its last reader
    std::optional<uint64_t> tag;             // staged and not yet computed
    int batch = 0;
  };
  // Which pass of a step a Run is, and where its gradients go.
  struct PassPlan {
    int pass = 0;
    int passes = 1;
    float* host_grads = nullptr;  // downloaded by the last pass, if not null
  };

  // Stages a batch into a free slot and returns it.
  InputSlot& Stage(std::optional<uint64_t> tag, const float* host_x,
                   const int32_t* host_labels, int batch);
  // The forward (and, if backward, the backward) pass over the slot's batch,
  // enqueued; the loss lands in *loss.
  void Run(InputSlot& slot, bool backward, LossOutput* loss, float loss_scale,
           const PassPlan& plan);
  // Unscales, accumulates and (last pass) starts downloading layer l's
  // gradient.
  // `grads`: the flat array the pass wrote its gradients into (the
  // model's, or on the CPU the caller's host_grads).
  void FinishLayerGradient(size_t l, float* grads, float loss_scale, const PassPlan& plan);
  // The weights the passes read: UseParameters' array, or the model's.
  const float* Params() const;
  // Makes the compute queue wait for the upload of layers [0, l] and round
  // them, once per SetParameters.
  void AwaitLayers(size_t l);
  // Reads a loss the compute queue has written (a label outside the
  // classes is a bug of the caller's, as on the CPU).
  static float CheckedMean(const LossOutput& loss, int64_t* correct);
  // Rounds x to the compute dtype (nothing in f32).
  void Round(float* x, size_t n);
  size_t layers() const { return widths_.size() - 1; }
  // Layer l's weights then bias: contiguous in the flat arrays.
  size_t LayerSize(size_t l) const {
    return static_cast<size_t>(widths_[l] * widths_[l + 1] + widths_[l + 1]);
  }

  Backend* backend_;
  std::vector<int64_t> widths_;
  int max_batch_;
  DType compute_dtype_ = DType::kF32;
  int64_t num_params_ = 0;
  std::vector<int64_t> weight_offset_;  // per layer, into the flat arrays
  std::vector<int64_t> bias_offset_;
  DeviceBuffer params_;
  const float* used_params_ = nullptr;  // UseParameters' array, if in use
  DeviceBuffer grads_;
  std::array<InputSlot, 2> slots_;
  int next_slot_ = 0;
  // outputs_[l]: the output of layer l (post-ReLU for hidden layers, logits
  // for the last).
  std::vector<DeviceBuffer> outputs_;
  std::vector<DeviceBuffer> deltas_;  // d loss / d pre-activation, per layer
  // SetParameters' uploads, per layer, and how many layers the compute queue
  // has waited for since.
  std::vector<std::unique_ptr<BackendEvent>> layer_uploaded_;
  size_t layers_awaited_ = 0;
  std::unique_ptr<BackendEvent> params_released_;  // compute: last reader
  std::unique_ptr<BackendEvent> layer_grads_ready_;  // compute, per layer
  std::unique_ptr<BackendEvent> grads_downloaded_;   // copy: the last layer's
  HostArray<LossOutput> step_losses_;  // a loss per pass of the step
  int step_passes_ = 0;                // passes enqueued in this step
  int step_total_passes_ = 0;          // ... of how many
  bool step_open_ = false;             // a step's passes came, FinishStep not
  HostArray<LossOutput> sync_loss_;    // synchronous passes' and Evaluate's
  // The batch of the last backward pass whose deltas_ and params_ are still
  // current; 0 when there is none (GetInputGradient's precondition).
  int backward_batch_ = 0;
  DeviceBuffer input_grad_;  // max_batch x widths[0], allocated on first use
  DeviceBuffer grad_sum_;    // the passes' sum, allocated on first use
};

}  // namespace grps

#endif  // GRPS_WORKER_MLP_MODEL_H_
