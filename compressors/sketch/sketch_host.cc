// Round 0's scan of the sketch compressor on the CPU (sketch_host.h):
// the index bitmap, this rank's nonzero values in index order and the
// exponent statistics, in one pass that reads the input once.
//
// Why the statistics are not per member: at 10% density the per-member
// decompose and min/max (a branch and a dependency chain per member) cost
// more than reading the input. They are a min and a max over the members,
// so they are taken with vector min/max over the members' values once the
// scan has copied them out (batch by batch, while they are in the L1 cache;
// every lane a member, so there are no zeros to mask), branch-free:
//  - the top bit: top() grows with |x|, so max top = top(max |x|), and |x|'s
//    bits order like |x| (an unsigned max of the bits with the sign cleared);
//  - the lowest bit: for a finite nonzero x with magnitude bits t and biased
//    exponent e, lowest = max(e, 1) - 150 + ctz(t | 2^23) (bit 23 stands in
//    for the implicit bit of a normal value and lies above a subnormal's
//    lowest set bit), and 2^ctz(v) = v & -v converts exactly to a float whose
//    exponent field is 127 + ctz. So key = max(e, 1) + 127 + ctz is a few
//    vector operations, and lowest = min key - 277;
//  - Inf/NaN (a magnitude >= 0x7f800000) would spoil both: when the maximum
//    says one is present, the statistics are taken again member by member
//    (addMemberStats, the reference rule; rare: Inf/NaN gradients).
// Blocks of 64 elements that are all +-0 (most of a sparse tensor, whole
// rows of an embedding's gradient) are recognised from one OR of the block
// and skipped. The values are copied out with a fixed run of writes per
// word (simdjson's "flatten" loop: no data-dependent loop exit per word; the
// writes past the word's members land in room the next word overwrites).
// Compiled for the build's target (x86-64-v2: SSE4.1) and, with GCC, for
// AVX2 and AVX-512, picked at run time by the CPU (scanIndex); AVX-512 copies
// the members out by compressing each vector instead. Every path gives the same
// words, values and statistics (tests/unit/test_sketch_host.cc compares them).
#include "compressors/sketch/sketch_host.h"

#if defined(__x86_64__) && defined(__SSE4_1__)
#include <immintrin.h>
#define SHOAL_SKETCH_X86 1
#if defined(__GNUC__) && !defined(__clang__)
#define SHOAL_SKETCH_AVX2 1    // GCC: functions compiled for AVX2 beside the baseline ones
#define SHOAL_SKETCH_AVX512 1  // ... and for AVX-512 (F, BW, VL)
#endif
#endif

namespace shoal::sketch {
namespace {

constexpr uint32_t kMagnitude = 0x7fffffffu, kNonfinite = 0x7f800000u;

// The lowest-bit key of magnitude bits t (finite, nonzero): lowest + 277.
inline uint32_t lowestKey(uint32_t t) {
  const uint32_t e = t >> 23;
  return (e > 1 ? e : 1) + 127 + uint32_t(__builtin_ctz(t | 0x800000u));
}

// What the vector pass gathers; finishStats makes LocalStats of it.
struct Totals {
  uint32_t maxMagnitude = 0;  // over every element (zeros are neutral)
  uint32_t minKey = ~0u;      // over the nonzero elements
  bool negativeZero = false;
};

// Folds x[k]'s members (mask bits) into totals one by one: few members.
inline void addMembersScalar(const float* x, uint64_t mask, Totals& totals) {
  for (; mask; mask &= mask - 1) {
    const uint32_t t = ops::floatBits(x[__builtin_ctzll(mask)]) & kMagnitude;
    totals.maxMagnitude = std::max(totals.maxMagnitude, t);
    totals.minKey = std::min(totals.minKey, lowestKey(t));
  }
}

// Folds values[0..n) (members: every one nonzero) into totals one by one: the vector loops' tails.
inline void addValuesScalar(const float* values, std::ptrdiff_t n, Totals& totals) {
  for (std::ptrdiff_t i = 0; i < n; ++i) {
    const uint32_t t = ops::floatBits(values[i]) & kMagnitude;
    totals.maxMagnitude = std::max(totals.maxMagnitude, t);
    totals.minKey = std::min(totals.minKey, lowestKey(t));
  }
}

// Folds a vector pass's N lanes (lanes[0]: maximum magnitudes, [1]: minimum keys, [2]: the -0
// bits seen) into totals.
template <size_t N>
inline void foldLanes(const uint32_t (&lanes)[3][N], Totals& totals) {
  for (size_t k = 0; k < N; ++k) {
    totals.maxMagnitude = std::max(totals.maxMagnitude, lanes[0][k]);
    totals.minKey = std::min(totals.minKey, lanes[1][k]);
    totals.negativeZero |= (lanes[2][k] & 0x80000000u) != 0;
  }
}

// x[0..64)'s members named by mask, at out in index order; returns the end.
// Writes up to 7 values past the end (room the caller provides): eight
// writes whatever the member count up to 8, then eight more up to 16.
inline float* flattenMembers(const float* x, uint64_t mask, float* out) {
  const int count = __builtin_popcountll(mask);
  float* const end = out + count;
  // Bit 63 keeps the index in the block once the members are used up.
  for (int k = 0; k < 8; ++k, mask &= mask - 1) out[k] = x[__builtin_ctzll(mask | (uint64_t(1) << 63))];
  if (count > 8) {
    for (int k = 8; k < 16; ++k, mask &= mask - 1) out[k] = x[__builtin_ctzll(mask | (uint64_t(1) << 63))];
    for (float* o = out + 16; mask; mask &= mask - 1) *o++ = x[__builtin_ctzll(mask)];
  }
  return end;
}

// The last, partial word: nothing past count is read.
inline uint64_t tailWord(const float* x, size_t tail, Totals& totals, float** out) {
  uint64_t mask = 0;
  for (size_t k = 0; k < tail; ++k) {
    const uint32_t bits = ops::floatBits(x[k]);
    mask |= uint64_t((bits & kMagnitude) != 0) << k;
    if (bits == 0x80000000u) totals.negativeZero = true;
  }
  addMembersScalar(x, mask, totals);
  if (*out)
    for (uint64_t m = mask; m; m &= m - 1) *(*out)++ = x[__builtin_ctzll(m)];
  return mask;
}

LocalStats finishStats(const float* x, size_t count, const uint64_t* words, const Totals& totals) {
  LocalStats s;
  s.negativeZero = totals.negativeZero;
  if (totals.maxMagnitude >= kNonfinite) {  // an Inf or NaN: the reference rule, member by member
    const size_t nwords = (count + 63) / 64;
    for (size_t w = 0; w < nwords; ++w) addMemberStats(x + 64 * w, words[w], s);
    return s;
  }
  if (totals.maxMagnitude == 0) return s;
  s.any = true;
  s.top = decompose(ops::bitsFloat(totals.maxMagnitude)).top;
  s.lowest = int(totals.minKey) - 277;
  return s;
}

// The portable scan (and the reference the vector ones are tested against).
LocalStats scanPortable(const float* x, size_t count, uint64_t* words, float* out) {
  Totals totals;
  const size_t full = count / 64;
  for (size_t w = 0; w < full; ++w) {
    const float* block = x + 64 * w;
    uint64_t mask = 0;
    for (int k = 0; k < 64; ++k) {
      const uint32_t bits = ops::floatBits(block[k]);
      mask |= uint64_t((bits & kMagnitude) != 0) << k;
      if (bits == 0x80000000u) totals.negativeZero = true;
    }
    words[w] = mask;
    addMembersScalar(block, mask, totals);
    if (out)
      for (uint64_t m = mask; m; m &= m - 1) *out++ = block[__builtin_ctzll(m)];
  }
  if (count % 64) words[full] = tailWord(x + 64 * full, count % 64, totals, &out);
  return finishStats(x, count, words, totals);
}

#if SHOAL_SKETCH_X86
// The statistics of the values the scan has copied out are taken every this
// many values, while they are still in the L1 cache.
constexpr std::ptrdiff_t kStatsBatch = 2048;

// SSE4.1 (the build's baseline): 4 lanes, 16 vectors a block.
struct Sse41 {
  __m128i maxMag = _mm_setzero_si128(), minKey = _mm_set1_epi32(-1), negZeros = _mm_setzero_si128();

  // Folds values[0..n) (members: every one nonzero) into the statistics.
  void addValues(const float* values, std::ptrdiff_t n, Totals& totals) {
    const __m128i magnitude = _mm_set1_epi32(int(kMagnitude)), implicit = _mm_set1_epi32(0x800000),
                  one = _mm_set1_epi32(1), zero = _mm_setzero_si128();
    std::ptrdiff_t i = 0;
    for (; i + 4 <= n; i += 4) {
      const __m128i t = _mm_and_si128(_mm_loadu_si128(reinterpret_cast<const __m128i*>(values + i)), magnitude);
      maxMag = _mm_max_epu32(maxMag, t);
      const __m128i b = _mm_or_si128(t, implicit);
      const __m128i low = _mm_and_si128(b, _mm_sub_epi32(zero, b));  // 2^ctz(b)
      const __m128i ctz127 = _mm_srli_epi32(_mm_castps_si128(_mm_cvtepi32_ps(low)), 23);
      minKey = _mm_min_epu32(minKey, _mm_add_epi32(_mm_max_epi32(_mm_srli_epi32(t, 23), one), ctz127));
    }
    addValuesScalar(values + i, n - i, totals);
  }

  // One block of 64: returns its word, notes its -0s, appends its members' values at *out.
  uint64_t block(const float* x, float** out) {
    const __m128i magnitude = _mm_set1_epi32(int(kMagnitude)), zero = _mm_setzero_si128();
    __m128i v[16], any = zero;
    for (int k = 0; k < 16; ++k) {
      v[k] = _mm_loadu_si128(reinterpret_cast<const __m128i*>(x + 4 * k));
      any = _mm_or_si128(any, v[k]);
    }
    if (_mm_testz_si128(any, magnitude)) {  // every element +-0: a skip
      negZeros = _mm_or_si128(negZeros, any);
      return 0;
    }
    uint64_t zeroBits = 0;
    for (int k = 0; k < 16; ++k) {
      const __m128i zeros = _mm_cmpeq_epi32(_mm_and_si128(v[k], magnitude), zero);
      zeroBits |= uint64_t(_mm_movemask_ps(_mm_castsi128_ps(zeros))) << (4 * k);
      negZeros = _mm_or_si128(negZeros, _mm_and_si128(v[k], zeros));
    }
    const uint64_t mask = ~zeroBits;
    *out = flattenMembers(x, mask, *out);
    return mask;
  }

  void finish(Totals& totals) const {
    alignas(16) uint32_t lanes[3][4];
    _mm_store_si128(reinterpret_cast<__m128i*>(lanes[0]), maxMag);
    _mm_store_si128(reinterpret_cast<__m128i*>(lanes[1]), minKey);
    _mm_store_si128(reinterpret_cast<__m128i*>(lanes[2]), negZeros);
    foldLanes(lanes, totals);
  }
};

// The scan with the vector steps of Lanes: each block's word and values first, then the
// statistics over the values copied out (members only: no zero lanes to mask
// out, a few percent of the elements at typical densities), batch by batch.
template <class Lanes>
inline LocalStats scanWith(const float* x, size_t count, uint64_t* words, float* out) {
  Lanes lanes;
  Totals totals;
  const size_t full = count / 64;
  float* statsFrom = out;
  for (size_t w = 0; w < full; ++w) {
    words[w] = lanes.block(x + 64 * w, &out);
    if (out - statsFrom >= kStatsBatch) {
      lanes.addValues(statsFrom, out - statsFrom, totals);
      statsFrom = out;
    }
  }
  lanes.addValues(statsFrom, out - statsFrom, totals);
  lanes.finish(totals);
  if (count % 64) words[full] = tailWord(x + 64 * full, count % 64, totals, &out);
  return finishStats(x, count, words, totals);
}

LocalStats scanSse41(const float* x, size_t count, uint64_t* words, float* out) {
  return scanWith<Sse41>(x, count, words, out);
}

#if SHOAL_SKETCH_AVX2
// AVX2: 8 lanes, 8 vectors a block; the same steps (compiled for AVX2 only, called when the CPU has it).
#pragma GCC push_options
#pragma GCC target("avx2")
struct Avx2 {
  __m256i maxMag, minKey, negZeros;
  // Defined here, so compiled for AVX2 (an implicit constructor would be compiled where it is used).
  Avx2() : maxMag(_mm256_setzero_si256()), minKey(_mm256_set1_epi32(-1)), negZeros(_mm256_setzero_si256()) {}

  void addValues(const float* values, std::ptrdiff_t n, Totals& totals) {
    const __m256i magnitude = _mm256_set1_epi32(int(kMagnitude)), implicit = _mm256_set1_epi32(0x800000),
                  one = _mm256_set1_epi32(1), zero = _mm256_setzero_si256();
    std::ptrdiff_t i = 0;
    for (; i + 8 <= n; i += 8) {
      const __m256i t =
          _mm256_and_si256(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(values + i)), magnitude);
      maxMag = _mm256_max_epu32(maxMag, t);
      const __m256i b = _mm256_or_si256(t, implicit);
      const __m256i low = _mm256_and_si256(b, _mm256_sub_epi32(zero, b));  // 2^ctz(b)
      const __m256i ctz127 = _mm256_srli_epi32(_mm256_castps_si256(_mm256_cvtepi32_ps(low)), 23);
      minKey = _mm256_min_epu32(minKey, _mm256_add_epi32(_mm256_max_epi32(_mm256_srli_epi32(t, 23), one), ctz127));
    }
    addValuesScalar(values + i, n - i, totals);
  }

  uint64_t block(const float* x, float** out) {
    const __m256i magnitude = _mm256_set1_epi32(int(kMagnitude)), zero = _mm256_setzero_si256();
    __m256i v[8], any = zero;
    for (int k = 0; k < 8; ++k) {
      v[k] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x + 8 * k));
      any = _mm256_or_si256(any, v[k]);
    }
    if (_mm256_testz_si256(any, magnitude)) {
      negZeros = _mm256_or_si256(negZeros, any);
      return 0;
    }
    uint64_t zeroBits = 0;
    for (int k = 0; k < 8; ++k) {
      const __m256i zeros = _mm256_cmpeq_epi32(_mm256_and_si256(v[k], magnitude), zero);
      zeroBits |= uint64_t(_mm256_movemask_ps(_mm256_castsi256_ps(zeros))) << (8 * k);
      negZeros = _mm256_or_si256(negZeros, _mm256_and_si256(v[k], zeros));
    }
    const uint64_t mask = ~zeroBits;
    *out = flattenMembers(x, mask, *out);
    return mask;
  }

  void finish(Totals& totals) const {
    alignas(32) uint32_t lanes[3][8];
    _mm256_store_si256(reinterpret_cast<__m256i*>(lanes[0]), maxMag);
    _mm256_store_si256(reinterpret_cast<__m256i*>(lanes[1]), minKey);
    _mm256_store_si256(reinterpret_cast<__m256i*>(lanes[2]), negZeros);
    foldLanes(lanes, totals);
  }
};

// flatten: scanWith and the block steps are inlined here, so all of it is compiled for AVX2.
__attribute__((flatten)) LocalStats scanAvx2(const float* x, size_t count, uint64_t* words, float* out) {
  return scanWith<Avx2>(x, count, words, out);
}
#pragma GCC pop_options
#endif

#if SHOAL_SKETCH_AVX512
// AVX-512: 16 lanes, 4 vectors a block. What it adds over AVX2 is the members'
// copy: a lane mask per vector and a compress of the vector's members into one
// register, stored whole (up to 15 floats past the last member: LocalValues'
// room) and the output advanced by their count, instead of a scalar load and
// store per member (flattenMembers). Compress to a register, not to memory:
// the store form is reported slow on AMD's Zen 4 (not measured here).
#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl")
// GCC 12's AVX-512 headers trip -Wmaybe-uninitialized on their own _mm512_undefined operands
// (GCC bug 105593, fixed in 13).
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
struct Avx512 {
  __m512i maxMag, minKey, negZeros;
  Avx512() : maxMag(_mm512_setzero_si512()), minKey(_mm512_set1_epi32(-1)), negZeros(_mm512_setzero_si512()) {}

  void addValues(const float* values, std::ptrdiff_t n, Totals& totals) {
    const __m512i magnitude = _mm512_set1_epi32(int(kMagnitude)), implicit = _mm512_set1_epi32(0x800000),
                  one = _mm512_set1_epi32(1), zero = _mm512_setzero_si512();
    std::ptrdiff_t i = 0;
    for (; i + 16 <= n; i += 16) {
      const __m512i t = _mm512_and_si512(_mm512_loadu_si512(values + i), magnitude);
      maxMag = _mm512_max_epu32(maxMag, t);
      const __m512i b = _mm512_or_si512(t, implicit);
      const __m512i low = _mm512_and_si512(b, _mm512_sub_epi32(zero, b));  // 2^ctz(b)
      const __m512i ctz127 = _mm512_srli_epi32(_mm512_castps_si512(_mm512_cvtepi32_ps(low)), 23);
      minKey = _mm512_min_epu32(minKey, _mm512_add_epi32(_mm512_max_epi32(_mm512_srli_epi32(t, 23), one), ctz127));
    }
    addValuesScalar(values + i, n - i, totals);
  }

  uint64_t block(const float* x, float** out) {
    // The skip test in 256-bit halves, as the AVX2 path's (measured faster there at 0.1%).
    __m256i any256 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x));
    for (int k = 1; k < 8; ++k)
      any256 = _mm256_or_si256(any256, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x + 8 * k)));
    if (_mm256_testz_si256(any256, _mm256_set1_epi32(int(kMagnitude)))) {  // every element +-0: a skip
      negZeros = _mm512_or_si512(negZeros, _mm512_zextsi256_si512(any256));  // upper lanes zero, not undefined
      return 0;
    }
    const __m512i magnitude = _mm512_set1_epi32(int(kMagnitude));
    __m512i v[4];
    for (int k = 0; k < 4; ++k) v[k] = _mm512_loadu_si512(x + 16 * k);
    uint64_t mask = 0;
    float* o = *out;
    for (int k = 0; k < 4; ++k) {
      const __mmask16 members = _mm512_test_epi32_mask(v[k], magnitude);
      negZeros = _mm512_mask_or_epi32(negZeros, __mmask16(~members), negZeros, v[k]);
      _mm512_storeu_ps(o, _mm512_maskz_compress_ps(members, _mm512_castsi512_ps(v[k])));
      o += __builtin_popcount(members);
      mask |= uint64_t(members) << (16 * k);
    }
    *out = o;
    return mask;
  }

  void finish(Totals& totals) const {
    alignas(64) uint32_t lanes[3][16];
    _mm512_store_si512(lanes[0], maxMag);
    _mm512_store_si512(lanes[1], minKey);
    _mm512_store_si512(lanes[2], negZeros);
    foldLanes(lanes, totals);
  }
};

__attribute__((flatten)) LocalStats scanAvx512(const float* x, size_t count, uint64_t* words, float* out) {
  return scanWith<Avx512>(x, count, words, out);
}
#pragma GCC diagnostic pop
#pragma GCC pop_options
#endif
#endif

}  // namespace

const char* scanPathName(ScanPath path) {
  switch (path) {
    case ScanPath::Portable: return "portable";
    case ScanPath::Sse41: return "sse4.1";
    case ScanPath::Avx2: return "avx2";
    case ScanPath::Avx512: return "avx512";
  }
  return "?";
}

bool scanPathAvailable(ScanPath path) {
  switch (path) {
    case ScanPath::Portable: return true;
#if SHOAL_SKETCH_X86
    case ScanPath::Sse41: return true;
#if SHOAL_SKETCH_AVX2
    case ScanPath::Avx2: return __builtin_cpu_supports("avx2");
#endif
#if SHOAL_SKETCH_AVX512
    case ScanPath::Avx512:
      return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
             __builtin_cpu_supports("avx512vl");
#endif
#endif
    default: return false;
  }
}

LocalStats scanIndexWith(ScanPath path, const float* x, size_t count, uint64_t* words, LocalValues* values) {
  // The vector paths take the statistics from the values they copy out, so
  // the values are written even for a caller that does not keep them.
  LocalValues scratch;
  LocalValues& kept = values ? *values : scratch;
  // + room for the vector scans' writes past the last member. Only [0, size) is ever read, and the scan
  // writes all of it: a buffer kept from an earlier call needs no clearing.
  if (kept.capacity < count + LocalValues::kRoom) {
    kept.data.reset();  // the old buffer goes before the new one is made, not beside it
    kept.capacity = 0;  // (consistent should the allocation throw)
    kept.data.reset(new float[count + LocalValues::kRoom]);
    kept.capacity = count + LocalValues::kRoom;
  }
  float* const out = kept.data.get();
  LocalStats s;
  switch (scanPathAvailable(path) ? path : ScanPath::Portable) {
#if SHOAL_SKETCH_X86
    case ScanPath::Sse41: s = scanSse41(x, count, words, out); break;
#if SHOAL_SKETCH_AVX2
    case ScanPath::Avx2: s = scanAvx2(x, count, words, out); break;
#endif
#if SHOAL_SKETCH_AVX512
    case ScanPath::Avx512: s = scanAvx512(x, count, words, out); break;
#endif
#endif
    default: s = scanPortable(x, count, words, out); break;
  }
  // Every member's value was written once, in index order: as many as the bitmap's bits.
  size_t members = 0;
  for (size_t w = 0; w < (count + 63) / 64; ++w) members += size_t(__builtin_popcountll(words[w]));
  kept.size = members;
  return s;
}

LocalStats scanIndex(const float* x, size_t count, uint64_t* words, LocalValues* values) {
  static const ScanPath best = scanPathAvailable(ScanPath::Avx512)  ? ScanPath::Avx512
                               : scanPathAvailable(ScanPath::Avx2)  ? ScanPath::Avx2
                               : scanPathAvailable(ScanPath::Sse41) ? ScanPath::Sse41
                                                                    : ScanPath::Portable;
  return scanIndexWith(best, x, count, words, values);
}

}  // namespace shoal::sketch
