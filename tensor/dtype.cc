#include "tensor/dtype.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "absl/base/config.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

// ConvertElements reads and writes wire bytes (little-endian) through native
// loads and stores.
#if !defined(ABSL_IS_LITTLE_ENDIAN)
#error "grps assumes a little-endian host"
#endif

namespace grps {

namespace {

// A DType outside the enum can only come from a cast that skipped ParseDType
// or the wire validation: a programming error, not bad input.
[[noreturn]] void DieInvalidDType(DType dtype) {
  std::fprintf(stderr, "grps: invalid DType value %d\n",
               static_cast<int>(dtype));
  std::abort();
}

uint32_t FloatBits(float value) {
  uint32_t bits;
  std::memcpy(&bits, &value, sizeof(bits));
  return bits;
}

float BitsToFloat(uint32_t bits) {
  float value;
  std::memcpy(&value, &bits, sizeof(value));
  return value;
}

// Shifts `value` right by `shift` (1..31) bits, rounding to nearest with ties
// to even.
uint32_t ShiftRightRoundingToEven(uint32_t value, uint32_t shift) {
  const uint32_t kept = value >> shift;
  const uint32_t rest = value & ((1u << shift) - 1);
  const uint32_t half = 1u << (shift - 1);
  return kept + ((rest > half || (rest == half && (kept & 1))) ? 1 : 0);
}

}  // namespace

size_t DTypeSize(DType dtype) {
  switch (dtype) {
    case DType::kF32:
      return 4;
    case DType::kF16:
    case DType::kBF16:
      return 2;
  }
  DieInvalidDType(dtype);
}

std::string_view DTypeName(DType dtype) {
  switch (dtype) {
    case DType::kF32:
      return "f32";
    case DType::kF16:
      return "f16";
    case DType::kBF16:
      return "bf16";
  }
  // Names appear in error messages, which must not crash on a bad value.
  return "invalid";
}

absl::StatusOr<DType> ParseDType(std::string_view name) {
  if (name == "f32") return DType::kF32;
  if (name == "f16") return DType::kF16;
  if (name == "bf16") return DType::kBF16;
  // Debian's Abseil is built with its own string_view, not std's.
  return absl::InvalidArgumentError(absl::StrCat(
      "unknown dtype \"", absl::string_view(name.data(), name.size()),
      "\" (expected f32, f16 or bf16)"));
}

// binary32: 1 sign, 8 exponent (bias 127), 23 mantissa bits.
// binary16: 1 sign, 5 exponent (bias 15), 10 mantissa bits.
uint16_t FloatToHalf(float value) {
  const uint32_t bits = FloatBits(value);
  const uint16_t sign = static_cast<uint16_t>((bits >> 16) & 0x8000);
  const uint32_t abs = bits & 0x7fffffff;

  if (abs > 0x7f800000) {
    // NaN: keep the top payload bits and set the quiet bit, so that the
    // result is a NaN even when the payload lives only in the low bits.
    return sign | 0x7e00 | static_cast<uint16_t>((abs >> 13) & 0x03ff);
  }
  // 65520 = 0x477ff000 lies halfway between the largest finite half (65504,
  // odd mantissa) and 65536; ties to even round it, and all above, to inf.
  if (abs >= 0x477ff000) return sign | 0x7c00;

  if (abs >= 0x38800000) {
    // Normal half (>= 2^-14). Re-bias the exponent (127 -> 15) and round the
    // 23-bit mantissa to 10 bits; a carry out of the mantissa correctly bumps
    // the exponent, and cannot reach inf because of the check above.
    const uint32_t rebiased = abs - ((127 - 15) << 23);
    return sign | static_cast<uint16_t>(ShiftRightRoundingToEven(rebiased, 13));
  }
  // 2^-25 (0x33000000) is halfway between 0 and the smallest subnormal half
  // 2^-24; it and everything smaller rounds to (signed) zero.
  if (abs <= 0x33000000) return sign;

  // Subnormal half: value = m * 2^-24 with m in [1, 1023] (m = 1024 after
  // rounding is the smallest normal, whose encoding 0x0400 is m itself).
  // value = mantissa * 2^(e - 150), so m = mantissa >> (126 - e).
  const uint32_t exponent = abs >> 23;  // 102..112
  const uint32_t mantissa = (abs & 0x007fffff) | 0x00800000;
  return sign | static_cast<uint16_t>(
                    ShiftRightRoundingToEven(mantissa, 126 - exponent));
}

float HalfToFloat(uint16_t bits) {
  const uint32_t sign = static_cast<uint32_t>(bits & 0x8000) << 16;
  const uint32_t exponent = (bits >> 10) & 0x1f;
  const uint32_t mantissa = bits & 0x03ff;

  if (exponent == 0x1f) {
    if (mantissa == 0) return BitsToFloat(sign | 0x7f800000);  // +-inf
    return BitsToFloat(sign | 0x7fc00000 | (mantissa << 13));  // quiet NaN
  }
  if (exponent == 0) {
    // Zero or subnormal: mantissa * 2^-24, exact in binary32.
    const float magnitude = static_cast<float>(mantissa) * 0x1p-24f;
    return BitsToFloat(sign | FloatBits(magnitude));
  }
  return BitsToFloat(sign | ((exponent + (127 - 15)) << 23) | (mantissa << 13));
}

uint16_t FloatToBFloat16(float value) {
  const uint32_t bits = FloatBits(value);
  // Round to nearest even: add just under half, plus the kept part's lowest
  // bit, and drop the low half (a carry into the exponent, also from the
  // largest finite values into 0x7f80 = inf, is the correct result).
  const uint32_t rounded = (bits + 0x7fffu + ((bits >> 16) & 1u)) >> 16;
  // Truncating a NaN whose payload is only in the low 16 bits would give
  // inf; setting the quiet bit keeps it a NaN. A select, not a branch, so
  // that the conversion loops vectorize.
  const uint32_t nan = (bits >> 16) | 0x0040u;
  return static_cast<uint16_t>((bits & 0x7fffffffu) > 0x7f800000u ? nan : rounded);
}

float BFloat16ToFloat(uint16_t bits) {
  const uint32_t wide = static_cast<uint32_t>(bits) << 16;
  const uint32_t quiet = (wide & 0x7fffffffu) > 0x7f800000u ? 0x00400000u : 0u;
  return BitsToFloat(wide | quiet);
}

namespace {

// Element loads and stores through memcpy: wire buffers need not be aligned.
template <typename T>
T Load(const unsigned char* p) {
  T value;
  std::memcpy(&value, p, sizeof(T));
  return value;
}

template <typename T>
void Store(unsigned char* p, T value) {
  std::memcpy(p, &value, sizeof(T));
}

template <DType kType>
float LoadAsFloat(const unsigned char* p) {
  if constexpr (kType == DType::kF32) return Load<float>(p);
  if constexpr (kType == DType::kF16) return HalfToFloat(Load<uint16_t>(p));
  if constexpr (kType == DType::kBF16) {
    return BFloat16ToFloat(Load<uint16_t>(p));
  }
}

template <DType kType>
void StoreFromFloat(unsigned char* p, float value) {
  if constexpr (kType == DType::kF32) Store<float>(p, value);
  if constexpr (kType == DType::kF16) Store<uint16_t>(p, FloatToHalf(value));
  if constexpr (kType == DType::kBF16) {
    Store<uint16_t>(p, FloatToBFloat16(value));
  }
}

// One tight loop per (from, to) pair, so that the dtype switch happens once
// per call rather than once per element.
template <DType kFrom, DType kTo>
void ConvertLoop(const unsigned char* in, unsigned char* out, size_t count) {
  constexpr size_t kInSize = kFrom == DType::kF32 ? 4 : 2;
  constexpr size_t kOutSize = kTo == DType::kF32 ? 4 : 2;
  for (size_t i = 0; i < count; ++i) {
    StoreFromFloat<kTo>(out + i * kOutSize,
                        LoadAsFloat<kFrom>(in + i * kInSize));
  }
}

template <DType kFrom>
void ConvertFrom(const unsigned char* in, unsigned char* out, DType to,
                 size_t count) {
  switch (to) {
    case DType::kF32:
      return ConvertLoop<kFrom, DType::kF32>(in, out, count);
    case DType::kF16:
      return ConvertLoop<kFrom, DType::kF16>(in, out, count);
    case DType::kBF16:
      return ConvertLoop<kFrom, DType::kBF16>(in, out, count);
  }
  DieInvalidDType(to);
}

}  // namespace

void ConvertElements(const void* src, DType from, void* dst, DType to,
                     size_t count) {
  if (from == to) {
    std::memmove(dst, src, count * DTypeSize(from));
    return;
  }
  const auto* in = static_cast<const unsigned char*>(src);
  auto* out = static_cast<unsigned char*>(dst);
  // Every f16 and bf16 value is exact in f32, so going through f32 rounds
  // once, at the store.
  switch (from) {
    case DType::kF32:
      return ConvertFrom<DType::kF32>(in, out, to, count);
    case DType::kF16:
      return ConvertFrom<DType::kF16>(in, out, to, count);
    case DType::kBF16:
      return ConvertFrom<DType::kBF16>(in, out, to, count);
  }
  DieInvalidDType(from);
}

int64_t FirstNonFinite(const float* values, int64_t n) {
  constexpr uint32_t kExponent = 0x7f800000u;  // all set: NaN or infinite
  constexpr int64_t kBlock = 4096;
  for (int64_t begin = 0; begin < n; begin += kBlock) {
    const int64_t end = std::min(n, begin + kBlock);
    uint32_t any = 0;
    for (int64_t i = begin; i < end; ++i) {
      uint32_t bits;
      std::memcpy(&bits, values + i, sizeof(bits));
      any |= static_cast<uint32_t>((bits & kExponent) == kExponent);
    }
    if (any == 0) continue;
    for (int64_t i = begin; i < end; ++i)
      if (!std::isfinite(values[i])) return i;
  }
  return -1;
}

}  // namespace grps
