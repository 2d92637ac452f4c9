// The sketch compressor's CUDA kernels (compressors/sketch/sketch.cu) against
// the CPU path, bit for bit: index and Bloom build, exponent statistics, union
// enumeration, compact encode, sketch scatter (u64 sums are exact in any
// order), peeling (same recovered set, limbs and certificate), decode; then
// the whole compressor on CUDA tensors, ranks simulated in lockstep (payloads
// reduced on the host), against the same compressor on host tensors. Skips
// without a device; tests/unit/test_sketch*.cc cover the shared logic on the CPU.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "compressors/sketch/sketch_cuda.h"
#include "compressors/sketch/sketch_math.h"
#include "compressors/sketch/sketch_peel.h"
#include "cuda_test_util.h"
#include "gpu/cuda/device.h"
#include "shoal/compressor.h"

namespace {

using namespace shoal::sketch;

#define SKIP_WITHOUT_DEVICE()                                                   \
  do {                                                                          \
    std::string why;                                                            \
    if (shoal::cuda::deviceCount(&why) == 0) GTEST_SKIP() << "no CUDA device: " << why; \
  } while (0)

uint64_t rnd(uint64_t x) { return mix64(x * 0x9e3779b97f4a7c15ull + 1); }

// Sparse values over a wide range of exponents, some Inf/NaN when asked.
std::vector<float> sparseData(uint64_t seed, size_t count, double density, bool specials = false) {
  std::vector<float> x(count, 0.0f);
  for (size_t i = 0; i < count; ++i) {
    const uint64_t h = rnd(seed * 1000003 + i);
    if (double(h >> 11) * 0x1p-53 >= density) continue;
    const float mant = float((rnd(h) & 0xffffff) | 0x800000);
    x[i] = std::ldexp(mant, int(rnd(h + 1) % 40) - 43) * ((h & 1) ? -1.0f : 1.0f);
    if (specials && i % 997 == 5) x[i] = (i & 2) ? INFINITY : NAN;
  }
  return x;
}

// A device copy of a host vector, released at scope exit.
template <class T>
struct DeviceVector {
  T* data = nullptr;
  size_t size = 0;
  explicit DeviceVector(size_t n) : size(n) {
    void* p = nullptr;
    EXPECT_EQ(gpu::allocate(&p, n * sizeof(T), nullptr), 0);
    data = static_cast<T*>(p);
    EXPECT_EQ(gpu::zero(data, n * sizeof(T), nullptr), 0);
  }
  explicit DeviceVector(const std::vector<T>& host) : DeviceVector(host.size()) {
    EXPECT_EQ(gpu::copyFromHost(data, host.data(), host.size() * sizeof(T), nullptr), 0);
  }
  ~DeviceVector() { gpu::release(data, nullptr); }
  std::vector<T> host() const {
    std::vector<T> out(size);
    EXPECT_EQ(gpu::copyToHost(out.data(), data, size * sizeof(T), nullptr), 0);
    return out;
  }
};

void hostIndex(const std::vector<float>& x, const BloomGeometry& bloom, std::vector<uint64_t>& words,
               uint64_t stats[3]) {
  int top = -1000, lowest = 1000;
  bool any = false, nonfinite = false;
  for (size_t i = 0; i < x.size(); ++i) {
    if (!isNonzero(x[i])) continue;
    if (bloom.words > 0) bloomInsert(words.data(), i, bloom);
    else bitmapSet(words.data(), i);
    if (!isFinite(x[i])) {
      nonfinite = true;
      continue;
    }
    FloatParts p = decompose(x[i]);
    any = true;
    top = std::max(top, p.top);
    lowest = std::min(lowest, p.lowest);
  }
  stats[0] = any ? uint64_t(top + 200) : 0;
  stats[1] = any ? uint64_t(200 - lowest) : 0;
  stats[2] = nonfinite;
}

TEST(SketchCuda, IndexStatsAndUnionMatchTheCpu) {
  SKIP_WITHOUT_DEVICE();
  for (size_t count : {size_t(1), size_t(63), size_t(1000003)}) {
    for (double density : {0.001, 0.1, 1.0}) {
      for (bool bloom : {false, true}) {
        std::vector<float> x = sparseData(count + uint64_t(density * 100), count, density, true);
        BloomGeometry b = bloom ? bloomGeometry(count, 0.001, 77) : BloomGeometry{};
        const size_t words = b.words > 0 ? b.words : (count + 63) / 64;
        std::vector<uint64_t> hostWords(words, 0);
        uint64_t hostStats[3];
        hostIndex(x, b, hostWords, hostStats);
        DeviceVector<float> dx(x);
        DeviceVector<uint64_t> dWords(words), dStats(3);
        ASSERT_EQ(gpu::encodeIndex(dx.data, count, b, dWords.data, dStats.data, nullptr), 0);
        ASSERT_EQ(dWords.host(), hostWords) << count << " " << density << " bloom " << bloom;
        std::vector<uint64_t> stats = dStats.host();
        ASSERT_EQ(std::vector<uint64_t>(hostStats, hostStats + 3), stats);
        std::vector<uint64_t> members;
        if (b.words > 0) bloomMembers(hostWords.data(), count, b, members);
        else bitmapMembers(hostWords.data(), count, members);
        size_t u = 0;
        unsigned indexFlags = ~0u;
        ASSERT_EQ(gpu::countMembers(dWords.data, count, b, &u, &indexFlags, nullptr), 0);
        ASSERT_EQ(indexFlags, 0u) << "a valid index was flagged";
        ASSERT_EQ(u, members.size());
        DeviceVector<uint64_t> dMembers(std::max<size_t>(u, 1));
        ASSERT_EQ(gpu::listMembers(dWords.data, count, b, dMembers.data, nullptr), 0);
        std::vector<uint64_t> got = dMembers.host();
        got.resize(u);
        ASSERT_EQ(got, members);
        size_t supportCount = 0;
        DeviceVector<uint64_t> dSupport(count);
        ASSERT_EQ(gpu::compactSupport(dx.data, count, dSupport.data, &supportCount, nullptr), 0);
        std::vector<uint64_t> support = dSupport.host(), want;
        support.resize(supportCount);
        for (size_t i = 0; i < count; ++i)
          if (isNonzero(x[i])) want.push_back(i);
        ASSERT_EQ(support, want);
      }
    }
  }
}

TEST(SketchCuda, EncodeScatterPeelDecodeMatchTheCpu) {
  SKIP_WITHOUT_DEVICE();
  const size_t count = 300007;
  for (double density : {0.001, 0.05, 0.5}) {
    for (double cellsPerItem : {1.1, 1.3}) {
      std::vector<float> x = sparseData(uint64_t(density * 1000 + cellsPerItem * 10), count, density);
      std::vector<uint64_t> members;
      for (size_t i = 0; i < count; ++i)
        if (isNonzero(x[i])) members.push_back(i);
      const size_t u = members.size();
      int top = -1000, lowest = 1000;
      for (uint64_t i : members) {
        FloatParts p = decompose(x[i]);
        top = std::max(top, p.top);
        lowest = std::min(lowest, p.lowest);
      }
      const int L = 61, Q = lowest, K = (top - lowest + 1 + L - 1) / L;
      DeviceVector<float> dx(x);
      DeviceVector<uint64_t> dMembers(members);
      // compact
      std::vector<uint64_t> compact(size_t(K) * u, 0);
      for (size_t p = 0; p < u; ++p) addLimbs(x[members[p]], Q, L, K, compact.data() + p, u);
      DeviceVector<uint64_t> dCompact(size_t(K) * u);
      DeviceVector<unsigned> dFlags(1);  // the encoders' refusal word: stays 0 for values within the scale
      ASSERT_EQ(gpu::encodeCompact(dx.data, dMembers.data, u, Q, L, K, dCompact.data, dFlags.data, nullptr), 0);
      ASSERT_EQ(dFlags.host()[0], 0u);
      ASSERT_EQ(dCompact.host(), compact);
      // scatter
      SketchGeometry g = sketchGeometry(uint64_t(std::ceil(cellsPerItem * double(u) / 3.0)), 1234);
      const size_t cells = 3 * g.part;
      std::vector<uint64_t> sketch(size_t(K) * cells, 0);
      for (uint64_t i : members)
        for (int j = 0; j < 3; ++j) addLimbs(x[i], Q, L, K, sketch.data() + cellOf(i, g, j), cells);
      DeviceVector<uint64_t> dCells(size_t(K) * cells);
      ASSERT_EQ(gpu::scatterSketch(dx.data, dMembers.data, u, g, Q, L, K, dCells.data, dFlags.data, nullptr), 0);
      ASSERT_EQ(dFlags.host()[0], 0u);
      ASSERT_EQ(dCells.host(), sketch);
      // peel
      std::vector<uint64_t> limbs;
      std::vector<size_t> leftover;
      ASSERT_TRUE(peelSketch(members.data(), u, g, K, sketch.data(), limbs, leftover));
      DeviceVector<uint64_t> dLimbs(size_t(K) * u), dLeftover(u);
      size_t m = 0;
      bool certified = false;
      int rounds = 0;
      ASSERT_EQ(gpu::peel(dMembers.data, u, g, K, dCells.data, dLimbs.data, dLeftover.data, &m, &certified, &rounds,
                          nullptr),
                0);
      EXPECT_TRUE(certified);
      ASSERT_EQ(m, leftover.size()) << density << " " << cellsPerItem;
      std::vector<uint64_t> gotLeftover = dLeftover.host();
      for (size_t l = 0; l < m; ++l) ASSERT_EQ(gotLeftover[l], leftover[l]);
      std::vector<uint64_t> gotLimbs = dLimbs.host();
      std::vector<uint8_t> stalled(u, 0);
      for (size_t p : leftover) stalled[p] = 1;
      for (size_t p = 0; p < u; ++p)
        for (int k = 0; k < K && !stalled[p]; ++k) ASSERT_EQ(gotLimbs[size_t(k) * u + p], limbs[size_t(k) * u + p]);
      // decode (sum and avg over 3 "ranks") from the compact limbs
      for (bool avg : {false, true}) {
        DeviceVector<float> dOut(count);
        ASSERT_EQ(gpu::decodeMembers(dCompact.data, u, dMembers.data, u, nullptr, K, L, Q, 3, avg, dOut.data, nullptr),
                  0);
        std::vector<float> out = dOut.host();
        for (size_t p = 0; p < u; ++p) {
          float want = decodeLimbs(compact.data() + p, u, K, L, Q, 3, avg);
          ASSERT_EQ(shoal::ops::floatBits(out[members[p]]), shoal::ops::floatBits(want));
        }
      }
    }
  }
}

// The compressor table on n ranks in lockstep (one instance shared by all,
// tests/harness/compressor_rounds.h), tensors in device memory (or host
// memory), payloads reduced on the host between rounds. Rank 0's output.
std::vector<float> runTable(const char* options, int n, bool onDevice, const std::vector<std::vector<float>>& inputs,
                            int* rounds) {
  const shoal_compressor_t* table = nullptr;
  EXPECT_EQ(shoal_compressor_lookup("sketch", &table), SHOAL_OK);
  const std::vector<std::pair<std::string, std::string>> pairs = shoal::test::optionPairs(options);
  std::vector<const char*> keys, values;
  for (const auto& [key, value] : pairs) keys.push_back(key.c_str()), values.push_back(value.c_str());
  char err[256] = {};
  shoal_compressor_params_t params{sizeof params, int(keys.size()), keys.data(), values.data(), nullptr, err,
                                   sizeof err};
  void* instance = nullptr;
  EXPECT_EQ(table->create(&params, &instance), SHOAL_OK) << err;
  const size_t count = inputs[0].size();
  std::vector<float> out;
  {
    shoal::test::CompressorRounds lockstep(table, n);
    lockstep.useInstances(std::vector<void*>(n, instance));
    if (onDevice) lockstep.placeTensors(shoal::test::deviceMemory());
    auto fill = [&](int r, int, void* data) { std::memcpy(data, inputs[r].data(), count * 4); };
    EXPECT_EQ(lockstep.allreduce({{SHOAL_F32, {int64_t(count)}, ""}}, SHOAL_SUM, 5, fill), SHOAL_OK)
        << lockstep.error(lockstep.failedRank());
    *rounds = lockstep.rounds();
    out = lockstep.outputAs<float>(0, 0);
    for (int r = 1; r < n && onDevice; ++r)
      EXPECT_EQ(std::memcmp(lockstep.output(r, 0), out.data(), count * 4), 0) << "ranks differ";
  }
  table->destroy(instance);
  return out;
}

TEST(SketchCuda, CompressorOnCudaTensorsMatchesHostTensors) {
  SKIP_WITHOUT_DEVICE();
  const shoal_compressor_t* table = nullptr;
  ASSERT_EQ(shoal_compressor_lookup("sketch", &table), SHOAL_OK);
  EXPECT_TRUE(table->caps & SHOAL_CAP_CUDA);
  for (int n : {1, 3, 5}) {
    for (double density : {0.0001, 0.01, 0.3}) {
      std::vector<std::vector<float>> inputs;
      for (int r = 0; r < n; ++r) inputs.push_back(sparseData(uint64_t(r * 100 + density * 1e4), 200003, density, true));
      for (const char* options : {"values=auto", "values=compact", "values=sketch", "values=sketch,cells_per_item=1.1",
                                  "values=dense", "index=bloom,expected_density=0.001"}) {
        int hostRounds = 0, deviceRounds = 0;
        std::vector<float> host = runTable(options, n, false, inputs, &hostRounds);
        std::vector<float> device = runTable(options, n, true, inputs, &deviceRounds);
        EXPECT_EQ(hostRounds, deviceRounds) << options;
        ASSERT_EQ(host.size(), device.size());
        for (size_t i = 0; i < host.size(); ++i)
          ASSERT_EQ(shoal::ops::floatBits(host[i]), shoal::ops::floatBits(device[i]))
              << options << ", " << n << " ranks, density " << density << ", element " << i;
      }
    }
  }
}

}  // namespace
