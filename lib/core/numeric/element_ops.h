// Per-element reduction logic, shared by the CPU reducers (reducer.cc) and the
// CUDA kernels that later issues add: everything here is __host__ __device__
// when compiled by nvcc and plain inline C++ otherwise.
//
// f16 and bf16 are combined in f32 and rounded once (round to nearest even),
// so a ring hop adds exactly one rounding. Signed integer sums and products
// wrap modulo 2^bits (computed in unsigned arithmetic: no undefined behaviour).
#pragma once

#include <cstdint>
#include <cstring>
#include <type_traits>

#if defined(__CUDACC__)
#define SHOAL_HD __host__ __device__
#else
#define SHOAL_HD
#endif

namespace shoal::ops {

// 16-bit float storage types: just the bits; arithmetic happens in f32.
struct Half { uint16_t bits; };
struct BFloat16 { uint16_t bits; };

SHOAL_HD inline uint32_t floatBits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
}
SHOAL_HD inline float bitsFloat(uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

SHOAL_HD inline float toFloat(Half h) {
  uint32_t sign = uint32_t(h.bits & 0x8000u) << 16;
  uint32_t exponent = (h.bits >> 10) & 0x1fu;
  uint32_t mantissa = h.bits & 0x3ffu;
  if (exponent == 0x1f) return bitsFloat(sign | 0x7f800000u | (mantissa << 13));  // inf / nan
  if (exponent == 0) {
    if (mantissa == 0) return bitsFloat(sign);
    // Subnormal half: value = mantissa * 2^-24, exact in f32.
    float value = float(mantissa) * 5.9604644775390625e-8f;
    return sign ? -value : value;
  }
  return bitsFloat(sign | ((exponent + 112) << 23) | (mantissa << 13));
}

SHOAL_HD inline Half toHalf(float f) {
  uint32_t u = floatBits(f);
  uint16_t sign = uint16_t((u >> 16) & 0x8000u);
  uint32_t absBits = u & 0x7fffffffu;
  if (absBits >= 0x7f800000u)  // inf or nan (keep nan quiet and nonzero)
    return Half{uint16_t(sign | 0x7c00u | (absBits > 0x7f800000u ? 0x200u : 0u))};
  if (absBits >= 0x477ff000u) return Half{uint16_t(sign | 0x7c00u)};  // rounds to >= 65520: inf
  if (absBits < 0x38800000u) {
    // Result is subnormal or zero in half: round abs * 2^24 to nearest even integer.
    float scaled = bitsFloat(absBits) * 16777216.0f;  // exact: power-of-two scaling
    uint32_t whole = uint32_t(scaled);
    float rest = scaled - float(whole);
    if (rest > 0.5f || (rest == 0.5f && (whole & 1u))) ++whole;
    return Half{uint16_t(sign | whole)};
  }
  // Normal: rebias exponent, round the 13 dropped mantissa bits to nearest even.
  uint32_t rounded = absBits + 0xfffu + ((absBits >> 13) & 1u);
  return Half{uint16_t(sign | ((rounded - 0x38000000u) >> 13))};
}

SHOAL_HD inline float toFloat(BFloat16 b) { return bitsFloat(uint32_t(b.bits) << 16); }

SHOAL_HD inline BFloat16 toBFloat16(float f) {
  uint32_t u = floatBits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return BFloat16{uint16_t((u >> 16) | 0x40u)};  // quiet nan
  uint32_t rounded = u + 0x7fffu + ((u >> 16) & 1u);
  return BFloat16{uint16_t(rounded >> 16)};
}

// The type arithmetic happens in: f32 for the 16-bit floats, else the type itself.
template <typename T> struct Compute { using type = T; };
template <> struct Compute<Half> { using type = float; };
template <> struct Compute<BFloat16> { using type = float; };

template <typename T> SHOAL_HD inline typename Compute<T>::type widen(T v) { return v; }
SHOAL_HD inline float widen(Half v) { return toFloat(v); }
SHOAL_HD inline float widen(BFloat16 v) { return toFloat(v); }

template <typename T> SHOAL_HD inline T narrow(typename Compute<T>::type v) { return static_cast<T>(v); }
template <> SHOAL_HD inline Half narrow<Half>(float v) { return toHalf(v); }
template <> SHOAL_HD inline BFloat16 narrow<BFloat16>(float v) { return toBFloat16(v); }

// Wrapping integer arithmetic via the unsigned type (defined behaviour).
template <typename T> SHOAL_HD inline T wrappingAdd(T a, T b) {
  if constexpr (std::is_integral_v<T>) {
    using U = std::make_unsigned_t<T>;
    return static_cast<T>(static_cast<U>(static_cast<U>(a) + static_cast<U>(b)));
  } else {
    return a + b;
  }
}
template <typename T> SHOAL_HD inline T wrappingMul(T a, T b) {
  if constexpr (std::is_integral_v<T>) {
    // Promote to at least unsigned int so uint16/uint8 products don't become signed int.
    using U = std::conditional_t<(sizeof(T) < sizeof(unsigned)), unsigned, std::make_unsigned_t<T>>;
    return static_cast<T>(static_cast<U>(static_cast<U>(a) * static_cast<U>(b)));
  } else {
    return a * b;
  }
}

// Binary operators on the compute type. Avg combines as Sum; the division by
// the world size happens once at the end (see Reducer::finishAverage).
struct Sum { template <typename C> SHOAL_HD C operator()(C a, C b) const { return wrappingAdd(a, b); } };
struct Prod { template <typename C> SHOAL_HD C operator()(C a, C b) const { return wrappingMul(a, b); } };
struct Min { template <typename C> SHOAL_HD C operator()(C a, C b) const { return b < a ? b : a; } };
struct Max { template <typename C> SHOAL_HD C operator()(C a, C b) const { return a < b ? b : a; } };
struct BitAnd { template <typename C> SHOAL_HD C operator()(C a, C b) const { return C(a & b); } };
struct BitOr { template <typename C> SHOAL_HD C operator()(C a, C b) const { return C(a | b); } };
struct BitXor { template <typename C> SHOAL_HD C operator()(C a, C b) const { return C(a ^ b); } };

// dst[i] = dst[i] (op) src[i]: the one loop every reducer is made of.
template <typename T, typename Op>
SHOAL_HD inline void combineElement(T* dst, const T* src, size_t i, Op op) {
  dst[i] = narrow<T>(op(widen(dst[i]), widen(src[i])));
}

// out[i] = a[i] (op) b[i]: the same, out of place (out may alias a).
template <typename T, typename Op>
SHOAL_HD inline void combineElementInto(T* out, const T* a, const T* b, size_t i, Op op) {
  out[i] = narrow<T>(op(widen(a[i]), widen(b[i])));
}

// The same over a span, in blocks of kBlock elements: a fixed trip count the
// compiler unrolls and vectorises, and restrict-qualified parameters (dst
// and src, out and a or b never overlap here) so that it needs no runtime
// overlap check. Each element still gets exactly combineElement's
// arithmetic, so the bits are the per-element function's. The CPU reducers
// (reducer.cc) run these; a device kernel runs combineElement per thread.
constexpr size_t kCombineBlock = 16;

template <typename T, typename Op>
SHOAL_HD inline void combineSpan(T* __restrict__ dst, const T* __restrict__ src, size_t count, Op op) {
  size_t i = 0;
  for (; i + kCombineBlock <= count; i += kCombineBlock)
    for (size_t j = i; j < i + kCombineBlock; ++j) combineElement(dst, src, j, op);
  for (; i < count; ++i) combineElement(dst, src, i, op);
}

template <typename T, typename Op>
SHOAL_HD inline void combineSpanInto(T* __restrict__ out, const T* __restrict__ a, const T* __restrict__ b,
                                     size_t count, Op op) {
  size_t i = 0;
  for (; i + kCombineBlock <= count; i += kCombineBlock)
    for (size_t j = i; j < i + kCombineBlock; ++j) combineElementInto(out, a, b, j, op);
  for (; i < count; ++i) combineElementInto(out, a, b, i, op);
}

// out[i] = out[i] / divisor, in the compute type (integer division truncates toward zero).
template <typename T>
SHOAL_HD inline void divideElement(T* out, size_t i, int divisor) {
  using C = typename Compute<T>::type;
  if constexpr (std::is_integral_v<C>) {
    // Divide in 64 bits so a world size beyond the type's range cannot wrap.
    using Wide = std::conditional_t<std::is_signed_v<C>, int64_t, uint64_t>;
    out[i] = static_cast<T>(static_cast<Wide>(out[i]) / static_cast<Wide>(divisor));
  } else {
    out[i] = narrow<T>(static_cast<C>(widen(out[i]) / static_cast<C>(divisor)));
  }
}

}  // namespace shoal::ops
