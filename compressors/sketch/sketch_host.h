// The sketch compressor's dense host passes, written for the CPU's vector
// units: the round-0 scan (index bitmap + exponent statistics, in
// sketch_host.cc), the member list and the output write. Host only (the CUDA
// kernels have their own, sketch.cu); per-element rules come from
// sketch_math.h so both sides agree bit for bit.
//
// Why a separate pass shape: the per-element loop (test, set a bit, decompose,
// min/max) ran at a quarter of memcpy's speed, branch- and latency-bound. The
// scan builds each 64-bit bitmap word from vector compares and takes the
// statistics as vector min/max, so it runs at about the speed of reading the
// input once; the lists of a word's members are written by fixed runs of
// stores rather than a loop whose exit depends on the data.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <new>
#include <utility>
#include <vector>

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

#include "compressors/sketch/sketch_math.h"

namespace shoal::sketch {

// An allocator whose resize() leaves new elements uninitialised: for buffers
// that are written in full right after (the member list, the f32 payload),
// which std::allocator would zero first, a pass over them for nothing.
template <class T>
struct UninitializedAllocator : std::allocator<T> {
  template <class U>
  struct rebind {
    using other = UninitializedAllocator<U>;
  };
  UninitializedAllocator() = default;
  template <class U>
  UninitializedAllocator(const UninitializedAllocator<U>&) noexcept {}
  template <class U>
  void construct(U* p) noexcept {
    ::new (static_cast<void*>(p)) U;
  }
  template <class U, class... Args>
  void construct(U* p, Args&&... args) {
    ::new (static_cast<void*>(p)) U(std::forward<Args>(args)...);
  }
};

// The union's members, ascending (bitmapMembersFast writes every entry).
using MemberList = std::vector<uint64_t, UninitializedAllocator<uint64_t>>;

// This rank's round-0 statistics of one tensor: any finite nonzero value, the
// highest (top) and lowest set bit positions over those, any Inf/NaN.
struct LocalStats {
  bool any = false, nonfinite = false;
  bool negativeZero = false;  // some element is -0 (scanIndex only): the in-place output must rewrite zeros
  int top = -1000, lowest = 1000;
};

// Folds one member's value into the statistics.
inline void addMemberStat(float v, LocalStats& s) {
  if (!isFinite(v)) {
    s.nonfinite = true;
    return;
  }
  const FloatParts p = decompose(v);
  s.any = true;
  s.top = std::max(s.top, p.top);
  s.lowest = std::min(s.lowest, p.lowest);
}

// Folds the members named by `mask` (bits of x[0..64)) into the statistics.
inline void addMemberStats(const float* x, uint64_t mask, LocalStats& s) {
  for (; mask; mask &= mask - 1) addMemberStat(x[__builtin_ctzll(mask)], s);
}

// Whether a finished call's buffers (bytes of capacity) are worth keeping for
// the next call (sketch.cc, giveBack): yes while they are at most twice the
// largest need of the last kWindow calls plus kSlack, so a step's mix of large
// and small calls keeps the large state, and one huge call's memory goes back
// after kWindow smaller ones. Not thread-safe: the caller holds its lock.
class SpareBudget {
 public:
  static constexpr int kWindow = 16;
  static constexpr size_t kSlack = size_t(4) << 20;  // a few MiB are not worth giving back

  // One finished call that needed `need` bytes and leaves `kept` bytes of capacity.
  bool keep(size_t need, size_t kept) {
    if (need >= recentNeed_ || ++callsSinceNeed_ > kWindow) {
      recentNeed_ = need;
      callsSinceNeed_ = 0;
    }
    return kept <= 2 * recentNeed_ + kSlack;
  }

 private:
  size_t recentNeed_ = 0;   // the largest need of the calls since it was set
  int callsSinceNeed_ = 0;  // ... and how many calls ago that was
};

// Room for a tensor's nonzero values, allocated but not initialised (the
// pages a sparse tensor never reaches are never touched). Kept across calls
// (sketch.cc keeps a finished operation's buffers): the scan allocates again
// only when capacity is short of the tensor's count + kRoom (the vector
// scans write whole vectors, up to 15 floats past the last member).
struct LocalValues {
  static constexpr size_t kRoom = 16;
  std::unique_ptr<float[]> data;
  size_t size = 0;      // values the last scan wrote
  size_t capacity = 0;  // floats data holds
};

// Round 0 over one tensor (sketch_host.cc): words[(count + 63) / 64] = the
// bitmap of x's nonzeros (every word written, bits past count clear), and
// the statistics. With values: this rank's nonzero values too, in index
// order, so that the values round reads them sequentially (memberValues)
// instead of gathering x at the union's members, a cache miss each once the
// tensor outgrows the caches. Vectorised for the CPU it runs on.
LocalStats scanIndex(const float* x, size_t count, uint64_t* words, LocalValues* values);

// The scan's implementations: the same words, values and statistics from each
// (tests run every one the CPU has).
enum class ScanPath { Portable, Sse41, Avx2, Avx512 };
constexpr ScanPath kScanPaths[] = {ScanPath::Portable, ScanPath::Sse41, ScanPath::Avx2, ScanPath::Avx512};
// The path's name in the option scan= ("portable", "sse4.1", "avx2", "avx512").
const char* scanPathName(ScanPath path);
bool scanPathAvailable(ScanPath path);
LocalStats scanIndexWith(ScanPath path, const float* x, size_t count, uint64_t* words, LocalValues* values);

// This rank's value at every member of the union (U, from unionWords), in U's
// order, into out[0..|U|): localValues[q] is the value of the q-th set bit of
// localWords (scanIndex), members outside this rank's support get +0. Returns
// false when the union lacks one of this rank's own members: an OR that
// includes this rank cannot, so the union payload was corrupted (its value
// would silently vanish; the caller refuses the payload).
inline bool memberValues(const uint64_t* unionWords, const uint64_t* localWords, size_t nwords,
                         const float* localValues, size_t localCount, float* out) {
  size_t q = 0, p = 0;
  // Words whose members are all this rank's are a straight copy, and along a
  // run of them p - q stays fixed: out[from, p) = localValues[q - (p - from), q)
  // goes as one memcpy when the run ends.
  size_t from = 0;
  auto copyRun = [&] {
    if (p > from) std::memcpy(out + from, localValues + (q - (p - from)), (p - from) * sizeof(float));
  };
  for (size_t k = 0; k < nwords; ++k) {
    const uint64_t all = unionWords[k], mine = localWords[k];
    if (mine & ~all) return false;
    const size_t m = size_t(__builtin_popcountll(mine));
    if (q + m > localCount) return false;
    if (mine == all) {
      p += m;
      q += m;
      continue;
    }
    copyRun();
    for (uint64_t word = all; word; word &= word - 1) {
      const uint64_t bit = word & (0 - word);
      out[p++] = (mine & bit) ? localValues[q + size_t(__builtin_popcountll(mine & (bit - 1)))] : 0.0f;
    }
    q += m;
    from = p;
  }
  copyRun();
  return true;
}

// The members of a bitmap index, ascending: counted first (popcount), so the
// list is written once without regrowth. Each word's positions go out in
// fixed runs of eight stores (as the scan's values, sketch_host.cc: no loop
// exit that depends on the word), the stores past the word's members into the
// next word's place or the 8 spare entries at the end.
template <class List>
inline void bitmapMembersFast(const uint64_t* words, size_t count, List& members) {
  const size_t nwords = (count + 63) / 64;
  size_t total = 0;
  for (size_t k = 0; k < nwords; ++k) total += size_t(__builtin_popcountll(words[k]));
  members.resize(total + 8);
  uint64_t* out = members.data();
  constexpr uint64_t kStop = uint64_t(1) << 63;  // keeps ctz defined once the word's members are used up
  for (size_t k = 0; k < nwords; ++k) {
    uint64_t word = words[k];
    if (word == 0) continue;
    const uint64_t base = k * 64;
    const int n = __builtin_popcountll(word);
    uint64_t* const end = out + n;
    for (int e = 0; e < 8; ++e, word &= word - 1) out[e] = base + uint64_t(__builtin_ctzll(word | kStop));
    if (n > 8) {
      for (int e = 8; e < 16; ++e, word &= word - 1) out[e] = base + uint64_t(__builtin_ctzll(word | kStop));
      for (uint64_t* o = out + 16; word; word &= word - 1) *o++ = base + uint64_t(__builtin_ctzll(word));
    }
    out = end;
  }
  members.resize(total);
}

// How writeMembers stores the dense output. Plain: 4 KiB at a time, zeroed
// then the block's members written into lines still in L1; the output stays
// in cache for the caller, who reads it next (the optimizer). Streaming: 64
// floats at a time built in a local block and written with streaming stores,
// which skip the read a plain store of a line not in cache makes first.
enum class OutputStores { Plain, Streaming };

// Streaming only pays where nearly every 64-float block holds no member (under
// 1 member in 256 elements: the write is mostly zeros, to lines a plain store
// would read first) in an output that is not tiny. Measured on this project's
// VM (AMD EPYC, 32 MiB L3; docs/benchmarks.md, "The sketch's output write"):
// streaming stores were 2.4-5.4x slower than plain ones at 10% density (4-256
// MiB) and 2.8x at 1% up to 16 MiB (near even at 64 MiB, 1.3x slower at 256);
// at 0.1% streaming made the compressor's whole call faster.
constexpr size_t kStreamingMinBytes = size_t(256) << 10;
inline OutputStores outputStoresFor(size_t count, size_t u) {
  return count * sizeof(float) >= kStreamingMinBytes && u < count / 256 ? OutputStores::Streaming
                                                                         : OutputStores::Plain;
}

// The dense output of a compact or sketch tensor: +0 off U, result[p] at
// members[p], in one pass (not a memset of the whole tensor followed by a
// scatter that misses the cache again).
inline void writeMembersWith(OutputStores stores, float* out, size_t count, const uint64_t* members,
                             const float* result, size_t u) {
  size_t p = 0;
  size_t base = 0;
#if defined(__SSE2__)
  if (stores == OutputStores::Streaming && reinterpret_cast<uintptr_t>(out) % 16 == 0) {
    alignas(16) float block[64];
    const __m128 zero = _mm_setzero_ps();
    for (; base + 64 <= count; base += 64) {
      if (p < u && members[p] < base + 64) {
        for (int k = 0; k < 64; k += 4) _mm_store_ps(block + k, zero);
        for (; p < u && members[p] < base + 64; ++p) block[members[p] - base] = result[p];
        for (int k = 0; k < 64; k += 4) _mm_stream_ps(out + base + k, _mm_load_ps(block + k));
      } else {
        for (int k = 0; k < 64; k += 4) _mm_stream_ps(out + base + k, zero);
      }
    }
    _mm_sfence();  // streaming stores are weakly ordered: visible before the caller reads out
  }
#endif
  constexpr size_t kBlock = 1024;  // 4 KiB: zeroed, then its members land in L1
  if (stores == OutputStores::Plain) {
    for (; base + kBlock <= count; base += kBlock) {
      std::memset(out + base, 0, kBlock * sizeof(float));
      for (; p < u && members[p] < base + kBlock; ++p) out[members[p]] = result[p];
    }
  }
  if (base < count) std::memset(out + base, 0, (count - base) * sizeof(float));
  for (; p < u; ++p) out[members[p]] = result[p];
}

inline void writeMembers(float* out, size_t count, const uint64_t* members, const float* result, size_t u) {
  writeMembersWith(outputStoresFor(count, u), out, count, members, result, u);
}

}  // namespace shoal::sketch
