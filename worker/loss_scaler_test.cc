#include "worker/loss_scaler.h"

#include "gtest/gtest.h"

namespace grps {
namespace {

TEST(LossScaler, AnOverflowIsSkippedCountedAndHalvesTheScale) {
  LossScaler scaler(/*dynamic=*/true, 0);
  EXPECT_EQ(scaler.scale(), 65536.0f);
  EXPECT_FALSE(scaler.Update(/*finite=*/false));
  EXPECT_EQ(scaler.overflows(), 1u);
  EXPECT_EQ(scaler.scale(), 32768.0f);
  EXPECT_TRUE(scaler.Update(true));
  EXPECT_EQ(scaler.scale(), 32768.0f);
}

TEST(LossScaler, TheScaleDoublesAfterTwoThousandFiniteStepsInARow) {
  LossScaler scaler(true, 1024);
  for (uint32_t i = 0; i + 1 < LossScaler::kGrowthInterval; ++i) ASSERT_TRUE(scaler.Update(true));
  EXPECT_EQ(scaler.scale(), 1024.0f);
  EXPECT_TRUE(scaler.Update(true));
  EXPECT_EQ(scaler.scale(), 2048.0f);
  // An overflow starts the count again.
  for (uint32_t i = 0; i + 1 < LossScaler::kGrowthInterval; ++i) ASSERT_TRUE(scaler.Update(true));
  EXPECT_FALSE(scaler.Update(false));
  EXPECT_EQ(scaler.scale(), 1024.0f);
  EXPECT_TRUE(scaler.Update(true));
  EXPECT_EQ(scaler.scale(), 1024.0f);
}

TEST(LossScaler, TheScaleStaysWithinOneAndTwoToThe24) {
  LossScaler low(true, 2);
  EXPECT_FALSE(low.Update(false));
  EXPECT_FALSE(low.Update(false));
  EXPECT_EQ(low.scale(), 1.0f);
  LossScaler high(true, 1e30f);
  EXPECT_EQ(high.scale(), LossScaler::kMaxScale);
  for (uint32_t i = 0; i < LossScaler::kGrowthInterval; ++i) high.Update(true);
  EXPECT_EQ(high.scale(), LossScaler::kMaxScale);
}

TEST(LossScaler, WithoutDynamicScalingTheScaleIsOneAndOnlyFinitenessCounts) {
  LossScaler scaler(/*dynamic=*/false, 4096);
  EXPECT_EQ(scaler.scale(), 1.0f);
  EXPECT_TRUE(scaler.Update(true));
  EXPECT_FALSE(scaler.Update(false));
  EXPECT_EQ(scaler.overflows(), 0u);
  EXPECT_EQ(scaler.scale(), 1.0f);
}

}  // namespace
}  // namespace grps
