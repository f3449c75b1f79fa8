#include "worker/mlp_model.h"

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

}  // namespace
}  // namespace grps
