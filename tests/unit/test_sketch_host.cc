// The sketch compressor's vectorised host passes (compressors/sketch/sketch_host.h)
// (and sketch_host.cc) against the per-element rules of sketch_math.h they
// replace, on every scan path the CPU has.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "compressors/sketch/sketch_host.h"
#include "compressors/sketch/sketch_peel.h"

namespace {

using namespace shoal::sketch;

// Sparse f32 data with zeros of both signs, subnormals, Inf and NaN sprinkled in.
std::vector<float> sample(size_t count, double density, uint64_t seed, bool specials) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> uni(0.0, 1.0);
  std::vector<float> x(count, 0.0f);
  for (size_t i = 0; i < count; ++i) {
    const double r = uni(rng);
    if (r < density) x[i] = float(std::ldexp(uni(rng) - 0.5, int(rng() % 60) - 30));
    else if (r < density * 1.1) x[i] = -0.0f;
    else if (r < density * 1.15) x[i] = std::numeric_limits<float>::denorm_min() * float(1 + rng() % 1000);
  }
  if (specials && count > 10) {
    x[3] = std::numeric_limits<float>::infinity();
    x[count - 2] = std::numeric_limits<float>::quiet_NaN();
  }
  return x;
}

// Every scan path this CPU has (the portable loop always; SSE4.1, AVX2 and AVX-512 on x86).
std::vector<ScanPath> scanPaths() {
  std::vector<ScanPath> paths;
  for (ScanPath p : kScanPaths)
    if (scanPathAvailable(p)) paths.push_back(p);
  return paths;
}

// scanIndexWith(path) against the per-element rule: words, values, statistics and the -0 flag.
void expectScanMatchesRule(ScanPath path, const std::vector<float>& x, const std::string& what) {
  const size_t count = x.size();
  std::vector<uint64_t> expected((count + 63) / 64, 0), words((count + 63) / 64, ~uint64_t(0));
  LocalStats want;
  std::vector<float> values;
  for (size_t i = 0; i < count; ++i) {
    uint32_t bits;
    std::memcpy(&bits, &x[i], 4);
    if (bits == 0x80000000u) want.negativeZero = true;
    if (!isNonzero(x[i])) continue;
    bitmapSet(expected.data(), i);
    values.push_back(x[i]);
    if (!isFinite(x[i])) {
      want.nonfinite = true;
      continue;
    }
    const FloatParts p = decompose(x[i]);
    want.any = true;
    want.top = std::max(want.top, p.top);
    want.lowest = std::min(want.lowest, p.lowest);
  }
  const std::string where = what + ", " + scanPathName(path) + ", count " + std::to_string(count);
  LocalValues got;
  const LocalStats s = scanIndexWith(path, x.data(), count, words.data(), &got);
  EXPECT_EQ(words, expected) << where;
  EXPECT_EQ(s.any, want.any) << where;
  EXPECT_EQ(s.nonfinite, want.nonfinite) << where;
  EXPECT_EQ(s.negativeZero, want.negativeZero) << where;
  EXPECT_EQ(s.top, want.top) << where;
  EXPECT_EQ(s.lowest, want.lowest) << where;
  ASSERT_EQ(got.size, values.size()) << where;
  if (!values.empty())  // memcmp's pointers must not be null, even for 0 bytes
    EXPECT_EQ(0, std::memcmp(got.data.get(), values.data(), values.size() * sizeof(float))) << where;
  // Without values: the same words and statistics.
  std::vector<uint64_t> again(words.size(), ~uint64_t(0));
  const LocalStats t = scanIndexWith(path, x.data(), count, again.data(), nullptr);
  EXPECT_EQ(again, expected) << where << ", no values";
  EXPECT_EQ(t.top, want.top) << where << ", no values";
  EXPECT_EQ(t.lowest, want.lowest) << where << ", no values";
}

TEST(SketchHost, ScanIndexMatchesPerElementRule) {
  for (ScanPath path : scanPaths()) {
    for (size_t count : {size_t(0), size_t(1), size_t(63), size_t(64), size_t(65), size_t(127), size_t(128),
                         size_t(129), size_t(1000), size_t(4096 + 17)}) {
      for (bool specials : {false, true})
        for (double density : {0.01, 0.05, 0.5, 1.0})
          expectScanMatchesRule(path, sample(count, density, count * 7 + specials + uint64_t(density * 100), specials),
                                "sample " + std::to_string(density) + (specials ? " with Inf/NaN" : ""));
    }
  }
  std::printf("scan paths tested:");
  for (ScanPath path : scanPaths()) std::printf(" %s", scanPathName(path));
  std::printf("\n");
}

// The compressor keeps each tensor's LocalValues from call to call: a scan
// into one that an earlier scan of another size and density filled gives the
// same words, values and count as a scan into a fresh one, and reallocates
// only when the room is short of count + LocalValues::kRoom.
TEST(SketchHost, ScanIntoKeptValuesMatchesFresh) {
  for (ScanPath path : scanPaths()) {
    LocalValues kept;
    size_t seed = 0;
    for (size_t count : {size_t(5000), size_t(70), size_t(5000), size_t(9000), size_t(1), size_t(640)}) {
      for (double density : {1.0, 0.02, 0.5}) {
        ++seed;
        const std::vector<float> x = sample(count, density, 1000 + seed, seed % 2 == 0);
        const std::string where = std::string(scanPathName(path)) + ", count " + std::to_string(count) + ", density " +
                                  std::to_string(density);
        const size_t room = kept.capacity;
        std::vector<uint64_t> words((count + 63) / 64, ~uint64_t(0)), fresh(words.size(), ~uint64_t(0));
        const LocalStats s = scanIndexWith(path, x.data(), count, words.data(), &kept);
        LocalValues once;
        const LocalStats t = scanIndexWith(path, x.data(), count, fresh.data(), &once);
        EXPECT_EQ(words, fresh) << where;
        EXPECT_EQ(s.top, t.top) << where;
        EXPECT_EQ(s.lowest, t.lowest) << where;
        EXPECT_EQ(s.nonfinite, t.nonfinite) << where;
        ASSERT_EQ(kept.size, once.size) << where;
        if (once.size > 0)
          EXPECT_EQ(0, std::memcmp(kept.data.get(), once.data.get(), once.size * sizeof(float))) << where;
        EXPECT_EQ(kept.capacity, std::max(room, count + LocalValues::kRoom)) << where;
      }
    }
  }
}

TEST(SketchHost, ScanIndexEdges) {
  const float inf = std::numeric_limits<float>::infinity(), nan = std::numeric_limits<float>::quiet_NaN();
  const float tiny = std::numeric_limits<float>::denorm_min(), big = std::numeric_limits<float>::max();
  for (ScanPath path : scanPaths()) {
    // Words with exactly k members, k = 0..64, at random places (the value runs of 8 and 16 and the loop after).
    std::mt19937_64 rng(41);
    std::vector<float> x;
    for (int k = 0; k <= 64; ++k) {
      std::vector<int> lanes(64);
      for (int l = 0; l < 64; ++l) lanes[l] = l;
      std::shuffle(lanes.begin(), lanes.end(), rng);
      std::vector<float> block(64, 0.0f);
      for (int m = 0; m < k; ++m) block[lanes[m]] = float(int(rng() % 2001) - 1000) * 0x1p-10f + 0x1p-20f;
      x.insert(x.end(), block.begin(), block.end());
    }
    expectScanMatchesRule(path, x, "k members a word");
    x.push_back(3.0f);  // and a partial last word
    expectScanMatchesRule(path, x, "k members a word, then a partial word");
    // Zeros only: +0, -0 in a full word, -0 only in the partial word.
    expectScanMatchesRule(path, std::vector<float>(200, 0.0f), "+0 only");
    std::vector<float> z(200, 0.0f);
    z[70] = -0.0f;
    expectScanMatchesRule(path, z, "-0 in a full word");
    z[70] = 0.0f;
    z[199] = -0.0f;
    expectScanMatchesRule(path, z, "-0 in the partial word");
    z[199] = 0.0f;
    z[5] = -0.0f;
    z[6] = 1.0f;
    expectScanMatchesRule(path, z, "-0 beside a member");
    // The f32 range's ends: subnormals only, the largest finite, both together; signs.
    std::vector<float> e(130, 0.0f);
    e[1] = tiny;
    e[66] = -tiny * 3.0f;
    expectScanMatchesRule(path, e, "subnormals only");
    e[100] = -big;
    e[129] = 0x1p-126f;
    expectScanMatchesRule(path, e, "subnormals and the largest finite");
    std::vector<float> dense(256);
    for (size_t i = 0; i < dense.size(); ++i) dense[i] = (i % 2 ? -1.0f : 1.0f) * std::ldexp(1.0f + float(i) / 512, int(i % 200) - 100);
    expectScanMatchesRule(path, dense, "dense words, exponents 2^-100..2^99");
    // Inf/NaN: alone (no finite member), and beside finite values of every magnitude class.
    for (float special : {inf, -inf, nan}) {
      std::vector<float> s(70, 0.0f);
      s[68] = special;
      expectScanMatchesRule(path, s, "one Inf/NaN alone");
      s[2] = 0x1p-140f;
      s[40] = 0x1p100f;
      expectScanMatchesRule(path, s, "Inf/NaN beside finite values");
      std::vector<float> d = dense;
      d[17] = special;
      expectScanMatchesRule(path, d, "Inf/NaN in a dense word");
    }
  }
}

TEST(SketchHost, BitmapMembersEveryPopulation) {
  // Words of every population 0..64 (the runs of 8 and 16 and the loop after), random words,
  // and a count that ends inside the last word.
  std::mt19937_64 rng(17);
  std::vector<uint64_t> words;
  for (int k = 0; k <= 64; ++k) {
    uint64_t w = 0;
    while (__builtin_popcountll(w) < k) w |= uint64_t(1) << (rng() % 64);
    words.push_back(w);
  }
  for (int k = 0; k < 200; ++k) words.push_back(rng() & rng());
  words.push_back(0x15);  // the last word: count ends 5 bits in
  const size_t count = 64 * (words.size() - 1) + 5;
  std::vector<uint64_t> fast, slow;
  bitmapMembersFast(words.data(), count, fast);
  bitmapMembers(words.data(), count, slow);
  EXPECT_EQ(fast, slow);
  std::vector<uint64_t> none(3, 0);
  bitmapMembersFast(none.data(), 150, fast);
  EXPECT_TRUE(fast.empty());
  bitmapMembersFast(none.data(), 0, fast);
  EXPECT_TRUE(fast.empty());
}

TEST(SketchHost, MemberValuesFollowTheUnion) {
  const size_t count = 5000;
  const std::vector<float> x = sample(count, 0.1, 99, false);
  std::vector<uint64_t> local((count + 63) / 64);
  LocalValues values;
  scanIndex(x.data(), count, local.data(), &values);
  // The union: this rank's bits plus another rank's, one word entirely this rank's.
  std::vector<uint64_t> all = local;
  std::mt19937_64 rng(5);
  for (size_t k = 1; k < all.size(); ++k) all[k] |= rng() & rng() & rng();
  if (count % 64) all.back() &= (uint64_t(1) << (count % 64)) - 1;
  std::vector<uint64_t> members;
  bitmapMembersFast(all.data(), count, members);
  std::vector<uint64_t> slow;
  bitmapMembers(all.data(), count, slow);
  EXPECT_EQ(members, slow);
  std::vector<float> mine(members.size(), -1.0f);
  ASSERT_TRUE(memberValues(all.data(), local.data(), all.size(), values.data.get(), values.size, mine.data()));
  for (size_t p = 0; p < members.size(); ++p) {
    const float want = isNonzero(x[members[p]]) ? x[members[p]] : 0.0f;
    ASSERT_EQ(std::memcmp(&mine[p], &want, 4), 0) << p;
  }
  // A union without one of this rank's members was not OR-ed with this rank: refused.
  std::vector<uint64_t> broken = all;
  for (size_t k = 0; k < broken.size(); ++k)
    if (local[k]) {
      broken[k] &= ~(local[k] & (0 - local[k]));  // drop this rank's lowest member of word k
      break;
    }
  bitmapMembersFast(broken.data(), count, members);
  mine.assign(members.size(), 0.0f);
  EXPECT_FALSE(memberValues(broken.data(), local.data(), broken.size(), values.data.get(), values.size, mine.data()));
}

TEST(SketchHost, WriteMembersAlignedAndNot) {
  for (OutputStores stores : {OutputStores::Plain, OutputStores::Streaming}) {
    for (size_t count : {size_t(1), size_t(64), size_t(200), size_t(1024), size_t(4099), size_t(9000)}) {
      for (size_t shift : {size_t(0), size_t(1)}) {  // out 16-byte aligned, then not
        std::vector<float> storage(count + 8, 7.0f);
        float* out = storage.data();
        while (reinterpret_cast<uintptr_t>(out) % 16) ++out;
        out += shift;
        std::vector<uint64_t> members;
        std::vector<float> result;
        for (size_t i = 0; i < count; i += 1 + i % 5) {
          members.push_back(i);
          result.push_back(float(i) + 0.5f);
        }
        writeMembersWith(stores, out, count, members.data(), result.data(), members.size());
        size_t p = 0;
        for (size_t i = 0; i < count; ++i) {
          const float want = p < members.size() && members[p] == i ? result[p++] : 0.0f;
          ASSERT_EQ(out[i], want) << int(stores) << " " << count << " " << shift << " " << i;
        }
        EXPECT_EQ(out[count], 7.0f);  // nothing past the end
      }
    }
  }
}

// Streaming stores only for an output of at least kStreamingMinBytes with under one member in 256
// elements; plain stores otherwise (where streaming was measured slower).
TEST(SketchHost, OutputStoresStreamOnlyALargeSparseOutput) {
  const size_t least = kStreamingMinBytes / sizeof(float), large = size_t(1) << 26;
  EXPECT_EQ(outputStoresFor(least - 1, 0), OutputStores::Plain);
  EXPECT_EQ(outputStoresFor(least, 0), OutputStores::Streaming);
  EXPECT_EQ(outputStoresFor(large, large / 1000), OutputStores::Streaming);  // 0.1%
  EXPECT_EQ(outputStoresFor(large, large / 256), OutputStores::Plain);
  EXPECT_EQ(outputStoresFor(large, large / 100), OutputStores::Plain);  // 1%
  EXPECT_EQ(outputStoresFor(large, large / 10), OutputStores::Plain);   // 10%
  EXPECT_EQ(outputStoresFor(1024, 1), OutputStores::Plain);
}

// The kept buffers' budget (sketch.cc keeps a finished call's state only within it): a large
// call's state stays through up to SpareBudget::kWindow smaller calls (a step's buckets, then a
// small one), and goes back after that many; what fits twice the need plus the slack stays.
TEST(SketchHost, SpareBudgetKeepsARecentLargeStateAndLetsAnOldOneGo) {
  constexpr size_t MiB = size_t(1) << 20;
  SpareBudget budget;
  EXPECT_TRUE(budget.keep(64 * MiB, 64 * MiB));  // the large call's own state
  for (int k = 1; k <= SpareBudget::kWindow; ++k)
    EXPECT_TRUE(budget.keep(MiB, 64 * MiB)) << "small call " << k << " after the large one";
  EXPECT_FALSE(budget.keep(MiB, 64 * MiB)) << "a 64 MiB state kept past the window of small calls";
  EXPECT_TRUE(budget.keep(MiB, 2 * MiB + SpareBudget::kSlack));  // within twice the need + the slack
  EXPECT_FALSE(budget.keep(MiB, 2 * MiB + SpareBudget::kSlack + 1));
  // A new large call resets the window at once.
  EXPECT_TRUE(budget.keep(32 * MiB, 32 * MiB));
  EXPECT_TRUE(budget.keep(MiB, 32 * MiB));
}

}  // namespace
