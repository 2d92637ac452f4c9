// The checks the sketch's CUDA kernels make on peers' data (sketch_checks.h),
// run on the CPU: the same __host__ __device__ functions the kernels call.
// An honest scale (the MAX of every rank's statistics, read by readScale)
// always fits every rank's values; a corrupted one does not, and bitmap bits
// past the count are caught in the last word only.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "compressors/sketch/sketch_checks.h"
#include "compressors/sketch/sketch_instance.h"

namespace shoal::sketch {
namespace {

using compressors::sketch_impl::readScale;
using compressors::sketch_impl::Scale;

TEST(SketchDeviceChecks, IndexBitsPastCountOnlyInTheTail) {
  EXPECT_FALSE(indexBitsPastCount(~uint64_t(0), 64));  // a full last word has no tail
  EXPECT_FALSE(indexBitsPastCount(~uint64_t(0), 128));
  EXPECT_FALSE(indexBitsPastCount((uint64_t(1) << 5) - 1, 5));
  EXPECT_TRUE(indexBitsPastCount(uint64_t(1) << 5, 5));
  EXPECT_TRUE(indexBitsPastCount(uint64_t(1) << 63, 70));  // count 70: the last word holds 6 coordinates
  EXPECT_FALSE(indexBitsPastCount((uint64_t(1) << 6) - 1, 70));
}

// The statistics words of one rank's values, as the encode kernel folds them.
void foldStats(const std::vector<float>& x, uint64_t* w) {
  for (float v : x) {
    if (!isNonzero(v) || !isFinite(v)) continue;
    const FloatParts p = decompose(v);
    w[0] = std::max<uint64_t>(w[0], uint64_t(p.top + 200));
    w[1] = std::max<uint64_t>(w[1], uint64_t(200 - p.lowest));
  }
}

TEST(SketchDeviceChecks, AnHonestScaleFitsEveryRanksValues) {
  std::mt19937 random(5);
  for (int worldSize : {2, 3, 8, 64}) {
    for (int trial = 0; trial < 50; ++trial) {
      std::vector<std::vector<float>> ranks(worldSize);
      uint64_t w[3] = {0, 0, 0};
      const int spread = 1 + trial % 40;
      std::uniform_int_distribution<int> exponent(-spread, spread);
      std::uniform_real_distribution<float> mantissa(-1.0f, 1.0f);
      for (auto& x : ranks) {
        for (int i = 0; i < 100; ++i) x.push_back(std::ldexp(mantissa(random), exponent(random)));
        x.push_back(std::ldexp(1.0f, 127));   // the largest binade
        x.push_back(std::ldexp(1.0f, -149));  // the smallest subnormal
        foldStats(x, w);
      }
      Scale scale;
      char why[200];
      ASSERT_TRUE(readScale(w, worldSize, scale, why, sizeof why)) << why;
      for (const auto& x : ranks)
        for (float v : x) ASSERT_TRUE(fitsScale(v, scale.Q, scale.L, scale.K)) << v << " n " << worldSize;
    }
  }
}

TEST(SketchDeviceChecks, ACorruptedScaleIsCaughtNotDropped) {
  const std::vector<float> x = {1.5f, -3.0f, 0.25f, 1024.0f};
  uint64_t w[3] = {0, 0, 0};
  foldStats(x, w);
  Scale scale;
  char why[200];
  ASSERT_TRUE(readScale(w, 2, scale, why, sizeof why)) << why;
  for (float v : x) EXPECT_TRUE(fitsScale(v, scale.Q, scale.L, scale.K));
  EXPECT_TRUE(fitsScale(0.0f, scale.Q + 10, scale.L, 0));  // zeros have no limbs to place
  // Q above 0.25's lowest bit (2^-2): the value has no limbs at this scale.
  EXPECT_FALSE(fitsScale(0.25f, -1, scale.L, scale.K));
  // Too few limbs for 1024 with a narrow limb width: its limbs fall past K.
  EXPECT_FALSE(fitsScale(1024.0f, -2, 4, 2));
  EXPECT_TRUE(fitsScale(1024.0f, -2, 4, 4));
  // The CPU path's limbPairOf drops exactly the values fitsScale refuses (k0 < 0).
  EXPECT_LT(limbPairOf(0.25f, -1, scale.L).k0, 0);
}

}  // namespace
}  // namespace shoal::sketch
