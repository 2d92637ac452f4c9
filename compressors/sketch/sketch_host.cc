// Round 0's scan of the sketch compressor on the CPU (sketch_host.h):
// the index bitmap, this rank's nonzero values in index order and the
// exponent statistics, in one pass that reads the input once.
//
// Why the statistics are not per member: at 10% density the per-member
// decompose and min/max (a branch and a dependency chain per member) cost
// more than reading the input. They are min and max over the members, so
// they can be taken over whole vectors instead, branch-free:
//  - the top bit: top() grows with |x|, so max top = top(max |x|), and |x|'s
//    bits order like |x| (an unsigned max of the bits with the sign cleared;
//    zeros are neutral);
//  - the lowest bit: for a finite nonzero x with magnitude bits t and biased
//    exponent e, lowest = max(e, 1) - 150 + ctz(t | 2^23) (bit 23 stands in
//    for the implicit bit of a normal value and lies above a subnormal's
//    lowest set bit), and 2^ctz(v) = v & -v converts exactly to a float whose
//    exponent field is 127 + ctz. So key = max(e, 1) + 127 + ctz is a few
//    vector operations, zeros are forced to the key's maximum, and lowest =
//    min key - 277;
//  - Inf/NaN (a magnitude >= 0x7f800000) would spoil both: when the maximum
//    says one is present, the statistics are taken again member by member
//    (addMemberStats, the reference rule; rare: Inf/NaN gradients).
// Blocks of 64 elements that are all +-0 (most of a sparse tensor, whole
// rows of an embedding's gradient) are recognised from one OR of the block
// and skipped. The values are copied out with a fixed run of writes per
// word (simdjson's "flatten" loop: no data-dependent loop exit per word; the
// writes past the word's members land in room the next word overwrites).
// Compiled for the build's target (x86-64-v2: SSE4.1) and for AVX2, picked
// at run time by the CPU (scanIndex); every path gives the same words,
// values and statistics (tests/unit/test_sketch_host.cc compares them).
#include "compressors/sketch/sketch_host.h"

#if defined(__x86_64__) && defined(__SSE4_1__)
#include <immintrin.h>
#define SHOAL_SKETCH_X86 1
#if defined(__GNUC__) && !defined(__clang__)
#define SHOAL_SKETCH_AVX2 1  // GCC: a target("avx2") function beside the baseline ones
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
// Blocks with more members than this take the vector statistics; fewer go
// member by member (cheaper for one or two, and the branch is predictable
// at both ends of the density range).
constexpr int kVectorStatsFrom = 3;

// SSE4.1 (the build's baseline): 16 vectors of 4 per block.
LocalStats scanSse41(const float* x, size_t count, uint64_t* words, float* out) {
  const __m128i magnitude = _mm_set1_epi32(int(kMagnitude)), implicit = _mm_set1_epi32(0x800000),
                one = _mm_set1_epi32(1), zero = _mm_setzero_si128();
  __m128i maxMag = zero, minKey = _mm_set1_epi32(-1), negZeros = zero;
  Totals totals;
  const size_t full = count / 64;
  for (size_t w = 0; w < full; ++w) {
    const float* block = x + 64 * w;
    __m128i v[16];
    __m128i any = zero;
    for (int k = 0; k < 16; ++k) {
      v[k] = _mm_loadu_si128(reinterpret_cast<const __m128i*>(block + 4 * k));
      any = _mm_or_si128(any, v[k]);
    }
    if (_mm_testz_si128(any, magnitude)) {  // every element +-0
      negZeros = _mm_or_si128(negZeros, any);
      words[w] = 0;
      continue;
    }
    uint64_t mask = 0;
    __m128i zeros[16];
    for (int k = 0; k < 16; ++k) {
      zeros[k] = _mm_cmpeq_epi32(_mm_and_si128(v[k], magnitude), zero);
      mask |= uint64_t(~_mm_movemask_ps(_mm_castsi128_ps(zeros[k])) & 0xf) << (4 * k);
      negZeros = _mm_or_si128(negZeros, _mm_and_si128(v[k], zeros[k]));
    }
    words[w] = mask;
    if (__builtin_popcountll(mask) < kVectorStatsFrom) {
      addMembersScalar(block, mask, totals);
    } else {
      for (int k = 0; k < 16; ++k) {
        const __m128i t = _mm_and_si128(v[k], magnitude);
        maxMag = _mm_max_epu32(maxMag, t);
        const __m128i b = _mm_or_si128(t, implicit);
        const __m128i low = _mm_and_si128(b, _mm_sub_epi32(zero, b));
        const __m128i ctz127 = _mm_srli_epi32(_mm_castps_si128(_mm_cvtepi32_ps(low)), 23);
        const __m128i key = _mm_add_epi32(_mm_max_epi32(_mm_srli_epi32(t, 23), one), ctz127);
        minKey = _mm_min_epu32(minKey, _mm_or_si128(key, zeros[k]));
      }
    }
    if (out) out = flattenMembers(block, mask, out);
  }
  alignas(16) uint32_t lanes[3][4];
  _mm_store_si128(reinterpret_cast<__m128i*>(lanes[0]), maxMag);
  _mm_store_si128(reinterpret_cast<__m128i*>(lanes[1]), minKey);
  _mm_store_si128(reinterpret_cast<__m128i*>(lanes[2]), negZeros);
  for (int k = 0; k < 4; ++k) {
    totals.maxMagnitude = std::max(totals.maxMagnitude, lanes[0][k]);
    totals.minKey = std::min(totals.minKey, lanes[1][k]);
    totals.negativeZero |= (lanes[2][k] & 0x80000000u) != 0;
  }
  if (count % 64) words[full] = tailWord(x + 64 * full, count % 64, totals, &out);
  return finishStats(x, count, words, totals);
}

#if SHOAL_SKETCH_AVX2
// AVX2: the same steps on 8 vectors of 8 per block.
__attribute__((target("avx2"))) LocalStats scanAvx2(const float* x, size_t count, uint64_t* words, float* out) {
  const __m256i magnitude = _mm256_set1_epi32(int(kMagnitude)), implicit = _mm256_set1_epi32(0x800000),
                one = _mm256_set1_epi32(1), zero = _mm256_setzero_si256();
  __m256i maxMag = zero, minKey = _mm256_set1_epi32(-1), negZeros = zero;
  Totals totals;
  const size_t full = count / 64;
  for (size_t w = 0; w < full; ++w) {
    const float* block = x + 64 * w;
    __m256i v[8];
    __m256i any = zero;
    for (int k = 0; k < 8; ++k) {
      v[k] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(block + 8 * k));
      any = _mm256_or_si256(any, v[k]);
    }
    if (_mm256_testz_si256(any, magnitude)) {  // every element +-0
      negZeros = _mm256_or_si256(negZeros, any);
      words[w] = 0;
      continue;
    }
    uint64_t mask = 0;
    __m256i zeros[8];
    for (int k = 0; k < 8; ++k) {
      zeros[k] = _mm256_cmpeq_epi32(_mm256_and_si256(v[k], magnitude), zero);
      mask |= uint64_t(~_mm256_movemask_ps(_mm256_castsi256_ps(zeros[k])) & 0xff) << (8 * k);
      negZeros = _mm256_or_si256(negZeros, _mm256_and_si256(v[k], zeros[k]));
    }
    words[w] = mask;
    if (__builtin_popcountll(mask) < kVectorStatsFrom) {
      addMembersScalar(block, mask, totals);
    } else {
      for (int k = 0; k < 8; ++k) {
        const __m256i t = _mm256_and_si256(v[k], magnitude);
        maxMag = _mm256_max_epu32(maxMag, t);
        const __m256i b = _mm256_or_si256(t, implicit);
        const __m256i low = _mm256_and_si256(b, _mm256_sub_epi32(zero, b));
        const __m256i ctz127 = _mm256_srli_epi32(_mm256_castps_si256(_mm256_cvtepi32_ps(low)), 23);
        const __m256i key = _mm256_add_epi32(_mm256_max_epi32(_mm256_srli_epi32(t, 23), one), ctz127);
        minKey = _mm256_min_epu32(minKey, _mm256_or_si256(key, zeros[k]));
      }
    }
    if (out) out = flattenMembers(block, mask, out);
  }
  alignas(32) uint32_t lanes[3][8];
  _mm256_store_si256(reinterpret_cast<__m256i*>(lanes[0]), maxMag);
  _mm256_store_si256(reinterpret_cast<__m256i*>(lanes[1]), minKey);
  _mm256_store_si256(reinterpret_cast<__m256i*>(lanes[2]), negZeros);
  for (int k = 0; k < 8; ++k) {
    totals.maxMagnitude = std::max(totals.maxMagnitude, lanes[0][k]);
    totals.minKey = std::min(totals.minKey, lanes[1][k]);
    totals.negativeZero |= (lanes[2][k] & 0x80000000u) != 0;
  }
  if (count % 64) words[full] = tailWord(x + 64 * full, count % 64, totals, &out);
  return finishStats(x, count, words, totals);
}
#endif
#endif

}  // namespace

bool scanPathAvailable(ScanPath path) {
  switch (path) {
    case ScanPath::Portable: return true;
#if SHOAL_SKETCH_X86
    case ScanPath::Sse41: return true;
#if SHOAL_SKETCH_AVX2
    case ScanPath::Avx2: return __builtin_cpu_supports("avx2");
#endif
#endif
    default: return false;
  }
}

ScanPath bestScanPath() {
  static const ScanPath best = scanPathAvailable(ScanPath::Avx2)    ? ScanPath::Avx2
                               : scanPathAvailable(ScanPath::Sse41) ? ScanPath::Sse41
                                                                    : ScanPath::Portable;
  return best;
}

LocalStats scanIndexWith(ScanPath path, const float* x, size_t count, uint64_t* words, LocalValues* values) {
  float* out = nullptr;
  if (values) {
    // Room for the flatten loop's writes past the last member (flattenMembers).
    values->data.reset(new float[count + 8]);
    out = values->data.get();
  }
  LocalStats s;
  switch (scanPathAvailable(path) ? path : ScanPath::Portable) {
#if SHOAL_SKETCH_X86
    case ScanPath::Sse41: s = scanSse41(x, count, words, out); break;
#if SHOAL_SKETCH_AVX2
    case ScanPath::Avx2: s = scanAvx2(x, count, words, out); break;
#endif
#endif
    default: s = scanPortable(x, count, words, out); break;
  }
  if (values) {
    // Every member was written once, in order: the count is the bitmap's.
    size_t members = 0;
    for (size_t w = 0; w < (count + 63) / 64; ++w) members += size_t(__builtin_popcountll(words[w]));
    values->size = members;
  }
  return s;
}

LocalStats scanIndex(const float* x, size_t count, uint64_t* words, LocalValues* values) {
  return scanIndexWith(bestScanPath(), x, count, words, values);
}

}  // namespace shoal::sketch
