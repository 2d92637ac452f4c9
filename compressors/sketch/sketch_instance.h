// What the host (sketch.cc) and device (sketch_device.cc) paths of the sketch
// compressor share: its options, the choice of the values encoding, payload
// set-up. Internal to compressors/sketch.
#pragma once

#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <map>
#include <utility>

#include "compressors/common/payload.h"
#include "shoal/compressor.h"

namespace shoal::compressors::sketch_impl {

enum class Mode { Auto, Compact, Sketch, Dense, None };

struct Instance {
  Mode mode = Mode::Auto;
  double cellsPerItem = 1.3;
  bool bloom = false;
  double expectedDensity = 0.001;
  double ratio = 0;  // > 0: pre-sized sketch in round 0 (host tensors)
  bool floatCells = false;  // cells=f32: 4-byte cells where provably exact (host tensors)
  // exact=0: compact and dense values travel and sum as f32 even where that is not provably exact
  // (compactValuesInF32); the count sketch's cells and ratio='s pre-sized sketch stay exact.
  bool exact = true;
  // chunk=: one host tensor of at least two chunks goes in chunks of this many elements, pipelined
  // (sketch.cc, pipelineRound); 0: in one piece.
  size_t chunk = size_t(1) << 22;
  // scan=: round 0's scan path on the host (sketch_host.h's ScanPath as an int), -1: the best the
  // CPU has. Every path gives the same bits (nothing on the wire changes); one the CPU lacks is refused.
  int scan = -1;
  // ratio mode: the scale (T, Q) agreed by the last operation, per (tensor position, count). Every
  // rank sees the same operations in the same order, so every rank guesses alike; round 0 checks
  // that they did (guess words) and that the values fit, else falls back losslessly.
  std::map<std::pair<int, size_t>, std::pair<int, int>> lastScale;
};

inline int ceilLog2(int n) {
  int c = 0;
  while (c < 31 && (1 << c) < n) ++c;
  return c;
}

// The most limbs a value may need: the f32 range (2^-149 .. 2^128, 277 bits)
// in limbs of L = 63 - ceil(log2 n) >= 32 bits is at most 9; peeling keeps up
// to this many limbs of one member on the stack.
constexpr int kMaxLimbs = 16;

// One tensor's scale as every rank reads it from round 0's statistics (after
// the MAX): whether any rank holds a finite nonzero value or an Inf/NaN, the
// top bit T, the lowest bit Q, the limb width L and the limb count K.
struct Scale {
  bool anyFinite = false, nonfinite = false;
  int T = 0, Q = 0, L = 63, K = 0;
};

// Reads and checks the three statistics words of one tensor
// [top + 200, 200 - lowest, nonfinite]. They come from the peers, so nothing
// is used before it is checked: an honest rank's top and lowest lie in
// [-149, 127] (f32: 2^-149 <= |x| < 2^128) with lowest <= top, both words are
// 0 when no rank holds a finite nonzero value, and nonfinite is 0 or 1. Any
// other word is a corrupted or hostile payload (the same on every rank: the
// MAX result is), refused with why[] saying which word; a K of more than a
// few limbs or an allocation sized by a wild exponent can then not happen.
inline bool readScale(const uint64_t* w, int worldSize, Scale& s, char* why, size_t whySize) {
  s = Scale{};
  s.L = 63 - ceilLog2(worldSize);
  const bool topSet = w[0] != 0, lowestSet = w[1] != 0;
  if (topSet != lowestSet) {
    std::snprintf(why, whySize, "top word %llu and lowest word %llu must both be 0 or both be set",
                  static_cast<unsigned long long>(w[0]), static_cast<unsigned long long>(w[1]));
    return false;
  }
  if (w[2] > 1) {
    std::snprintf(why, whySize, "nonfinite word %llu is not 0 or 1", static_cast<unsigned long long>(w[2]));
    return false;
  }
  s.nonfinite = w[2] != 0;
  if (!topSet) return true;
  if (w[0] < 200 - 149 || w[0] > 200 + 127 || w[1] < 200 - 127 || w[1] > 200 + 149) {
    std::snprintf(why, whySize, "top word %llu or lowest word %llu is outside the f32 range [51, 327] / [73, 349]",
                  static_cast<unsigned long long>(w[0]), static_cast<unsigned long long>(w[1]));
    return false;
  }
  s.anyFinite = true;
  s.T = int(w[0]) - 200;
  s.Q = 200 - int(w[1]);
  if (s.Q > s.T) {
    std::snprintf(why, whySize, "lowest bit 2^%d lies above the top bit 2^%d", s.Q, s.T);
    return false;
  }
  s.K = (s.T - s.Q + 1 + s.L - 1) / s.L;
  return s.K <= kMaxLimbs;  // always (277 bits / 32 <= 9): kept as the peel's stack bound
}

// The host path's round 0 sends its statistics inside the index's OR
// allreduce: one exchange with the peers instead of an OR and a MAX (each
// ~50-200 us on the critical path of a step: docs/training.md). The MAX of a
// statistics word becomes the OR of thermometer codes: a word w in
// [base, base + 319] sets the lowest w - base + 1 bits of five u64 (w = 0
// sets none), and the OR of thermometers is the thermometer of the largest
// word. Top (base 51) and lowest (base 73) travel so; the nonfinite word (0 or
// 1) and ratio mode's guess words (code, ~code: after the OR, w[4] == ~w[3]
// iff every rank guessed alike, as after the MAX) travel as they are. Per
// tensor: statsCodeWords(stride) u64 after every tensor's index words.
// (The CUDA path keeps its separate MAX payload of the plain words.)
constexpr size_t kThermometerWords = 5;  // 320 bits >= the 277 honest values of each word
constexpr uint64_t kTopBase = 200 - 149, kLowestBase = 200 - 127;

inline size_t statsCodeWords(size_t statsStride) { return statsStride + 2 * (kThermometerWords - 1); }

// An honest word is 0 or lies in [base, base + 276] (encodeIndex derives it from f32 bits).
inline void encodeThermometer(uint64_t value, uint64_t base, uint64_t* code) {
  const uint64_t bits = value == 0 ? 0 : value - base + 1;
  for (size_t i = 0; i < kThermometerWords; ++i) {
    const uint64_t below = i * 64;
    code[i] = bits <= below ? 0 : bits - below >= 64 ? ~uint64_t(0) : (uint64_t(1) << (bits - below)) - 1;
  }
}

// The word a thermometer code stands for, or false when the set bits are not
// one run from bit 0 (no OR of honest codes makes that).
inline bool decodeThermometer(const uint64_t* code, uint64_t base, uint64_t& value) {
  uint64_t bits = 0;
  size_t i = 0;
  while (i < kThermometerWords && code[i] == ~uint64_t(0)) bits += 64, ++i;
  if (i < kThermometerWords) {
    const int ones = std::countr_one(code[i]);
    if ((code[i] >> ones) != 0) return false;  // (ones < 64 here)
    bits += uint64_t(ones);
    for (++i; i < kThermometerWords; ++i)
      if (code[i] != 0) return false;
  }
  value = bits == 0 ? 0 : base + bits - 1;
  return true;
}

// One tensor's statistics words (stride of them) into their codes.
inline void encodeStatsCodes(const uint64_t* w, size_t stride, uint64_t* code) {
  encodeThermometer(w[0], kTopBase, code);
  encodeThermometer(w[1], kLowestBase, code + kThermometerWords);
  for (size_t k = 2; k < stride; ++k) code[2 * kThermometerWords + k - 2] = w[k];
}

// The OR-ed codes back into the words readScale checks (the same words the
// MAX of every rank's gave). False, with why[], for a code no OR of honest
// codes makes; the words' ranges are readScale's to check.
inline bool decodeStatsCodes(const uint64_t* code, size_t stride, uint64_t* w, char* why, size_t whySize) {
  const bool topOk = decodeThermometer(code, kTopBase, w[0]);
  if (!topOk || !decodeThermometer(code + kThermometerWords, kLowestBase, w[1])) {
    std::snprintf(why, whySize, "the %s word's code is not a thermometer code (one run of set bits from bit 0)",
                  topOk ? "lowest" : "top");
    return false;
  }
  for (size_t k = 2; k < stride; ++k) w[k] = code[2 * kThermometerWords + k - 2];
  return true;
}

// Cells per part of a sketch sized after the index: cells_per_item per member,
// plus 64 cells: small sketches fail to peel often at 1.3 cells per member
// (a third to a half of the time at 10-300 members; 2% or less with the 64).
inline uint64_t afterIndexPart(double cellsPerItem, size_t u) {
  return uint64_t(std::ceil((cellsPerItem * double(u) + 64.0) / 3.0));
}

// Whether f32 sums of these values are exact in any order: every partial sum
// of any subset of the n ranks is a multiple of 2^Q below 2^(Q+24) and below
// 2^127 in magnitude (span = T - Q + 1 bits; meaningful when anyFinite).
inline bool sumsExactInF32(bool anyFinite, int span, int T, int n) {
  const int c = ceilLog2(n);
  return !anyFinite || (span + c <= 24 && T + c + 1 <= 127);
}

// Two ranks: each member's f32 sum is one IEEE addition a + b, rounded once,
// which is the exact sum rounded once whatever the span (the rule above is
// for any order of many additions), as long as it cannot overflow (|a + b| <
// 2^(T+2) <= 2^127). avg: round(a + b) / 2 is exact there too. So on dense
// gradients two ranks send 4 bytes a member (with the index: ~1.03x dense f32)
// instead of 8 K. For compact values only: a cell adds several members, and
// values=dense copies -0 as it is. Host and device paths alike (same payloads).
inline bool oneAdditionExact(int T, int n) { return n == 2 && T + 2 <= 127; }

// Whether a tensor's compact values travel as f32 (4 bytes a member, summed as
// f32 in the payload's allreduce): where that is exact (the two rules above),
// or anywhere when the user gave exactness up (exact=0: with three or more
// ranks and a wide span the f32 sums then round at each hop, as the plain
// allreduce's do; every rank still gets the same bits, since the payload's
// allreduce gives every rank the same result).
inline bool compactValuesInF32(bool exact, bool anyFinite, int span, int T, int n) {
  return !exact || sumsExactInF32(anyFinite, span, T, n) || oneAdditionExact(T, n);
}

// The values encoding of one tensor once round 0 is known: count elements,
// u members, K limbs, exponent span and top T (meaningful when anyFinite), n
// ranks. Dense only when provably exact (or exact=0) and no rank holds an
// Inf/NaN; compact sends f32 values
// (4 bytes a member) when compactValuesInF32, else K limbs of 8 bytes.
inline Mode chooseMode(Mode requested, bool sketchAllowed, bool exact, size_t count, size_t u, int K, bool anyFinite,
                       bool nonfinite, int span, int T, int n) {
  if (u == 0) return Mode::None;
  // exact=0 sends the dense data where the rule fails too. Never beside an Inf/NaN: those keep their
  // own words and decodeSpecial's rules, so +Inf meeting -Inf is the same NaN on every path and
  // device (an IEEE sum of the dense data gives the FPU's own NaN: 0xffc00000 on x86).
  const bool denseAllowed = !nonfinite && (!exact || sumsExactInF32(anyFinite, span, T, n));
  const double denseBytes = 4.0 * double(count);
  const double compactBytes = (compactValuesInF32(exact, anyFinite, span, T, n) ? 4.0 : 8.0 * K) * double(u) +
                              (nonfinite ? 8.0 * double(u) : 0.0);
  switch (requested) {
    case Mode::Auto: return denseAllowed && denseBytes < compactBytes ? Mode::Dense : Mode::Compact;
    case Mode::Dense: return denseAllowed ? Mode::Dense : Mode::Compact;
    case Mode::Sketch: return K > 0 && sketchAllowed ? Mode::Sketch : Mode::Compact;
    default: return Mode::Compact;
  }
}

#if SHOAL_WITH_CUDA
// The path for CUDA tensors (sketch_device.cc): the same rounds and payloads
// as the host path (bitmap/Bloom index, compact/sketch/dense values, leftover
// round), with payload buffers in device memory on the tensors' device and
// every kernel on the first tensor's stream. ratio= does not apply there (the
// sketch is sized after the index). Round 0's statistics there are a second
// payload (MAX of the plain words), not codes in the index (statsCodeWords):
// not moved for want of a GPU to test it on; a call never mixes the paths.
shoal_status_t deviceStart(const Instance& inst, shoal_compress_op_t* op, void** state);
shoal_status_t deviceRound(const Instance& inst, void* state, shoal_compress_op_t* op, shoal_round_t* round);
void deviceFinish(void* state);
#endif

}  // namespace shoal::compressors::sketch_impl
