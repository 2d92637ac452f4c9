// shoal-bench's data: how values of each dtype are encoded, the inputs each collective gets and
// the results it must produce (exactly computable whatever the reduction order), and how a
// compressed allreduce's output is judged. Included by bench/shoal_bench/ only.
#pragma once

#include <shoal/compressor.h>
#include <shoal/shoal.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>

namespace bench {

// ---- data types: host-side encoding of the values we send and expect -----------------

struct TypeInfo {
  bool isFloat, isSigned;
  int64_t exactLimit;  // every integer in [0, exactLimit] is exact (enough for what we use)
  int64_t plainMod;    // prime modulus of the values moved without reduction
  uint64_t infBits;    // floats: the bits of +inf; larger magnitudes are NaN
};
inline constexpr TypeInfo kTypes[SHOAL_DTYPE_COUNT] = {
    {true, true, 2048, 2039, 0x7c00u},                     // f16
    {true, true, 256, 251, 0x7f80u},                       // bf16
    {true, true, 1 << 24, 1000003, 0x7f800000u},           // f32
    {true, true, 1 << 24, 1000003, 0x7ff0000000000000u},   // f64
    {false, true, 127, 127, 0},                            // i8
    {false, false, 255, 127, 0},                           // u8
    {false, true, 1 << 24, 1000003, 0},                    // i32
    {false, false, 1 << 24, 1000003, 0},                   // u32
    {false, true, 1 << 24, 1000003, 0},                    // i64
    {false, false, 1 << 24, 1000003, 0},                   // u64
};

inline uint16_t toHalf(float f) {  // IEEE binary16, round to nearest even
  uint32_t x;
  std::memcpy(&x, &f, 4);
  const uint32_t sign = (x >> 16) & 0x8000u;
  x &= 0x7fffffffu;
  if (x >= 0x7f800000u) return uint16_t(sign | (x > 0x7f800000u ? 0x7e00u : 0x7c00u));
  if (x >= 0x477ff000u) return uint16_t(sign | 0x7c00u);  // >= 65520 rounds to inf
  if (x < 0x38800000u) {                                    // below 2^-14: subnormal half
    float a;
    std::memcpy(&a, &x, 4);
    return uint16_t(sign | uint32_t(std::nearbyint(a * 16777216.0f)));
  }
  uint32_t h = (((x >> 23) - 112) << 10) | ((x & 0x7fffffu) >> 13);  // rebias 127 -> 15
  const uint32_t rest = x & 0x1fffu;
  if (rest > 0x1000u || (rest == 0x1000u && (h & 1))) ++h;
  return uint16_t(sign | h);
}

inline uint16_t toBf16(float f) {  // round to nearest even
  uint32_t x;
  std::memcpy(&x, &f, 4);
  if ((x & 0x7fffffffu) > 0x7f800000u) return uint16_t((x >> 16) | 0x40u);
  return uint16_t((x + 0x7fffu + ((x >> 16) & 1u)) >> 16);
}

inline float fromHalf(uint16_t h) {
  const float mag = (h & 0x7c00u) == 0x7c00u ? ((h & 0x3ffu) ? NAN : INFINITY)
                    : (h & 0x7c00u)          ? std::ldexp(float(0x400u | (h & 0x3ffu)), ((h >> 10) & 0x1f) - 25)
                                             : std::ldexp(float(h & 0x3ffu), -24);
  return h & 0x8000u ? -mag : mag;
}

inline float fromBf16(uint16_t b) {
  const uint32_t x = uint32_t(b) << 16;
  float f;
  std::memcpy(&f, &x, 4);
  return f;
}

template <typename T> inline void put(char *buf, size_t k, T v) { std::memcpy(buf + k * sizeof(T), &v, sizeof(T)); }
template <typename T> inline T get(const char *buf, size_t k) {
  T v;
  std::memcpy(&v, buf + k * sizeof(T), sizeof(T));
  return v;
}

// Element k of buf = i for integer dtypes (truncated to the width), d for float dtypes.
inline void store(shoal_dtype_t t, char *buf, size_t k, int64_t i, double d) {
  switch (t) {
    case SHOAL_F16: put(buf, k, toHalf(float(d))); break;
    case SHOAL_BF16: put(buf, k, toBf16(float(d))); break;
    case SHOAL_F32: put(buf, k, float(d)); break;
    case SHOAL_F64: put(buf, k, d); break;
    case SHOAL_I8: put(buf, k, int8_t(i)); break;
    case SHOAL_U8: put(buf, k, uint8_t(i)); break;
    case SHOAL_I32: put(buf, k, int32_t(i)); break;
    case SHOAL_U32: put(buf, k, uint32_t(i)); break;
    case SHOAL_I64: put(buf, k, int64_t(i)); break;
    default: put(buf, k, uint64_t(i)); break;
  }
}

// Element k of buf as a double (exact for every dtype but 64-bit integers beyond 2^53).
inline double load(shoal_dtype_t t, const char *buf, size_t k) {
  switch (t) {
    case SHOAL_F16: return fromHalf(get<uint16_t>(buf, k));
    case SHOAL_BF16: return fromBf16(get<uint16_t>(buf, k));
    case SHOAL_F32: return get<float>(buf, k);
    case SHOAL_F64: return get<double>(buf, k);
    case SHOAL_I8: return get<int8_t>(buf, k);
    case SHOAL_U8: return get<uint8_t>(buf, k);
    case SHOAL_I32: return get<int32_t>(buf, k);
    case SHOAL_U32: return get<uint32_t>(buf, k);
    case SHOAL_I64: return double(get<int64_t>(buf, k));
    default: return double(get<uint64_t>(buf, k));
  }
}

// Integers compare bit for bit; floats by distance in ULPs (so -0 == +0), NaN never matches.
inline bool sameValue(shoal_dtype_t t, const char *got, const char *want, int64_t ulps) {
  const size_t ts = shoal_dtype_size(t);
  if (!kTypes[t].isFloat) return std::memcmp(got, want, ts) == 0;
  uint64_t a = 0, b = 0;
  std::memcpy(&a, got, ts);
  std::memcpy(&b, want, ts);
  const uint64_t signBit = uint64_t{1} << (8 * ts - 1), inf = kTypes[t].infBits;
  auto ordered = [&](uint64_t u) { return (u & signBit ? -1 : 1) * int64_t(u & (signBit - 1)); };
  if ((a & (signBit - 1)) > inf || (b & (signBit - 1)) > inf) return false;
  return std::llabs(ordered(a) - ordered(b)) <= ulps;
}

// ---- verifiable inputs ------------------------------------------------------------------

struct Counts {  // elements, as nccl-tests' getCollByteCount
  size_t sendCount, recvCount, paramCount, sendInplaceOffset, recvInplaceOffset;
};

struct Ctx {  // everything the value functions need for one size
  shoal_dtype_t dtype;
  shoal_op_t op;
  int nranks, rank, root;
  Counts c;
  size_t ts, bits;  // type size in bytes and bits
  bool isSigned;
  int64_t sumMax;  // sum/avg inputs lie in [0, sumMax]; 0 = one rank holds a 1
  int64_t plainMod;
  // Allreduce only:
  const shoal_allreduce_options_t *arOpts = nullptr;  // compressor, options, tensor name
  int ndim = 1;                     // --shape: the tensor's shape (nullptr: 1-D, count elements)
  const int64_t *shape = nullptr;
  shoal_memory_t memory = SHOAL_MEMORY_HOST;  // --memory: where the collectives' buffers live
  int device = 0;
  int64_t richMax = 0;  // > 0: sum/avg inputs are +-[1, richMax], standing for that times scale
  double scale = 1;     // what an input integer stands for (the value stored)
  bool sparse = false;  // density < 1: see nonzeroAt
  double common = 1, arc = 1;  // see sparsity
};

inline uint64_t mix(uint64_t z) {  // splitmix64's finaliser: a well-spread hash of z
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

// Sparse inputs (--density D, --overlap O). A hash u in [0,1) of the index alone makes a position
// common to all ranks when u < c = D*O. The other positions form a circle, w = (u - c) / (1 - c)
// in [0,1); rank r holds the arc [r*p, r*p + p) of it (wrapping at 1), p = D(1-O) / (1-c). So each
// rank has density c + (1-c)*p = D, a fraction c/D = O of its positions shared by every rank, and
// the rest private to it while the arcs are disjoint, n*p <= 1; beyond that (e.g. D = 1, O < 1)
// neighbouring arcs overlap and the real overlap exceeds O (the header says so).
inline void sparsity(double density, double overlap, double *common, double *arc) {  // c and p above
  *common = density * overlap;
  *arc = *common < 1 ? density * (1 - overlap) / (1 - *common) : 0;
}

inline bool nonzeroAt(const Ctx &x, int r, size_t k) {
  const double u = double(mix(k + 0x9e3779b97f4a7c15ull) >> 11) * 0x1p-53;
  if (!x.sparse || u < x.common) return true;
  const double a = (u - x.common) / (1 - x.common) - r * x.arc;
  return a - std::floor(a) < x.arc;
}

// Rank r's contribution at global index k of a reduction.
inline int64_t redValue(const Ctx &x, int r, size_t k) {
  if (!nonzeroAt(x, r, k)) return 0;
  const size_t rk = size_t(r) + k, n = size_t(x.nranks), bits = x.bits;
  switch (x.op) {
    case SHOAL_SUM:
    case SHOAL_AVG:
      if (x.richMax > 0) {  // signed, spread out: what a compressor sees matters
        const uint64_t h = mix(mix(k) ^ (uint64_t(r) + 1) * 0x9e3779b97f4a7c15ull);
        return (h & 1 ? -1 : 1) * int64_t(1 + (h >> 1) % uint64_t(x.richMax));
      }
      if (x.sparse && x.sumMax > 0) return 1 + int64_t(rk % size_t(x.sumMax));  // nonzero
      return x.sumMax > 0 ? int64_t(rk % size_t(x.sumMax + 1)) : int64_t(rk % n == 0);
    case SHOAL_PROD:  // one 2 per element, and -1s where signed: |product| == 2
      if (rk % n == 0) return 2;
      return x.isSigned && (3 * size_t(r) + k) % 5 == 0 ? -1 : 1;
    case SHOAL_MIN:
    case SHOAL_MAX: {  // distinct per rank (up to 127 ranks), negative too where signed
      const size_t span = std::min<size_t>(n, 127);
      return int64_t(rk % n % span) - (x.isSigned ? int64_t(span / 2) : 0);
    }
    case SHOAL_BAND: return int64_t(~(uint64_t{1} << ((5 * size_t(r) + k) % bits)));
    case SHOAL_BOR: return int64_t(uint64_t{1} << ((5 * size_t(r) + k) % (bits - 1)));  // never all ones
    default: return int64_t((uint64_t(r) + 1) * 0x9e3779b97f4a7c15ull ^ (k + 1) * 0xbf58476d1ce4e5b9ull);  // BXOR
  }
}

// The reduction over all ranks at global index k (before avg's division).
inline int64_t reduceOverRanks(const Ctx &x, size_t k) {
  int64_t acc = redValue(x, 0, k);
  for (int r = 1; r < x.nranks; ++r) {
    const int64_t v = redValue(x, r, k);
    switch (x.op) {
      case SHOAL_SUM:
      case SHOAL_AVG: acc += v; break;
      case SHOAL_PROD: acc *= v; break;
      case SHOAL_MIN: acc = std::min(acc, v); break;
      case SHOAL_MAX: acc = std::max(acc, v); break;
      case SHOAL_BAND: acc &= v; break;
      case SHOAL_BOR: acc |= v; break;
      default: acc ^= v; break;
    }
  }
  return acc;
}

// Values of allgather/broadcast: differ between ranks at every index, never the sentinel.
inline int64_t plainValue(const Ctx &x, int r, size_t k) {
  return int64_t((size_t(r) * 31 + k * 7 + 1) % size_t(x.plainMod));
}

// How outputs are judged: EXACT as every uncompressed collective (float avg allows 2 ULP);
// RELATIVE by the compressor's bound, |out - exact| <= bound * n * sum_r |x_r|; FEEDBACK (error
// feedback: a call's error is paid back later, so one call cannot be judged) for finiteness only.
struct Check {
  shoal_error_kind_t kind = SHOAL_ERROR_EXACT;
  double bound = 0;
};

}  // namespace bench
