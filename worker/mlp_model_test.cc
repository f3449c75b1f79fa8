#include "worker/mlp_model.h"

#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

#include "gtest/gtest.h"

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

}  // namespace
}  // namespace grps
