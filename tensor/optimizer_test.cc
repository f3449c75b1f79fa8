// The server-side optimizer updates against their textbook formulas, written
// out here in double, over several steps with weight decay.
#include <cmath>
#include <cstddef>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "tensor/backend.h"

namespace grps {
namespace {

// Odd, so that vectorized loops also run their scalar tails.
constexpr size_t kN = 1003;
constexpr int kSteps = 5;

std::vector<float> RandomVector(size_t n, std::mt19937* rng, float lo,
                                float hi) {
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> v(n);
  for (float& x : v) x = dist(*rng);
  return v;
}

// One element's parameter and up to two slots of optimizer state, in double.
struct RefElement {
  double p = 0.0;
  double s1 = 0.0;  // velocity, Adam m, or AdaGrad accumulator
  double s2 = 0.0;  // Adam v
};

// Runs kSteps updates with fresh random gradients on the backend (float) and
// on the reference (double) and checks parameters and state after each step.
//   update(step, param, grad, s1, s2): the backend update, step = 1..kSteps.
//   reference(step, g, element): the textbook update of one element.
class OptimizerTest : public ::testing::Test {
 protected:
  using BackendUpdate = std::function<void(
      int step, float* param, const float* grad, float* s1, float* s2)>;
  using ReferenceUpdate = std::function<void(int step, double g, RefElement*)>;

  OptimizerTest() : backend_(CreateCpuBackend()), rng_(7) {}

  void CheckAgainstReference(const BackendUpdate& update,
                             const ReferenceUpdate& reference,
                             double tolerance) {
    std::vector<float> param = RandomVector(kN, &rng_, -1.0f, 1.0f);
    std::vector<float> s1(kN, 0.0f), s2(kN, 0.0f);
    std::vector<RefElement> ref(kN);
    for (size_t i = 0; i < kN; ++i) ref[i].p = param[i];

    for (int step = 1; step <= kSteps; ++step) {
      const std::vector<float> grad = RandomVector(kN, &rng_, -0.5f, 0.5f);
      update(step, param.data(), grad.data(), s1.data(), s2.data());
      for (size_t i = 0; i < kN; ++i) {
        reference(step, grad[i], &ref[i]);
        ASSERT_NEAR(param[i], ref[i].p, tolerance)
            << "param " << i << " after step " << step;
        ASSERT_NEAR(s1[i], ref[i].s1, tolerance * (1 + std::fabs(ref[i].s1)))
            << "state 1 of " << i << " after step " << step;
        ASSERT_NEAR(s2[i], ref[i].s2, tolerance * (1 + std::fabs(ref[i].s2)))
            << "state 2 of " << i << " after step " << step;
      }
    }
  }

  // CheckAgainstReference for AdamUpdate with `hp` (its step set per step).
  void CheckAdam(const AdamParams& hp);

  std::unique_ptr<Backend> backend_;
  std::mt19937 rng_;
};

// ---- against the textbook formulas ------------------------------------------

TEST_F(OptimizerTest, SgdWithWeightDecayFollowsTheFormula) {
  SgdParams hp;
  hp.lr = 0.1f;
  hp.weight_decay = 0.1f;
  CheckAgainstReference([&](int, float* p, const float* g, float*,
                            float*) { backend_->SgdUpdate(hp, p, g, kN); },
                        [&](int, double g, RefElement* e) {
                          const double gd = g + double{hp.weight_decay} * e->p;
                          e->p -= double{hp.lr} * gd;
                        },
                        1e-6);
}

TEST_F(OptimizerTest, MomentumWithWeightDecayFollowsTheFormula) {
  MomentumParams hp;
  hp.lr = 0.05f;
  hp.momentum = 0.9f;
  hp.weight_decay = 0.1f;
  hp.nesterov = false;
  CheckAgainstReference(
      [&](int, float* p, const float* g, float* v, float*) {
        backend_->MomentumUpdate(hp, p, g, v, kN);
      },
      [&](int, double g, RefElement* e) {
        const double gd = g + double{hp.weight_decay} * e->p;
        e->s1 = double{hp.momentum} * e->s1 + gd;
        e->p -= double{hp.lr} * e->s1;
      },
      1e-6);
}

TEST_F(OptimizerTest, NesterovWithWeightDecayFollowsTheFormula) {
  MomentumParams hp;
  hp.lr = 0.05f;
  hp.momentum = 0.9f;
  hp.weight_decay = 0.1f;
  hp.nesterov = true;
  CheckAgainstReference(
      [&](int, float* p, const float* g, float* v, float*) {
        backend_->MomentumUpdate(hp, p, g, v, kN);
      },
      [&](int, double g, RefElement* e) {
        const double gd = g + double{hp.weight_decay} * e->p;
        e->s1 = double{hp.momentum} * e->s1 + gd;
        e->p -= double{hp.lr} * (gd + double{hp.momentum} * e->s1);
      },
      1e-6);
}

// Adam's formula with bias correction, in double: weight decay added to the
// gradient, or (decoupled_weight_decay, torch.optim.AdamW's order) taken
// from the weights before the step.
void OptimizerTest::CheckAdam(const AdamParams& hp) {
  CheckAgainstReference(
      [&](int step, float* p, const float* g, float* m, float* v) {
        AdamParams at = hp;
        at.step = step;
        backend_->AdamUpdate(at, p, g, m, v, kN);
      },
      [&](int t, double g, RefElement* e) {
        const double b1 = hp.beta1, b2 = hp.beta2, wd = hp.weight_decay;
        if (hp.decoupled_weight_decay) e->p *= 1 - double{hp.lr} * wd;
        const double gd = hp.decoupled_weight_decay ? g : g + wd * e->p;
        e->s1 = b1 * e->s1 + (1 - b1) * gd;
        e->s2 = b2 * e->s2 + (1 - b2) * gd * gd;
        const double m_hat = e->s1 / (1 - std::pow(b1, t));
        const double v_hat = e->s2 / (1 - std::pow(b2, t));
        e->p -= double{hp.lr} * m_hat / (std::sqrt(v_hat) + hp.epsilon);
      },
      2e-6);
}

TEST_F(OptimizerTest, AdamWithBiasCorrectionAndWeightDecayFollowsTheFormula) {
  AdamParams hp;
  hp.lr = 0.01f;
  hp.beta1 = 0.9f;
  hp.beta2 = 0.999f;
  hp.epsilon = 1e-8f;
  hp.weight_decay = 0.1f;
  CheckAdam(hp);
}

TEST_F(OptimizerTest, AdamWDecaysTheWeightsApartFromTheGradient) {
  AdamParams hp;
  hp.lr = 0.01f;
  hp.beta1 = 0.8f;
  hp.beta2 = 0.99f;
  hp.epsilon = 1e-8f;
  hp.weight_decay = 0.5f;
  hp.decoupled_weight_decay = true;
  CheckAdam(hp);
}

TEST_F(OptimizerTest, AdagradWithWeightDecayFollowsTheFormula) {
  AdagradParams hp;
  hp.lr = 0.05f;
  hp.epsilon = 1e-10f;
  hp.weight_decay = 0.1f;
  CheckAgainstReference(
      [&](int, float* p, const float* g, float* a, float*) {
        backend_->AdagradUpdate(hp, p, g, a, kN);
      },
      [&](int, double g, RefElement* e) {
        const double gd = g + double{hp.weight_decay} * e->p;
        e->s1 += gd * gd;
        e->p -= double{hp.lr} * gd / (std::sqrt(e->s1) + hp.epsilon);
      },
      2e-6);
}

// ---- properties worth stating on their own ----------------------------------

TEST_F(OptimizerTest, SgdHandComputedStep) {
  SgdParams hp;
  hp.lr = 0.5f;
  hp.weight_decay = 0.25f;
  std::vector<float> p = {2.0f, -4.0f};
  const std::vector<float> g = {1.0f, 1.0f};
  backend_->SgdUpdate(hp, p.data(), g.data(), 2);
  // p - 0.5 * (g + 0.25 p)
  EXPECT_EQ(p, (std::vector<float>{2.0f - 0.5f * 1.5f, -4.0f - 0.5f * 0.0f}));
}

TEST_F(OptimizerTest, AdamFirstStepMovesEachParameterByAboutLr) {
  // With bias correction, m_hat = g and v_hat = g^2 at t = 1, so each
  // parameter moves by lr against the sign of its gradient, whatever the
  // gradient's scale. Without the correction the step would be ~3.2 lr.
  AdamParams hp;
  hp.lr = 0.01f;
  hp.step = 1;
  std::vector<float> p(4, 0.0f), m(4, 0.0f), v(4, 0.0f);
  const std::vector<float> g = {1e-3f, -2.0f, 50.0f, -1e-2f};
  backend_->AdamUpdate(hp, p.data(), g.data(), m.data(), v.data(), 4);
  for (int i = 0; i < 4; ++i) {
    EXPECT_NEAR(p[i], g[i] > 0 ? -hp.lr : hp.lr, 1e-6) << i;
  }
}

TEST_F(OptimizerTest, NesterovLooksAheadFurtherThanClassicMomentum) {
  MomentumParams hp;
  hp.lr = 0.1f;
  hp.momentum = 0.9f;
  std::vector<float> classic = {0.0f}, nesterov = {0.0f};
  std::vector<float> v_classic = {0.0f}, v_nesterov = {0.0f};
  const std::vector<float> g = {1.0f};
  backend_->MomentumUpdate(hp, classic.data(), g.data(), v_classic.data(), 1);
  hp.nesterov = true;
  backend_->MomentumUpdate(hp, nesterov.data(), g.data(), v_nesterov.data(), 1);
  EXPECT_FLOAT_EQ(classic[0], -0.1f);          // -lr * v,          v = 1
  EXPECT_FLOAT_EQ(nesterov[0], -0.1f * 1.9f);  // -lr * (g + mu v)
  EXPECT_EQ(v_classic[0], v_nesterov[0]);
}

TEST_F(OptimizerTest, ZeroGradientWithWeightDecayShrinksParameters) {
  SgdParams hp;
  hp.lr = 0.1f;
  hp.weight_decay = 0.5f;
  std::vector<float> p = {1.0f, -2.0f};
  const std::vector<float> g = {0.0f, 0.0f};
  backend_->SgdUpdate(hp, p.data(), g.data(), 2);
  EXPECT_FLOAT_EQ(p[0], 0.95f);
  EXPECT_FLOAT_EQ(p[1], -1.9f);
}

TEST_F(OptimizerTest, AdamAtStepZeroAborts) {
  AdamParams hp;
  hp.step = 0;  // t is 1-based; 1 - beta^0 = 0 would divide by zero
  float p = 0, g = 1, m = 0, v = 0;
  EXPECT_DEATH(backend_->AdamUpdate(hp, &p, &g, &m, &v, 1),
               "step must be >= 1");
}

}  // namespace
}  // namespace grps
