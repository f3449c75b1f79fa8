#include "worker/mlp_model.h"

#include <algorithm>
#include <cmath>
#include <memory>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "absl/status/statusor.h"
#include "gtest/gtest.h"
#include "tensor/backend.h"
#include "tensor/testing/lazy_queue_backend.h"

namespace grps {
namespace {

struct Batch {
  std::vector<float> x;
  std::vector<int32_t> y;
};

Batch RandomBatch(int n, int features, int classes, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(-1, 1);
  Batch b;
  for (int i = 0; i < n * features; ++i) b.x.push_back(u(rng));
  for (int i = 0; i < n; ++i) b.y.push_back(rng() % classes);
  return b;
}

std::vector<float> RandomParams(int64_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> g(0, 0.5f);
  std::vector<float> p(n);
  for (float& v : p) v = g(rng);
  return p;
}

TEST(MlpModel, GradientMatchesFiniteDifferences) {
  auto backend = CreateCpuBackend();
  MlpModel model(backend.get(), {5, 4, 3}, 8);
  ASSERT_EQ(model.num_parameters(), 5 * 4 + 4 + 4 * 3 + 3);
  std::vector<float> p = RandomParams(model.num_parameters(), 1);
  Batch b = RandomBatch(6, 5, 3, 2);
  model.SetParameters(p.data());
  model.ForwardBackward(b.x.data(), b.y.data(), 6, nullptr);
  std::vector<float> grad(model.num_parameters());
  model.GetGradients(grad.data());
  const float h = 1e-3f;
  for (int64_t i = 0; i < model.num_parameters(); ++i) {
    std::vector<float> q = p;
    q[i] = p[i] + h;
    model.SetParameters(q.data());
    double up = model.Evaluate(b.x.data(), b.y.data(), 6).loss;
    q[i] = p[i] - h;
    model.SetParameters(q.data());
    double down = model.Evaluate(b.x.data(), b.y.data(), 6).loss;
    EXPECT_NEAR(grad[i], (up - down) / (2 * h), 2e-3) << "parameter " << i;
  }
}

TEST(MlpModel, EvaluateCountsHitsAndAveragesLossOverBatches) {
  auto backend = CreateCpuBackend();
  // Softmax regression whose weights pick the largest input feature.
  MlpModel model(backend.get(), {3, 3}, 2);
  std::vector<float> p(3 * 3 + 3, 0.0f);
  for (int i = 0; i < 3; ++i) p[i * 3 + i] = 10.0f;
  model.SetParameters(p.data());
  std::vector<float> x = {1, 0, 0, 0, 1, 0, 0, 0, 1, 1, 0, 0, 0, 0, 1};
  std::vector<int32_t> y = {0, 1, 2, 1, 2};  // the fourth is wrong
  EvalResult r = model.Evaluate(x.data(), y.data(), 5);
  EXPECT_EQ(r.examples, 5);
  EXPECT_DOUBLE_EQ(r.accuracy, 0.8);
  const double right = -std::log(std::exp(10.0) / (std::exp(10.0) + 2));
  const double wrong = -std::log(1.0 / (std::exp(10.0) + 2));
  EXPECT_NEAR(r.loss, (4 * right + wrong) / 5, 1e-4);
}

TEST(MlpModel, ATwoClassModelGivesTheAucOfItsClassOneScoresOverBatches) {
  auto backend = CreateCpuBackend();
  // Class 1's logit is the first feature, class 0's the second: the score
  // (their difference) is x0 - x1. Batches of 2 over 5 examples.
  MlpModel model(backend.get(), {2, 2}, 2);
  std::vector<float> p(2 * 2 + 2, 0.0f);
  p[0 * 2 + 1] = 1.0f;  // W[0][1]: x0 into class 1
  p[1 * 2 + 0] = 1.0f;  // W[1][0]: x1 into class 0
  model.SetParameters(p.data());
  // Scores 3, -1, 2, 0.5, -2; class 1 for the first three and the last.
  std::vector<float> x = {3, 0, 0, 1, 2, 0, 1, 0.5f, 0, 2};
  std::vector<int32_t> y = {1, 1, 1, 0, 1};
  std::vector<float> scores;
  EvalResult r = model.Evaluate(x.data(), y.data(), 5, &scores);
  const std::vector<float> want = {3, -1, 2, 0.5f, -2};
  ASSERT_EQ(scores.size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) EXPECT_FLOAT_EQ(scores[i], want[i]) << i;
  // The one class-0 example (0.5) is beaten by 3 and 2 of the four: 0.5.
  EXPECT_DOUBLE_EQ(r.auc, 0.5);
  y = {1, 0, 1, 0, 0};
  EXPECT_DOUBLE_EQ(model.Evaluate(x.data(), y.data(), 5).auc, 1.0);
  // More classes: no AUC, no scores.
  MlpModel three(backend.get(), {3, 3}, 2);
  std::vector<float> q(3 * 3 + 3, 0.0f);
  three.SetParameters(q.data());
  scores.clear();
  std::vector<float> x3(6, 1.0f);
  std::vector<int32_t> y3 = {0, 1};
  EXPECT_EQ(three.Evaluate(x3.data(), y3.data(), 2, &scores).auc, -1);
  EXPECT_TRUE(scores.empty());
}

TEST(MlpModel, GradientDescentLearnsASeparableProblem) {
  auto backend = CreateCpuBackend();
  MlpModel model(backend.get(), {2, 8, 2}, 64);
  std::vector<float> p = RandomParams(model.num_parameters(), 3);
  Batch b = RandomBatch(64, 2, 2, 4);
  for (int i = 0; i < 64; ++i) b.y[i] = b.x[2 * i] + b.x[2 * i + 1] > 0 ? 1 : 0;
  std::vector<float> g(model.num_parameters());
  model.SetParameters(p.data());
  const double before = model.Evaluate(b.x.data(), b.y.data(), 64).loss;
  for (int step = 0; step < 300; ++step) {
    model.ForwardBackward(b.x.data(), b.y.data(), 64, nullptr);
    model.GetGradients(g.data());
    for (size_t i = 0; i < p.size(); ++i) p[i] -= 0.5f * g[i];
    model.SetParameters(p.data());
  }
  EvalResult after = model.Evaluate(b.x.data(), b.y.data(), 64);
  EXPECT_LT(after.loss, before / 4);
  EXPECT_GE(after.accuracy, 0.95);
}

// The gradient of `batch` computed in `dtype` at `loss_scale`.
std::vector<float> GradientIn(DType dtype, float loss_scale, const std::vector<float>& p,
                              const Batch& b, int batch, float* loss = nullptr) {
  auto backend = CreateCpuBackend();
  MlpModel model(backend.get(), {20, 16, 4}, batch);
  model.set_compute_dtype(dtype);
  model.SetParameters(p.data());
  const float l = model.ForwardBackward(b.x.data(), b.y.data(), batch, nullptr, loss_scale);
  if (loss != nullptr) *loss = l;
  std::vector<float> g(model.num_parameters());
  model.GetGradients(g.data());
  return g;
}

// |a - b| / |a| (L2).
double RelativeDifference(const std::vector<float>& a, const std::vector<float>& b) {
  double diff = 0, norm = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    diff += (double(a[i]) - b[i]) * (double(a[i]) - b[i]);
    norm += double(a[i]) * a[i];
  }
  return std::sqrt(diff / norm);
}

TEST(MlpModelMixedPrecision, SixteenBitGradientsAreTheF32OnesWithinTheirRounding) {
  const std::vector<float> p = RandomParams(20 * 16 + 16 + 16 * 4 + 4, 3);
  const Batch b = RandomBatch(32, 20, 4, 4);
  float loss32 = 0, loss16 = 0, loss_bf = 0;
  const std::vector<float> g32 = GradientIn(DType::kF32, 1, p, b, 32, &loss32);
  const std::vector<float> g16 = GradientIn(DType::kF16, 1024, p, b, 32, &loss16);
  const std::vector<float> gbf = GradientIn(DType::kBF16, 1, p, b, 32, &loss_bf);
  // f16 keeps 11 significant bits, bf16 8: errors of about 2^-11 and 2^-8
  // relative per rounding, a few roundings deep.
  EXPECT_LT(RelativeDifference(g32, g16), 5e-3);
  EXPECT_LT(RelativeDifference(g32, gbf), 1e-1);
  EXPECT_NEAR(loss16, loss32, 5e-3 * loss32);
  EXPECT_NEAR(loss_bf, loss32, 4e-2 * loss32);
  // And they did round: the 16-bit results are not the f32 ones.
  EXPECT_GT(RelativeDifference(g32, g16), 0);
  EXPECT_GT(RelativeDifference(g32, gbf), RelativeDifference(g32, g16));
}

TEST(MlpModelMixedPrecision, LossScalingKeepsF16GradientsThatWouldFlushToZero) {
  // Inputs of 1e-4, second-layer weights of 1e-3 and a batch of 256 make
  // the first layer's weight gradients about 1e-9, below half of f16's
  // smallest subnormal (6e-8): unscaled they round to zero; at 2^16 they
  // survive.
  constexpr int kBatch = 256;
  std::vector<float> p = RandomParams(20 * 16 + 16 + 16 * 4 + 4, 5);
  for (size_t i = 20 * 16 + 16; i < p.size(); ++i) p[i] *= 1e-3f;
  Batch b = RandomBatch(kBatch, 20, 4, 6);
  for (float& x : b.x) x *= 1e-4f;
  const std::vector<float> g32 = GradientIn(DType::kF32, 1, p, b, kBatch);
  const std::vector<float> unscaled = GradientIn(DType::kF16, 1, p, b, kBatch);
  const std::vector<float> scaled = GradientIn(DType::kF16, 65536, p, b, kBatch);
  // The first layer's weight gradient (20 x 16).
  auto first = [](const std::vector<float>& g) {
    return std::vector<float>(g.begin(), g.begin() + 20 * 16);
  };
  // Zeros where f32 has none (units whose ReLU never opens have none).
  const std::vector<float> f32 = first(g32);
  auto lost = [&](const std::vector<float>& g) {
    int n = 0;
    for (size_t i = 0; i < g.size(); ++i) n += f32[i] != 0 && g[i] == 0;
    return n;
  };
  const int live = static_cast<int>(std::count_if(f32.begin(), f32.end(),
                                                  [](float v) { return v != 0; }));
  ASSERT_GT(live, 20 * 16 / 2);
  EXPECT_GT(lost(first(unscaled)), live / 2);
  EXPECT_EQ(lost(first(scaled)), 0);
  EXPECT_LT(RelativeDifference(first(g32), first(scaled)), 1e-2);
}

TEST(MlpModelMixedPrecision, AnF16GradientBeyondItsRangeOverflowsToInfinity) {
  const std::vector<float> p = RandomParams(20 * 16 + 16 + 16 * 4 + 4, 7);
  const Batch b = RandomBatch(32, 20, 4, 8);
  // (softmax - onehot) / 32 is up to 1/32; times 2^24 it is far past 65504.
  const std::vector<float> g = GradientIn(DType::kF16, 16777216.0f, p, b, 32);
  EXPECT_TRUE(std::any_of(g.begin(), g.end(), [](float v) { return !std::isfinite(v); }));
  // bf16 has f32's range: the same scale is harmless there.
  const std::vector<float> bf = GradientIn(DType::kBF16, 16777216.0f, p, b, 32);
  EXPECT_TRUE(std::all_of(bf.begin(), bf.end(), [](float v) { return std::isfinite(v); }));
}

// ---- the pipelined step, on backends that run one queue as late as allowed ----

TEST(LazyQueueBackend, ACopyNobodyWaitedForHasNotHappened) {
  LazyQueueBackend lazy(CreateCpuBackend(), LazyQueueBackend::Lazy::kCopies);
  DeviceBuffer device(&lazy, 4 * sizeof(float));
  lazy.Fill(device.f32(), 0.0f, 4);
  HostArray<float> host(&lazy, 4);
  for (size_t i = 0; i < 4; ++i) host[i] = static_cast<float>(i + 1);
  lazy.CopyToDeviceAsync(device.data(), host.data(), 4 * sizeof(float));
  std::unique_ptr<BackendEvent> uploaded = lazy.CreateEvent();
  lazy.Record(Queue::kCopy, uploaded.get());
  std::vector<float> seen(4);
  lazy.CopyToHost(seen.data(), device.data(), 4 * sizeof(float));
  EXPECT_EQ(seen, std::vector<float>(4, 0.0f));
  EXPECT_EQ(lazy.pending(), 1u);
  lazy.Wait(Queue::kCompute, *uploaded);
  lazy.CopyToHost(seen.data(), device.data(), 4 * sizeof(float));
  EXPECT_EQ(seen, (std::vector<float>{1, 2, 3, 4}));
}

TEST(LazyQueueBackend, AComputeOpNobodyWaitedForHasNotHappened) {
  LazyQueueBackend lazy(CreateCpuBackend(), LazyQueueBackend::Lazy::kCompute);
  DeviceBuffer device(&lazy, 4 * sizeof(float));
  lazy.Fill(device.f32(), 0.0f, 4);
  lazy.Synchronize();
  lazy.Fill(device.f32(), 5.0f, 4);
  HostArray<float> host(&lazy, 4);
  lazy.CopyToHostAsync(host.data(), device.data(), 4 * sizeof(float));
  EXPECT_EQ(std::vector<float>(host.begin(), host.end()), std::vector<float>(4, 0.0f));
  EXPECT_EQ(lazy.pending(), 1u);
  std::unique_ptr<BackendEvent> filled = lazy.CreateEvent();
  lazy.Record(Queue::kCompute, filled.get());
  lazy.Wait(Queue::kCopy, *filled);
  lazy.CopyToHostAsync(host.data(), device.data(), 4 * sizeof(float));
  EXPECT_EQ(std::vector<float>(host.begin(), host.end()), std::vector<float>(4, 5.0f));
}

using Lazy = LazyQueueBackend::Lazy;

// What the trainer gets from a step of `passes` batches: the mean gradient
// and the mean loss, computed here pass by pass with the synchronous calls
// on the CPU backend, the mean in the order the model takes it.
struct StepResult {
  std::vector<float> grads;
  float loss = 0;
};

StepResult SynchronousStep(DType dtype, float loss_scale, const std::vector<int64_t>& widths,
                           const std::vector<float>& params, const std::vector<Batch>& passes) {
  auto backend = CreateCpuBackend();
  const int batch = static_cast<int>(passes[0].y.size());
  MlpModel model(backend.get(), widths, batch);
  model.set_compute_dtype(dtype);
  model.SetParameters(params.data());
  StepResult result;
  result.grads.assign(model.num_parameters(), 0.0f);
  std::vector<float> g(model.num_parameters());
  double loss = 0;
  for (size_t j = 0; j < passes.size(); ++j) {
    loss += model.ForwardBackward(passes[j].x.data(), passes[j].y.data(), batch, nullptr,
                                  loss_scale);
    model.GetGradients(g.data());
    for (size_t i = 0; i < g.size(); ++i) result.grads[i] = j == 0 ? g[i] : result.grads[i] + g[i];
  }
  if (passes.size() > 1) {
    const float inv = 1.0f / static_cast<float>(passes.size());
    for (float& v : result.grads) v *= inv;
  }
  result.loss = static_cast<float>(loss / passes.size());
  return result;
}

// Runs `steps` steps of `passes` passes each on `backend`, driven as
// Trainer::DenseStep drives them: each batch staged while the one before
// computes, the next step's first batch staged before FinishStep, the host's
// weights and batches overwritten as soon as the model allows. Returns each
// step's gradient and loss beside what the synchronous calls give on the CPU.
struct StepPair {
  StepResult got, want;
};
// `in_place`: the weights go in through UseParameters (read where they
// are on the CPU in f32) instead of SetParameters.
std::vector<StepPair> PipelinedSteps(Backend* backend, DType dtype, float loss_scale,
                                     const std::vector<int64_t>& widths, int batch, int passes,
                                     int steps, bool in_place = false) {
  std::vector<std::vector<Batch>> data(steps + 1);
  for (int s = 0; s <= steps; ++s)
    for (int j = 0; j < passes; ++j)
      data[s].push_back(RandomBatch(batch, static_cast<int>(widths.front()),
                                    static_cast<int>(widths.back()), 100 * s + j));
  MlpModel model(backend, widths, batch);
  model.set_compute_dtype(dtype);
  HostArray<float> host_params(backend, model.num_parameters());
  HostArray<float> host_grads(backend, model.num_parameters());
  // The caller's batch buffer, refilled as the trainer's loader refills it.
  Batch scratch;
  auto stage = [&](int s, int j) {
    scratch = data[s][j];
    model.StageBatch(s * passes + j, scratch.x.data(), scratch.y.data(), batch);
    std::fill(scratch.x.begin(), scratch.x.end(), 99.0f);
    std::fill(scratch.y.begin(), scratch.y.end(), 0);
  };
  std::vector<StepPair> result;
  for (int s = 0; s < steps; ++s) {
    const std::vector<float> params = RandomParams(model.num_parameters(), 10 + s);
    std::copy(params.begin(), params.end(), host_params.begin());
    if (in_place) model.UseParameters(host_params.data());
    else model.SetParameters(host_params.data());
    if (!model.IsStaged(s * passes)) stage(s, 0);
    for (int j = 0; j < passes; ++j) {
      if (j + 1 < passes) stage(s, j + 1);
      model.ComputeStaged(s * passes + j, j, passes, loss_scale, host_grads.data());
    }
    stage(s + 1, 0);
    StepPair pair;
    pair.got.loss = model.FinishStep();
    pair.got.grads.assign(host_grads.begin(), host_grads.end());
    // As a push's reply does: the next weights land in the host buffer.
    std::fill(host_params.begin(), host_params.end(), -7.0f);
    pair.want = SynchronousStep(dtype, loss_scale, widths, params, data[s]);
    result.push_back(std::move(pair));
  }
  EXPECT_TRUE(model.IsStaged(steps * passes));
  return result;
}

class PipelinedStepTest : public ::testing::TestWithParam<std::tuple<Lazy, DType>> {};

// Four steps of three passes: every step's gradient and loss are bit for bit
// the synchronous ones, with either queue or both run as late as allowed:
// nothing was read before it was written, or overwritten while still to be
// read.
TEST_P(PipelinedStepTest, EqualsSynchronousPassesWhenQueuesRunAsLateAsAllowed) {
  const auto [lazy_queue, dtype] = GetParam();
  LazyQueueBackend lazy(CreateCpuBackend(), lazy_queue);
  const std::vector<StepPair> steps =
      PipelinedSteps(&lazy, dtype, dtype == DType::kF16 ? 1024.0f : 1.0f, {6, 5, 4, 3}, 4, 3, 4);
  for (size_t s = 0; s < steps.size(); ++s) {
    EXPECT_EQ(steps[s].got.grads, steps[s].want.grads) << "step " << s;
    EXPECT_EQ(steps[s].got.loss, steps[s].want.loss) << "step " << s;
  }
}

// One-pass steps on the CPU: the weights read in place (UseParameters) and
// the gradients written straight into the caller's array, with no copy
// either way, give the synchronous calls' gradients and losses bit for bit,
// with the queues run as late as allowed (in f16 UseParameters copies, as
// SetParameters does).
TEST_P(PipelinedStepTest, OnePassStepsReadAndWriteTheHostArraysInPlaceUnchanged) {
  const auto [lazy_queue, dtype] = GetParam();
  LazyQueueBackend lazy(CreateCpuBackend(), lazy_queue);
  const std::vector<StepPair> steps =
      PipelinedSteps(&lazy, dtype, dtype == DType::kF16 ? 1024.0f : 1.0f, {6, 5, 4, 3}, 4, 1, 4,
                     /*in_place=*/true);
  for (size_t s = 0; s < steps.size(); ++s) {
    EXPECT_EQ(steps[s].got.grads, steps[s].want.grads) << "step " << s;
    EXPECT_EQ(steps[s].got.loss, steps[s].want.loss) << "step " << s;
  }
}

INSTANTIATE_TEST_SUITE_P(
    LazyQueues, PipelinedStepTest,
    ::testing::Combine(::testing::Values(Lazy::kCopies, Lazy::kCompute, Lazy::kBoth),
                       ::testing::Values(DType::kF32, DType::kF16)),
    [](const ::testing::TestParamInfo<std::tuple<Lazy, DType>>& info) {
      return LazyQueueBackend::LazyName(std::get<0>(info.param)) + "_" +
             std::string(DTypeName(std::get<1>(info.param)));
    });

class MlpModelPipeline : public ::testing::TestWithParam<Lazy> {};

TEST_P(MlpModelPipeline, EvaluateAndGetParametersWaitForTheirUploads) {
  const std::vector<int64_t> widths = {6, 5, 3};
  const Batch test = RandomBatch(23, 6, 3, 5);
  const std::vector<float> params = RandomParams(6 * 5 + 5 + 5 * 3 + 3, 6);
  auto cpu = CreateCpuBackend();
  MlpModel plain(cpu.get(), widths, 4);
  plain.SetParameters(params.data());
  const EvalResult want = plain.Evaluate(test.x.data(), test.y.data(), 23);

  LazyQueueBackend lazy(CreateCpuBackend(), GetParam());
  MlpModel model(&lazy, widths, 4);
  HostArray<float> host(&lazy, params.size());
  std::copy(params.begin(), params.end(), host.begin());
  model.SetParameters(host.data());
  std::vector<float> back(params.size());
  model.GetParameters(back.data());
  EXPECT_EQ(back, params);
  const EvalResult got = model.Evaluate(test.x.data(), test.y.data(), 23);
  EXPECT_EQ(got.loss, want.loss);
  EXPECT_EQ(got.accuracy, want.accuracy);
  EXPECT_EQ(got.examples, 23);
}

INSTANTIATE_TEST_SUITE_P(LazyQueues, MlpModelPipeline,
                         ::testing::Values(Lazy::kCopies, Lazy::kCompute, Lazy::kBoth),
                         [](const ::testing::TestParamInfo<Lazy>& info) {
                           return LazyQueueBackend::LazyName(info.param);
                         });

TEST(MlpModelStaging, DroppedBatchesAreNoLongerStaged) {
  auto backend = CreateCpuBackend();
  MlpModel model(backend.get(), {3, 2}, 2);
  const Batch b = RandomBatch(2, 3, 2, 1);
  model.StageBatch(7, b.x.data(), b.y.data(), 2);
  model.StageBatch(8, b.x.data(), b.y.data(), 2);
  EXPECT_TRUE(model.IsStaged(7));
  EXPECT_TRUE(model.IsStaged(8));
  model.DropStaged();
  EXPECT_FALSE(model.IsStaged(7));
  EXPECT_FALSE(model.IsStaged(8));
  std::vector<float> grads(model.num_parameters());
  EXPECT_DEATH(model.ComputeStaged(7, 0, 1, 1.0f, grads.data()), "not staged");
  // A step's passes come in order, and FinishStep after the last.
  model.StageBatch(9, b.x.data(), b.y.data(), 2);
  model.StageBatch(10, b.x.data(), b.y.data(), 2);
  EXPECT_DEATH(model.ComputeStaged(9, 1, 2, 1.0f, grads.data()), "out of order");
  model.ComputeStaged(9, 0, 2, 1.0f, grads.data());
  EXPECT_DEATH(model.FinishStep(), "before the step's last pass");
  model.ComputeStaged(10, 1, 2, 1.0f, grads.data());
  model.FinishStep();
}

// On a GPU (skipped elsewhere): the pipelined step computes what the CPU
// computes, within float rounding (summation order, fused multiply-add).
TEST(MlpModelCuda, PipelinedStepsMatchTheCpuWithinRounding) {
  absl::StatusOr<std::unique_ptr<Backend>> cuda = CreateBackend(BackendKind::kCuda);
  if (!cuda.ok()) GTEST_SKIP() << "CUDA backend unavailable: " << cuda.status().message();
  // The default model; three steps of two passes, new weights each step.
  const std::vector<StepPair> steps =
      PipelinedSteps(cuda->get(), DType::kF32, 1.0f, {784, 256, 128, 10}, 64, 2, 3);
  for (size_t s = 0; s < steps.size(); ++s) {
    EXPECT_NEAR(steps[s].got.loss, steps[s].want.loss, 1e-4 * std::abs(steps[s].want.loss))
        << "step " << s;
    EXPECT_LT(RelativeDifference(steps[s].want.grads, steps[s].got.grads), 1e-4) << "step " << s;
  }
}

}  // namespace
}  // namespace grps
