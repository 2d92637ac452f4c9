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
#include <cstdlib>
#include <new>
#include <utility>
#include <vector>

#include <sys/mman.h>

#include "compressors/sketch/sketch_host.h"  // UninitializedAllocator
#include "compressors/sketch/sketch_math.h"

namespace shoal::sketch {

// ---- memory for random cell accesses ----------------------------------------
// An allocator for the peel's cell records: blocks of at least 2 MiB are
// 2 MiB-aligned and advised as huge pages (Linux, transparent huge pages in
// "madvise" mode, the default of Debian and Ubuntu), so that random accesses
// over tens of MiB do not miss the TLB on every 4 KiB page; resize() leaves new
// elements uninitialised (UninitializedAllocator: every record is written
// before it is read).
template <class T>
struct HugePageAllocator : UninitializedAllocator<T> {
  using value_type = T;
  static constexpr size_t kHuge = size_t(2) << 20;
  HugePageAllocator() = default;
  template <class U>
  HugePageAllocator(const HugePageAllocator<U>&) noexcept {}
  template <class U>
  struct rebind {
    using other = HugePageAllocator<U>;
  };
  static size_t roundedBytes(size_t n) { return (n * sizeof(T) + kHuge - 1) / kHuge * kHuge; }
  T* allocate(size_t n) {
    if (n * sizeof(T) < kHuge) return static_cast<T*>(::operator new(n * sizeof(T)));
    void* p = std::aligned_alloc(kHuge, roundedBytes(n));
    if (p == nullptr) throw std::bad_alloc();
#ifdef MADV_HUGEPAGE
    madvise(p, roundedBytes(n), MADV_HUGEPAGE);  // advice only: without it the pages are 4 KiB
#endif
    return static_cast<T*>(p);
  }
  void deallocate(T* p, size_t n) noexcept {
    if (n * sizeof(T) < kHuge)
      ::operator delete(p);
    else
      std::free(p);
  }
  template <class U>
  bool operator==(const HugePageAllocator<U>&) const noexcept {
    return true;
  }
  template <class U>
  bool operator!=(const HugePageAllocator<U>&) const noexcept {
    return false;
  }
};

// Calls touch(c) on the three cells c of member p + kMemberCellsAhead, then
// visit(p, index, cells) with member p's own three cells, for p = 0 .. u-1 in
// order. Members of one block share three rows, but the next block's rows are
// unrelated: in order, the loop waits for one cache miss after another; with
// touch a prefetch, the cells of 16 members (48 lines) are on their way at once
// (BM_PeelDecode in bench/kernels/sketch_kernels_bench.cc measures the peel
// built on it: docs/benchmarks.md, "The count sketch's peel").
constexpr size_t kMemberCellsAhead = 16;
template <class Touch, class Visit>
inline void forEachMemberCells(const uint64_t* members, size_t u, const SketchGeometry& g, Touch touch,
                               Visit visit) {
  constexpr size_t kRing = 32;  // > kMemberCellsAhead, a power of two
  static_assert(kRing > kMemberCellsAhead && (kRing & (kRing - 1)) == 0, "ring");
  uint64_t ring[kRing][3];
  CellHasher hasher(g);
  const auto compute = [&](size_t q) {
    hasher.cells(members[q], ring[q % kRing]);
    for (int j = 0; j < 3; ++j) touch(ring[q % kRing][j]);
  };
  for (size_t q = 0; q < std::min(u, kMemberCellsAhead); ++q) compute(q);
  for (size_t p = 0; p < u; ++p) {
    if (p + kMemberCellsAhead < u) compute(p + kMemberCellsAhead);
    visit(p, members[p], ring[p % kRing]);
  }
}

// One cell of the peel: its first limb, its count of members and the XOR of
// their positions in U share one record (16 bytes with 32-bit counts and
// positions, for tables below 2^32 cells), so touching a cell costs one cache miss (limbs 1..
// live apart; K = 1 is usual). A pure cell names its member by that position,
// and the member's three cells are kept from the count pass (no second hashing).
template <class V, class P>
struct PeelCell {
  V limb0;
  P count;        // members of U hashed here
  P positionXor;  // XOR of their positions in U
};

// The peel's working memory, kept by the caller across calls (sketch.cc keeps
// it in the operation's state, given back at finish): a table of tens of MiB
// allocated afresh each call costs its page faults every time.
template <class V>
struct PeelScratch {
  template <class P>
  using Cells = std::vector<PeelCell<V, P>, HugePageAllocator<PeelCell<V, P>>>;
  Cells<uint32_t> cells;      // tables of fewer than 2^32 cells (so |U| < 2^32 too)
  Cells<uint64_t> cellsWide;  // larger ones
  // Each member's three cells, from the count pass (narrow tables, then wide ones), and the stack
  // of pure cells: written before they are read, so resize() leaves them uninitialised.
  std::vector<uint32_t, UninitializedAllocator<uint32_t>> memberCells;
  std::vector<uint64_t, UninitializedAllocator<uint64_t>> memberCellsWide;
  std::vector<V> upper;       // limbs 1..K-1 of every cell
  std::vector<uint64_t, UninitializedAllocator<uint64_t>> queue;
  std::vector<uint8_t> done;
  Cells<uint32_t>& table(uint32_t) { return cells; }
  Cells<uint64_t>& table(uint64_t) { return cellsWide; }
  auto& cellsOfMembers(uint32_t) { return memberCells; }
  auto& cellsOfMembers(uint64_t) { return memberCellsWide; }
  // The sum of bytes(buffer) over the buffers (bytes: their capacity or their size in bytes).
  template <class Bytes>
  size_t bytes(Bytes b) const {
    return b(cells) + b(cellsWide) + b(memberCells) + b(memberCellsWide) + b(upper) + b(queue) + b(done);
  }
  size_t capacityBytes() const {
    return bytes([](const auto& v) { return v.capacity() * sizeof(v[0]); });
  }
  void clear() {  // capacity kept
    cells.clear();
    cellsWide.clear();
    memberCells.clear();
    memberCellsWide.clear();
    upper.clear();
    queue.clear();
    done.clear();
  }
};

// Peels a summed sketch (K limbs per cell, limb-major: limb k of cell c at
// summed[k * 3 * part + c]) whose members are U (members[0..u), ascending).
// Fills limbs (K per member, limb-major: limbs[k * u + p]) for the recovered
// members and leftover with the positions in U of the others (peeling
// stalled). Returns false only if the certificate fails: when every member is
// recovered, every count and every cell must be exactly zero.
//
// Memory-bound (random cell accesses); the counts and positions come from U
// (never sent), in one pass over U with its cells prefetched ahead
// (forEachMemberCells), which also keeps each member's three cell numbers. The
// peel takes pure cells off the stack in batches of kPeelBatch, prefetching in
// three steps (each cell's record, then its member's cell numbers, then those
// cells) before removing the members one by one (a cell that stopped being
// pure meanwhile is skipped): which members peel does not depend on the
// order, and the arithmetic is exact, so the results are those of the one-at-
// a-time peel, with up to 3 * kPeelBatch misses in flight instead of one.
//
// V = uint64_t: fixed-point limbs (wrapping, exact modulo 2^64). V = float
// (K = 1): f32 cells, exact only when every partial sum is representable
// (sketch.cc proves it before choosing them).
constexpr int kPeelBatch = 16;
template <class V, class P>
inline bool peelWith(const uint64_t* members, size_t u, const SketchGeometry& g, int K, const V* summed,
                     std::vector<V>& limbs, std::vector<size_t>& leftover, PeelScratch<V>& scratch) {
  // A member's upper limbs sit in mine[] below: K comes from checked statistics
  // (sketch_instance.h, readScale), and a K out of range is refused here too.
  constexpr int kMaxK = 16;
  if (K < 1 || K > kMaxK) return false;
  const size_t cells = 3 * g.part;
  const auto pure = [](P count) { return isPure(uint32_t(std::min<P>(count, 2))); };  // exact for wide counts too
  auto& cell = scratch.table(P(0));
  cell.resize(cells);
  for (size_t c = 0; c < cells; ++c) cell[c] = PeelCell<V, P>{summed[c], 0, 0};
  auto& upper = scratch.upper;
  upper.assign(summed + cells, summed + size_t(K) * cells);  // limbs 1..K-1
  auto& memberCells = scratch.cellsOfMembers(P(0));  // kept for the peel: no second hashing
  memberCells.resize(3 * u);
  P* const cellsOf = memberCells.data();
  forEachMemberCells(
      members, u, g, [&](uint64_t c) { __builtin_prefetch(&cell[c], 1); },
      [&](size_t p, uint64_t, const uint64_t* where) {
        for (int j = 0; j < 3; ++j) {
          PeelCell<V, P>& c = cell[where[j]];
          ++c.count;
          c.positionXor ^= P(p);
          cellsOf[3 * p + size_t(j)] = P(where[j]);
        }
      });
  limbs.assign(size_t(K) * u, V(0));
  auto& done = scratch.done;
  done.assign(u, 0);
  size_t recovered = 0;
  // The stack of pure cells: a cell enters it once at most (pure at the start, or when its count
  // falls to 1; counts only fall), so `cells` entries always hold it. Pushes are branch-free (the
  // pure test is a coin toss to the branch predictor): every visited cell is written at top, one
  // past the stack, and kept by moving top; one entry more keeps that write inside.
  auto& queue = scratch.queue;
  queue.resize(cells + 1);
  uint64_t* const stack = queue.data();
  size_t top = 0;
  for (size_t c = 0; c < cells; ++c) {
    stack[top] = c;
    top += pure(cell[c].count);
  }
  V mine[kMaxK];  // K <= 9 for honest payloads: L = 63 - ceil(log2 n) >= 32 for any int world size
  uint64_t batch[kPeelBatch];
  while (top > 0) {
    int taken = 0;
    for (; taken < kPeelBatch && top > 0; ++taken) {
      batch[taken] = stack[--top];
      __builtin_prefetch(&cell[batch[taken]]);
    }
    for (int b = 0; b < taken; ++b)  // the member as the cell reads now (a cell emptied since: member 0)
      __builtin_prefetch(cellsOf + 3 * size_t(cell[batch[b]].positionXor));
    for (int b = 0; b < taken; ++b) {
      const P* where = cellsOf + 3 * size_t(cell[batch[b]].positionXor);
      for (int j = 0; j < 3; ++j) __builtin_prefetch(&cell[where[j]], 1);
    }
    for (int b = 0; b < taken; ++b) {
      const uint64_t cc = batch[b];
      if (!pure(cell[cc].count)) continue;  // emptied by an earlier member of the batch
      const uint64_t position = cell[cc].positionXor;
      const P* where = cellsOf + 3 * position;
      const V v0 = cell[cc].limb0;
      limbs[position] = v0;
      for (int k = 1; k < K; ++k) limbs[size_t(k) * u + position] = mine[k] = upper[size_t(k - 1) * cells + cc];
      done[position] = 1;
      ++recovered;
      for (int j = 0; j < 3; ++j) {
        const uint64_t d = where[j];
        PeelCell<V, P>& c = cell[d];
        c.limb0 -= v0;
        for (int k = 1; k < K; ++k) upper[size_t(k - 1) * cells + d] -= mine[k];
        --c.count;
        c.positionXor ^= P(position);
        stack[top] = d;
        top += pure(c.count);
      }
    }
  }
  leftover.clear();
  for (size_t p = 0; p < u; ++p)
    if (!done[p]) leftover.push_back(p);
  if (recovered == u) {
    for (size_t c = 0; c < cells; ++c)
      if (cell[c].count != 0 || cell[c].limb0 != V(0)) return false;
    for (V v : upper)
      if (v != V(0)) return false;
  }
  return true;
}

template <class V>
inline bool peelSketch(const uint64_t* members, size_t u, const SketchGeometry& g, int K, const V* summed,
                       std::vector<V>& limbs, std::vector<size_t>& leftover, PeelScratch<V>& scratch) {
  return 3 * g.part < (uint64_t(1) << 32) ? peelWith<V, uint32_t>(members, u, g, K, summed, limbs, leftover, scratch)
                                         : peelWith<V, uint64_t>(members, u, g, K, summed, limbs, leftover, scratch);
}

// The same with working memory of its own (tests, one-off callers).
template <class V>
inline bool peelSketch(const uint64_t* members, size_t u, const SketchGeometry& g, int K, const V* summed,
                       std::vector<V>& limbs, std::vector<size_t>& leftover) {
  PeelScratch<V> scratch;
  return peelSketch(members, u, g, K, summed, limbs, leftover, scratch);
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
