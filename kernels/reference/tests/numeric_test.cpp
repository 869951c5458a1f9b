// Exhaustive checks of the 16-bit conversions: every one of the 65536 bit patterns of bf16 and
// f16, against values computed independently from the format's definition.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>

#include "kdaguard/numeric.h"

namespace kdaguard::numeric {
namespace {

struct Format {
  const char* name;
  int exponent_bits, mantissa_bits, bias;
  float (*to_f32)(std::uint16_t);
  std::uint16_t (*from_f32)(float);
  std::uint16_t (*from_f64)(double);
};

const Format kBf16{"bf16", 8, 7, 127, bf16_to_f32, f32_to_bf16, f64_to_bf16};
const Format kF16{"f16", 5, 10, 15, f16_to_f32, f32_to_f16, f64_to_f16};

// The value a bit pattern stands for, from the IEEE definition; NaN for NaN patterns.
double decode_by_definition(const Format& f, std::uint16_t h) {
  const int sign = h >> 15;
  const int exponent = (h >> f.mantissa_bits) & ((1 << f.exponent_bits) - 1);
  const int mantissa = h & ((1 << f.mantissa_bits) - 1);
  const int max_exponent = (1 << f.exponent_bits) - 1;
  double magnitude;
  if (exponent == max_exponent)
    magnitude = mantissa == 0 ? std::numeric_limits<double>::infinity()
                              : std::numeric_limits<double>::quiet_NaN();
  else if (exponent == 0)
    magnitude = std::ldexp(static_cast<double>(mantissa), 1 - f.bias - f.mantissa_bits);
  else
    magnitude = std::ldexp(static_cast<double>(mantissa + (1 << f.mantissa_bits)),
                           exponent - f.bias - f.mantissa_bits);
  return sign ? -magnitude : magnitude;
}

bool is_nan_pattern(const Format& f, std::uint16_t h) {
  return std::isnan(decode_by_definition(f, h));
}

class Conversions : public ::testing::TestWithParam<const Format*> {};

TEST_P(Conversions, EveryPatternDecodesExactly) {
  const Format& f = *GetParam();
  for (std::uint32_t h = 0; h < 65536; ++h) {
    const double want = decode_by_definition(f, static_cast<std::uint16_t>(h));
    const float got = f.to_f32(static_cast<std::uint16_t>(h));
    if (std::isnan(want)) {
      ASSERT_TRUE(std::isnan(got)) << f.name << " pattern " << std::hex << h;
    } else {
      ASSERT_EQ(static_cast<double>(got), want) << f.name << " pattern " << std::hex << h;
      ASSERT_EQ(std::signbit(got), (h & 0x8000u) != 0) << f.name << " pattern " << std::hex << h;
    }
  }
}

TEST_P(Conversions, EveryPatternRoundTripsThroughF32AndF64) {
  const Format& f = *GetParam();
  for (std::uint32_t h = 0; h < 65536; ++h) {
    const auto bits = static_cast<std::uint16_t>(h);
    const float x = f.to_f32(bits);
    if (is_nan_pattern(f, bits)) {
      ASSERT_TRUE(is_nan_pattern(f, f.from_f32(x))) << f.name << " NaN " << std::hex << h;
      ASSERT_TRUE(is_nan_pattern(f, f.from_f64(x))) << f.name << " NaN " << std::hex << h;
      continue;
    }
    ASSERT_EQ(f.from_f32(x), bits) << f.name << " pattern " << std::hex << h;
    ASSERT_EQ(f.from_f64(static_cast<double>(x)), bits) << f.name << " pattern " << std::hex << h;
  }
}

// Between every pair of neighbouring finite values of the same sign: the midpoint goes to the
// one with the even mantissa, anything nearer one neighbour (by one f32 or f64 ulp) goes to it.
TEST_P(Conversions, EveryMidpointRoundsToNearestEven) {
  const Format& f = *GetParam();
  const std::uint16_t infinity = static_cast<std::uint16_t>(((1u << f.exponent_bits) - 1u)
                                                            << f.mantissa_bits);
  for (std::uint32_t sign : {0u, 0x8000u}) {
    for (std::uint32_t m = 0; m < infinity; ++m) {  // magnitudes 0 .. largest finite
      const auto lo = static_cast<std::uint16_t>(sign | m);
      const auto hi = static_cast<std::uint16_t>(sign | (m + 1));  // next magnitude, maybe inf
      const double a = decode_by_definition(f, lo);
      const double b = m + 1 == infinity
                           // the rounding boundary to infinity: one more step of the top binade
                           ? (sign ? -1 : 1) * std::ldexp(1.0, (1 << (f.exponent_bits - 1)))
                           : decode_by_definition(f, hi);
      const double mid = (a + b) / 2;  // exact in f32: at most mantissa_bits + 2 bits
      const std::uint16_t even = (m & 1u) ? hi : lo;
      ASSERT_EQ(static_cast<double>(static_cast<float>(mid)), mid);
      ASSERT_EQ(f.from_f64(mid), even) << f.name << " midpoint above " << std::hex << lo;
      ASSERT_EQ(f.from_f32(static_cast<float>(mid)), even)
          << f.name << " midpoint above " << std::hex << lo;

      const double toward_lo_f64 = std::nextafter(mid, a), toward_hi_f64 = std::nextafter(mid, b);
      ASSERT_EQ(f.from_f64(toward_lo_f64), lo) << f.name << " below midpoint " << std::hex << lo;
      ASSERT_EQ(f.from_f64(toward_hi_f64), hi) << f.name << " above midpoint " << std::hex << lo;
      const float mid32 = static_cast<float>(mid);
      const float toward_lo_f32 = std::nextafter(mid32, static_cast<float>(a));
      const float toward_hi_f32 = std::nextafter(mid32, static_cast<float>(b));
      ASSERT_EQ(f.from_f32(toward_lo_f32), lo) << f.name << " below midpoint " << std::hex << lo;
      ASSERT_EQ(f.from_f32(toward_hi_f32), hi) << f.name << " above midpoint " << std::hex << lo;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Formats, Conversions, ::testing::Values(&kBf16, &kF16),
                         [](const auto& info) { return std::string(info.param->name); });

TEST(Conversions, TinyAndHugeDoublesRoundLikeTheFormat) {
  // Below half the smallest subnormal: signed zero. Far past the largest finite: infinity.
  EXPECT_EQ(f64_to_f16(1e-30), 0x0000);
  EXPECT_EQ(f64_to_f16(-1e-30), 0x8000);
  EXPECT_EQ(f64_to_bf16(1e-300), 0x0000);
  EXPECT_EQ(f64_to_bf16(-1e-300), 0x8000);
  EXPECT_EQ(f64_to_f16(1e10), 0x7C00);
  EXPECT_EQ(f64_to_bf16(-1e300), 0xFF80);
  EXPECT_EQ(f64_to_f32(1e300), std::numeric_limits<float>::infinity());
  // A double just past a bf16 midpoint that f64 -> f32 -> bf16 would round down twice:
  // 1 + 2^-8 + 2^-30 rounds to 1 + 2^-8 in f32 (a tie for bf16, going to even = 1.0),
  // while the correct single rounding goes up to 1 + 2^-7.
  const double just_above_tie = 1.0 + std::ldexp(1.0, -8) + std::ldexp(1.0, -30);
  EXPECT_EQ(f32_to_bf16(static_cast<float>(just_above_tie)), 0x3F80);
  EXPECT_EQ(f64_to_bf16(just_above_tie), 0x3F81);
  const double f16_just_above_tie = 1.0 + std::ldexp(1.0, -11) + std::ldexp(1.0, -40);
  EXPECT_EQ(f32_to_f16(static_cast<float>(f16_just_above_tie)), 0x3C00);
  EXPECT_EQ(f64_to_f16(f16_just_above_tie), 0x3C01);
}

TEST(Conversions, LoadAndStoreUseTheDtypesRounding) {
  unsigned char buffer[16] = {};
  store(buffer, DType::bf16, 1, 1.0 + std::ldexp(1.0, -9));  // below the tie: rounds to 1
  EXPECT_EQ(load(buffer, DType::bf16, 1), 1.0);
  store(buffer, DType::f16, 2, 65519.0);  // just below the tie with infinity
  EXPECT_EQ(load(buffer, DType::f16, 2), 65504.0);
  store(buffer, DType::f32, 2, 0.1);
  EXPECT_EQ(load(buffer, DType::f32, 2), static_cast<double>(0.1f));
  EXPECT_EQ(round_to(DType::bf16, 3.0 + std::ldexp(1.0, -7)), 3.0);  // a tie: to even, 3
  EXPECT_EQ(round_to(DType::f32, 1.0 / 3.0), static_cast<double>(1.0f / 3.0f));
}

}  // namespace
}  // namespace kdaguard::numeric
