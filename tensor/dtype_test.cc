#include "tensor/dtype.h"

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include "gtest/gtest.h"

namespace grps {
namespace {

uint32_t Bits(float f) {
  uint32_t b;
  std::memcpy(&b, &f, sizeof(b));
  return b;
}

float FromBits(uint32_t b) {
  float f;
  std::memcpy(&f, &b, sizeof(f));
  return f;
}

constexpr float kInf = std::numeric_limits<float>::infinity();

// ---- names and sizes --------------------------------------------------------

TEST(DTypeTest, SizesAreFourForF32AndTwoForHalfTypes) {
  EXPECT_EQ(DTypeSize(DType::kF32), 4u);
  EXPECT_EQ(DTypeSize(DType::kF16), 2u);
  EXPECT_EQ(DTypeSize(DType::kBF16), 2u);
}

TEST(DTypeTest, NamesRoundTripThroughParse) {
  for (DType d : {DType::kF32, DType::kF16, DType::kBF16}) {
    absl::StatusOr<DType> parsed = ParseDType(DTypeName(d));
    ASSERT_TRUE(parsed.ok()) << parsed.status();
    EXPECT_EQ(*parsed, d);
  }
  EXPECT_EQ(DTypeName(DType::kF32), "f32");
  EXPECT_EQ(DTypeName(DType::kF16), "f16");
  EXPECT_EQ(DTypeName(DType::kBF16), "bf16");
}

TEST(DTypeTest, WireValuesMatchTheProtoEnum) {
  EXPECT_EQ(static_cast<int>(DType::kF32), 1);
  EXPECT_EQ(static_cast<int>(DType::kF16), 2);
  EXPECT_EQ(static_cast<int>(DType::kBF16), 3);
}

TEST(DTypeTest, ParseRejectsUnknownNamesWithInvalidArgument) {
  for (const char* bad : {"", "F32", "fp32", "float", "f64", "bf16 ", "int8"}) {
    absl::StatusOr<DType> parsed = ParseDType(bad);
    EXPECT_EQ(parsed.status().code(), absl::StatusCode::kInvalidArgument)
        << "\"" << bad << "\"";
  }
}

TEST(DTypeTest, NameOfAnInvalidValueDoesNotCrash) {
  EXPECT_EQ(DTypeName(static_cast<DType>(0)), "invalid");
}

// ---- binary16 ---------------------------------------------------------------

TEST(HalfTest, KnownValuesHaveKnownBitPatterns) {
  EXPECT_EQ(FloatToHalf(0.0f), 0x0000);
  EXPECT_EQ(FloatToHalf(1.0f), 0x3c00);
  EXPECT_EQ(FloatToHalf(-2.0f), 0xc000);
  EXPECT_EQ(FloatToHalf(0.5f), 0x3800);
  EXPECT_EQ(FloatToHalf(0.333251953125f), 0x3555);  // nearest half to 1/3
  EXPECT_EQ(FloatToHalf(1.0f / 3.0f), 0x3555);
  EXPECT_EQ(FloatToHalf(65504.0f), 0x7bff);  // largest finite
  EXPECT_EQ(FloatToHalf(-65504.0f), 0xfbff);
  EXPECT_EQ(FloatToHalf(std::ldexp(1.0f, -14)), 0x0400);  // smallest normal
  EXPECT_EQ(FloatToHalf(std::ldexp(1.0f, -24)), 0x0001);  // smallest subnormal
  EXPECT_EQ(FloatToHalf(1023 * std::ldexp(1.0f, -24)), 0x03ff);  // largest sub.
  EXPECT_EQ(FloatToHalf(-std::ldexp(1.0f, -24)), 0x8001);

  EXPECT_EQ(HalfToFloat(0x3c00), 1.0f);
  EXPECT_EQ(HalfToFloat(0xc000), -2.0f);
  EXPECT_EQ(HalfToFloat(0x7bff), 65504.0f);
  EXPECT_EQ(HalfToFloat(0x0400), std::ldexp(1.0f, -14));
  EXPECT_EQ(HalfToFloat(0x0001), std::ldexp(1.0f, -24));
  EXPECT_EQ(HalfToFloat(0x03ff), 1023 * std::ldexp(1.0f, -24));
  EXPECT_EQ(HalfToFloat(0x8001), -std::ldexp(1.0f, -24));
  EXPECT_EQ(HalfToFloat(0x3555), 0.333251953125f);
}

TEST(HalfTest, NegativeZeroKeepsItsSign) {
  EXPECT_EQ(FloatToHalf(-0.0f), 0x8000);
  const float back = HalfToFloat(0x8000);
  EXPECT_EQ(back, 0.0f);
  EXPECT_TRUE(std::signbit(back));
}

TEST(HalfTest, TiesRoundToEven) {
  // Halfway between 1 (0x3c00, even) and 1 + 2^-10 (0x3c01): down to even.
  EXPECT_EQ(FloatToHalf(1.0f + std::ldexp(1.0f, -11)), 0x3c00);
  // Halfway between 0x3c01 (odd) and 0x3c02: up to even.
  EXPECT_EQ(FloatToHalf(1.0f + 3 * std::ldexp(1.0f, -11)), 0x3c02);
  // Just above a tie goes up, just below goes down.
  EXPECT_EQ(FloatToHalf(std::nextafter(1.0f + std::ldexp(1.0f, -11), 2.0f)),
            0x3c01);
  EXPECT_EQ(FloatToHalf(std::nextafter(1.0f + 3 * std::ldexp(1.0f, -11), 0.0f)),
            0x3c01);
  // Negative ties mirror positive ones.
  EXPECT_EQ(FloatToHalf(-(1.0f + std::ldexp(1.0f, -11))), 0xbc00);
  EXPECT_EQ(FloatToHalf(-(1.0f + 3 * std::ldexp(1.0f, -11))), 0xbc02);
}

TEST(HalfTest, MantissaCarryBumpsTheExponent) {
  // Just under 2 rounds up to exactly 2 (0x4000).
  EXPECT_EQ(FloatToHalf(std::nextafter(2.0f, 0.0f)), 0x4000);
  // 2047/1024 + 1/2048 = halfway between 0x3fff (odd) and 2.0: up to 2.0.
  EXPECT_EQ(FloatToHalf(2.0f - std::ldexp(1.0f, -11)), 0x4000);
}

TEST(HalfTest, OverflowBecomesInfinity) {
  // 65520 is halfway between 65504 (odd mantissa) and 65536: ties to even
  // means infinity.
  EXPECT_EQ(FloatToHalf(65520.0f), 0x7c00);
  EXPECT_EQ(FloatToHalf(std::nextafter(65520.0f, 0.0f)), 0x7bff);
  EXPECT_EQ(FloatToHalf(65536.0f), 0x7c00);
  EXPECT_EQ(FloatToHalf(1e10f), 0x7c00);
  EXPECT_EQ(FloatToHalf(std::numeric_limits<float>::max()), 0x7c00);
  EXPECT_EQ(FloatToHalf(-65520.0f), 0xfc00);
  EXPECT_EQ(FloatToHalf(-1e30f), 0xfc00);
}

TEST(HalfTest, InfinitiesStayInfinite) {
  EXPECT_EQ(FloatToHalf(kInf), 0x7c00);
  EXPECT_EQ(FloatToHalf(-kInf), 0xfc00);
  EXPECT_EQ(HalfToFloat(0x7c00), kInf);
  EXPECT_EQ(HalfToFloat(0xfc00), -kInf);
}

TEST(HalfTest, NanStaysQuietNan) {
  const float nans[] = {
      std::numeric_limits<float>::quiet_NaN(),
      -std::numeric_limits<float>::quiet_NaN(),
      FromBits(0x7f800001),  // signaling, payload only in the lowest bit
      FromBits(0xff800001),
      FromBits(0x7fffffff),
  };
  for (float nan : nans) {
    const uint16_t h = FloatToHalf(nan);
    EXPECT_EQ(h & 0x7c00, 0x7c00) << std::hex << Bits(nan);
    EXPECT_NE(h & 0x03ff, 0) << "became infinity: " << std::hex << Bits(nan);
    EXPECT_NE(h & 0x0200, 0) << "not quiet: " << std::hex << Bits(nan);
    EXPECT_EQ(h & 0x8000, (Bits(nan) >> 16) & 0x8000) << "sign lost";
  }
  // A signaling half NaN widens to a quiet float NaN.
  const float widened = HalfToFloat(0x7c01);
  EXPECT_TRUE(std::isnan(widened));
  EXPECT_NE(Bits(widened) & 0x00400000, 0u);
  EXPECT_TRUE(std::isnan(HalfToFloat(0xfe00)));
}

TEST(HalfTest, SubnormalsRoundToNearestEven) {
  const float tiny = std::ldexp(1.0f, -24);  // one half-subnormal step
  // 2^-25 is halfway between 0 and the smallest subnormal: to even (zero).
  EXPECT_EQ(FloatToHalf(tiny / 2), 0x0000);
  EXPECT_EQ(FloatToHalf(-tiny / 2), 0x8000);  // sign survives underflow
  EXPECT_EQ(FloatToHalf(std::nextafter(tiny / 2, 1.0f)), 0x0001);
  // 1.5 steps: halfway between 1 (odd) and 2: up to 2.
  EXPECT_EQ(FloatToHalf(1.5f * tiny), 0x0002);
  // 2.5 steps: halfway between 2 (even) and 3: down to 2.
  EXPECT_EQ(FloatToHalf(2.5f * tiny), 0x0002);
  // 1023.5 steps: halfway between the largest subnormal and the smallest
  // normal (even): rounds into the normal range.
  EXPECT_EQ(FloatToHalf(1023.5f * tiny), 0x0400);
  // Far below the subnormal range, including float subnormals: zero.
  EXPECT_EQ(FloatToHalf(1e-10f), 0x0000);
  EXPECT_EQ(FloatToHalf(FromBits(0x00000001)), 0x0000);
  EXPECT_EQ(FloatToHalf(-FromBits(0x00000001)), 0x8000);
}

TEST(HalfTest, EveryNonNanHalfRoundTripsExactly) {
  for (uint32_t h = 0; h <= 0xffff; ++h) {
    const bool is_nan = (h & 0x7c00) == 0x7c00 && (h & 0x03ff) != 0;
    const float f = HalfToFloat(static_cast<uint16_t>(h));
    if (is_nan) {
      EXPECT_TRUE(std::isnan(f)) << std::hex << h;
      EXPECT_TRUE(std::isnan(HalfToFloat(FloatToHalf(f)))) << std::hex << h;
    } else {
      ASSERT_EQ(FloatToHalf(f), h) << std::hex << h;
    }
  }
}

// For every pair of adjacent non-negative halves (the last pair being 65504
// and infinity), the float midpoint rounds to the even one of the pair and
// the floats next to it round to the nearer one.
TEST(HalfTest, EveryMidpointBetweenAdjacentHalvesRoundsToEven) {
  for (uint32_t h = 0; h < 0x7c00; ++h) {
    const double lo = HalfToFloat(static_cast<uint16_t>(h));
    const double hi = h + 1 == 0x7c00
                          ? 65536.0  // where 2^16 would be
                          : HalfToFloat(static_cast<uint16_t>(h + 1));
    const float mid = static_cast<float>((lo + hi) / 2);  // exact in float
    ASSERT_EQ(static_cast<double>(mid), (lo + hi) / 2);
    const uint16_t even = (h & 1) ? h + 1 : h;
    ASSERT_EQ(FloatToHalf(mid), even) << std::hex << h;
    ASSERT_EQ(FloatToHalf(std::nextafter(mid, 0.0f)), h) << std::hex << h;
    ASSERT_EQ(FloatToHalf(std::nextafter(mid, kInf)), h + 1) << std::hex << h;
    ASSERT_EQ(FloatToHalf(-mid), 0x8000 | even) << std::hex << h;
  }
}

// ---- bfloat16 ---------------------------------------------------------------

TEST(BFloat16Test, KnownValuesHaveKnownBitPatterns) {
  EXPECT_EQ(FloatToBFloat16(0.0f), 0x0000);
  EXPECT_EQ(FloatToBFloat16(1.0f), 0x3f80);
  EXPECT_EQ(FloatToBFloat16(-2.0f), 0xc000);
  EXPECT_EQ(FloatToBFloat16(3.14159265f), 0x4049);  // 0x40490fdb rounds down
  EXPECT_EQ(FloatToBFloat16(FromBits(0x3f80c000)), 0x3f81);  // rounds up
  EXPECT_EQ(BFloat16ToFloat(0x3f80), 1.0f);
  EXPECT_EQ(BFloat16ToFloat(0x4049), 3.140625f);
  EXPECT_EQ(BFloat16ToFloat(0x7f7f), FromBits(0x7f7f0000));  // largest finite
}

TEST(BFloat16Test, TiesRoundToEven) {
  // Halfway between 1 (0x3f80, even) and 0x3f81: down.
  EXPECT_EQ(FloatToBFloat16(FromBits(0x3f808000)), 0x3f80);
  // Halfway between 0x3f81 (odd) and 0x3f82: up.
  EXPECT_EQ(FloatToBFloat16(FromBits(0x3f818000)), 0x3f82);
  EXPECT_EQ(FloatToBFloat16(FromBits(0x3f808001)), 0x3f81);
  EXPECT_EQ(FloatToBFloat16(FromBits(0x3f817fff)), 0x3f81);
  EXPECT_EQ(FloatToBFloat16(FromBits(0xbf818000)), 0xbf82);
}

TEST(BFloat16Test, OverflowBecomesInfinity) {
  EXPECT_EQ(FloatToBFloat16(std::numeric_limits<float>::max()), 0x7f80);
  EXPECT_EQ(FloatToBFloat16(FromBits(0x7f7f8000)), 0x7f80);  // tie, odd -> up
  EXPECT_EQ(FloatToBFloat16(FromBits(0x7f7f7fff)), 0x7f7f);
  EXPECT_EQ(FloatToBFloat16(-std::numeric_limits<float>::max()), 0xff80);
}

TEST(BFloat16Test, InfinitiesAndNegativeZeroAreKept) {
  EXPECT_EQ(FloatToBFloat16(kInf), 0x7f80);
  EXPECT_EQ(FloatToBFloat16(-kInf), 0xff80);
  EXPECT_EQ(BFloat16ToFloat(0x7f80), kInf);
  EXPECT_EQ(BFloat16ToFloat(0xff80), -kInf);
  EXPECT_EQ(FloatToBFloat16(-0.0f), 0x8000);
  EXPECT_TRUE(std::signbit(BFloat16ToFloat(0x8000)));
}

TEST(BFloat16Test, NanStaysQuietNan) {
  // Plain truncation would turn 0x7f800001 into 0x7f80, infinity.
  for (uint32_t bits : {0x7f800001u, 0xff800001u, 0x7fc00000u, 0x7fffffffu}) {
    const uint16_t b = FloatToBFloat16(FromBits(bits));
    EXPECT_EQ(b & 0x7f80, 0x7f80) << std::hex << bits;
    EXPECT_NE(b & 0x0040, 0) << "not quiet: " << std::hex << bits;
    EXPECT_EQ(b & 0x8000, (bits >> 16) & 0x8000) << "sign lost";
  }
  const float widened = BFloat16ToFloat(0x7f81);  // signaling
  EXPECT_TRUE(std::isnan(widened));
  EXPECT_NE(Bits(widened) & 0x00400000, 0u);
}

TEST(BFloat16Test, SubnormalsAreKept) {
  EXPECT_EQ(FloatToBFloat16(FromBits(0x00010000)), 0x0001);
  EXPECT_EQ(BFloat16ToFloat(0x0001), FromBits(0x00010000));
  EXPECT_EQ(FloatToBFloat16(FromBits(0x00008000)), 0x0000);  // tie -> even
  EXPECT_EQ(FloatToBFloat16(FromBits(0x00018000)), 0x0002);  // tie -> even
  EXPECT_EQ(FloatToBFloat16(FromBits(0x00000001)), 0x0000);
  EXPECT_EQ(FloatToBFloat16(FromBits(0x007fffff)), 0x0080);  // to min normal
}

TEST(BFloat16Test, EveryNonNanBFloat16RoundTripsExactly) {
  for (uint32_t b = 0; b <= 0xffff; ++b) {
    const bool is_nan = (b & 0x7f80) == 0x7f80 && (b & 0x007f) != 0;
    const float f = BFloat16ToFloat(static_cast<uint16_t>(b));
    if (is_nan) {
      EXPECT_TRUE(std::isnan(f)) << std::hex << b;
    } else {
      ASSERT_EQ(FloatToBFloat16(f), b) << std::hex << b;
    }
  }
}

TEST(BFloat16Test, EveryMidpointBetweenAdjacentValuesRoundsToEven) {
  for (uint32_t b = 0; b < 0x7f80; ++b) {
    const uint32_t mid_bits = (b << 16) | 0x8000;  // halfway to b + 1
    const uint16_t even = (b & 1) ? b + 1 : b;
    ASSERT_EQ(FloatToBFloat16(FromBits(mid_bits)), even) << std::hex << b;
    ASSERT_EQ(FloatToBFloat16(FromBits(mid_bits - 1)), b) << std::hex << b;
    ASSERT_EQ(FloatToBFloat16(FromBits(mid_bits + 1)), b + 1) << std::hex << b;
    ASSERT_EQ(FloatToBFloat16(FromBits(mid_bits | 0x80000000u)), 0x8000 | even);
  }
}

// ---- ConvertElements --------------------------------------------------------

TEST(ConvertElementsTest, F32ToHalfTypesAndBackMatchesScalarConversions) {
  const std::vector<float> src = {0.0f, -0.0f, 1.0f,  -1.5f,       65504.0f,
                                  1e6f, kInf,  1e-7f, 3.14159265f, -1e-30f};
  for (DType half : {DType::kF16, DType::kBF16}) {
    std::vector<uint16_t> narrow(src.size());
    ConvertElements(src.data(), DType::kF32, narrow.data(), half, src.size());
    std::vector<float> wide(src.size());
    ConvertElements(narrow.data(), half, wide.data(), DType::kF32, src.size());
    for (size_t i = 0; i < src.size(); ++i) {
      const uint16_t expected =
          half == DType::kF16 ? FloatToHalf(src[i]) : FloatToBFloat16(src[i]);
      EXPECT_EQ(narrow[i], expected) << DTypeName(half) << " " << i;
      const float back = half == DType::kF16 ? HalfToFloat(expected)
                                             : BFloat16ToFloat(expected);
      EXPECT_EQ(Bits(wide[i]), Bits(back)) << DTypeName(half) << " " << i;
    }
  }
}

TEST(ConvertElementsTest, HalfToBFloat16RoundsOnceThroughF32) {
  // 65504 in f16 is exactly representable in f32; bf16 rounds it to 65536.
  const uint16_t f16[] = {0x7bff, 0x3c00, 0x0001, 0x7c00, 0xfc00};
  uint16_t bf16[5];
  ConvertElements(f16, DType::kF16, bf16, DType::kBF16, 5);
  EXPECT_EQ(bf16[0], FloatToBFloat16(65504.0f));
  EXPECT_EQ(BFloat16ToFloat(bf16[0]), 65536.0f);
  EXPECT_EQ(bf16[1], 0x3f80);
  EXPECT_EQ(bf16[2], FloatToBFloat16(std::ldexp(1.0f, -24)));
  EXPECT_EQ(bf16[3], 0x7f80);
  EXPECT_EQ(bf16[4], 0xff80);

  // And back: bf16 values beyond f16's range overflow to inf.
  const uint16_t big[] = {0x4780 /* 65536 */, 0x3f80};
  uint16_t half[2];
  ConvertElements(big, DType::kBF16, half, DType::kF16, 2);
  EXPECT_EQ(half[0], 0x7c00);
  EXPECT_EQ(half[1], 0x3c00);
}

TEST(ConvertElementsTest, WorksOnUnalignedWireBuffers) {
  const float values[] = {1.0f, -2.0f, 0.5f};
  unsigned char wire[1 + sizeof(values)];
  std::memcpy(wire + 1, values, sizeof(values));  // odd address
  unsigned char out[1 + 3 * 2];
  ConvertElements(wire + 1, DType::kF32, out + 1, DType::kF16, 3);
  uint16_t h[3];
  std::memcpy(h, out + 1, sizeof(h));
  EXPECT_EQ(h[0], 0x3c00);
  EXPECT_EQ(h[1], 0xc000);
  EXPECT_EQ(h[2], 0x3800);
}

TEST(ConvertElementsTest, SameTypeIsAnOverlapSafeMove) {
  std::vector<float> buf = {1, 2, 3, 4, 5, 6};
  ConvertElements(buf.data(), DType::kF32, buf.data() + 2, DType::kF32, 4);
  EXPECT_EQ(buf, (std::vector<float>{1, 2, 1, 2, 3, 4}));
  std::vector<uint16_t> h = {1, 2, 3, 4};
  ConvertElements(h.data() + 1, DType::kBF16, h.data(), DType::kBF16, 3);
  EXPECT_EQ(h, (std::vector<uint16_t>{2, 3, 4, 4}));
}

TEST(ConvertElementsTest, ZeroCountTouchesNothing) {
  float f = 7.0f;
  uint16_t h = 0xabcd;
  ConvertElements(&f, DType::kF32, &h, DType::kF16, 0);
  EXPECT_EQ(h, 0xabcd);
}

TEST(FirstNonFiniteTest, FindsTheFirstNaNOrInfinityAndOnlyThose) {
  std::vector<float> v(10000, 1.0f);
  v[3] = std::numeric_limits<float>::max();     // large, finite
  v[5] = std::numeric_limits<float>::denorm_min();
  v[6] = -0.0f;
  EXPECT_EQ(FirstNonFinite(v.data(), static_cast<int64_t>(v.size())), -1);
  EXPECT_EQ(FirstNonFinite(v.data(), 0), -1);
  v[9000] = -std::numeric_limits<float>::infinity();  // a later block
  EXPECT_EQ(FirstNonFinite(v.data(), static_cast<int64_t>(v.size())), 9000);
  v[4096] = std::numeric_limits<float>::quiet_NaN();  // a block's first element
  EXPECT_EQ(FirstNonFinite(v.data(), static_cast<int64_t>(v.size())), 4096);
  v[4095] = std::numeric_limits<float>::infinity();   // the block before's last
  EXPECT_EQ(FirstNonFinite(v.data(), static_cast<int64_t>(v.size())), 4095);
  EXPECT_EQ(FirstNonFinite(v.data(), 4095), -1);      // n ends before it
}

}  // namespace
}  // namespace grps
