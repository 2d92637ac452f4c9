// An independent model of shoal's dtypes for tests: bit layouts, exact
// rounding to each float format, and a hash for reproducible inputs. Written
// without shoal's own conversion code, so tests check that code instead of
// repeating it.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>

#include "shoal/shoal.h"

namespace shoal::test {

inline uint64_t mix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}
inline uint64_t hash3(uint64_t a, uint64_t b, uint64_t c) { return mix64(mix64(mix64(a) ^ b) + c); }

struct DType {
  shoal_dtype_t id;
  const char* name;
  size_t bytes;
  bool isFloat;
  bool isSigned;
  int mant;  // stored significand bits (floats)
  int exp;   // exponent bits (floats)
  int bits() const { return static_cast<int>(bytes * 8); }
  int bias() const { return (1 << (exp - 1)) - 1; }
  uint64_t mask() const { return bytes == 8 ? ~uint64_t(0) : (uint64_t(1) << bits()) - 1; }
  long double unitRoundoff() const { return isFloat ? std::ldexp(1.0L, -mant - 1) : 0.0L; }
};

inline const DType kDtypes[] = {
    {SHOAL_F16, "f16", 2, true, true, 10, 5},  {SHOAL_BF16, "bf16", 2, true, true, 7, 8},
    {SHOAL_F32, "f32", 4, true, true, 23, 8},  {SHOAL_F64, "f64", 8, true, true, 52, 11},
    {SHOAL_I8, "i8", 1, false, true, 0, 0},    {SHOAL_U8, "u8", 1, false, false, 0, 0},
    {SHOAL_I32, "i32", 4, false, true, 0, 0},  {SHOAL_U32, "u32", 4, false, false, 0, 0},
    {SHOAL_I64, "i64", 8, false, true, 0, 0},  {SHOAL_U64, "u64", 8, false, false, 0, 0},
};
inline const DType& dtypeOf(shoal_dtype_t id) {
  for (const DType& t : kDtypes)
    if (t.id == id) return t;
  std::abort();
}

// Rounds v to the nearest value of the float format (ties to even); no overflow handling.
inline long double roundToFormat(const DType& t, long double v) {
  // f32/f64: C++ conversions round to nearest even (the default rounding mode).
  if (t.id == SHOAL_F32) return static_cast<float>(v);
  if (t.id == SHOAL_F64) return static_cast<double>(v);
  if (v == 0 || std::isnan(v)) return v;
  int e = 0;
  std::frexp(std::fabs(v), &e);
  int unbiased = e - 1, minExp = 1 - t.bias();
  int ulpExp = std::max(unbiased, minExp) - t.mant;
  return std::ldexp(std::nearbyint(std::ldexp(v, -ulpExp)), ulpExp);
}

// Bits of a value exactly representable in the float format.
inline uint64_t encodeFloat(const DType& t, long double v) {
  if (t.id == SHOAL_F32) {
    float f = static_cast<float>(v);
    uint32_t bits;
    std::memcpy(&bits, &f, 4);
    return bits;
  }
  if (t.id == SHOAL_F64) {
    double d = static_cast<double>(v);
    uint64_t bits;
    std::memcpy(&bits, &d, 8);
    return bits;
  }
  uint64_t sign = std::signbit(v) ? 1 : 0;
  long double a = std::fabs(v);
  uint64_t result = sign << (t.mant + t.exp);
  if (a == 0) return result;
  int e = 0;
  std::frexp(a, &e);
  int unbiased = e - 1, minExp = 1 - t.bias();
  if (unbiased >= minExp) {
    auto significand = static_cast<uint64_t>(std::ldexp(std::ldexp(a, -unbiased) - 1, t.mant));
    return result | (uint64_t(unbiased + t.bias()) << t.mant) | significand;
  }
  return result | static_cast<uint64_t>(std::ldexp(a, t.mant - minExp));
}

inline long double decodeFloat(const DType& t, uint64_t bits) {
  if (t.id == SHOAL_F32) {
    float f;
    uint32_t narrow = static_cast<uint32_t>(bits);
    std::memcpy(&f, &narrow, 4);
    return f;
  }
  if (t.id == SHOAL_F64) {
    double d;
    std::memcpy(&d, &bits, 8);
    return d;
  }
  bool negative = (bits >> (t.mant + t.exp)) & 1;
  int biased = static_cast<int>((bits >> t.mant) & ((uint64_t(1) << t.exp) - 1));
  uint64_t significand = bits & ((uint64_t(1) << t.mant) - 1);
  long double value;
  if (biased == (1 << t.exp) - 1) {
    value = significand ? NAN : INFINITY;
  } else if (biased == 0) {
    value = std::ldexp(static_cast<long double>(significand), 1 - t.bias() - t.mant);
  } else {
    value = std::ldexp(static_cast<long double>(significand | (uint64_t(1) << t.mant)), biased - t.bias() - t.mant);
  }
  return negative ? -value : value;
}

inline int64_t signExtend(const DType& t, uint64_t bits) {
  int shift = 64 - t.bits();
  return static_cast<int64_t>(bits << shift) >> shift;
}

}  // namespace shoal::test
