#include "worker/binary_auc.h"

#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "gtest/gtest.h"

namespace grps {
namespace {

// The definition, over every pair: what BinaryAuc must equal.
double PairwiseAuc(const std::vector<float>& s, const std::vector<int32_t>& y) {
  double wins = 0, pairs = 0;
  for (size_t i = 0; i < s.size(); ++i)
    for (size_t j = 0; j < s.size(); ++j)
      if (y[i] == 1 && y[j] == 0) {
        pairs += 1;
        wins += s[i] > s[j] ? 1 : s[i] == s[j] ? 0.5 : 0;
      }
  return wins / pairs;
}

TEST(BinaryAuc, ASeparatingScoreIsOneItsReverseZeroAndTiesAHalf) {
  EXPECT_DOUBLE_EQ(BinaryAuc({0.1f, 0.2f, 0.8f, 0.9f}, {0, 0, 1, 1}), 1.0);
  EXPECT_DOUBLE_EQ(BinaryAuc({0.9f, 0.8f, 0.2f, 0.1f}, {0, 0, 1, 1}), 0.0);
  EXPECT_DOUBLE_EQ(BinaryAuc({0.5f, 0.5f, 0.5f, 0.5f}, {0, 1, 0, 1}), 0.5);
  // One of four pairs in the wrong order: 0.75.
  EXPECT_DOUBLE_EQ(BinaryAuc({0.1f, 0.6f, 0.5f, 0.9f}, {0, 0, 1, 1}), 0.75);
}

TEST(BinaryAuc, EqualsTheCountOverEveryPairWithManyTies) {
  std::mt19937 rng(3);
  std::vector<float> scores(500);
  std::vector<int32_t> labels(500);
  for (size_t i = 0; i < scores.size(); ++i) {
    labels[i] = static_cast<int32_t>(rng() % 2);
    scores[i] = static_cast<float>(rng() % 20) + (labels[i] == 1 ? 3.0f : 0.0f);  // ties
  }
  const double auc = BinaryAuc(scores, labels);
  EXPECT_NEAR(auc, PairwiseAuc(scores, labels), 1e-12);
  EXPECT_GT(auc, 0.5);
}

TEST(BinaryAuc, IsMinusOneWithoutBothClassesOrWithANanAndIgnoresOtherLabels) {
  EXPECT_EQ(BinaryAuc({0.1f, 0.2f}, {1, 1}), -1);
  EXPECT_EQ(BinaryAuc({}, {}), -1);
  EXPECT_EQ(BinaryAuc({0.1f}, {0, 1}), -1);  // sizes differ
  EXPECT_EQ(BinaryAuc({0.1f, NAN, 0.3f}, {0, 1, 1}), -1);  // a diverged model's
  EXPECT_DOUBLE_EQ(BinaryAuc({-INFINITY, INFINITY}, {0, 1}), 1.0);
  EXPECT_DOUBLE_EQ(BinaryAuc({0.1f, 0.9f, 0.0f}, {0, 1, 7}), 1.0);
}

}  // namespace
}  // namespace grps
