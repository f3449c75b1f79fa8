#include "worker/straggler.h"

#include "gtest/gtest.h"

namespace grps {
namespace {

TEST(Straggler, NoneSleepsNothing) {
  Straggler none;
  EXPECT_FALSE(none.active());
  EXPECT_EQ(none.AfterStep(absl::Milliseconds(10)), absl::ZeroDuration());
  EXPECT_FALSE(Straggler::Create(1, absl::ZeroDuration())->active());
}

TEST(Straggler, FactorSleepsFMinusOneTimesItsOwnAverageStepTime) {
  Straggler s = *Straggler::Create(5, absl::ZeroDuration());
  EXPECT_TRUE(s.active());
  // The first step sets the average; a steady 10 ms step then sleeps 40 ms,
  // so the step takes 5 x 10 ms in all.
  EXPECT_EQ(s.AfterStep(absl::Milliseconds(10)), absl::Milliseconds(40));
  for (int i = 0; i < 100; ++i) s.AfterStep(absl::Milliseconds(10));
  EXPECT_NEAR(absl::ToDoubleMilliseconds(s.AfterStep(absl::Milliseconds(10))), 40, 1e-6);
  // One outlier moves the average only a little.
  EXPECT_LT(s.AfterStep(absl::Milliseconds(1000)), absl::Milliseconds(40 + 4 * 60));
}

TEST(Straggler, FixedDelayIsAddedEveryStep) {
  Straggler s = *Straggler::Create(1, absl::Milliseconds(20));
  EXPECT_EQ(s.AfterStep(absl::Milliseconds(3)), absl::Milliseconds(20));
  Straggler both = *Straggler::Create(2, absl::Milliseconds(20));
  EXPECT_EQ(both.AfterStep(absl::Milliseconds(3)), absl::Milliseconds(23));
  EXPECT_EQ(both.Describe(), "2x its own step time + 20ms per step");
}

TEST(Straggler, RefusesAFactorBelowOneAndANegativeDelay) {
  EXPECT_FALSE(Straggler::Create(0.5, absl::ZeroDuration()).ok());
  EXPECT_FALSE(Straggler::Create(1, absl::Milliseconds(-1)).ok());
}

}  // namespace
}  // namespace grps
