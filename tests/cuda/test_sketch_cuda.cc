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
#include <vector>

#include "compressors/sketch/sketch_cuda.h"
#include "compressors/sketch/sketch_math.h"
#include "compressors/sketch/sketch_peel.h"
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

// The compressor table on n ranks in lockstep, tensors in device memory (or
// host memory), payloads reduced on the host between rounds.
std::vector<float> runTable(const char* options, int n, bool onDevice, const std::vector<std::vector<float>>& inputs,
                            int* rounds) {
  const shoal_compressor_t* table = nullptr;
  EXPECT_EQ(shoal_compressor_lookup("sketch", &table), SHOAL_OK);
  std::string text = options;
  std::vector<std::string> keys, values;
  for (size_t pos = 0; pos < text.size();) {
    size_t comma = text.find(',', pos);
    std::string kv = text.substr(pos, comma == std::string::npos ? std::string::npos : comma - pos);
    keys.push_back(kv.substr(0, kv.find('=')));
    values.push_back(kv.substr(kv.find('=') + 1));
    pos = comma == std::string::npos ? text.size() : comma + 1;
  }
  std::vector<const char*> kp, vp;
  for (size_t i = 0; i < keys.size(); ++i) kp.push_back(keys[i].c_str()), vp.push_back(values[i].c_str());
  char err[256] = {};
  shoal_compressor_params_t params{sizeof params, int(kp.size()), kp.data(), vp.data(), nullptr, err, sizeof err};
  void* instance = nullptr;
  EXPECT_EQ(table->create(&params, &instance), SHOAL_OK) << err;
  const size_t count = inputs[0].size();
  struct Rank {
    std::vector<float> in, out;
    void *din = nullptr, *dout = nullptr;
    shoal_compress_tensor_t tensor{};
    shoal_compress_op_t op{};
    shoal_round_t round{};
    void* state = nullptr;
    char error[256] = {};
  };
  std::vector<Rank> ranks(n);
  for (int r = 0; r < n; ++r) {
    Rank& R = ranks[r];
    R.in = inputs[r];
    R.out.assign(count, 0.0f);
    R.tensor.input = shoal_tensor_1d(R.in.data(), count, SHOAL_F32);
    R.tensor.output = shoal_tensor_1d(R.out.data(), count, SHOAL_F32);
    if (onDevice) {
      EXPECT_EQ(gpu::allocate(&R.din, count * 4 + 4, nullptr), 0);
      EXPECT_EQ(gpu::allocate(&R.dout, count * 4 + 4, nullptr), 0);
      EXPECT_EQ(gpu::copyFromHost(R.din, R.in.data(), count * 4, nullptr), 0);
      R.tensor.input.data = R.din;
      R.tensor.output.data = R.dout;
      R.tensor.input.memory = R.tensor.output.memory = SHOAL_MEMORY_CUDA;
    }
    R.op = shoal_compress_op_t{sizeof R.op, r, n, SHOAL_SUM, 1, &R.tensor, 5, R.error, sizeof R.error};
    EXPECT_EQ(table->start(instance, &R.op, &R.state), SHOAL_OK) << R.error;
    R.round.struct_size = sizeof R.round;
  }
  for (int index = 0; index < 6; ++index) {
    for (Rank& R : ranks) {
      R.round.index = index;
      EXPECT_EQ(table->round(instance, R.state, &R.op, &R.round), SHOAL_OK) << R.error;
    }
    if (ranks[0].round.done) {
      *rounds = index;
      break;
    }
    for (int p = 0; p < ranks[0].round.num_payloads; ++p) {
      const shoal_payload_t& P0 = ranks[0].round.payloads[p];
      const size_t bytes = P0.count * (P0.dtype == SHOAL_F32 ? 4 : 8);
      std::vector<std::vector<uint8_t>> host(n, std::vector<uint8_t>(bytes));
      for (int r = 0; r < n; ++r) {
        const void* b = ranks[r].round.payloads[p].buffer;
        if (onDevice) EXPECT_EQ(gpu::copyToHost(host[r].data(), b, bytes, nullptr), 0);
        else std::memcpy(host[r].data(), b, bytes);
      }
      std::vector<uint8_t> acc = host[0];
      for (int r = 1; r < n; ++r)
        for (size_t i = 0; i < P0.count; ++i) {
          if (P0.dtype == SHOAL_F32) {
            float a, b;
            std::memcpy(&a, &acc[i * 4], 4);
            std::memcpy(&b, &host[r][i * 4], 4);
            a += b;
            std::memcpy(&acc[i * 4], &a, 4);
          } else {
            uint64_t a, b;
            std::memcpy(&a, &acc[i * 8], 8);
            std::memcpy(&b, &host[r][i * 8], 8);
            a = P0.op == SHOAL_SUM ? a + b : P0.op == SHOAL_BOR ? (a | b) : std::max(a, b);
            std::memcpy(&acc[i * 8], &a, 8);
          }
        }
      for (int r = 0; r < n; ++r) {
        void* b = ranks[r].round.payloads[p].buffer;
        if (onDevice) EXPECT_EQ(gpu::copyFromHost(b, acc.data(), bytes, nullptr), 0);
        else std::memcpy(b, acc.data(), bytes);
      }
    }
  }
  std::vector<float> out = ranks[0].out;
  for (int r = 0; r < n; ++r) {
    Rank& R = ranks[r];
    if (onDevice) {
      EXPECT_EQ(gpu::copyToHost(R.out.data(), R.dout, count * 4, nullptr), 0);
      if (r == 0) out = R.out;
      EXPECT_EQ(std::memcmp(R.out.data(), out.data(), count * 4), 0) << "ranks differ";
    }
    table->finish(instance, R.state);
    gpu::release(R.din, nullptr);
    gpu::release(R.dout, nullptr);
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
