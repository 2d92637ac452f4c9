// compressors/cast/cast_math.h (the integer-only conversions the fp16/bf16
// CUDA kernels run) against the CPU converters of collectives/common: the
// per-element element_ops.h code bit for bit, and the array converters
// (F16C on x86 CPUs that have it: a hardware reference) bit for bit except
// NaN payloads. Inputs: every sign, exponent and top-10 mantissa pattern
// with the rounding-relevant low bits (0, 1, just below / at / above the
// halfway point, all ones), every rounding boundary of the half subnormal
// range, and a million random patterns.
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

#include <gtest/gtest.h>

#include "core/numeric/element_ops.h"
#include "core/numeric/half_convert.h"
#include "compressors/cast/cast_math.h"

namespace {

using shoal::cast::bfloat16ToFloatBits;
using shoal::cast::floatBitsToBfloat16;
using shoal::cast::floatBitsToHalf;
using shoal::cast::halfToFloatBits;

bool isFloatNan(uint32_t bits) { return (bits & 0x7fffffffu) > 0x7f800000u; }
bool isHalfNan(uint16_t bits) { return (bits & 0x7fffu) > 0x7c00u; }

// Float bit patterns that exercise f32 -> f16 rounding everywhere.
std::vector<uint32_t> halfRoundingPatterns() {
  std::vector<uint32_t> patterns;
  // Normal range: the 13 dropped bits at the interesting points, for every upper pattern.
  const uint32_t lowBits[] = {0x0000, 0x0001, 0x0fff, 0x1000, 0x1001, 0x1fff};
  for (uint32_t upper = 0; upper < (1u << 19); ++upper)
    for (uint32_t low : lowBits) patterns.push_back((upper << 13) | low);
  // Half subnormal range (f32 exponents 101..112): |x| * 2^24 = m >> shift; the
  // dropped part at 0, 1, halfway - 1, halfway, halfway + 1 and all ones, after every kept part.
  for (uint32_t exponent = 100; exponent <= 113; ++exponent) {
    const uint32_t shift = exponent <= 126 ? 126 - exponent : 0;
    if (shift < 14 || shift > 24) continue;
    const uint32_t halfway = 1u << (shift - 1);
    const uint32_t rests[] = {0, 1, halfway - 1, halfway, halfway + 1, (1u << shift) - 1};
    for (uint32_t whole = 0; whole < (1u << (24 - shift)); ++whole)
      for (uint32_t rest : rests) {
        uint32_t mantissa = ((whole << shift) | rest) & 0x7fffffu;  // the implicit bit is the exponent's
        for (uint32_t sign : {0u, 0x80000000u}) patterns.push_back(sign | (exponent << 23) | mantissa);
      }
  }
  std::mt19937_64 random(20261130);
  for (int i = 0; i < 1000000; ++i) patterns.push_back(static_cast<uint32_t>(random()));
  return patterns;
}

TEST(CastMath, FloatToHalfMatchesElementOpsEverywhere) {
  size_t mismatches = 0;
  for (uint32_t bits : halfRoundingPatterns()) {
    uint16_t expected = shoal::ops::toHalf(shoal::ops::bitsFloat(bits)).bits;
    uint16_t got = floatBitsToHalf(bits);
    if (got != expected && ++mismatches <= 10)
      ADD_FAILURE() << std::hex << "f32 0x" << bits << ": cast_math 0x" << got << ", element_ops 0x" << expected;
  }
  EXPECT_EQ(mismatches, 0u);
}

TEST(CastMath, FloatToHalfMatchesTheArrayConverterExceptNanPayloads) {
  std::vector<uint32_t> patterns = halfRoundingPatterns();
  std::vector<float> values(patterns.size());
  for (size_t i = 0; i < patterns.size(); ++i) values[i] = shoal::ops::bitsFloat(patterns[i]);
  std::vector<uint16_t> reference(values.size());
  shoal::ops::floatToHalf(values.data(), reference.data(), values.size());
  size_t mismatches = 0;
  for (size_t i = 0; i < patterns.size(); ++i) {
    uint16_t got = floatBitsToHalf(patterns[i]);
    bool same = isFloatNan(patterns[i]) ? isHalfNan(got) && isHalfNan(reference[i]) && (got >> 15) == (reference[i] >> 15)
                                        : got == reference[i];
    if (!same && ++mismatches <= 10)
      ADD_FAILURE() << std::hex << "f32 0x" << patterns[i] << ": cast_math 0x" << got << ", array converter 0x"
                    << reference[i];
  }
  EXPECT_EQ(mismatches, 0u);
}

TEST(CastMath, HalfRoundingByHand) {
  auto half = [](float value) { return floatBitsToHalf(shoal::ops::floatBits(value)); };
  EXPECT_EQ(half(1.0f), 0x3c00);
  EXPECT_EQ(half(1.0f + 0x1p-11f), 0x3c00);          // tie, to even (down)
  EXPECT_EQ(half(1.0f + 3 * 0x1p-11f), 0x3c02);      // tie, to even (up)
  EXPECT_EQ(half(1.0f + 0x1p-11f + 0x1p-20f), 0x3c01);  // just above the tie
  EXPECT_EQ(half(65504.0f), 0x7bff);
  EXPECT_EQ(half(65519.99f), 0x7bff);
  EXPECT_EQ(half(65520.0f), 0x7c00);                 // the tie with 65536 overflows
  EXPECT_EQ(half(-1e9f), 0xfc00);
  EXPECT_EQ(half(0x1p-24f), 0x0001);                 // smallest subnormal
  EXPECT_EQ(half(0x1p-25f), 0x0000);                 // tie with 0, to even
  EXPECT_EQ(half(0x1.8p-25f), 0x0001);
  EXPECT_EQ(half(0x1.8p-24f), 0x0002);               // 1.5 ulp: tie, to even (up)
  EXPECT_EQ(half(0x1.ffcp-15f), 0x0400);             // the largest subnormal's tie rounds into the normals
  EXPECT_EQ(half(0x1.ff8p-15f), 0x03ff);             // the largest subnormal itself
  EXPECT_EQ(half(0x1p-14f), 0x0400);
  EXPECT_EQ(half(-0.0f), 0x8000);
  EXPECT_EQ(half(0x1p-149f), 0x0000);                // f32 denormal
  EXPECT_EQ(half(std::numeric_limits<float>::infinity()), 0x7c00);
  EXPECT_EQ(half(-std::numeric_limits<float>::quiet_NaN()), 0xfe00);
  EXPECT_EQ(floatBitsToHalf(0x7f800001u), 0x7e00);   // a signalling NaN stays a NaN
}

TEST(CastMath, HalfToFloatIsExactForEveryHalf) {
  std::vector<uint16_t> all(65536);
  for (uint32_t h = 0; h < 65536; ++h) all[h] = static_cast<uint16_t>(h);
  std::vector<float> arrayResult(all.size());
  shoal::ops::halfToFloat(all.data(), arrayResult.data(), all.size());
  for (uint32_t h = 0; h < 65536; ++h) {
    const uint16_t half = static_cast<uint16_t>(h);
    const uint32_t got = halfToFloatBits(half);
    ASSERT_EQ(got, shoal::ops::floatBits(shoal::ops::toFloat(shoal::ops::Half{half}))) << std::hex << "half 0x" << h;
    if (isHalfNan(half)) {
      ASSERT_TRUE(isFloatNan(shoal::ops::floatBits(arrayResult[h])));
      continue;
    }
    ASSERT_EQ(got, shoal::ops::floatBits(arrayResult[h])) << std::hex << "half 0x" << h;
    ASSERT_EQ(floatBitsToHalf(got), half) << std::hex << "round trip of half 0x" << h;
  }
  // An independent value check of the subnormals: m * 2^-24.
  for (uint32_t m = 1; m < 0x400; ++m) ASSERT_EQ(shoal::cast::halfValue(static_cast<uint16_t>(m)), std::ldexp(float(m), -24));
}

TEST(CastMath, FloatToBfloat16MatchesBothCpuConverters) {
  std::vector<uint32_t> patterns;
  const uint32_t lowBits[] = {0x0000, 0x0001, 0x7fff, 0x8000, 0x8001, 0xffff};
  for (uint32_t upper = 0; upper < 65536; ++upper)
    for (uint32_t low : lowBits) patterns.push_back((upper << 16) | low);
  std::mt19937_64 random(7);
  for (int i = 0; i < 1000000; ++i) patterns.push_back(static_cast<uint32_t>(random()));
  std::vector<float> values(patterns.size());
  for (size_t i = 0; i < patterns.size(); ++i) values[i] = shoal::ops::bitsFloat(patterns[i]);
  std::vector<uint16_t> arrayResult(values.size());
  shoal::ops::floatToBfloat16(values.data(), arrayResult.data(), values.size());
  for (size_t i = 0; i < patterns.size(); ++i) {
    const uint16_t got = floatBitsToBfloat16(patterns[i]);
    ASSERT_EQ(got, shoal::ops::toBFloat16(values[i]).bits) << std::hex << "f32 0x" << patterns[i];
    ASSERT_EQ(got, arrayResult[i]) << std::hex << "f32 0x" << patterns[i];
  }
  EXPECT_EQ(floatBitsToBfloat16(0x3f808000u), 0x3f80);  // tie, to even (down)
  EXPECT_EQ(floatBitsToBfloat16(0x3f818000u), 0x3f82);  // tie, to even (up)
  EXPECT_EQ(floatBitsToBfloat16(0x7f7fffffu), 0x7f80);  // f32 max rounds to inf
  EXPECT_EQ(floatBitsToBfloat16(0xff800001u), 0xffc0);  // signalling NaN, quieted, sign kept
}

TEST(CastMath, Bfloat16ToFloatIsExact) {
  for (uint32_t b = 0; b < 65536; ++b) {
    const uint16_t value = static_cast<uint16_t>(b);
    ASSERT_EQ(bfloat16ToFloatBits(value), shoal::ops::floatBits(shoal::ops::toFloat(shoal::ops::BFloat16{value})));
  }
}

TEST(CastMath, DoubleGoesThroughFloat) {
  const double values[] = {1.0 + 0x1p-11 + 0x1p-40, 65519.999999, 0x1p-25 + 0x1p-60, -3.3e-8, 1e300};
  for (double value : values) {
    EXPECT_EQ(shoal::cast::toHalfBits(value), shoal::ops::toHalf(static_cast<float>(value)).bits) << value;
    EXPECT_EQ(shoal::cast::toBfloat16Bits(value), shoal::ops::toBFloat16(static_cast<float>(value)).bits) << value;
  }
}

}  // namespace
