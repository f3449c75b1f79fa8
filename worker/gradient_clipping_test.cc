#include "worker/gradient_clipping.h"

#include <cmath>
#include <limits>
#include <vector>

#include "gtest/gtest.h"

namespace grps {
namespace {

double Norm(const std::vector<float>& a, const std::vector<float>& b) {
  double s = 0;
  for (float g : a) s += static_cast<double>(g) * g;
  for (float g : b) s += static_cast<double>(g) * g;
  return std::sqrt(s);
}

TEST(ClipGradient, ScalesAGradientLongerThanClipNormToThatNormAcrossItsParts) {
  // Two parts, one vector: (3, 4) and (12): norm 13.
  std::vector<float> head = {3, 4}, rows = {12};
  const absl::Span<float> parts[] = {absl::MakeSpan(head), absl::MakeSpan(rows)};
  const ClipResult r = ClipGradient({.value = 0, .norm = 6.5f}, parts);
  EXPECT_DOUBLE_EQ(r.norm, 13.0);
  EXPECT_TRUE(r.norm_clipped);
  EXPECT_TRUE(r.clipped());
  EXPECT_EQ(r.values_clamped, 0u);
  // Halved: same direction, norm 6.5.
  EXPECT_FLOAT_EQ(head[0], 1.5f);
  EXPECT_FLOAT_EQ(head[1], 2.0f);
  EXPECT_FLOAT_EQ(rows[0], 6.0f);
  EXPECT_NEAR(Norm(head, rows), 6.5, 1e-6);
}

TEST(ClipGradient, LeavesAGradientWithinClipNormAsItIs) {
  std::vector<float> g = {3, 4};
  const absl::Span<float> parts[] = {absl::MakeSpan(g)};
  const ClipResult r = ClipGradient({.value = 0, .norm = 5.0f}, parts);
  EXPECT_DOUBLE_EQ(r.norm, 5.0);
  EXPECT_FALSE(r.clipped());
  EXPECT_EQ(g, (std::vector<float>{3, 4}));
}

TEST(ClipGradient, ClampsEachValueThenMeasuresTheNormOfTheClampedGradient) {
  std::vector<float> g = {-10, 0.5f, 7, -0.25f};
  const absl::Span<float> parts[] = {absl::MakeSpan(g)};
  const ClipResult r = ClipGradient({.value = 1.0f, .norm = 0}, parts);
  EXPECT_EQ(g, (std::vector<float>{-1, 0.5f, 1, -0.25f}));
  EXPECT_EQ(r.values_clamped, 2u);
  EXPECT_FALSE(r.norm_clipped);
  EXPECT_NEAR(r.norm, std::sqrt(1 + 0.25 + 1 + 0.0625), 1e-12);
}

TEST(ClipGradient, ANonFiniteGradientIsReportedNotScaled) {
  std::vector<float> g = {1, std::numeric_limits<float>::infinity()};
  const absl::Span<float> parts[] = {absl::MakeSpan(g)};
  const ClipResult r = ClipGradient({.value = 0, .norm = 1.0f}, parts);
  EXPECT_FALSE(std::isfinite(r.norm));
  EXPECT_FALSE(r.norm_clipped);
  EXPECT_EQ(g[0], 1.0f);
}

}  // namespace
}  // namespace grps
