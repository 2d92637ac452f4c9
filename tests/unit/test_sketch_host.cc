// The sketch compressor's vectorised host passes (compressors/sketch/sketch_host.h)
// against the per-element rules of sketch_math.h they replace.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
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

TEST(SketchHost, ScanIndexMatchesPerElementRule) {
  for (size_t count : {size_t(0), size_t(1), size_t(63), size_t(64), size_t(65), size_t(1000), size_t(4096 + 17)}) {
    for (bool specials : {false, true}) {
      const std::vector<float> x = sample(count, 0.05, count * 7 + specials, specials);
      std::vector<uint64_t> expected((count + 63) / 64, 0), words((count + 63) / 64, ~uint64_t(0));
      LocalStats want;
      std::vector<float> values;
      for (size_t i = 0; i < count; ++i) {
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
      LocalValues got;
      const LocalStats s = scanIndex(x.data(), count, words.data(), &got);
      EXPECT_EQ(words, expected) << count;
      EXPECT_EQ(s.any, want.any);
      EXPECT_EQ(s.nonfinite, want.nonfinite);
      EXPECT_EQ(s.top, want.top);
      EXPECT_EQ(s.lowest, want.lowest);
      ASSERT_EQ(got.size, values.size());
      if (!values.empty())  // memcmp's pointers must not be null, even for 0 bytes
        EXPECT_EQ(0, std::memcmp(got.data.get(), values.data(), values.size() * sizeof(float)));
    }
  }
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
  for (size_t count : {size_t(1), size_t(64), size_t(200), size_t(4099)}) {
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
      writeMembers(out, count, members.data(), result.data(), members.size());
      size_t p = 0;
      for (size_t i = 0; i < count; ++i) {
        const float want = p < members.size() && members[p] == i ? result[p++] : 0.0f;
        ASSERT_EQ(out[i], want) << count << " " << shift << " " << i;
      }
      EXPECT_EQ(out[count], 7.0f);  // nothing past the end
    }
  }
}

}  // namespace
