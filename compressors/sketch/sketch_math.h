// Per-element logic of the sketch compressor, shared by the host code
// (sketch.cc) and the CUDA kernels (sketch.cu): everything here is __host__ __device__
// under nvcc (SHOAL_HD, from collectives/common/element_ops.h) and plain inline
// C++ otherwise. No allocation, no standard containers.
//
// Pieces:
//  - the index bitmap: bit i of word i / 64 is coordinate i;
//  - the Bloom index (bit positions of a coordinate);
//  - the count-sketch cell of (index, j), j = 0, 1, 2 (lane-rotated blocks),
//    and the per-member steps of peeling (pure-cell test, apply);
//  - the exact fixed-point encoding of an f32 as signed 64-bit limbs and the
//    exact decoding of a sum of such encodings back to f32, rounded once.
//
// Fixed point (see sketch.cc for the rule that picks Q, L and K):
//   every finite f32 is x = +-m * 2^q with m < 2^24 an integer; normalised
//   (m odd) q is the position of x's lowest set bit. With Q <= q for every
//   nonzero value of every rank (the global minimum), x * 2^-Q = +-m * 2^(q-Q)
//   is an integer. It is split into K limbs of L bits:
//     x * 2^-Q = sum_k d_k * 2^(k L),  d_k in (-2^L, 2^L), all of x's sign.
//   Limbs are summed (across ranks, sketch cells) as u64 modulo 2^64; with
//   L + ceil(log2 n) <= 63 the true limb sum over n ranks satisfies
//   |sum| <= n (2^L - 1) < 2^63, so the modular result read as int64 IS the
//   true limb sum. The exact total sum_r x_r = 2^Q * sum_k S_k 2^(k L) is then
//   rebuilt in a 512-bit two's-complement integer (no rounding), optionally
//   divided by n with a sticky remainder bit, and rounded ONCE to f32 (round to
//   nearest even, subnormals and overflow to inf as IEEE does).
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>

#include "core/numeric/element_ops.h"  // SHOAL_HD

namespace shoal::sketch {

// ---- bitmap -------------------------------------------------------------------
SHOAL_HD inline void bitmapSet(uint64_t* words, size_t i) { words[i >> 6] |= uint64_t(1) << (i & 63); }
SHOAL_HD inline bool bitmapTest(const uint64_t* words, size_t i) { return (words[i >> 6] >> (i & 63)) & 1u; }

// ---- hashing ------------------------------------------------------------------
// The high 64 bits of a * b: range reduction without division.
SHOAL_HD inline uint64_t mulhi64(uint64_t a, uint64_t b) {
#if defined(__CUDA_ARCH__)
  return __umul64hi(a, b);
#else
  return static_cast<uint64_t>((static_cast<unsigned __int128>(a) * b) >> 64);
#endif
}

// splitmix64's finaliser: a full-avalanche 64-bit mix.
SHOAL_HD inline uint64_t mix64(uint64_t x) {
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ull;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebull;
  x ^= x >> 31;
  return x;
}

// ---- count-sketch geometry: lane-rotated blocks -----------------------------
// The table has 3 parts (hash j lands in part j, so an element's three cells
// differ), each of rows x width cells, width a power of two <= 1024. Element i
// is lane t = i mod width of block b = i / width; its cell in part j is
//     j * part + row_j(b) * width + (t + offset_j(b)) mod width,
// with row_j, offset_j from one hash of (b, seed, j). Neighbouring elements of
// a block land in neighbouring cells of one row (coalesced on a GPU, cache-
// friendly on a CPU, since U is scanned in ascending order), while the per-
// block rotation keeps the hypergraph random enough to peel: with block-shared
// rows and no rotation (the seed paper's code) two blocks that draw the same
// three rows collide in EVERY lane, a structural 2-core that no amount of
// space removes (tests/unit/test_sketch_math.cc shows both).
struct SketchGeometry {
  uint64_t part = 0;   // cells per part = rows << widthLog2
  uint64_t rows = 0;
  int widthLog2 = 0;
  uint64_t seed = 0;
};

// A geometry of at least targetPart cells per part. The width is the largest
// power of two <= 1024 with at least 256 rows: rounding up to whole rows costs
// < 1/256 of a part, and a dense union (where every lane of a block is a
// member, so rotation cannot separate two blocks that share a row) still has
// >= 256 * count / part blocks, enough for the block-level hypergraph to peel
// like a random one. Tables under 512 cells a part get width 1 (per-element
// hashing). Width 1024 from 256k cells a part (~600k members).
SHOAL_HD inline SketchGeometry sketchGeometry(uint64_t targetPart, uint64_t seed) {
  SketchGeometry g;
  if (targetPart == 0) targetPart = 1;
  int w = 0;
  while (w < 10 && (uint64_t(256) << (w + 1)) <= targetPart) ++w;
  g.widthLog2 = w;
  g.rows = (targetPart + (uint64_t(1) << w) - 1) >> w;
  g.part = g.rows << w;
  g.seed = seed;
  return g;
}

// The per-table salt of hash j (0..2).
SHOAL_HD inline uint64_t cellSalt(const SketchGeometry& g, int j) {
  return mix64(g.seed + 0x632be59bd9b4e019ull * uint64_t(j + 1));
}
// Hash j of a block, given its salt.
SHOAL_HD inline uint64_t blockHash(uint64_t block, uint64_t salt) { return mix64(block * 0x9e3779b97f4a7c15ull + salt); }
// The cell of lane (index mod width) in part j, for the block's hash h.
SHOAL_HD inline uint64_t cellInPart(uint64_t index, uint64_t h, const SketchGeometry& g, int j) {
  const uint64_t mask = (uint64_t(1) << g.widthLog2) - 1;
  // Row from the high bits (multiply-shift range reduction), rotation from the low bits.
  const uint64_t row = mulhi64(h, g.rows);
  return uint64_t(j) * g.part + (row << g.widthLog2) + (((index & mask) + h) & mask);
}

// The cell of element `index` for hash j (0..2).
SHOAL_HD inline uint64_t cellOf(uint64_t index, const SketchGeometry& g, int j) {
  return cellInPart(index, blockHash(index >> g.widthLog2, cellSalt(g, j)), g, j);
}

// cellOf for loops over many members (the same cells): the salts computed once,
// and the block's three hashes kept while the next member is in the same block
// (ascending members: at 10% density ~50 members share a block of 512).
struct CellHasher {
  SketchGeometry g;
  uint64_t salt[3];
  uint64_t block = ~uint64_t(0), h[3] = {0, 0, 0};
  SHOAL_HD explicit CellHasher(const SketchGeometry& geometry) : g(geometry) {
    for (int j = 0; j < 3; ++j) salt[j] = cellSalt(g, j);
  }
  SHOAL_HD void cells(uint64_t index, uint64_t* out) {
    const uint64_t b = index >> g.widthLog2;
    if (b != block) {
      block = b;
      for (int j = 0; j < 3; ++j) h[j] = blockHash(b, salt[j]);
    }
    for (int j = 0; j < 3; ++j) out[j] = cellInPart(index, h[j], g, j);
  }
};

// ---- peeling, per member (the two-phase rounds of the GPU; the CPU peel in
// sketch_peel.h uses a queue but the same cells and the same pure-cell test) --
// counts[c] = members of U hashed to cell c (computed from U, never sent).
SHOAL_HD inline bool isPure(uint32_t count) { return count == 1; }

// Phase A: the first of member `index`'s cells that holds it alone, or
// UINT64_MAX. Cells of count 1 hold exactly that member's sum.
SHOAL_HD inline uint64_t pureCellOf(uint64_t index, const SketchGeometry& g, const uint32_t* counts) {
  for (int j = 0; j < 3; ++j) {
    const uint64_t c = cellOf(index, g, j);
    if (isPure(counts[c])) return c;
  }
  return ~uint64_t(0);
}

// Phase B (one thread, plain arithmetic; the GPU does the same with atomics):
// removes a recovered member's K limbs (limbs[k]) from its three cells.
// Wrapping u64 arithmetic: exact modulo 2^64, whatever the cells held.
SHOAL_HD inline void peelApply(uint64_t index, const SketchGeometry& g, const uint64_t* limbs, int K, uint64_t* cells,
                               uint64_t stride, uint32_t* counts) {
  for (int j = 0; j < 3; ++j) {
    const uint64_t c = cellOf(index, g, j);
    for (int k = 0; k < K; ++k) cells[uint64_t(k) * stride + c] -= limbs[k];
    --counts[c];
  }
}

// ---- Bloom index ------------------------------------------------------------
// An unblocked Bloom filter of `words` u64 words and `hashes` bit positions per
// coordinate, ORed across ranks like the bitmap. Its members are every
// coordinate whose bits are all set: U plus false positives, whose values are
// zero on every rank, so they decode to exact +0 (they only cost space).
struct BloomGeometry {
  uint64_t words = 0;
  int hashes = 0;
  uint64_t seed = 0;
};

// Bit position h (0 <= h < hashes) of coordinate `index` in [0, 64 * words).
SHOAL_HD inline uint64_t bloomBit(uint64_t index, const BloomGeometry& b, int h) {
  const uint64_t x = mix64(index * 0xd6e8feb86659fd93ull + mix64(b.seed + 0x9e3779b97f4a7c15ull * uint64_t(h + 1)));
  return mulhi64(x, b.words * 64);
}

SHOAL_HD inline void bloomInsert(uint64_t* words, uint64_t index, const BloomGeometry& b) {
  for (int h = 0; h < b.hashes; ++h) bitmapSet(words, bloomBit(index, b, h));
}

SHOAL_HD inline bool bloomTest(const uint64_t* words, uint64_t index, const BloomGeometry& b) {
  for (int h = 0; h < b.hashes; ++h)
    if (!bitmapTest(words, bloomBit(index, b, h))) return false;
  return true;
}

// ---- f32 decomposition ----------------------------------------------------------
struct FloatParts {
  uint32_t mag;   // odd (normalised), < 2^24; 0 for a zero
  int lowest;     // value = +-mag * 2^lowest
  int top;        // position of the highest set bit: 2^top <= |x| < 2^(top+1)
  bool negative;
};

SHOAL_HD inline int clz32(uint32_t v) {
#if defined(__CUDA_ARCH__)
  return __clz(v);
#else
  return __builtin_clz(v);
#endif
}
SHOAL_HD inline int clz64(uint64_t v) {
#if defined(__CUDA_ARCH__)
  return __clzll(v);
#else
  return __builtin_clzll(v);
#endif
}
SHOAL_HD inline int ctz32(uint32_t v) {
#if defined(__CUDA_ARCH__)
  return __ffs(v) - 1;
#else
  return __builtin_ctz(v);
#endif
}

// For a finite value only (the caller tests isFinite first).
SHOAL_HD inline FloatParts decompose(float x) {
  uint32_t bits = ops::floatBits(x);
  FloatParts p{};
  p.negative = (bits >> 31) != 0;
  uint32_t e = (bits >> 23) & 0xffu, frac = bits & 0x7fffffu;
  uint32_t mag = e == 0 ? frac : (frac | 0x800000u);
  int q = e == 0 ? -149 : int(e) - 150;
  if (mag == 0) return p;
  int tz = ctz32(mag);
  p.mag = mag >> tz;
  p.lowest = q + tz;
  p.top = q + 31 - clz32(mag);
  return p;
}

SHOAL_HD inline bool isFinite(float x) { return (ops::floatBits(x) & 0x7f800000u) != 0x7f800000u; }

// Adds x's limbs (scale 2^-Q, limb width L bits, K limbs) to limbs[k * stride]
// modulo 2^64. Requires Q <= decompose(x).lowest and K limbs covering x.
// x's two nonzero limbs: x 2^-Q = lo 2^(k0 L) + hi 2^((k0+1) L) (wrapping
// two's complement, both of x's sign). k0 = -1 for a zero.
struct LimbPair {
  int k0;
  uint64_t lo, hi;
};

SHOAL_HD inline LimbPair limbPairOf(float x, int Q, int L) {
  FloatParts p = decompose(x);
  // A value below the scale (Q above its lowest bit: only a scale that was not
  // agreed by every rank) has no limbs; dropping it keeps the shifts defined
  // and the limb index non-negative (the device kernels write limbs[k0 * stride]).
  if (p.mag == 0 || p.lowest < Q) return LimbPair{-1, 0, 0};
  int shift = p.lowest - Q;
  int k0 = shift / L, r = shift % L;
  unsigned __int128 w = static_cast<unsigned __int128>(p.mag) << r;
  uint64_t lo = static_cast<uint64_t>(w) & ((uint64_t(1) << L) - 1);
  uint64_t hi = static_cast<uint64_t>(w >> L);
  if (p.negative) {
    lo = 0 - lo;
    hi = 0 - hi;
  }
  return LimbPair{k0, lo, hi};
}

SHOAL_HD inline void addLimbs(float x, int Q, int L, int K, uint64_t* limbs, size_t stride) {
  const LimbPair l = limbPairOf(x, Q, L);
  if (l.k0 < 0) return;
  if (l.k0 < K) limbs[size_t(l.k0) * stride] += l.lo;
  if (l.k0 + 1 < K) limbs[size_t(l.k0 + 1) * stride] += l.hi;
}

// ---- exact decoding -----------------------------------------------------------------
constexpr int kBigWords = 8;  // 512 bits: 2^-149 .. 2^128 is 277 bits, + log2 n, + 64 for the division

struct Big {
  uint64_t w[kBigWords];
};

SHOAL_HD inline void bigZero(Big& b) {
  for (int i = 0; i < kBigWords; ++i) b.w[i] = 0;
}

// b += v * 2^shift (two's complement, v signed).
SHOAL_HD inline void bigAddShifted(Big& b, int64_t v, int shift) {
  uint64_t t[kBigWords];
  uint64_t ext = v < 0 ? ~uint64_t(0) : 0;
  for (int i = 0; i < kBigWords; ++i) t[i] = i < shift / 64 ? 0 : ext;
  int w = shift / 64, s = shift % 64;
  __int128 shifted = static_cast<__int128>(v) * (static_cast<__int128>(1) << s);  // fits: |v| < 2^63, s < 64
  if (w < kBigWords) t[w] = static_cast<uint64_t>(shifted);
  if (w + 1 < kBigWords) t[w + 1] = static_cast<uint64_t>(static_cast<unsigned __int128>(shifted) >> 64);
  uint64_t carry = 0;
  for (int i = 0; i < kBigWords; ++i) {
    unsigned __int128 sum = static_cast<unsigned __int128>(b.w[i]) + t[i] + carry;
    b.w[i] = static_cast<uint64_t>(sum);
    carry = static_cast<uint64_t>(sum >> 64);
  }
}

SHOAL_HD inline bool bigNegative(const Big& b) { return (b.w[kBigWords - 1] >> 63) != 0; }

SHOAL_HD inline void bigNegate(Big& b) {
  uint64_t carry = 1;
  for (int i = 0; i < kBigWords; ++i) {
    unsigned __int128 sum = static_cast<unsigned __int128>(~b.w[i]) + carry;
    b.w[i] = static_cast<uint64_t>(sum);
    carry = static_cast<uint64_t>(sum >> 64);
  }
}

// Highest set bit, -1 for zero.
SHOAL_HD inline int bigTop(const Big& b) {
  for (int i = kBigWords - 1; i >= 0; --i)
    if (b.w[i]) return i * 64 + 63 - clz64(b.w[i]);
  return -1;
}

SHOAL_HD inline bool bigBit(const Big& b, int i) { return i >= 0 && ((b.w[i / 64] >> (i % 64)) & 1u); }

// Any bit below position i set?
SHOAL_HD inline bool bigAnyBelow(const Big& b, int i) {
  for (int k = 0; k < kBigWords && k * 64 < i; ++k) {
    uint64_t word = b.w[k];
    if ((k + 1) * 64 > i) word &= (uint64_t(1) << (i - k * 64)) - 1;
    if (word) return true;
  }
  return false;
}

// Bits [from, from + 25) as an integer (from >= 0).
SHOAL_HD inline uint64_t bigBits(const Big& b, int from, int count) {
  uint64_t out = 0;
  for (int i = 0; i < count; ++i)
    if (bigBit(b, from + i)) out |= uint64_t(1) << i;
  return out;
}

// b = (b << 64) / d, returns whether the remainder is nonzero. b >= 0 and its
// top word must be free.
SHOAL_HD inline bool bigShiftDivide(Big& b, uint64_t d) {
  for (int i = kBigWords - 1; i > 0; --i) b.w[i] = b.w[i - 1];
  b.w[0] = 0;
  unsigned __int128 rem = 0;
  for (int i = kBigWords - 1; i >= 0; --i) {
    unsigned __int128 cur = (rem << 64) | b.w[i];
    b.w[i] = static_cast<uint64_t>(cur / d);
    rem = cur % d;
  }
  return rem != 0;
}

SHOAL_HD inline float ldexpExact(uint64_t m, int e) {
  // m <= 2^24: exact as float; scaling by powers of two in steps keeps every
  // intermediate exact until the final (representable or overflowing) result.
  float f = static_cast<float>(m);
  while (e > 100) { f *= 0x1p100f; e -= 100; }
  while (e < -100) { f *= 0x1p-100f; e += 100; }  // only reached with results >= 2^-149, see roundToFloat
  // Final step: |e| <= 100; build 2^e in two factors to stay in range.
  int e1 = e / 2, e2 = e - e1;
  return f * ops::bitsFloat(uint32_t(e1 + 127) << 23) * ops::bitsFloat(uint32_t(e2 + 127) << 23);
}

// The f32 nearest (ties to even) to (negative ? -1 : 1) * (mag + sticky_tail) * 2^Q,
// where sticky says that a nonzero tail below mag's bit 0 exists (smaller than 1).
SHOAL_HD inline float roundToFloat(const Big& mag, int Q, bool sticky, bool negative) {
  int t = bigTop(mag);
  if (t < 0) return negative ? -0.0f : 0.0f;
  int e = t + Q;
  if (e >= 128) return negative ? -ops::bitsFloat(0x7f800000u) : ops::bitsFloat(0x7f800000u);
  int cut = e >= -126 ? t - 23 : -149 - Q;  // bit position of the result's last place
  uint64_t m;
  if (cut <= 0) {
    // Every bit of mag is a bit of the result (t <= 23 + cut <= 23): exact.
    // (sticky is never set here: callers that divide first scale by 2^64, so
    // t >= 56 and cut > 0.)
    m = bigBits(mag, 0, t + 1);
    cut = 0;
  } else {
    m = bigBits(mag, cut, t + 1 - cut);
    bool half = bigBit(mag, cut - 1);
    bool below = sticky || bigAnyBelow(mag, cut - 1);
    if (half && (below || (m & 1u))) ++m;
  }
  // Value = m * 2^(cut + Q), with m <= 2^24 and the result >= 2^-149 (or 0).
  if (m == 0) return negative ? -0.0f : 0.0f;
  float f;
  int exp = cut + Q;
  if (exp + 64 - clz64(m) > 128) f = ops::bitsFloat(0x7f800000u);
  else f = ldexpExact(m, exp);
  return negative ? -f : f;
}

// The fast path of the common case, one limb (K = 1): the exact sum is the
// int64 S times 2^Q (avg: S * 2^Q / n). Same rounding as roundToFloat, on
// 128-bit integers: (|S| << 64) / n keeps >= 56 quotient bits, the remainder
// becomes the sticky bit.
SHOAL_HD inline int top128(unsigned __int128 v) {
  uint64_t hi = static_cast<uint64_t>(v >> 64), lo = static_cast<uint64_t>(v);
  return hi ? 127 - clz64(hi) : (lo ? 63 - clz64(lo) : -1);
}

SHOAL_HD inline float roundToFloat128(unsigned __int128 mag, int Q, bool sticky, bool negative) {
  int t = top128(mag);
  if (t < 0) return negative ? -0.0f : 0.0f;
  int e = t + Q;
  if (e >= 128) return negative ? -ops::bitsFloat(0x7f800000u) : ops::bitsFloat(0x7f800000u);
  int cut = e >= -126 ? t - 23 : -149 - Q;
  uint64_t m;
  if (cut <= 0) {
    m = static_cast<uint64_t>(mag);  // t <= 23: exact (sticky never set here, see decodeOneLimb)
    cut = 0;
  } else if (cut > 127) {
    m = 0;  // unreachable (t <= 127 so cut <= 104 when normal; <= 64 + 149 + Q when subnormal); a guard for the shifts
  } else {
    m = static_cast<uint64_t>(mag >> cut);
    bool half = (mag >> (cut - 1)) & 1u;
    bool below = sticky || (cut >= 2 && (mag & ((static_cast<unsigned __int128>(1) << (cut - 1)) - 1)) != 0);
    if (half && (below || (m & 1u))) ++m;
  }
  if (m == 0) return negative ? -0.0f : 0.0f;
  float f;
  int exp = cut + Q;
  if (exp + 64 - clz64(m) > 128) f = ops::bitsFloat(0x7f800000u);
  else f = ldexpExact(m, exp);
  return negative ? -f : f;
}

// S * 2^scale rounded once, when the result is a normal f32: the int64's
// conversion rounds once, to nearest with ties to even (the FPU's default mode,
// as roundToFloat128 rounds), and the scaling then only moves the exponent
// field, which is exact while the result stays normal. False where it cannot
// tell (S = 0, a result that is subnormal or beyond f32's range): the caller
// takes the 128-bit path. Most members of a gradient's sum end here.
SHOAL_HD inline bool scaledNormal(int64_t S, int scale, float& out) {
  if (S == 0) return false;
  const uint32_t bits = ops::floatBits(static_cast<float>(S));
  const int exponent = int((bits >> 23) & 0xffu) + scale;  // >= 127 before scaling: |S| >= 1
  if (exponent < 1 || exponent > 254) return false;
  out = ops::bitsFloat(bits + (static_cast<uint32_t>(scale) << 23));  // (wraps for scale < 0: the same bits)
  return true;
}

// log2 of a rank count that is a power of two (n = 1: 0): dividing by it only lowers a scale.
SHOAL_HD inline bool isPowerOfTwo(int n) { return n > 0 && (n & (n - 1)) == 0; }
SHOAL_HD inline int log2PowerOfTwo(int n) { return ctz32(static_cast<uint32_t>(n)); }

// S * 2^Q (divided by n when n > 1), rounded once.
SHOAL_HD inline float decodeOneLimb(int64_t S, int Q, int n) {
  if (isPowerOfTwo(n)) {  // sum (n = 1) or avg over 2^k ranks: no division
    Q -= log2PowerOfTwo(n);
    n = 1;
    float fast;
    if (scaledNormal(S, Q, fast)) return fast;
  }
  if (n > 1 && n < (1 << 29) && S != 0 && S > -(int64_t(1) << 53) && S < (int64_t(1) << 53)) {
    // Other rank counts: S is exact in double, and the quotient rounded to double and then to f32
    // is the quotient rounded once to f32. Where the exact quotient S 2^Q / n is not an f32
    // midpoint (odd multiples of 2^(E-24) in its binade 2^E, of 2^-150 below the normal range), it
    // differs from one by a nonzero multiple of 2^min(Q, E-24) over n: at least 2^(E-24) / n when
    // Q >= E - 24, and otherwise at least 2^Q / n > 2^(E-53) since |S| < 2^53. Double's rounding
    // moves it by at most 2^(E-53) < 2^(E-24) / n for n < 2^29, so never across a midpoint; a
    // midpoint itself (at most 25 bits) is exact in double. Scaling by 2^Q in double is exact.
    const uint64_t powerBits = uint64_t(Q + 1023) << 52;  // 2^Q: a normal double at any tensor's scale
    double power;
    std::memcpy(&power, &powerBits, sizeof power);
    return static_cast<float>(static_cast<double>(S) / n * power);
  }
  bool negative = S < 0;
  unsigned __int128 mag = negative ? static_cast<uint64_t>(0) - static_cast<uint64_t>(S) : static_cast<uint64_t>(S);
  bool sticky = false;
  if (n > 1 && mag != 0) {
    unsigned __int128 scaled = mag << 64;  // mag < 2^63: fits
    sticky = scaled % static_cast<unsigned>(n) != 0;
    mag = scaled / static_cast<unsigned>(n);
    Q -= 64;
  }
  return roundToFloat128(mag, Q, sticky, negative);
}

// The K limb sums of one member (limbs[k * stride]) as f32: the exact
// sum_k S_k 2^(k L + Q) (divided by n for avg), rounded once.
SHOAL_HD inline float decodeLimbs(const uint64_t* limbs, size_t stride, int K, int L, int Q, int n, bool avg) {
  if (K == 1) return decodeOneLimb(static_cast<int64_t>(limbs[0]), Q, avg ? n : 1);
  // Two limbs (values spanning up to ~2 L bits): S0 + S1 2^L lies below 2^127
  // in magnitude (|S_k| <= 2^63, L <= 63), so the exact sum is rounded once
  // straight from a 128-bit integer; avg over 2^k ranks only lowers the scale
  // by k (exact). Other rank counts divide on the 512-bit path below.
  if (K == 2 && L <= 63 && (!avg || isPowerOfTwo(n))) {
    const __int128 v = static_cast<__int128>(static_cast<int64_t>(limbs[stride])) * (static_cast<__int128>(1) << L) +
                       static_cast<int64_t>(limbs[0]);
    const bool negative = v < 0;
    const unsigned __int128 mag =
        negative ? static_cast<unsigned __int128>(0) - static_cast<unsigned __int128>(v) : static_cast<unsigned __int128>(v);
    return roundToFloat128(mag, avg ? Q - log2PowerOfTwo(n) : Q, false, negative);
  }
  Big big;
  bigZero(big);
  for (int k = 0; k < K; ++k) bigAddShifted(big, static_cast<int64_t>(limbs[size_t(k) * stride]), k * L);
  bool negative = bigNegative(big);
  if (negative) bigNegate(big);
  bool sticky = false;
  if (avg && n > 1 && bigTop(big) >= 0) {
    sticky = bigShiftDivide(big, uint64_t(n));
    Q -= 64;
  }
  return roundToFloat(big, Q, sticky, negative);
}

// ---- Inf and NaN ------------------------------------------------------------------
// One word per member, ORed across ranks: 1 +Inf, 2 -Inf, 4 NaN.
SHOAL_HD inline uint64_t specialBits(float x) {
  uint32_t b = ops::floatBits(x);
  if ((b & 0x7fffffffu) > 0x7f800000u) return 4;
  if ((b & 0x7fffffffu) == 0x7f800000u) return (b >> 31) ? 2 : 1;
  return 0;
}

// A NaN, or +Inf meeting -Inf, gives NaN; else the infinity.
SHOAL_HD inline float decodeSpecial(uint64_t bits) {
  if ((bits & 4) || (bits & 3) == 3) return ops::bitsFloat(0x7fc00000u);
  return (bits & 1) ? ops::bitsFloat(0x7f800000u) : ops::bitsFloat(0xff800000u);
}

// Round 0's per-tensor statistics of one value: nonzero (not +-0)?
SHOAL_HD inline bool isNonzero(float x) { return (ops::floatBits(x) & 0x7fffffffu) != 0; }

}  // namespace shoal::sketch
