// Per-element conversions of the fp16/bf16 compressor, shared by its CPU
// tests and its CUDA kernels (cast_kernels.cu): __host__ __device__ under nvcc
// (SHOAL_HD), plain inline C++ otherwise.
//
// Integer arithmetic only, so the result cannot depend on the device's float
// modes (flush-to-zero of denormals, fast math). Round to nearest even, and
// the same bits as collectives/common/element_ops.h's toHalf / toFloat /
// toBFloat16 for every input, NaNs included (tests/unit/test_cast_math.cc
// checks it over every exponent, rounding boundary and tie):
//   f32 -> f16: NaN -> sign | 0x7e00 (quiet, payload dropped); |x| at or above
//               65520 (the tie between 65504 and 65536) -> inf; denormal
//               results rounded like normal ones.
//   f16 -> f32: exact; a NaN keeps its sign and payload (mantissa << 13).
//   f32 -> bf16: NaN -> the top 16 bits with the quiet bit set; overflow
//               rounds to inf naturally.
//   bf16 -> f32: exact (a shift).
// (The CPU compressor's F16C array path keeps NaN payload bits that this one
// drops: every NaN stays a NaN of the same sign either way.)
#pragma once

#include <cstdint>

#include "core/numeric/element_ops.h"  // SHOAL_HD

namespace shoal::cast {

SHOAL_HD inline uint16_t floatBitsToHalf(uint32_t bits) {
  const uint16_t sign = static_cast<uint16_t>((bits >> 16) & 0x8000u);
  const uint32_t magnitude = bits & 0x7fffffffu;
  if (magnitude >= 0x7f800000u)  // inf, or NaN kept quiet and nonzero
    return static_cast<uint16_t>(sign | 0x7c00u | (magnitude > 0x7f800000u ? 0x200u : 0u));
  if (magnitude >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // rounds to >= 65536
  if (magnitude < 0x38800000u) {
    // Below half's smallest normal 2^-14: the result is magnitude * 2^24
    // rounded to an integer (the half's subnormal mantissa; 0x400 when it
    // rounds up into the normals, which is the right bit pattern too).
    // |x| = m * 2^(e - 150) with the implicit bit, so |x| * 2^24 = m >> (126 - e).
    const uint32_t exponent = magnitude >> 23;
    const uint32_t shift = 126u - exponent;  // >= 14
    if (shift > 24) return sign;             // below 2^-25 (m < 2^24 <= half of 2^shift): rounds to 0
    const uint32_t mantissa = (magnitude & 0x7fffffu) | 0x800000u;
    uint32_t whole = mantissa >> shift;
    const uint32_t rest = mantissa & ((1u << shift) - 1u);
    const uint32_t halfway = 1u << (shift - 1u);
    if (rest > halfway || (rest == halfway && (whole & 1u))) ++whole;
    return static_cast<uint16_t>(sign | whole);
  }
  // Normal: rebias the exponent (127 -> 15) and round the 13 dropped bits to nearest even.
  const uint32_t rounded = magnitude + 0xfffu + ((magnitude >> 13) & 1u);
  return static_cast<uint16_t>(sign | ((rounded - 0x38000000u) >> 13));
}

SHOAL_HD inline uint32_t halfToFloatBits(uint16_t half) {
  const uint32_t sign = static_cast<uint32_t>(half & 0x8000u) << 16;
  const uint32_t exponent = (half >> 10) & 0x1fu;
  uint32_t mantissa = half & 0x3ffu;
  if (exponent == 0x1f) return sign | 0x7f800000u | (mantissa << 13);  // inf / NaN
  if (exponent == 0) {
    if (mantissa == 0) return sign;
    // Subnormal half m * 2^-24: normalise until the implicit bit (0x400) is set.
    uint32_t floatExponent = 113;  // 2^-14's biased f32 exponent, lowered once per shift
    while ((mantissa & 0x400u) == 0) {
      mantissa <<= 1;
      --floatExponent;
    }
    return sign | (floatExponent << 23) | ((mantissa & 0x3ffu) << 13);
  }
  return sign | ((exponent + 112u) << 23) | (mantissa << 13);
}

SHOAL_HD inline uint16_t floatBitsToBfloat16(uint32_t bits) {
  if ((bits & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((bits >> 16) | 0x40u);  // quiet NaN
  return static_cast<uint16_t>((bits + 0x7fffu + ((bits >> 16) & 1u)) >> 16);
}

SHOAL_HD inline uint32_t bfloat16ToFloatBits(uint16_t value) { return static_cast<uint32_t>(value) << 16; }

// The same on values. f64 goes through f32 first (one more rounding), as on the CPU path.
SHOAL_HD inline uint16_t toHalfBits(float value) { return floatBitsToHalf(ops::floatBits(value)); }
SHOAL_HD inline uint16_t toHalfBits(double value) { return toHalfBits(static_cast<float>(value)); }
SHOAL_HD inline uint16_t toBfloat16Bits(float value) { return floatBitsToBfloat16(ops::floatBits(value)); }
SHOAL_HD inline uint16_t toBfloat16Bits(double value) { return toBfloat16Bits(static_cast<float>(value)); }
SHOAL_HD inline float halfValue(uint16_t half) { return ops::bitsFloat(halfToFloatBits(half)); }
SHOAL_HD inline float bfloat16Value(uint16_t value) { return ops::bitsFloat(bfloat16ToFloatBits(value)); }

}  // namespace shoal::cast
