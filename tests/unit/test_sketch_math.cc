// The per-element and per-cell logic of the sketch compressor
// (compressors/sketch/sketch_math.h, sketch_peel.h), which the CPU path runs
// and the CUDA kernels share: the lane-rotated geometry, its peeling where the
// seed paper's block-shared hashing fails, the queue peel against the
// two-phase rounds the GPU runs, and the Bloom index.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <set>
#include <vector>

#include "compressors/sketch/sketch_math.h"
#include "compressors/sketch/sketch_instance.h"
#include "compressors/sketch/sketch_peel.h"

namespace {

using namespace shoal::sketch;

uint64_t rnd(uint64_t x) { return mix64(x + 0x9e3779b97f4a7c15ull); }

// Members: each coordinate of [0, count) with probability density.
std::vector<uint64_t> randomSupport(uint64_t seed, size_t count, double density) {
  std::vector<uint64_t> members;
  const uint64_t threshold = density >= 1.0 ? ~uint64_t(0) : uint64_t(density * 18446744073709551616.0);
  for (size_t i = 0; i < count; ++i)
    if (density >= 1.0 || rnd(seed * 1000003 + i) < threshold) members.push_back(i);
  return members;
}

// A summed one-limb sketch of the members with values 1 + position (any
// nonzero values do: peeling sees only counts).
std::vector<uint64_t> scatter(const std::vector<uint64_t>& members, const SketchGeometry& g, int K,
                              uint64_t (*cell)(uint64_t, const SketchGeometry&, int)) {
  const size_t cells = 3 * g.part;
  std::vector<uint64_t> summed(size_t(K) * cells, 0);
  for (size_t p = 0; p < members.size(); ++p)
    for (int j = 0; j < 3; ++j)
      for (int k = 0; k < K; ++k) summed[size_t(k) * cells + cell(members[p], g, j)] += rnd(p * 7 + uint64_t(k)) | 1;
  return summed;
}

uint64_t laneRotated(uint64_t i, const SketchGeometry& g, int j) { return cellOf(i, g, j); }

// The seed paper's layout (research/sketch.md §1): every lane of a block uses
// the block's three rows, no rotation. Here only to show what it costs.
uint64_t blockShared(uint64_t i, const SketchGeometry& g, int j) {
  const uint64_t block = i >> g.widthLog2, lane = i & ((uint64_t(1) << g.widthLog2) - 1);
  const uint64_t h = mix64(block * 0x9e3779b97f4a7c15ull + mix64(g.seed + 0x632be59bd9b4e019ull * uint64_t(j + 1)));
  const uint64_t row = static_cast<uint64_t>((static_cast<unsigned __int128>(h) * g.rows) >> 64);
  return uint64_t(j) * g.part + (row << g.widthLog2) + lane;
}

// Peels with the production peel, but over any cell function (re-implemented
// minimal: counts, then repeatedly strip pure cells; returns the unrecovered).
size_t unrecovered(const std::vector<uint64_t>& members, const SketchGeometry& g,
                   uint64_t (*cell)(uint64_t, const SketchGeometry&, int)) {
  std::vector<uint32_t> counts(3 * g.part, 0);
  for (uint64_t i : members)
    for (int j = 0; j < 3; ++j) ++counts[cell(i, g, j)];
  std::vector<uint8_t> done(members.size(), 0);
  size_t left = members.size();
  for (bool progress = true; progress;) {
    progress = false;
    for (size_t p = 0; p < members.size(); ++p) {
      if (done[p]) continue;
      bool pure = false;
      for (int j = 0; j < 3; ++j) pure = pure || isPure(counts[cell(members[p], g, j)]);
      if (!pure) continue;
      done[p] = 1;
      --left;
      progress = true;
      for (int j = 0; j < 3; ++j) --counts[cell(members[p], g, j)];
    }
  }
  return left;
}

TEST(SketchGeometry, SizesAndCellRanges) {
  for (uint64_t target : {uint64_t(0), uint64_t(1), uint64_t(7), uint64_t(8), uint64_t(17), uint64_t(100),
                          uint64_t(8191), uint64_t(8192), uint64_t(100000), uint64_t(12345677)}) {
    SketchGeometry g = sketchGeometry(target, 42);
    ASSERT_GE(g.part, std::max<uint64_t>(target, 1));
    ASSERT_LE(g.widthLog2, 10);
    ASSERT_EQ(g.part, g.rows << g.widthLog2);
    if (g.widthLog2 > 0) ASSERT_GE(g.rows, 256u) << target;
    ASSERT_LT(double(g.part), double(std::max<uint64_t>(target, 1)) * (1 + 1.0 / 256) + 1) << target;
    for (uint64_t i = 0; i < 5000; ++i) {
      uint64_t index = rnd(i) % (uint64_t(1) << 40);
      for (int j = 0; j < 3; ++j) {
        uint64_t c = cellOf(index, g, j);
        ASSERT_GE(c, uint64_t(j) * g.part);
        ASSERT_LT(c, uint64_t(j + 1) * g.part);
      }
    }
  }
}

TEST(SketchGeometry, CellHasherAndCellOfKeepTheWireFormula) {
  // Every rank (CPU and GPU) must put an element in the same cells: the loops' CellHasher (salts
  // once, a block's hashes kept) and cellOf against the formula written out, on ascending runs that
  // stay in a block and cross blocks, and on random indices.
  const auto formula = [](uint64_t index, const SketchGeometry& g, int j) {
    const uint64_t block = index >> g.widthLog2, mask = (uint64_t(1) << g.widthLog2) - 1;
    const uint64_t h = mix64(block * 0x9e3779b97f4a7c15ull + mix64(g.seed + 0x632be59bd9b4e019ull * uint64_t(j + 1)));
    return uint64_t(j) * g.part + (mulhi64(h, g.rows) << g.widthLog2) + (((index & mask) + h) & mask);
  };
  for (uint64_t target : {uint64_t(1), uint64_t(300), uint64_t(18000), uint64_t(181000), uint64_t(12345677)}) {
    const SketchGeometry g = sketchGeometry(target, rnd(target));
    CellHasher hasher(g);
    std::vector<uint64_t> indices;
    for (uint64_t i = 0; i < 3000; ++i) indices.push_back(i * 3);                     // runs within blocks
    for (uint64_t i = 0; i < 2000; ++i) indices.push_back(rnd(i) % (uint64_t(1) << 40));  // jumps
    for (uint64_t index : indices) {
      uint64_t cells[3];
      hasher.cells(index, cells);
      for (int j = 0; j < 3; ++j) {
        ASSERT_EQ(cells[j], formula(index, g, j)) << index << " " << j;
        ASSERT_EQ(cellOf(index, g, j), cells[j]);
      }
    }
  }
}

TEST(SketchGeometry, LanesOfABlockHitDistinctNeighbouringCells) {
  SketchGeometry g = sketchGeometry(1 << 20, 7);
  ASSERT_EQ(g.widthLog2, 10);
  const uint64_t width = uint64_t(1) << g.widthLog2;
  for (uint64_t block : {uint64_t(0), uint64_t(3), uint64_t(999999)}) {
    for (int j = 0; j < 3; ++j) {
      std::set<uint64_t> cells, rows;
      for (uint64_t t = 0; t < width; ++t) {
        uint64_t c = cellOf(block * width + t, g, j);
        cells.insert(c);
        rows.insert((c - uint64_t(j) * g.part) >> g.widthLog2);
      }
      EXPECT_EQ(cells.size(), width) << "a block's lanes collide";
      EXPECT_EQ(rows.size(), 1u) << "a block's lanes leave their row";
    }
  }
}

TEST(SketchGeometry, LaneRotationPeelsWhereBlockSharedRowsFail) {
  // research/sketch.md §2: 1024 blocks x 1024 lanes, 5% density, 2 cells per
  // member: block-shared rows left ~2e-3 of the members unrecovered. That
  // geometry (1024 lanes, ~35 rows a part; sketchGeometry would pick more
  // rows), the same members, with and without the rotation.
  const size_t count = size_t(1) << 20;
  int sharedFailures = 0;
  for (uint64_t seed = 1; seed <= 4; ++seed) {
    std::vector<uint64_t> members = randomSupport(seed, count, 0.05);
    SketchGeometry g;
    g.widthLog2 = 10;
    g.rows = (2 * members.size() / 3 + 1023) / 1024;
    g.part = g.rows << 10;
    g.seed = rnd(seed);
    const size_t shared = unrecovered(members, g, blockShared);
    const size_t rotated = unrecovered(members, g, laneRotated);
    EXPECT_EQ(rotated, 0u) << "seed " << seed << ": lane-rotated hashing left members with 2 cells each";
    sharedFailures += shared > 0;
    // Production peel agrees on the rotated layout and certifies.
    std::vector<uint64_t> summed = scatter(members, g, 1, laneRotated), limbs;
    std::vector<size_t> leftover;
    ASSERT_TRUE(peelSketch(members.data(), members.size(), g, 1, summed.data(), limbs, leftover));
    EXPECT_TRUE(leftover.empty());
  }
  EXPECT_EQ(sharedFailures, 4) << "block-shared rows were expected to leave members unrecovered";
}

TEST(SketchGeometry, LaneRotationPeelsJustAboveTheThreshold) {
  // 1.3 cells per member (the default), several sizes and densities: full recovery.
  for (size_t count : {size_t(3000), size_t(20011), size_t(100003), size_t(1) << 20, size_t(1) << 22}) {
    for (double density : {0.001, 0.01, 0.1, 0.5, 1.0}) {
      std::vector<uint64_t> members = randomSupport(count + uint64_t(density * 1000), count, density);
      if (members.size() < 1000) continue;  // small sets peel by luck, not by the threshold
      SketchGeometry g = sketchGeometry(uint64_t(std::ceil(1.3 * double(members.size()) / 3.0)), rnd(count));
      EXPECT_EQ(unrecovered(members, g, laneRotated), 0u) << count << " " << density;
    }
  }
}

TEST(SketchGeometry, SmallSketchesPeelWithTheirHeadroom) {
  // 1.3 cells a member alone stalls a third to a half of the time at 10-300
  // members (finite-size effects); the 64 extra cells of afterIndexPart bring
  // that to a few percent (the leftover round covers the rest).
  for (size_t u : {size_t(10), size_t(30), size_t(100), size_t(300)}) {
    int bare = 0, sized = 0;
    const int trials = 300;
    for (int t = 0; t < trials; ++t) {
      std::vector<uint64_t> members;
      for (size_t i = 0; i < u; ++i) members.push_back(rnd(u * 1000 + uint64_t(t) * 7919 + i) % (uint64_t(1) << 30));
      std::sort(members.begin(), members.end());
      members.erase(std::unique(members.begin(), members.end()), members.end());
      SketchGeometry plain = sketchGeometry(uint64_t(std::ceil(1.3 * double(members.size()) / 3.0)), rnd(t));
      SketchGeometry padded = sketchGeometry(shoal::compressors::sketch_impl::afterIndexPart(1.3, members.size()), rnd(t));
      bare += unrecovered(members, plain, laneRotated) > 0;
      sized += unrecovered(members, padded, laneRotated) > 0;
    }
    EXPECT_GT(bare, trials / 20) << u << ": expected the bare sizing to stall often";
    EXPECT_LE(sized, trials / 20) << u << " members: " << sized << " of " << trials << " stalled";
  }
}

TEST(SketchPeel, QueueAndTwoPhaseRoundsAgree) {
  // Same recovered set, same limbs, same certificate, with and without stalls, K = 1..3.
  for (int K : {1, 2, 3}) {
    for (double cellsPerItem : {1.1, 1.3, 3.0}) {
      std::vector<uint64_t> members = randomSupport(K * 17 + uint64_t(cellsPerItem * 10), 50000, 0.2);
      SketchGeometry g = sketchGeometry(uint64_t(std::ceil(cellsPerItem * double(members.size()) / 3.0)), 99);
      std::vector<uint64_t> summed = scatter(members, g, K, laneRotated);
      std::vector<uint64_t> a, b;
      std::vector<size_t> leftA, leftB;
      ASSERT_TRUE(peelSketch(members.data(), members.size(), g, K, summed.data(), a, leftA));
      bool certified = false;
      int rounds = peelTwoPhase(members.data(), members.size(), g, K, summed.data(), b, leftB, &certified);
      ASSERT_EQ(leftA, leftB) << K << " " << cellsPerItem;
      EXPECT_TRUE(certified) << "the certificate fails only when all peeled and a cell is nonzero";
      EXPECT_GT(rounds, 0);
      std::vector<uint8_t> stalled(members.size(), 0);
      for (size_t p : leftA) stalled[p] = 1;
      const size_t u = members.size();
      for (size_t p = 0; p < u; ++p) {
        if (stalled[p]) continue;
        for (int k = 0; k < K; ++k) {
          ASSERT_EQ(a[size_t(k) * u + p], b[size_t(k) * u + p]);
          ASSERT_EQ(a[size_t(k) * u + p], rnd(p * 7 + uint64_t(k)) | 1) << "recovered limb is not the member's";
        }
      }
      if (cellsPerItem < 1.2) EXPECT_FALSE(leftA.empty()) << "1.1 cells per member should stall";
      if (cellsPerItem > 1.2) EXPECT_TRUE(leftA.empty());
    }
  }
}

TEST(SketchPeel, ScratchKeptAcrossCallsOfOtherSizes) {
  // sketch.cc keeps one PeelScratch per operation state and reuses it for every tensor and call: a
  // large table (its cells in the 2 MiB huge-page blocks), a small one that stalls, a K = 2 one and
  // the large one again must each give what a fresh scratch and the two-phase rounds give.
  struct Case {
    size_t count;
    double density, cellsPerItem;
    int K;
  };
  const Case cases[] = {{size_t(1) << 22, 0.1, 1.3, 1}, {20000, 0.2, 1.1, 1}, {50000, 0.1, 1.3, 2},
                        {size_t(1) << 22, 0.1, 1.3, 1}};
  PeelScratch<uint64_t> kept;
  for (const Case& c : cases) {
    std::vector<uint64_t> members = randomSupport(c.count + uint64_t(c.K), c.count, c.density);
    SketchGeometry g = sketchGeometry(uint64_t(std::ceil(c.cellsPerItem * double(members.size()) / 3.0)), 7);
    std::vector<uint64_t> summed = scatter(members, g, c.K, laneRotated);
    std::vector<uint64_t> a, b, d, w;
    std::vector<size_t> leftA, leftB, leftD, leftW;
    ASSERT_TRUE(peelSketch(members.data(), members.size(), g, c.K, summed.data(), a, leftA, kept));
    ASSERT_TRUE(peelSketch(members.data(), members.size(), g, c.K, summed.data(), b, leftB));
    // The layout for tables of 2^32 cells or more (64-bit counts, positions and cell numbers),
    // which no test can allocate, on these tables.
    ASSERT_TRUE((peelWith<uint64_t, uint64_t>(members.data(), members.size(), g, c.K, summed.data(), w, leftW, kept)));
    ASSERT_EQ(leftA, leftW);
    ASSERT_EQ(a, w);
    bool certified = false;
    peelTwoPhase(members.data(), members.size(), g, c.K, summed.data(), d, leftD, &certified);
    EXPECT_TRUE(certified);
    ASSERT_EQ(leftA, leftB);
    ASSERT_EQ(leftA, leftD);
    if (c.cellsPerItem < 1.2) EXPECT_FALSE(leftA.empty()) << "1.1 cells per member should stall";
    std::vector<uint8_t> stalled(members.size(), 0);
    for (size_t p : leftA) stalled[p] = 1;
    for (size_t k = 0; k < size_t(c.K) * members.size(); ++k) {
      if (stalled[k % members.size()]) continue;
      ASSERT_EQ(a[k], b[k]);
      ASSERT_EQ(a[k], d[k]);
    }
    EXPECT_GE(kept.capacityBytes(), 3 * g.part * sizeof(PeelCell<uint64_t, uint32_t>));
  }
  // A corrupted cell after the reuse: the certificate still fails.
  std::vector<uint64_t> members = randomSupport(5, 20000, 0.1);
  SketchGeometry g = sketchGeometry(members.size(), 3);
  std::vector<uint64_t> summed = scatter(members, g, 1, laneRotated), limbs;
  std::vector<size_t> leftover;
  std::vector<uint32_t> counts(3 * g.part, 0);
  for (uint64_t i : members)
    for (int j = 0; j < 3; ++j) ++counts[cellOf(i, g, j)];
  const size_t empty = std::find(counts.begin(), counts.end(), 0u) - counts.begin();
  ASSERT_LT(empty, counts.size());
  summed[empty] += 1;
  EXPECT_FALSE(peelSketch(members.data(), members.size(), g, 1, summed.data(), limbs, leftover, kept));
  EXPECT_FALSE((peelWith<uint64_t, uint64_t>(members.data(), members.size(), g, 1, summed.data(), limbs, leftover,
                                             kept)));
}

TEST(SketchPeel, CertificateCatchesACorruptedCell) {
  std::vector<uint64_t> members = randomSupport(5, 20000, 0.1);
  SketchGeometry g = sketchGeometry(members.size(), 3);  // 3 cells per member: peels fully
  std::vector<uint64_t> summed = scatter(members, g, 1, laneRotated), limbs;
  std::vector<size_t> leftover;
  ASSERT_TRUE(peelSketch(members.data(), members.size(), g, 1, summed.data(), limbs, leftover));
  // A cell no member hashes to, made nonzero: every member still peels, the certificate must fail.
  std::vector<uint32_t> counts(3 * g.part, 0);
  for (uint64_t i : members)
    for (int j = 0; j < 3; ++j) ++counts[cellOf(i, g, j)];
  size_t empty = std::find(counts.begin(), counts.end(), 0u) - counts.begin();
  ASSERT_LT(empty, counts.size());
  summed[empty] += 1;
  EXPECT_FALSE(peelSketch(members.data(), members.size(), g, 1, summed.data(), limbs, leftover));
  bool certified = true;
  peelTwoPhase(members.data(), members.size(), g, 1, summed.data(), limbs, leftover, &certified);
  EXPECT_FALSE(certified);
}

TEST(SketchBloom, NoFalseNegativesAndFewFalsePositives) {
  const size_t count = 2000003;
  for (double density : {0.00001, 0.0001, 0.001, 0.01}) {
    std::vector<uint64_t> members = randomSupport(uint64_t(density * 1e7), count, density);
    BloomGeometry b = bloomGeometry(count, density, 1234);
    ASSERT_GT(b.words, 0u) << density;
    ASSERT_LT(b.words, (count + 63) / 64) << "a Bloom filter no smaller than the bitmap";
    std::vector<uint64_t> words(b.words, 0);
    for (uint64_t i : members) bloomInsert(words.data(), i, b);
    std::vector<uint64_t> found;
    bloomMembers(words.data(), count, b, found);
    ASSERT_TRUE(std::includes(found.begin(), found.end(), members.begin(), members.end())) << "false negative";
    const double falsePositives = double(found.size() - members.size());
    // Sized for 5% extra members; allow 3x (small sets vary).
    EXPECT_LE(falsePositives, 0.15 * double(members.size()) + 3) << density;
    // And it is smaller than the bitmap by roughly 1 / (bits per member x density).
    EXPECT_LT(double(b.words), 0.5 * double(count) / 64) << density;
  }
  // Dense unions: no filter (the bitmap is smaller).
  EXPECT_EQ(bloomGeometry(1000000, 0.2, 1).words, 0u);
  EXPECT_EQ(bloomGeometry(0, 0.001, 1).words, 0u);
}

}  // namespace
