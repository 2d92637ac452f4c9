// Host-side pieces of the sketch compressor shared by sketch.cc, its tests and
// its benchmarks: the peeling decoder (queue-driven on the CPU; the two-phase
// round model the GPU runs, for tests), the support enumeration of a bitmap or
// Bloom index, and the Bloom sizing rule. Per-element logic comes from
// sketch_math.h, so CPU and GPU agree cell for cell.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "compressors/sketch/sketch_math.h"

namespace shoal::sketch {

// Peels a summed sketch (K limbs per cell, limb-major: limb k of cell c at
// summed[k * 3 * part + c]) whose members are U (members[0..u), ascending).
// Fills limbs (K per member, limb-major: limbs[k * u + p]) for the recovered
// members and leftover with the positions in U of the others (peeling
// stalled). Returns false only if the certificate fails: when every member is
// recovered, every count and every cell must be exactly zero.
//
// Memory-bound (random cell accesses): each cell's count, XORs and first limb
// share one 32-byte record, so touching a cell costs one cache miss (limbs 1..
// live apart; K = 1 is usual); a pure cell names its member by the XOR of the
// indices hashed there (computed from U, like the counts: never sent).
//
// V = uint64_t: fixed-point limbs (wrapping, exact modulo 2^64). V = float
// (K = 1): f32 cells, exact only when every partial sum is representable
// (sketch.cc proves it before choosing them).
template <class V>
inline bool peelSketch(const uint64_t* members, size_t u, const SketchGeometry& g, int K, const V* summed,
                       std::vector<V>& limbs, std::vector<size_t>& leftover) {
  // A member's upper limbs sit in mine[] below: K comes from checked statistics
  // (sketch_instance.h, readScale), and a K out of range is refused here too.
  constexpr int kMaxK = 16;
  if (K < 1 || K > kMaxK) return false;
  const size_t cells = 3 * g.part;
  struct Cell {
    V limb0;
    uint64_t indexXor;     // XOR of the indices of the cell's members
    uint64_t positionXor;  // XOR of their positions in U
    uint64_t count;        // members of U hashed here
  };
  std::vector<Cell> cell(cells);
  for (size_t c = 0; c < cells; ++c) cell[c] = Cell{summed[c], 0, 0, 0};
  std::vector<V> upper(summed + cells, summed + size_t(K) * cells);  // limbs 1..K-1
  for (size_t p = 0; p < u; ++p) {
    const uint64_t index = members[p];
    for (int j = 0; j < 3; ++j) {
      Cell& c = cell[cellOf(index, g, j)];
      ++c.count;
      c.indexXor ^= index;
      c.positionXor ^= p;
    }
  }
  struct Recovered {
    uint64_t position;
    V limb0;
  };
  std::vector<Recovered> log;  // sequential, scattered to limbs afterwards
  std::vector<V> logUpper;     // (K - 1) limbs per log entry
  log.reserve(u);
  std::vector<uint64_t> queue;
  for (size_t c = 0; c < cells; ++c)
    if (isPure(uint32_t(cell[c].count))) queue.push_back(c);
  V mine[kMaxK];  // K <= 9 for honest payloads: L = 63 - ceil(log2 n) >= 32 for any int world size
  while (!queue.empty()) {
    const uint64_t cc = queue.back();
    queue.pop_back();
    if (!isPure(uint32_t(cell[cc].count))) continue;
    const uint64_t index = cell[cc].indexXor, position = cell[cc].positionXor;
    const V v0 = cell[cc].limb0;
    log.push_back({position, v0});
    for (int k = 1; k < K; ++k) logUpper.push_back(mine[k] = upper[size_t(k - 1) * cells + cc]);
    for (int j = 0; j < 3; ++j) {
      const uint64_t d = cellOf(index, g, j);
      Cell& c = cell[d];
      c.limb0 -= v0;
      for (int k = 1; k < K; ++k) upper[size_t(k - 1) * cells + d] -= mine[k];
      --c.count;
      c.indexXor ^= index;
      c.positionXor ^= position;
      if (isPure(uint32_t(c.count))) queue.push_back(d);
    }
  }
  limbs.assign(size_t(K) * u, V(0));
  std::vector<uint8_t> done(u, 0);
  for (size_t e = 0; e < log.size(); ++e) {
    const size_t p = log[e].position;
    done[p] = 1;
    limbs[p] = log[e].limb0;
    for (int k = 1; k < K; ++k) limbs[size_t(k) * u + p] = logUpper[e * size_t(K - 1) + size_t(k - 1)];
  }
  leftover.clear();
  for (size_t p = 0; p < u; ++p)
    if (!done[p]) leftover.push_back(p);
  if (log.size() == u) {
    for (const Cell& c : cell)
      if (c.count != 0 || c.limb0 != V(0)) return false;
    for (V v : upper)
      if (v != V(0)) return false;
  }
  return true;
}

// The GPU's peel, sequentially: rounds of phase A (every unrecovered member
// with a pure cell takes that cell's limbs) then phase B (each one taken is
// removed from its three cells), until a round recovers nothing. Same outputs
// as peelSketch (the set peeling recovers does not depend on the order, and
// the arithmetic is exact); *certified as peelSketch's result (false only when
// every member peeled and a cell or count is not zero); returns the rounds.
inline int peelTwoPhase(const uint64_t* members, size_t u, const SketchGeometry& g, int K, const uint64_t* summed,
                        std::vector<uint64_t>& limbs, std::vector<size_t>& leftover, bool* certified) {
  const size_t cells = 3 * g.part;
  std::vector<uint64_t> cellValues(summed, summed + size_t(K) * cells);
  std::vector<uint32_t> counts(cells, 0);
  for (size_t p = 0; p < u; ++p)
    for (int j = 0; j < 3; ++j) ++counts[cellOf(members[p], g, j)];
  limbs.assign(size_t(K) * u, 0);
  std::vector<uint8_t> done(u, 0);
  std::vector<size_t> taken;
  std::vector<uint64_t> mine(K);
  int rounds = 0;
  for (;;) {
    taken.clear();
    for (size_t p = 0; p < u; ++p) {  // phase A
      if (done[p]) continue;
      const uint64_t c = pureCellOf(members[p], g, counts.data());
      if (c == ~uint64_t(0)) continue;
      for (int k = 0; k < K; ++k) limbs[size_t(k) * u + p] = cellValues[size_t(k) * cells + c];
      taken.push_back(p);
    }
    if (taken.empty()) break;
    ++rounds;
    for (size_t p : taken) {  // phase B
      done[p] = 1;
      for (int k = 0; k < K; ++k) mine[k] = limbs[size_t(k) * u + p];
      peelApply(members[p], g, mine.data(), K, cellValues.data(), cells, counts.data());
    }
  }
  leftover.clear();
  for (size_t p = 0; p < u; ++p)
    if (!done[p]) leftover.push_back(p);
  bool zero = true;
  if (leftover.empty()) {
    for (uint32_t c : counts) zero = zero && c == 0;
    for (uint64_t v : cellValues) zero = zero && v == 0;
  }
  *certified = zero;
  return rounds;
}

// The members of a bitmap index, ascending.
inline void bitmapMembers(const uint64_t* words, size_t count, std::vector<uint64_t>& members) {
  members.clear();
  for (size_t k = 0; k < (count + 63) / 64; ++k)
    for (uint64_t word = words[k]; word; word &= word - 1) members.push_back(k * 64 + uint64_t(__builtin_ctzll(word)));
}

// The members of a Bloom index over [0, count), ascending (a superset of U).
template <class List>
inline void bloomMembers(const uint64_t* words, size_t count, const BloomGeometry& b, List& members) {
  members.clear();
  for (size_t i = 0; i < count; ++i)
    if (bloomTest(words, i, b)) members.push_back(i);
}

// Bloom sizing from an expected union density d (a fraction of count, agreed
// in advance: an option, so every rank computes the same filter without a
// round trip). Target false-positive rate f = d / 20 per non-member, i.e.
// about 5% extra members: bits per expected member m/|U| = log2(1/f) / ln 2,
// hashes = (m/|U|) ln 2, rounded, 1..16. words = 0 when the filter would not
// be smaller than the bitmap (the caller then uses the bitmap).
inline BloomGeometry bloomGeometry(size_t count, double expectedDensity, uint64_t seed) {
  BloomGeometry b;
  b.seed = seed;
  if (count == 0 || !(expectedDensity > 0.0) || expectedDensity >= 1.0) return b;
  const double f = expectedDensity / 20.0;
  const double bitsPerMember = std::log2(1.0 / f) / std::log(2.0);
  const double expected = std::max(1.0, expectedDensity * double(count));
  const uint64_t words = uint64_t(std::ceil(bitsPerMember * expected / 64.0));
  if (words >= (count + 63) / 64) return b;
  b.words = words;
  b.hashes = int(std::lround(bitsPerMember * std::log(2.0)));
  if (b.hashes < 1) b.hashes = 1;
  if (b.hashes > 16) b.hashes = 16;
  return b;
}

}  // namespace shoal::sketch
