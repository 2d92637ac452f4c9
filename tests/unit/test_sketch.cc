// The sketch built-in compressor (lossless homomorphic): outputs must be the
// exact sum over ranks rounded once to f32, bit for bit, on every rank, in
// every values= mode, over densities, support overlaps, rank counts and sizes;
// plus values spanning the f32 range, Inf/NaN, forced peeling stalls (the
// leftover round), payload sizes and option checks.
//
// References: a long double sum rounded to f32, with inputs chosen so that the
// long double sum is exact (per coordinate the values' exponents span at most
// 2^-20 .. 2^20, 24-bit significands, <= 8 ranks: < 64 bits); avg only for
// power-of-two rank counts (the division is then exact too). Cases that need
// more than long double use hand-computed expectations.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <iterator>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "compressors/sketch/sketch_host.h"
#include "compressors/sketch/sketch_instance.h"
#include "compressors/sketch/sketch_math.h"
#include "compressors/sketch/sketch_peel.h"
#include "harness/compressor_rounds.h"
#include "harness/dtype_model.h"
#include "harness/harness.h"
#include "shoal/compressor.h"
#include "shoal/shoal.h"

namespace {

using shoal::test::CompressorRounds;
using shoal::test::runRanks;

using shoal::test::mix64;  // splitmix64 (harness/dtype_model.h)
uint64_t hash3(uint64_t a, uint64_t b, uint64_t c) { return mix64(a ^ mix64(b ^ mix64(c))); }
double unit(uint64_t h) { return double(h >> 11) * 0x1.0p-53; }  // [0, 1)

uint32_t bitsOf(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
}

using Gen = std::function<float(int rank, size_t i)>;

// Round 0's statistics of one tensor: OR-able codes in the index payload (sketch_instance.h).
const size_t kStatsBytes = 8 * shoal::compressors::sketch_impl::statsCodeWords(3);

enum class Overlap { Identical, Disjoint, Independent };

// A random f32: random sign, 24-bit significand, exponent in [lo, hi].
float randomValue(uint64_t h, int lo, int hi) {
  uint32_t mant = uint32_t(h & 0xffffffu) | 0x800000u;
  int e = lo + int((h >> 24) % uint64_t(hi - lo + 1));
  float v = std::ldexp(float(mant), e - 23);
  return (h >> 60) & 1 ? -v : v;
}

Gen sparseGen(uint64_t seed, int n, double density, Overlap overlap, int lo = -20, int hi = 20) {
  return [=](int r, size_t i) -> float {
    bool active;
    switch (overlap) {
      case Overlap::Identical: active = unit(hash3(seed, 1, i)) < density; break;
      case Overlap::Disjoint:
        active = unit(hash3(seed, 1, i)) < density && int(hash3(seed, 2, i) % uint64_t(n)) == r;
        break;
      default: active = unit(hash3(seed, 3, i * 1000 + uint64_t(r))) < density; break;
    }
    return active ? randomValue(hash3(seed, 4 + uint64_t(r), i), lo, hi) : 0.0f;
  };
}

std::vector<float> reference(const Gen& gen, int n, size_t count, shoal_op_t op) {
  std::vector<float> out(count);
  for (size_t i = 0; i < count; ++i) {
    long double sum = 0;
    for (int r = 0; r < n; ++r) sum += gen(r, i);
    if (op == SHOAL_AVG) sum /= n;
    out[i] = float(sum);
  }
  return out;
}

// Every rank's input of one case, generated once: the reference and every
// mode's call read these vectors (generating them again per call and per
// rank was most of the slow tests' time).
using Inputs = std::vector<std::vector<float>>;  // [rank][element]

std::shared_ptr<const Inputs> inputsOf(const Gen& gen, int n, size_t count) {
  auto in = std::make_shared<Inputs>(size_t(n), std::vector<float>(count));
  for (int r = 0; r < n; ++r)
    for (size_t i = 0; i < count; ++i) (*in)[r][i] = gen(r, i);
  return in;
}

// reference() of generated inputs: the same sums in the same rank order.
std::vector<float> referenceOf(const Inputs& in, shoal_op_t op) {
  const size_t count = in.empty() ? 0 : in[0].size();
  std::vector<float> out(count);
  for (size_t i = 0; i < count; ++i) {
    long double sum = 0;
    for (const std::vector<float>& x : in) sum += x[i];
    if (op == SHOAL_AVG) sum /= int(in.size());
    out[i] = float(sum);
  }
  return out;
}

// One compressed allreduce (out of place) on this rank of `input`; checks the
// output bits against expected (so every rank holds the same bits) and that
// the input is untouched; rank 0 copies its stats to *stats.
void runOneInput(shoal_comm_t comm, int rank, const std::vector<float>& input, const std::string& options,
                 shoal_op_t op, const std::vector<float>& expected, const std::string& what,
                 shoal_compress_stats_t* stats) {
  const size_t count = input.size();
  std::vector<float> in = input, out(count, 12345.0f);
  shoal_allreduce_options_t opts = SHOAL_ALLREDUCE_OPTIONS_INIT;
  opts.compressor = "sketch";
  opts.compressor_options = options.c_str();
  opts.compress_min_bytes = 0;
  shoal_tensor_t tin = shoal_tensor_1d(in.data(), count, SHOAL_F32);
  shoal_tensor_t tout = shoal_tensor_1d(out.data(), count, SHOAL_F32);
  shoal_status_t status = shoal_allreduce_tensor(comm, &tin, &tout, op, &opts);
  ASSERT_EQ(status, SHOAL_OK) << what << ": " << shoal_last_error(comm);
  size_t bad = 0;
  for (size_t i = 0; i < count; ++i) {
    if (bitsOf(out[i]) != bitsOf(expected[i])) {
      if (++bad <= 3)
        ADD_FAILURE() << what << ", rank " << rank << ", element " << i << ": got " << out[i] << " (0x" << std::hex
                      << bitsOf(out[i]) << "), want " << expected[i] << " (0x" << bitsOf(expected[i]) << std::dec
                      << ")";
    }
  }
  EXPECT_EQ(bad, 0u) << what << ", rank " << rank;
  EXPECT_TRUE(in == input) << what << ": input modified";
  if (rank == 0 && count > 0 && stats != nullptr) {
    EXPECT_EQ(shoal_last_compress_stats(comm, stats), SHOAL_OK);
    EXPECT_STREQ(stats->compressor, "sketch") << what;
  }
}

// runOneInput on this rank's input generated by gen.
void runOne(shoal_comm_t comm, int rank, size_t count, const Gen& gen, const std::string& options, shoal_op_t op,
            const std::vector<float>& expected, const std::string& what, shoal_compress_stats_t* stats) {
  std::vector<float> in(count);
  for (size_t i = 0; i < count; ++i) in[i] = gen(rank, i);
  runOneInput(comm, rank, in, options, op, expected, what, stats);
}

struct Result {
  shoal_compress_stats_t stats = SHOAL_COMPRESS_STATS_INIT;
};

// runOne on n fresh ranks; returns rank 0's stats.
Result check(int n, size_t count, const Gen& gen, const std::string& options, shoal_op_t op,
             const std::vector<float>& expected, const std::string& what) {
  Result result;
  runRanks(n, [&](int rank, shoal_comm_t comm) {
    runOne(comm, rank, count, gen, options, op, expected, what, &result.stats);
  });
  return result;
}

const char* kModes[] = {"values=auto", "values=compact", "values=sketch", "values=dense"};

TEST(Sketch, ExactOverDensitiesOverlapsRanksAndModes) {
  const double densities[] = {0.00001, 0.001, 0.01, 0.1, 0.5, 1.0};
  const Overlap overlaps[] = {Overlap::Identical, Overlap::Disjoint, Overlap::Independent};
  const size_t count = 20011;
  struct Case {
    std::shared_ptr<const Inputs> inputs;  // shared by sum and avg, read by every mode
    shoal_op_t op;
    std::vector<float> expected;
    std::string what;
  };
  for (int n : {1, 2, 3, 5, 8}) {
    std::vector<Case> cases;
    for (double density : densities)
      for (Overlap overlap : overlaps) {
        Gen gen = sparseGen(hash3(n, uint64_t(density * 1e6), int(overlap)), n, density, overlap);
        const std::shared_ptr<const Inputs> inputs = inputsOf(gen, n, count);
        for (shoal_op_t op : {SHOAL_SUM, SHOAL_AVG}) {
          if (op == SHOAL_AVG && (n & (n - 1)) != 0) continue;  // long double avg is exact only for 2^k ranks
          cases.push_back({inputs, op, referenceOf(*inputs, op),
                           std::to_string(n) + " ranks, density " + std::to_string(density) + ", overlap " +
                               std::to_string(int(overlap)) + (op == SHOAL_AVG ? ", avg" : ", sum")});
        }
      }
    // One communicator set per rank count; every case and mode in turn.
    runRanks(n, [&](int rank, shoal_comm_t comm) {
      for (const Case& c : cases)
        for (const char* mode : kModes)
          runOneInput(comm, rank, (*c.inputs)[rank], mode, c.op, c.expected, c.what + ", " + mode, nullptr);
    });
  }
}

TEST(Sketch, QuarterValuesDenseAndAvgAnyRankCount) {
  // Multiples of 1/4 in +-[0.5, 8]: exact f32 sums, so values=dense really goes dense;
  // avg is checked for 3 and 5 ranks too, against the exact sum / n rounded once
  // (computed in double from an exact sum: one rounding to double, then to f32,
  // can only differ at an exact f32 midpoint, which sum/3 and sum/5 never hit).
  for (int n : {1, 2, 3, 5, 8}) {
    Gen gen = [](int r, size_t i) -> float {
      int q = int(hash3(7, r, i) % 31) + 2;  // 2..32 quarters
      return ((hash3(8, r, i) & 1) ? -0.25f : 0.25f) * float(q);
    };
    const size_t count = 4099;
    for (shoal_op_t op : {SHOAL_SUM, SHOAL_AVG}) {
      std::vector<float> expected = reference(gen, n, count, op);
      for (const char* mode : kModes) {
        Result r = check(n, count, gen, mode, op, expected, std::to_string(n) + " ranks quarter " + mode);
        if (std::string(mode) == "values=dense" || std::string(mode) == "values=auto") {
          EXPECT_EQ(r.stats.payload_bytes, (count + 63) / 64 * 8 + kStatsBytes + count * 4) << mode;  // index + dense f32
        }
      }
    }
  }
}

TEST(Sketch, AvgOneLimbAnyRankCount) {
  // Exponents in [-10, 10]: one limb (span ~45 bits) with large fixed-point sums,
  // avg over 3, 5, 7 ranks: the long double quotient of a < 60-bit exact sum is
  // never within 2^-64 of an f32 midpoint unless it is one, so the reference
  // rounds once too.
  for (int n : {3, 5, 7}) {
    Gen gen = sparseGen(hash3(21, n, 0), n, 0.3, Overlap::Independent, -10, 10);
    const size_t count = 30011;
    std::vector<float> expected = reference(gen, n, count, SHOAL_AVG);
    runRanks(n, [&](int rank, shoal_comm_t comm) {
      for (const char* mode : kModes)
        runOne(comm, rank, count, gen, mode, SHOAL_AVG, expected, std::to_string(n) + " ranks avg " + mode, nullptr);
    });
  }
}

TEST(Sketch, SizesZeroOneAndLarge) {
  // One communicator set per rank count; each large input generated once and
  // run in both modes.
  const size_t big = 1000003;
  for (int n : {1, 2, 3}) {
    Gen tinyGen = [](int r, size_t) -> float { return float(r + 1) * 0.75f; };
    struct Case {
      std::shared_ptr<const Inputs> inputs;
      std::vector<float> expected;
      std::vector<const char*> modes;
      std::string what;
    };
    std::vector<Case> cases;
    for (size_t count : {size_t(0), size_t(1)}) {
      auto inputs = inputsOf(tinyGen, n, count);
      cases.push_back({inputs, referenceOf(*inputs, SHOAL_SUM), {std::begin(kModes), std::end(kModes)}, "tiny"});
    }
    if (n >= 2)
      for (double density : {0.00001, 0.01, 1.0}) {
        Gen gen = sparseGen(hash3(99, n, uint64_t(density * 1e6)), n, density, Overlap::Independent);
        auto inputs = inputsOf(gen, n, big);
        cases.push_back({inputs, referenceOf(*inputs, SHOAL_SUM), {"values=auto", "values=sketch"},
                         "1000003, density " + std::to_string(density)});
      }
    runRanks(n, [&](int rank, shoal_comm_t comm) {
      for (const Case& c : cases)
        for (const char* mode : c.modes)
          runOneInput(comm, rank, (*c.inputs)[rank], mode, SHOAL_SUM, c.expected, c.what + " " + mode, nullptr);
    });
  }
}

TEST(Sketch, TinyNextToHugeAcrossTheF32Range) {
  // One tensor holding values from the smallest subnormal to FLT_MAX: many limbs.
  const float values[] = {std::numeric_limits<float>::denorm_min(), 1e-30f, 3.0e38f, -2.5e-7f, 1.0f, 0x1.fffffep127f,
                          -0x1.fffffep127f, 1e-45f, 7.0f};
  const size_t count = sizeof values / sizeof values[0];
  for (int n : {1, 2, 3, 5}) {
    Gen gen = [&](int r, size_t i) -> float { return (r % 2 == 0 || i % 3 == 0) ? values[i] : 0.0f; };
    std::vector<float> expected(count);
    for (size_t i = 0; i < count; ++i) {
      int k = 0;
      for (int r = 0; r < n; ++r) k += gen(r, i) != 0.0f;
      // k copies of the same value: k * v exactly, rounded once (overflow -> inf).
      expected[i] = float(static_cast<long double>(values[i]) * k);
    }
    for (const char* mode : kModes)
      check(n, count, gen, mode, SHOAL_SUM, expected, std::to_string(n) + " ranks wide range " + mode);
  }
}

TEST(Sketch, RoundsOnceBeyondLongDouble) {
  // Coordinate 0: 1 + 2^-24 + 2^-80 (3 ranks). The exact sum lies just above the
  // midpoint between 1 and 1 + 2^-23: rounded once it is 1 + 2^-23 (a long
  // double sum would round 2^-80 away and then tie to even: 1).
  // Coordinate 1: 1 + 2^-24 exactly: a tie, to even: 1.
  // Coordinate 2: 2^-149 * 3 (subnormals add exactly): 3 * 2^-149.
  // Coordinate 3: FLT_MAX + 2^103 (= half an ulp of FLT_MAX): ties to even -> inf.
  // Coordinate 4: FLT_MAX + 2^103 - 2^-149: below the midpoint: FLT_MAX.
  const float maxf = 0x1.fffffep127f;
  const float v[5][3] = {{1.0f, 0x1p-24f, 0x1p-80f},
                         {1.0f, 0x1p-24f, 0.0f},
                         {0x1p-149f, 0x1p-149f, 0x1p-149f},
                         {maxf, 0x1p103f, 0.0f},
                         {maxf, 0x1p103f, -0x1p-149f}};
  const std::vector<float> expected = {1.0f + 0x1p-23f, 1.0f, 3 * 0x1p-149f, std::numeric_limits<float>::infinity(),
                                       maxf};
  Gen gen = [&](int r, size_t i) -> float { return v[i][r]; };
  for (const char* mode : kModes) check(3, 5, gen, mode, SHOAL_SUM, expected, std::string("beyond long double ") + mode);
  // avg with 3 ranks of 1, 1, 2^-60: (2 + 2^-60) / 3 rounded once.
  Gen gen2 = [](int r, size_t) -> float { return r < 2 ? 1.0f : 0x1p-60f; };
  const float want = float((2.0L + 0x1p-60L) / 3.0L);  // 2/3 + tiny: far from a midpoint
  for (const char* mode : kModes) check(3, 1, gen2, mode, SHOAL_AVG, {want}, std::string("avg ") + mode);
}

TEST(Sketch, InfAndNan) {
  const float inf = std::numeric_limits<float>::infinity();
  // rank 0 / rank 1 values per coordinate.
  const float v[6][2] = {{inf, 1.0f}, {-inf, 0.0f}, {inf, -inf}, {NAN, 2.0f}, {3.0f, 4.0f}, {0.0f, 0.0f}};
  Gen gen = [&](int r, size_t i) -> float { return v[i][r]; };
  for (const char* mode : kModes) {
    runRanks(2, [&](int rank, shoal_comm_t comm) {
      std::vector<float> in(6), out(6);
      for (size_t i = 0; i < 6; ++i) in[i] = gen(rank, i);
      shoal_allreduce_options_t opts = SHOAL_ALLREDUCE_OPTIONS_INIT;
      opts.compressor = "sketch";
      opts.compressor_options = mode;
      opts.compress_min_bytes = 0;
      shoal_tensor_t tin = shoal_tensor_1d(in.data(), 6, SHOAL_F32), tout = shoal_tensor_1d(out.data(), 6, SHOAL_F32);
      ASSERT_EQ(shoal_allreduce_tensor(comm, &tin, &tout, SHOAL_SUM, &opts), SHOAL_OK) << shoal_last_error(comm);
      EXPECT_EQ(out[0], inf) << mode;
      EXPECT_EQ(out[1], -inf) << mode;
      // +Inf meeting -Inf, and a NaN: decodeSpecial's NaN in every mode (values=dense included:
      // beside an Inf/NaN the dense data never travels, whose IEEE sum would give the FPU's NaN).
      EXPECT_EQ(bitsOf(out[2]), 0x7fc00000u) << mode;
      EXPECT_EQ(bitsOf(out[3]), 0x7fc00000u) << mode;
      EXPECT_EQ(out[4], 7.0f) << mode;
      EXPECT_EQ(bitsOf(out[5]), 0u) << mode;
    });
  }
}

TEST(Sketch, ForcedLeftoversStayExact) {
  // cells_per_item=1.1 is below the peeling threshold (~1.222): with tens of
  // thousands of members peeling stalls, and the stalled members travel in a
  // third round. Still exact.
  for (int n : {2, 3}) {
    const size_t count = 200003;
    Gen gen = sparseGen(hash3(5, 5, n), n, 0.2, Overlap::Independent);
    std::vector<float> expected = reference(gen, n, count, SHOAL_SUM);
    Result r = check(n, count, gen, "values=sketch,cells_per_item=1.1", SHOAL_SUM, expected, "leftovers");
    EXPECT_EQ(r.stats.rounds, 3) << "expected the index, sketch and leftover rounds";
    // With ample cells, peeling completes: two rounds.
    r = check(n, count, gen, "values=sketch,cells_per_item=2", SHOAL_SUM, expected, "no leftovers");
    EXPECT_EQ(r.stats.rounds, 2);
  }
}

TEST(Sketch, SeveralStepsVaryTheSeed) {
  // Same communicator, several calls (op->step changes the hash seed), small |U|
  // where stalls are likely with 1.1 cells per item: exact every time.
  const size_t count = 1000;
  runRanks(3, [&](int rank, shoal_comm_t comm) {
    for (int step = 0; step < 20; ++step) {
      Gen gen = sparseGen(hash3(11, step, 0), 3, 0.02, Overlap::Independent);
      std::vector<float> expected = reference(gen, 3, count, SHOAL_SUM);
      std::vector<float> in(count), out(count);
      for (size_t i = 0; i < count; ++i) in[i] = gen(rank, i);
      shoal_allreduce_options_t opts = SHOAL_ALLREDUCE_OPTIONS_INIT;
      opts.compressor = "sketch";
      opts.compressor_options = "values=sketch,cells_per_item=1.1";
      opts.compress_min_bytes = 0;
      shoal_tensor_t tin = shoal_tensor_1d(in.data(), count, SHOAL_F32);
      shoal_tensor_t tout = shoal_tensor_1d(out.data(), count, SHOAL_F32);
      ASSERT_EQ(shoal_allreduce_tensor(comm, &tin, &tout, SHOAL_SUM, &opts), SHOAL_OK) << shoal_last_error(comm);
      for (size_t i = 0; i < count; ++i) ASSERT_EQ(bitsOf(out[i]), bitsOf(expected[i])) << "step " << step << " i " << i;
    }
  });
}

TEST(Sketch, PayloadSmallerThanDenseAtOnePercent) {
  const size_t count = 100003;
  for (int n : {2, 5}) {
    Gen gen = sparseGen(hash3(3, 3, n), n, 0.01, Overlap::Identical);
    std::vector<float> expected = reference(gen, n, count, SHOAL_SUM);
    for (const char* mode : {"values=auto", "values=compact", "values=sketch"}) {
      Result r = check(n, count, gen, mode, SHOAL_SUM, expected, std::string("payload ") + mode);
      EXPECT_LT(r.stats.payload_bytes, count * 4 / 4) << mode << ": not 4x smaller than dense f32";
      EXPECT_GT(r.stats.payload_bytes, 0u);
    }
  }
}

TEST(Sketch, BloomIndexExactOverDensitiesRanksAndModes) {
  // index=bloom sized for the density it gets, and for one far below it (a
  // saturated filter: many false positives), in every values= mode: exact.
  const size_t count = 30011;
  for (int n : {1, 2, 3, 5, 17}) {
    std::vector<std::string> options;
    for (const char* mode : kModes)
      for (const char* index : {"index=bloom,expected_density=0.01", "index=bloom,expected_density=0.00001"})
        options.push_back(std::string(mode) + "," + index);
    std::vector<std::pair<std::shared_ptr<const Inputs>, std::vector<float>>> cases;
    for (double density : {0.00001, 0.001, 0.01, 0.1})
      for (Overlap overlap : {Overlap::Identical, Overlap::Independent}) {
        Gen gen = sparseGen(hash3(n, uint64_t(density * 1e6), 40 + int(overlap)), n, density, overlap);
        const std::shared_ptr<const Inputs> inputs = inputsOf(gen, n, count);
        cases.emplace_back(inputs, referenceOf(*inputs, SHOAL_SUM));
      }
    runRanks(n, [&](int rank, shoal_comm_t comm) {
      for (size_t c = 0; c < cases.size(); ++c)
        for (const std::string& o : options)
          runOneInput(comm, rank, (*cases[c].first)[rank], o, SHOAL_SUM, cases[c].second,
                      std::to_string(n) + " ranks, case " + std::to_string(c) + ", " + o, nullptr);
    });
  }
}

TEST(Sketch, BloomFalsePositivesDecodeToExactZeros) {
  // A filter sized for 10 members holding ~3000: most probed coordinates are
  // false positives. They travel as members (the compact payload says how
  // many) and every one of them comes back +0.
  const int n = 3;
  const size_t count = 100003;
  Gen gen = sparseGen(hash3(12, 34, 56), n, 0.01, Overlap::Independent, -12, 12);  // one limb
  size_t unionSize = 0;
  for (size_t i = 0; i < count; ++i) {
    bool any = false;
    for (int r = 0; r < n; ++r) any = any || gen(r, i) != 0.0f;
    unionSize += any;
  }
  std::vector<float> expected = reference(gen, n, count, SHOAL_SUM);  // +0 off the union
  Result r = check(n, count, gen, "values=compact,index=bloom,expected_density=0.0001", SHOAL_SUM, expected, "bloom fp");
  const shoal::sketch::BloomGeometry b = shoal::sketch::bloomGeometry(count, 0.0001, 0);
  ASSERT_GT(b.words, 0u);
  // payload = filter + the stats' codes + one limb (values here need one) per member.
  const size_t members = (r.stats.payload_bytes - 8 * b.words - kStatsBytes) / 8;
  EXPECT_GT(members, unionSize + 1000) << "expected many false positives";
  EXPECT_LT(b.words * 64, count / 10) << "the filter should be far smaller than the bitmap";
  // Sized right, the filter costs < 1/5 of the bitmap and adds few members.
  r = check(n, count, gen, "values=compact,index=bloom,expected_density=0.03", SHOAL_SUM, expected, "bloom sized");
  const shoal::sketch::BloomGeometry sized = shoal::sketch::bloomGeometry(count, 0.03, 0);
  ASSERT_GT(sized.words, 0u);
  const size_t sizedMembers = (r.stats.payload_bytes - 8 * sized.words - kStatsBytes) / 8;
  EXPECT_GE(sizedMembers, unionSize);
  EXPECT_LT(sizedMembers, unionSize + unionSize / 5);
}

TEST(Sketch, SeventeenRanksBitmap) {
  const size_t count = 10007;
  const int n = 17;
  std::vector<std::pair<std::shared_ptr<const Inputs>, std::vector<float>>> cases;
  for (double density : {0.001, 0.1, 1.0})
    for (Overlap overlap : {Overlap::Identical, Overlap::Disjoint, Overlap::Independent}) {
      Gen gen = sparseGen(hash3(17, uint64_t(density * 1e6), int(overlap)), n, density, overlap, -12, 12);
      const std::shared_ptr<const Inputs> inputs = inputsOf(gen, n, count);
      cases.emplace_back(inputs, referenceOf(*inputs, SHOAL_SUM));
    }
  runRanks(n, [&](int rank, shoal_comm_t comm) {
    for (size_t c = 0; c < cases.size(); ++c)
      for (const char* mode : kModes)
        runOneInput(comm, rank, (*cases[c].first)[rank], mode, SHOAL_SUM, cases[c].second,
                    "17 ranks, case " + std::to_string(c) + ", " + mode, nullptr);
  });
}

TEST(Sketch, OptionsRefusedWithText) {
  runRanks(2, [](int, shoal_comm_t comm) {
    float data[4] = {1, 2, 3, 4};
    shoal_tensor_t t = shoal_tensor_1d(data, 4, SHOAL_F32);
    shoal_allreduce_options_t opts = SHOAL_ALLREDUCE_OPTIONS_INIT;
    opts.compressor = "sketch";
    opts.compress_min_bytes = 0;
    for (const char* bad : {"values=fast", "cells_per_item=1.0", "cells_per_item=abc", "cells_per_item=", "bogus=1",
                            "index=tree", "expected_density=0", "expected_density=1.5", "ratio=1",
                            "ratio=x", "cells=f16", "scan=sse2", "scan="}) {
      opts.compressor_options = bad;
      EXPECT_EQ(shoal_allreduce_tensor(comm, &t, &t, SHOAL_SUM, &opts), SHOAL_ERR_INVALID_ARGUMENT) << bad;
      std::string key = std::string(bad).substr(0, std::string(bad).find('='));
      EXPECT_NE(std::string(shoal_last_error(comm)).find(key), std::string::npos) << shoal_last_error(comm);
    }
    opts.compressor_options = "values=compact,cells_per_item=1.5";
    EXPECT_EQ(shoal_allreduce_tensor(comm, &t, &t, SHOAL_SUM, &opts), SHOAL_OK) << shoal_last_error(comm);
    EXPECT_EQ(data[3], 8.0f);
  });
}

// scan= picks round 0's scan path (every path gives the same bits; the option, like every
// compressor option, must agree between ranks): each path this CPU has gives the exact sum in
// every mode; one it lacks is refused with SHOAL_ERR_UNSUPPORTED and text.
TEST(Sketch, EveryScanPathExactAndOneTheCpuLacksRefused) {
  using shoal::sketch::ScanPath;
  using shoal::sketch::scanPathAvailable;
  const size_t count = 20011;
  std::vector<std::string> paths = {"auto"};
  for (ScanPath path : shoal::sketch::kScanPaths)
    if (scanPathAvailable(path)) paths.push_back(shoal::sketch::scanPathName(path));
  for (double density : {0.001, 0.05, 0.5}) {
    Gen gen = sparseGen(hash3(7, uint64_t(density * 1e6), 1), 3, density, Overlap::Independent);
    const std::shared_ptr<const Inputs> inputs = inputsOf(gen, 3, count);
    const std::vector<float> expected = referenceOf(*inputs, SHOAL_SUM);
    runRanks(3, [&](int rank, shoal_comm_t comm) {
      for (const std::string& path : paths)
        for (const char* mode : kModes) {
          const std::string options = std::string(mode) + ",scan=" + path;
          runOneInput(comm, rank, (*inputs)[rank], options, SHOAL_SUM, expected,
                      "density " + std::to_string(density) + ", " + options, nullptr);
        }
    });
  }
  std::printf("scan paths run: ");
  for (const std::string& p : paths) std::printf(" %s", p.c_str());
  std::printf("\n");
  for (ScanPath path : shoal::sketch::kScanPaths) {
    if (scanPathAvailable(path)) continue;
    const std::string name = shoal::sketch::scanPathName(path);
    CompressorRounds run(shoal::compressors::sketch(), 1);
    EXPECT_EQ(run.create({{"scan", name}}), SHOAL_ERR_UNSUPPORTED) << name;
    EXPECT_NE(std::string(run.error(0)).find("lacks"), std::string::npos) << run.error(0);
  }
}

TEST(Sketch, TableDeclaresExactLossless) {
  const shoal_compressor_t* table = nullptr;
  ASSERT_EQ(shoal_compressor_lookup("sketch", &table), SHOAL_OK);
  EXPECT_EQ(table->error_kind, SHOAL_ERROR_EXACT);
  EXPECT_TRUE(table->caps & SHOAL_CAP_LOSSLESS);
  EXPECT_TRUE(table->caps & SHOAL_CAP_HOMOMORPHIC);
  EXPECT_EQ(table->dtypes, 1u << SHOAL_F32);
}

// Round 0 is one exchange with the peers: the statistics travel in the index's
// OR allreduce (before: a second, MAX, allreduce of 24 bytes a tensor), a second
// payload only for ratio='s pre-sized sketch; in the pipelined path one index
// payload a chunk.
TEST(Sketch, RoundZeroIsOneExchange) {
  struct Case {
    const char* options;
    size_t count;
    int payloads;
  };
  for (const Case& c : {Case{"values=auto", 5000, 1}, Case{"index=bloom", 5000, 1}, Case{"ratio=20", 5000, 2},
                        Case{"chunk=64", 1000, 1}}) {
    CompressorRounds run(shoal::compressors::sketch(), 2);
    ASSERT_EQ(run.create(shoal::test::optionPairs(c.options)), SHOAL_OK) << run.error(0);
    std::vector<int> roundZero(2, -1);
    run.observe([&](int rank, const shoal_round_t& round) {
      if (round.index == 0 && !round.done) roundZero[rank] = round.num_payloads;
      for (int p = 0; p < (round.done ? 0 : round.num_payloads); ++p)
        if (round.payloads[p].op == SHOAL_MAX) ADD_FAILURE() << c.options << ": a MAX payload in round " << round.index;
    });
    auto fill = [&](int r, int, void* data) {
      auto* x = static_cast<float*>(data);
      for (size_t i = 0; i < c.count; ++i) x[i] = (i + size_t(r)) % 5 == 0 ? float(int(i % 9) - 4 + r) * 0.5f : 0.0f;
    };
    ASSERT_EQ(run.start({{SHOAL_F32, {int64_t(c.count)}, ""}}, SHOAL_SUM, 0, fill), SHOAL_OK) << run.error(0);
    ASSERT_EQ(run.run(nullptr, 16), SHOAL_OK) << run.error(run.failedRank());
    for (int r = 0; r < 2; ++r) EXPECT_EQ(roundZero[r], c.payloads) << c.options << ", rank " << r;
  }
}

// The statistics' codes: the OR of any ranks' codes decodes to the MAX of their
// words, for every pair of honest words; a code with a gap is refused.
TEST(Sketch, StatisticsCodesOrToTheMax) {
  using namespace shoal::compressors::sketch_impl;
  const size_t words = statsCodeWords(3);
  auto codeOf = [&](uint64_t top, uint64_t lowest, uint64_t nonfinite) {
    const uint64_t w[3] = {top, lowest, nonfinite};
    std::vector<uint64_t> code(words);
    encodeStatsCodes(w, 3, code.data());
    return code;
  };
  std::vector<uint64_t> tops = {0}, lowests = {0};
  for (int e = -149; e <= 127; ++e) tops.push_back(uint64_t(e + 200)), lowests.push_back(uint64_t(200 - e));
  char why[200];
  for (size_t a = 0; a < tops.size(); ++a)
    for (size_t b = 0; b < tops.size(); ++b) {
      std::vector<uint64_t> x = codeOf(tops[a], lowests[b], a % 2), y = codeOf(tops[b], lowests[a], b % 3 == 0);
      for (size_t i = 0; i < words; ++i) x[i] |= y[i];
      uint64_t w[3];
      ASSERT_TRUE(decodeStatsCodes(x.data(), 3, w, why, sizeof why)) << why;
      ASSERT_EQ(w[0], std::max(tops[a], tops[b]));
      ASSERT_EQ(w[1], std::max(lowests[a], lowests[b]));
      ASSERT_EQ(w[2], uint64_t(a % 2 || b % 3 == 0));
    }
  std::vector<uint64_t> gap = codeOf(200 + 100, 200, 0);
  gap[0] &= ~uint64_t(4);  // bit 2 cleared below set bits
  uint64_t w[3];
  EXPECT_FALSE(decodeStatsCodes(gap.data(), 3, w, why, sizeof why));
  EXPECT_NE(std::string(why).find("top"), std::string::npos) << why;
  std::vector<uint64_t> stray = codeOf(200, 200 + 3, 0);
  stray[2 * kThermometerWords - 1] |= uint64_t(1) << 63;  // a bit far above the lowest word's run
  EXPECT_FALSE(decodeStatsCodes(stray.data(), 3, w, why, sizeof why));
  EXPECT_NE(std::string(why).find("lowest"), std::string::npos) << why;
}

// The table driven directly, n ranks simulated in lockstep (harness/compressor_rounds.h:
// payloads reduced with shoal's Reducer in rank order: u64 sums wrap, f32 sums, BOR,
// MAX), with a fused call of several tensors that take different paths in one
// operation: dense (quarter values), compact, empty, wide range (several limbs), Inf,
// count 0. Every rank runs on one instance, or on perRank[r] (created by the caller
// with the same options); *rounds is the collective rounds the call took.
void simulate(const char* options, int n, shoal_op_t reduceOp, const std::vector<std::vector<Gen>>& gens,
              const std::vector<size_t>& counts, std::vector<std::vector<float>>* outputs, int* rounds,
              const std::vector<void*>* perRank = nullptr) {
  const shoal_compressor_t* table = nullptr;
  ASSERT_EQ(shoal_compressor_lookup("sketch", &table), SHOAL_OK);
  std::vector<const char*> kp, vp;
  const auto pairs = shoal::test::optionPairs(options);
  for (const auto& [key, value] : pairs) kp.push_back(key.c_str()), vp.push_back(value.c_str());
  char err[256] = {};
  shoal_compressor_params_t params{sizeof params, int(kp.size()), kp.data(), vp.data(), nullptr, err, sizeof err};
  void* instance = nullptr;
  ASSERT_EQ(table->create(&params, &instance), SHOAL_OK) << err;
  std::unique_ptr<void, void (*)(void*)> shared(instance, table->destroy);
  CompressorRounds run(table, n);
  run.useInstances(perRank ? *perRank : std::vector<void*>(n, instance));
  run.observe([&](int rank, const shoal_round_t& round) {
    for (int p = 0; p < (round.done ? 0 : round.num_payloads); ++p) {
      const shoal_payload_t& payload = round.payloads[p];
      EXPECT_EQ(payload.collective, SHOAL_COLLECTIVE_ALLREDUCE) << "rank " << rank << " round " << round.index;
      if (payload.dtype == SHOAL_F32) EXPECT_EQ(payload.op, SHOAL_SUM);
      else EXPECT_TRUE(payload.dtype == SHOAL_U64 && (payload.op == SHOAL_SUM || payload.op == SHOAL_BOR ||
                                                      payload.op == SHOAL_MAX));
    }
  });
  std::vector<CompressorRounds::TensorSpec> specs;
  for (size_t count : counts) specs.push_back({SHOAL_F32, {int64_t(count)}, ""});
  auto fill = [&](int r, int t, void* data) {
    auto* values = static_cast<float*>(data);
    for (size_t i = 0; i < counts[t]; ++i) values[i] = gens[t][0](r, i);
  };
  shoal_status_t status = run.start(specs, reduceOp, 3, fill);
  if (status == SHOAL_OK) status = run.run(nullptr, 16);  // chunk= takes up to 10 rounds
  ASSERT_EQ(status, SHOAL_OK) << run.error(run.failedRank());
  *rounds = run.rounds();
  outputs->clear();
  for (int t = 0; t < int(counts.size()); ++t) {
    for (int r = 1; r < n; ++r) ASSERT_TRUE(run.outputAs<float>(r, t) == run.outputAs<float>(0, t));
    outputs->push_back(run.outputAs<float>(0, t));
  }
}

TEST(Sketch, FusedTensorsThroughTheTable) {
  const int n = 4;
  Gen quarters = [](int r, size_t i) -> float { return 0.25f * float(int(hash3(1, r, i) % 64) - 32); };
  Gen sparse = sparseGen(77, n, 0.01, Overlap::Independent);
  Gen empty = [](int, size_t) -> float { return 0.0f; };
  Gen wide = [](int r, size_t i) -> float { return i % 2 ? 0x1p-140f * float(r + 1) : 0x1p120f * float(r + 1); };
  Gen inf = [](int r, size_t i) -> float { return i == 3 && r == 1 ? std::numeric_limits<float>::infinity() : 1.5f; };
  const std::vector<std::vector<Gen>> gens = {{quarters}, {sparse}, {empty}, {wide}, {inf}, {empty}};
  const std::vector<size_t> counts = {1000, 5000, 300, 64, 10, 0};
  for (const char* options : {"values=auto", "values=sketch,cells_per_item=1.1", "values=compact"}) {
    for (shoal_op_t op : {SHOAL_SUM, SHOAL_AVG}) {
      std::vector<std::vector<float>> outputs;
      int rounds = 0;
      simulate(options, n, op, gens, counts, &outputs, &rounds);
      if (HasFatalFailure()) return;
      ASSERT_EQ(outputs.size(), counts.size());
      EXPECT_GE(rounds, 2);
      for (size_t t = 0; t < counts.size(); ++t) {
        std::vector<float> want = reference(gens[t][0], n, counts[t], op);
        for (size_t i = 0; i < counts[t]; ++i)
          ASSERT_EQ(bitsOf(outputs[t][i]), bitsOf(want[i])) << options << " tensor " << t << " element " << i;
      }
    }
  }
}

TEST(SketchMath, OneLimbFastPathMatchesBigPath) {
  // decodeOneLimb (128-bit) against the 512-bit path, sum and avg, over scales
  // that reach subnormals, overflow and zero.
  for (uint64_t s = 0; s < 200000; ++s) {
    int64_t S = int64_t(mix64(s)) >> (mix64(s + 1) % 64);
    int Q = int(mix64(s + 2) % 400) - 260;
    int n = 1 + int(mix64(s + 3) % 9);
    shoal::sketch::Big b;
    shoal::sketch::bigZero(b);
    shoal::sketch::bigAddShifted(b, S, 0);
    bool negative = shoal::sketch::bigNegative(b);
    if (negative) shoal::sketch::bigNegate(b);
    bool sticky = false;
    int q = Q;
    if (n > 1 && shoal::sketch::bigTop(b) >= 0) {
      sticky = shoal::sketch::bigShiftDivide(b, uint64_t(n));
      q -= 64;
    }
    float slow = shoal::sketch::roundToFloat(b, q, sticky, negative);
    float fast = shoal::sketch::decodeOneLimb(S, Q, n);
    ASSERT_EQ(bitsOf(fast), bitsOf(slow)) << "S " << S << " Q " << Q << " n " << n;
    if (n == 1 || n == 2 || n == 4 || n == 8) {  // exact in long double: check the value too
      float want = float(std::ldexp(static_cast<long double>(S), Q) / n);
      if (S == 0) want = 0.0f;
      ASSERT_EQ(bitsOf(fast), bitsOf(want)) << "S " << S << " Q " << Q << " n " << n;
    }
  }
}

// The 512-bit path's rounding of S * 2^Q / n: the reference for decodeOneLimb.
float oneLimbReference(int64_t S, int Q, int n) {
  shoal::sketch::Big b;
  shoal::sketch::bigZero(b);
  shoal::sketch::bigAddShifted(b, S, 0);
  const bool negative = shoal::sketch::bigNegative(b);
  if (negative) shoal::sketch::bigNegate(b);
  bool sticky = false;
  if (n > 1 && shoal::sketch::bigTop(b) >= 0) {
    sticky = shoal::sketch::bigShiftDivide(b, uint64_t(n));
    Q -= 64;
  }
  return shoal::sketch::roundToFloat(b, Q, sticky, negative);
}

TEST(SketchMath, OneLimbNormalPathAtItsEdges) {
  // decodeOneLimb's conversion-and-scale path (sum, and avg over 2^k ranks) where its
  // rounding could go wrong: ties to even at 25 and more significant bits, the
  // smallest normal and the subnormals just below it, the largest finite values and
  // overflow, +-2^63, and every rank count up to 16 (powers of two take the conversion, others the
  // double division).
  std::vector<int64_t> sums = {1, -1, 3, (int64_t(1) << 24) + 1, (int64_t(1) << 24) + 3, (int64_t(1) << 25) + 2,
                               (int64_t(1) << 25) + 6, (int64_t(1) << 40) + (int64_t(1) << 16),
                               (int64_t(1) << 40) + (int64_t(1) << 16) + 1, (int64_t(1) << 62) - 1,
                               std::numeric_limits<int64_t>::max(), std::numeric_limits<int64_t>::min(),
                               std::numeric_limits<int64_t>::min() + 1, (int64_t(1) << 24) - 1};
  for (size_t i = 0, m = sums.size(); i < m; ++i)
    if (sums[i] != std::numeric_limits<int64_t>::min()) sums.push_back(-sums[i]);  // (-min overflows)
  int checked = 0;
  for (int64_t S : sums) {
    const int top = 63 - __builtin_clzll(S < 0 ? uint64_t(0) - uint64_t(S) : uint64_t(S));
    for (int target : {-152, -151, -150, -149, -127, -126, -125, 0, 126, 127, 128}) {
      for (int n = 1; n <= 16; ++n) {
        const int Q = target - top;
        ASSERT_EQ(bitsOf(shoal::sketch::decodeOneLimb(S, Q, n)), bitsOf(oneLimbReference(S, Q, n)))
            << "S " << S << " Q " << Q << " n " << n;
        ++checked;
      }
    }
  }
  EXPECT_EQ(checked, 27 * 11 * 16);
  // The double division near f32 midpoints: S = n * m + d for m an odd 25-bit integer (a midpoint
  // of the 24-bit grid), at scales that put it among the normals and the subnormals, for rank counts
  // up to 2^31 (from 2^29 on the 128-bit path: double's rounding could cross a midpoint there, as
  // S = 715827876, n = 536870915 would).
  for (int64_t n : {3, 5, 7, 1000003, 536870909, 536870915, 1073741827, 2147483647})
    for (int64_t m : {(int64_t(1) << 25) + 1, (int64_t(1) << 25) + 3, (int64_t(1) << 26) - 1})
      for (int d = -3; d <= 3; ++d)
        for (int Q : {0, -150, -174, 100}) {
          const int64_t S = n * m + d;
          ASSERT_EQ(bitsOf(shoal::sketch::decodeOneLimb(S, Q, int(n))), bitsOf(oneLimbReference(S, Q, int(n))))
              << "S " << S << " Q " << Q << " n " << n;
        }
  EXPECT_EQ(bitsOf(shoal::sketch::decodeOneLimb(715827876, 0, 536870915)),
            bitsOf(oneLimbReference(715827876, 0, 536870915)));
}

TEST(SketchMath, TwoLimbFastPathMatchesBigPath) {
  // decodeLimbs with K = 2 (the 128-bit path for sums and avg over 2^k ranks)
  // against the 512-bit path, over limb widths, signs, scales that reach
  // subnormals, overflow and zero, and rank counts (3, 5, ... keep the 512-bit path).
  for (uint64_t s = 0; s < 200000; ++s) {
    const int64_t S0 = int64_t(mix64(s)) >> (mix64(s + 1) % 64);
    const int64_t S1 = s % 7 == 0 ? 0 : int64_t(mix64(s + 4)) >> (mix64(s + 5) % 64);
    const int L = 32 + int(mix64(s + 6) % 32);  // 63 - ceil(log2 n) for n up to 2^31
    const int Q = int(mix64(s + 2) % 400) - 300;
    const int n = 1 + int(mix64(s + 3) % 16);
    const bool avg = (s & 1) != 0;
    shoal::sketch::Big b;
    shoal::sketch::bigZero(b);
    shoal::sketch::bigAddShifted(b, S0, 0);
    shoal::sketch::bigAddShifted(b, S1, L);
    const bool negative = shoal::sketch::bigNegative(b);
    if (negative) shoal::sketch::bigNegate(b);
    bool sticky = false;
    int q = Q;
    if (avg && n > 1 && shoal::sketch::bigTop(b) >= 0) {
      sticky = shoal::sketch::bigShiftDivide(b, uint64_t(n));
      q -= 64;
    }
    const float slow = shoal::sketch::roundToFloat(b, q, sticky, negative);
    const uint64_t limbs[2] = {uint64_t(S0), uint64_t(S1)};
    const float fast = shoal::sketch::decodeLimbs(limbs, 1, 2, L, Q, n, avg);
    ASSERT_EQ(bitsOf(fast), bitsOf(slow)) << "S0 " << S0 << " S1 " << S1 << " L " << L << " Q " << Q << " n " << n
                                          << (avg ? " avg" : " sum");
  }
}

TEST(SketchMath, RoundToFloatMatchesCastsOnIntegers) {
  // Big integers of up to 64 bits at many scales: roundToFloat == the correctly
  // rounded conversion (long double holds a 64-bit integer exactly; ldexp exact).
  for (uint64_t s = 0; s < 20000; ++s) {
    uint64_t v = mix64(s) >> (s % 64);
    int Q = int(mix64(s + 7) % 300) - 200;
    shoal::sketch::Big b;
    shoal::sketch::bigZero(b);
    shoal::sketch::bigAddShifted(b, int64_t(v >> 1), 1);
    shoal::sketch::bigAddShifted(b, int64_t(v & 1), 0);
    float got = shoal::sketch::roundToFloat(b, Q, false, false);
    float want = float(std::ldexp(static_cast<long double>(v), Q));
    ASSERT_EQ(bitsOf(got), bitsOf(want)) << "v " << v << " Q " << Q;
  }
}

}  // namespace

namespace {

// ---- ratio=R: the sketch sized in advance, sent with the index in round 0 ----

TEST(SketchRatio, OneRoundWhenItPeelsExactAlways) {
  // ratio=20: count/20 cells of one limb. At 0.05-0.2% union density the
  // sketch peels: one round (index + cells), at the default window on the
  // first call (values below 2^9) and at the last agreed scale on the second.
  // Overloaded (10% density) it leaves leftovers: a second round, still exact.
  const size_t count = 100003;
  for (int n : {1, 2, 3, 5, 8}) {
    struct Case {
      Gen gen;
      std::vector<float> expected;
      double density;
    };
    std::vector<Case> cases;
    for (double density : {0.0005, 0.002, 0.1}) {
      Gen gen = sparseGen(hash3(n, uint64_t(density * 1e6), 77), n, density, Overlap::Identical, -10, 5);
      cases.push_back({gen, reference(gen, n, count, SHOAL_SUM), density});
    }
    runRanks(n, [&](int rank, shoal_comm_t comm) {
      for (const Case& c : cases) {
        shoal_compress_stats_t first = SHOAL_COMPRESS_STATS_INIT, second = SHOAL_COMPRESS_STATS_INIT;
        const std::string what = std::to_string(n) + " ranks, density " + std::to_string(c.density);
        runOne(comm, rank, count, c.gen, "ratio=20", SHOAL_SUM, c.expected, what + ", first call", &first);
        runOne(comm, rank, count, c.gen, "ratio=20", SHOAL_SUM, c.expected, what + ", second call", &second);
        if (rank != 0) continue;
        if (c.density < 0.01) {
          // index (count / 8 bytes) + cells (8 bytes each, count / 20) + stats: 7x below dense.
          EXPECT_EQ(second.payload_bytes, first.payload_bytes) << what << ": sizes follow from options and shape";
          EXPECT_LT(first.payload_bytes, count * 4 / 7) << what;
          EXPECT_EQ(first.rounds, 1) << what;
          EXPECT_EQ(second.rounds, 1) << what;
        } else {
          EXPECT_EQ(second.rounds, 2) << what << ": an overloaded sketch needs the leftover round";
        }
      }
    });
  }
}

TEST(SketchRatio, ScaleChangeFallsBackLosslessly) {
  // Second call's values are 2^20 larger (above the guessed top) and then 2^-40
  // smaller (below the guessed lowest bit): round 0's statistics show the
  // cells cannot hold them, and the values travel compact in round 2. Then
  // Inf in a pre-sized tensor: also a fallback.
  const size_t count = 50021;
  const int n = 3;
  Gen base = sparseGen(hash3(1, 2, 3), n, 0.001, Overlap::Independent, -5, 5);
  Gen big = [&](int r, size_t i) { return base(r, i) * 0x1p20f; };
  Gen tiny = [&](int r, size_t i) { return base(r, i) * 0x1p-40f; };
  Gen inf = [&](int r, size_t i) { return i == 17 && r == 1 ? std::numeric_limits<float>::infinity() : base(r, i); };
  std::vector<float> infExpected = reference(base, n, count, SHOAL_SUM);
  infExpected[17] = std::numeric_limits<float>::infinity();
  runRanks(n, [&](int rank, shoal_comm_t comm) {
    shoal_compress_stats_t stats = SHOAL_COMPRESS_STATS_INIT;
    runOne(comm, rank, count, base, "ratio=50", SHOAL_SUM, reference(base, n, count, SHOAL_SUM), "base", &stats);
    runOne(comm, rank, count, base, "ratio=50", SHOAL_SUM, reference(base, n, count, SHOAL_SUM), "base again", &stats);
    if (rank == 0) EXPECT_EQ(stats.rounds, 1);
    runOne(comm, rank, count, big, "ratio=50", SHOAL_SUM, reference(big, n, count, SHOAL_SUM), "big", &stats);
    if (rank == 0) EXPECT_EQ(stats.rounds, 2) << "values above the guess must fall back";
    runOne(comm, rank, count, tiny, "ratio=50", SHOAL_SUM, reference(tiny, n, count, SHOAL_SUM), "tiny", &stats);
    if (rank == 0) EXPECT_EQ(stats.rounds, 2) << "values below the guess must fall back";
    runOne(comm, rank, count, inf, "ratio=50", SHOAL_SUM, infExpected, "inf", &stats);
    if (rank == 0) EXPECT_EQ(stats.rounds, 2);
  });
}

TEST(SketchRatio, RanksThatGuessDifferentlyFallBack) {
  // Rank 0's instance has a history (a previous operation), rank 1's has not:
  // their cells use different scales. Round 0's guess words reveal it and
  // every rank falls back to the values round: exact, never mixed.
  const shoal_compressor_t* table = nullptr;
  ASSERT_EQ(shoal_compressor_lookup("sketch", &table), SHOAL_OK);
  const char* keys[] = {"ratio"};
  const char* values[] = {"20"};
  char err[256] = {};
  shoal_compressor_params_t params{sizeof params, 1, keys, values, nullptr, err, sizeof err};
  std::vector<void*> instances(2, nullptr);
  for (void*& instance : instances) ASSERT_EQ(table->create(&params, &instance), SHOAL_OK) << err;
  const int n = 2;
  Gen gen = sparseGen(hash3(4, 5, 6), n, 0.002, Overlap::Independent, -8, 8);
  const std::vector<size_t> counts = {40000};
  std::vector<std::vector<float>> outputs;
  int rounds = 0;
  // Warm rank 0's instance alone: a 1-rank op on the same shape.
  std::vector<void*> warm = {instances[0]};
  simulate("ratio=20", 1, SHOAL_SUM, {{gen}}, counts, &outputs, &rounds, &warm);
  ASSERT_EQ(rounds, 1);
  simulate("ratio=20", n, SHOAL_SUM, {{gen}}, counts, &outputs, &rounds, &instances);
  EXPECT_EQ(rounds, 2) << "mismatched guesses must not be peeled";
  std::vector<float> want = reference(gen, n, counts[0], SHOAL_SUM);
  for (size_t i = 0; i < counts[0]; ++i) ASSERT_EQ(bitsOf(outputs[0][i]), bitsOf(want[i])) << i;
  // Both instances now share the history: one round again.
  simulate("ratio=20", n, SHOAL_SUM, {{gen}}, counts, &outputs, &rounds, &instances);
  EXPECT_EQ(rounds, 1);
  for (size_t i = 0; i < counts[0]; ++i) ASSERT_EQ(bitsOf(outputs[0][i]), bitsOf(want[i])) << i;
  for (void* instance : instances) table->destroy(instance);
}

TEST(SketchRatio, FusedTensorsAndModes) {
  const int n = 4;
  Gen sparse = sparseGen(78, n, 0.003, Overlap::Independent);
  Gen dense = sparseGen(79, n, 0.5, Overlap::Independent);
  Gen empty = [](int, size_t) -> float { return 0.0f; };
  const std::vector<std::vector<Gen>> gens = {{sparse}, {dense}, {empty}, {sparse}};
  const std::vector<size_t> counts = {30000, 4000, 300, 0};
  for (const char* options : {"ratio=30", "ratio=30,values=dense", "ratio=30,index=bloom,expected_density=0.01"}) {
    for (shoal_op_t op : {SHOAL_SUM, SHOAL_AVG}) {
      std::vector<std::vector<float>> outputs;
      int rounds = 0;
      simulate(options, n, op, gens, counts, &outputs, &rounds);
      if (HasFatalFailure()) return;
      for (size_t t = 0; t < counts.size(); ++t) {
        std::vector<float> want = reference(gens[t][0], n, counts[t], op);
        for (size_t i = 0; i < counts[t]; ++i)
          ASSERT_EQ(bitsOf(outputs[t][i]), bitsOf(want[i])) << options << " tensor " << t << " element " << i;
      }
    }
  }
}

}  // namespace

namespace {

// ---- cells=f32: 4-byte cells where every partial sum is provably exact ----

TEST(SketchFloatCells, ExactAndHalfTheCellBytesWhenProvable) {
  // Values on a coarse grid (multiples of 1/64 below 16: 10 bits): f32 cells are
  // exact for any order of addition and peeling; compared with i64 cells they
  // send 4 bytes a cell instead of 8. Sum and avg, rank counts incl. 17; one
  // communicator set per rank count, each input generated once.
  const size_t count = 40009;
  for (int n : {1, 2, 3, 5, 8, 17}) {
    struct Case {
      std::shared_ptr<const Inputs> inputs;
      shoal_op_t op;
      std::vector<float> expected;
      std::string what;
      shoal_compress_stats_t f32 = SHOAL_COMPRESS_STATS_INIT, i64 = SHOAL_COMPRESS_STATS_INIT;  // rank 0's
    };
    std::vector<Case> cases;
    for (double density : {0.001, 0.05, 0.5}) {
      Gen gen = [=](int r, size_t i) -> float {
        if (unit(hash3(n, r, i)) >= density) return 0.0f;
        return float(int(hash3(n + 1, r, i) % 2047) - 1023) / 64.0f;
      };
      const std::shared_ptr<const Inputs> inputs = inputsOf(gen, n, count);
      for (shoal_op_t op : {SHOAL_SUM, SHOAL_AVG}) {
        if (op == SHOAL_AVG && (n & (n - 1)) != 0) continue;
        Case c{inputs, op, referenceOf(*inputs, op), std::to_string(n) + " ranks, density " + std::to_string(density)};
        cases.push_back(std::move(c));
      }
    }
    runRanks(n, [&](int rank, shoal_comm_t comm) {
      for (Case& c : cases) {
        runOneInput(comm, rank, (*c.inputs)[rank], "values=sketch,cells=f32", c.op, c.expected, c.what + ", f32 cells",
                    &c.f32);
        runOneInput(comm, rank, (*c.inputs)[rank], "values=sketch,cells=i64", c.op, c.expected, c.what + ", i64 cells",
                    &c.i64);
      }
    });
    const size_t index = (count + 63) / 64 * 8 + kStatsBytes;
    for (const Case& c : cases) EXPECT_EQ(c.f32.payload_bytes - index, (c.i64.payload_bytes - index) / 2) << c.what;
  }
}

TEST(SketchFloatCells, WideValuesFallBackToI64Cells) {
  // Full 24-bit significands over 2^-20 .. 2^20: f32 cells would round; the
  // compressor sees it from round 0's scale and uses i64 cells (same bytes).
  const size_t count = 30011;
  const int n = 3;
  Gen gen = sparseGen(hash3(9, 9, 9), n, 0.02, Overlap::Independent);
  std::vector<float> expected = reference(gen, n, count, SHOAL_SUM);
  Result f = check(n, count, gen, "values=sketch,cells=f32", SHOAL_SUM, expected, "wide, f32 asked");
  Result i = check(n, count, gen, "values=sketch", SHOAL_SUM, expected, "wide, i64");
  EXPECT_EQ(f.stats.payload_bytes, i.stats.payload_bytes);
}

TEST(SketchFloatCells, LeftoversAndInfStayExact) {
  // 1.1 cells per member: peeling stalls, the stalled members travel as i64
  // limbs in round 3 next to f32-recovered ones. With an Inf: i64 cells.
  const size_t count = 200003;
  const int n = 3;
  Gen gen = [](int r, size_t i) -> float {
    if (unit(hash3(5, r, i)) >= 0.2) return 0.0f;
    return float(int(hash3(6, r, i) % 4001) - 2000) * 0.125f;
  };
  std::vector<float> expected = reference(gen, n, count, SHOAL_SUM);
  Result r = check(n, count, gen, "values=sketch,cells=f32,cells_per_item=1.1", SHOAL_SUM, expected, "f32 leftovers");
  EXPECT_EQ(r.stats.rounds, 3);
  Result i64 = check(n, count, gen, "values=sketch,cells_per_item=1.1", SHOAL_SUM, expected, "i64 leftovers");
  EXPECT_LT(r.stats.payload_bytes, i64.stats.payload_bytes) << "f32 cells were expected";
  Gen withInf = [&](int rank, size_t i) -> float {
    return i == 100 && rank == 2 ? std::numeric_limits<float>::infinity() : gen(rank, i);
  };
  std::vector<float> infExpected = expected;
  infExpected[100] = std::numeric_limits<float>::infinity();
  check(n, count, withInf, "values=sketch,cells=f32", SHOAL_SUM, infExpected, "f32 with inf");
}

}  // namespace

namespace {

TEST(SketchCompact, SendsF32ValuesWhenTheirSumsAreExact) {
  // shoal-bench's values (signed multiples of 2^-12 in (-1, 1): 12 bits) on 4
  // ranks: f32 sums are exact, so compact sends 4 bytes a member; full 24-bit
  // significands need 8-byte limbs. Both exact, sum and avg.
  const size_t count = 100003;
  const int n = 4;
  Gen grid = [](int r, size_t i) -> float {
    if (unit(hash3(31, r, i)) >= 0.01) return 0.0f;
    return float(int(hash3(32, r, i) % 8191) - 4095) * 0x1p-12f;
  };
  Gen wide = sparseGen(hash3(33, 0, 0), n, 0.01, Overlap::Independent, -3, 3);
  for (bool onGrid : {true, false}) {
    const Gen& gen = onGrid ? grid : wide;
    size_t u = 0;
    for (size_t i = 0; i < count; ++i) {
      bool any = false;
      for (int r = 0; r < n; ++r) any = any || gen(r, i) != 0.0f;
      u += any;
    }
    for (shoal_op_t op : {SHOAL_SUM, SHOAL_AVG}) {
      Result r = check(n, count, gen, "values=compact", op, reference(gen, n, count, op), onGrid ? "grid" : "wide");
      EXPECT_EQ(r.stats.payload_bytes, (count + 63) / 64 * 8 + kStatsBytes + (onGrid ? 4 : 8) * u) << (onGrid ? "grid" : "wide");
    }
  }
}

}  // namespace

namespace {

// ---- chunk=: one large tensor pipelined in chunks -----------------------------

// chunk=64 on 1000 elements: chunks of max(64, 1000 / 8) -> 128 elements, so
// 8 chunks (the last of 104: a partial bitmap word) and 10 collective rounds.
constexpr size_t kChunkedCount = 1000;
constexpr int kChunks = 8;

TEST(SketchChunks, EveryChunkExactThroughTheTable) {
  // Inputs that take each per-chunk path: dense f32 (quarters), compact f32 and
  // limbs (sparse, wide), Inf words next to finite values, chunks with no member
  // (gap: no values payload for them; empty: none at all).
  const int n = 4;
  const float inf = std::numeric_limits<float>::infinity();
  Gen quarters = [](int r, size_t i) -> float { return 0.25f * float(int(hash3(2, r, i) % 64) - 32); };
  Gen sparse = sparseGen(78, n, 0.05, Overlap::Independent);
  Gen wide = [](int r, size_t i) -> float { return i % 2 ? 0x1p-140f * float(r + 1) : 0x1p120f * float(r + 1); };
  Gen withInf = [=](int r, size_t i) -> float { return i == 700 && r == 1 ? inf : (i % 5 == 0 ? 1.5f : 0.0f); };
  Gen gap = [=](int r, size_t i) -> float { return i >= 200 && i < 600 ? 0.0f : sparse(r, i); };
  Gen empty = [](int, size_t) -> float { return 0.0f; };
  const std::pair<const char*, Gen> inputs[] = {{"quarters", quarters}, {"sparse", sparse}, {"wide", wide},
                                                {"inf", withInf},        {"gap", gap},       {"empty", empty}};
  for (const char* options : {"chunk=64", "chunk=64,values=compact", "chunk=64,values=dense"}) {
    for (shoal_op_t op : {SHOAL_SUM, SHOAL_AVG}) {
      for (const auto& [name, gen] : inputs) {
        std::vector<std::vector<float>> outputs;
        int rounds = 0;
        simulate(options, n, op, {{gen}}, {kChunkedCount}, &outputs, &rounds);
        if (HasFatalFailure()) return;
        // Chunk r's index and chunk r-2's values share round r; the last two chunks' values
        // need rounds P and P + 1 unless they have no member.
        EXPECT_EQ(rounds, std::string(name) == "empty" ? kChunks : kChunks + 2) << options << " " << name;
        const std::vector<float> want = reference(gen, n, kChunkedCount, op);
        for (size_t i = 0; i < kChunkedCount; ++i)
          ASSERT_EQ(bitsOf(outputs[0][i]), bitsOf(want[i])) << options << " " << name << " element " << i;
      }
    }
  }
  // chunk=0, and a chunk too large for two: one piece, two rounds, the same bits.
  for (const char* options : {"chunk=0", "chunk=600", "chunk=64,values=sketch", "chunk=64,index=bloom"}) {
    std::vector<std::vector<float>> outputs;
    int rounds = 0;
    simulate(options, n, SHOAL_SUM, {{sparse}}, {kChunkedCount}, &outputs, &rounds);
    if (HasFatalFailure()) return;
    EXPECT_LE(rounds, 3) << options;
    const std::vector<float> want = reference(sparse, n, kChunkedCount, SHOAL_SUM);
    for (size_t i = 0; i < kChunkedCount; ++i) ASSERT_EQ(bitsOf(outputs[0][i]), bitsOf(want[i])) << options << " " << i;
  }
}

TEST(SketchChunks, ThroughTheCommunicatorInPlaceAndOutOfPlace) {
  // chunk=256 on 5003 elements: max(256, 626) -> 640-element chunks, 8 of them.
  const int n = 3;
  const size_t count = 5003;
  for (double density : {0.05, 0.5, 1.0}) {
    Gen gen = sparseGen(hash3(61, n, uint64_t(density * 1e6)), n, density, Overlap::Independent);
    const std::vector<float> expected = reference(gen, n, count, SHOAL_SUM);
    const std::string what = "chunks, density " + std::to_string(density);
    runRanks(n, [&](int rank, shoal_comm_t comm) {
      shoal_compress_stats_t stats = SHOAL_COMPRESS_STATS_INIT;
      runOne(comm, rank, count, gen, "chunk=256", SHOAL_SUM, expected, what, &stats);
      if (rank == 0) EXPECT_EQ(stats.rounds, kChunks + 2) << what;
      // In place: chunk r-3's output is written while chunk r+1's input is scanned.
      std::vector<float> data(count);
      for (size_t i = 0; i < count; ++i) data[i] = gen(rank, i);
      shoal_allreduce_options_t opts = SHOAL_ALLREDUCE_OPTIONS_INIT;
      opts.compressor = "sketch";
      opts.compressor_options = "chunk=256";
      opts.compress_min_bytes = 0;
      shoal_tensor_t t = shoal_tensor_1d(data.data(), count, SHOAL_F32);
      ASSERT_EQ(shoal_allreduce_tensor(comm, &t, &t, SHOAL_SUM, &opts), SHOAL_OK) << shoal_last_error(comm);
      size_t bad = 0;
      for (size_t i = 0; i < count; ++i) bad += bitsOf(data[i]) != bitsOf(expected[i]);
      EXPECT_EQ(bad, 0u) << what << ", in place, rank " << rank;
    });
  }
}

TEST(SketchChunks, CorruptedChunkPayloadsRefusedOnEveryRank) {
  // The chunks' payloads go through the one-piece path's checks: a bit past the
  // last chunk's count (its index travels in round 7), statistics out of range
  // in a middle chunk (round 3), a middle chunk's union lacking a member of
  // this rank. Every rank refuses with text that names the check and the chunk.
  const int n = 2;
  auto fill = [](int r, int, void* data) {
    auto* x = static_cast<float*>(data);
    for (size_t i = 0; i < kChunkedCount; ++i) x[i] = (i + size_t(r)) % 3 == 0 ? float(int(i % 7) - 3 + r) : 0.0f;
  };
  auto word = [](const shoal::test::Delivered& d, size_t i) {
    uint64_t w;
    std::memcpy(&w, d.bytes.data() + 8 * i, 8);
    return w;
  };
  auto setWord = [](shoal::test::Delivered& d, size_t i, uint64_t w) { std::memcpy(d.bytes.data() + 8 * i, &w, 8); };
  struct Corruption {
    const char* needle;
    shoal::test::Hook hook;
  };
  const Corruption corruptions[] = {
      {"past the tensor's count",
       [&](shoal::test::Delivered& d) {
         if (d.round == kChunks - 1 && d.payload == 0) setWord(d, 1, word(d, 1) | (uint64_t(1) << 63));
       }},
      // A chunk of 128 elements: two index words, then the statistics' codes (nonfinite: the 11th).
      {"statistics", [&](shoal::test::Delivered& d) { if (d.round == 3 && d.payload == 0) setWord(d, 2 + 10, 7); }},
      {"the union lacks", [&](shoal::test::Delivered& d) { if (d.round == 4 && d.payload == 0) setWord(d, 0, 0); }},
  };
  for (const Corruption& c : corruptions) {
    CompressorRounds run(shoal::compressors::sketch(), n);
    ASSERT_EQ(run.create({{"chunk", "64"}}), SHOAL_OK) << run.error(0);
    ASSERT_EQ(run.start({{SHOAL_F32, {int64_t(kChunkedCount)}, ""}}, SHOAL_SUM, 0, fill), SHOAL_OK) << run.error(0);
    const shoal_status_t status = run.run(c.hook);
    EXPECT_EQ(status, SHOAL_ERR_INTERNAL) << c.needle;
    for (int r = 0; r < n; ++r) {
      EXPECT_NE(run.status(r), SHOAL_OK) << "rank " << r << " accepted: " << c.needle;
      const std::string text = run.error(r);
      EXPECT_NE(text.find(c.needle), std::string::npos) << "rank " << r << ": " << text;
      EXPECT_NE(text.find("chunk"), std::string::npos) << "rank " << r << ": " << text;
    }
  }
}

TEST(SketchChunks, OptionRefusedWithText) {
  runRanks(1, [](int, shoal_comm_t comm) {
    float data[4] = {1, 2, 3, 4};
    shoal_tensor_t t = shoal_tensor_1d(data, 4, SHOAL_F32);
    shoal_allreduce_options_t opts = SHOAL_ALLREDUCE_OPTIONS_INIT;
    opts.compressor = "sketch";
    opts.compress_min_bytes = 0;
    for (const char* bad : {"chunk=-1", "chunk=", "chunk=1.5", "chunk=x", "chunk=2000000000000"}) {
      opts.compressor_options = bad;
      EXPECT_EQ(shoal_allreduce_tensor(comm, &t, &t, SHOAL_SUM, &opts), SHOAL_ERR_INVALID_ARGUMENT) << bad;
      EXPECT_NE(std::string(shoal_last_error(comm)).find("chunk"), std::string::npos) << shoal_last_error(comm);
    }
  });
}


// In place (the training path: DistributedOptimizer reduces each gradient in
// its own buffer). With the bitmap index the output writes only the union's
// members when this rank's input holds no -0 (off U it holds zeros already);
// with a -0 there, or the Bloom index, the whole output. Every case's bits
// equal the reference's (whose -0 sums the sketch returns as +0), on every
// rank, for the one-piece and the chunked paths.
TEST(SketchInPlace, MembersOnlyAndWholeOutputsExact) {
  const int n = 3;
  const size_t count = 100 * 32 + 17;  // rows of 32, then a partial bitmap word
  // Row-sparse, as an embedding's gradient: each rank touches a tenth of the rows, whole.
  Gen rows = [](int r, size_t i) -> float {
    const bool touched = hash3(91, uint64_t(r), i / 32) % 10 == 0;
    return touched ? randomValue(hash3(92, uint64_t(r), i), -20, 20) : 0.0f;
  };
  Gen sparse = sparseGen(93, n, 0.02, Overlap::Independent);
  // -0 on rank 1: mostly off the union, sometimes where another rank holds a value.
  Gen negZeros = [=](int r, size_t i) -> float { return r == 1 && i % 97 == 5 ? -0.0f : sparse(r, i); };
  Gen withInf = [=](int r, size_t i) -> float {
    return r == 2 && i == 70 ? -std::numeric_limits<float>::infinity() : rows(r, i);
  };
  Gen empty = [](int, size_t) -> float { return 0.0f; };
  Gen dense = sparseGen(94, n, 1.0, Overlap::Independent);
  const std::pair<const char*, Gen> inputs[] = {{"rows", rows},   {"sparse", sparse}, {"-0", negZeros},
                                                {"inf", withInf}, {"empty", empty},   {"dense", dense}};
  const char* options[] = {"values=auto", "values=sketch", "chunk=512", "index=bloom,expected_density=0.05"};
  std::vector<std::vector<float>> wants;
  for (const auto& input : inputs) {
    std::vector<float> want = reference(input.second, n, count, SHOAL_SUM);
    for (float& w : want)
      if (w == 0.0f) w = 0.0f;  // +0
    wants.push_back(std::move(want));
  }
  runRanks(n, [&](int rank, shoal_comm_t comm) {
    for (size_t c = 0; c < std::size(inputs); ++c) {
      for (const char* o : options) {
        std::vector<float> data(count);
        for (size_t i = 0; i < count; ++i) data[i] = inputs[c].second(rank, i);
        shoal_allreduce_options_t opts = SHOAL_ALLREDUCE_OPTIONS_INIT;
        opts.compressor = "sketch";
        opts.compressor_options = o;
        opts.compress_min_bytes = 0;
        shoal_tensor_t t = shoal_tensor_1d(data.data(), count, SHOAL_F32);
        ASSERT_EQ(shoal_allreduce_tensor(comm, &t, &t, SHOAL_SUM, &opts), SHOAL_OK) << shoal_last_error(comm);
        size_t bad = 0, first = count;
        for (size_t i = 0; i < count; ++i)
          if (bitsOf(data[i]) != bitsOf(wants[c][i])) first = std::min(first, i), ++bad;
        EXPECT_EQ(bad, 0u) << inputs[c].first << ", " << o << ", rank " << rank << ", first at " << first;
      }
    }
  });
}

// A union without any member while this rank holds a nonzero value cannot come
// from an OR that included this rank: refused with text on every rank (the
// in-place output would otherwise keep this rank's input there).
TEST(SketchInPlace, EmptyUnionBesideThisRanksValuesRefused) {
  const int n = 2;
  const size_t count = 300;
  auto fill = [=](int r, int, void* data) {
    auto* x = static_cast<float*>(data);
    for (size_t i = 0; i < count; ++i) x[i] = i % 7 == size_t(r) ? 1.5f : 0.0f;
  };
  CompressorRounds run(shoal::compressors::sketch(), n);
  ASSERT_EQ(run.create({}), SHOAL_OK) << run.error(0);
  ASSERT_EQ(run.start({{SHOAL_F32, {int64_t(count)}, ""}}, SHOAL_SUM, 0, fill), SHOAL_OK) << run.error(0);
  const shoal_status_t status = run.run([](shoal::test::Delivered& d) {
    // The index's words, not the statistics' codes after them.
    if (d.round == 0 && d.payload == 0) std::fill(d.bytes.begin(), d.bytes.end() - kStatsBytes, uint8_t(0));
  });
  EXPECT_EQ(status, SHOAL_ERR_INTERNAL);
  for (int r = 0; r < n; ++r) {
    EXPECT_NE(run.status(r), SHOAL_OK) << "rank " << r;
    EXPECT_NE(std::string(run.error(r)).find("the union is empty"), std::string::npos) << "rank " << r << ": " << run.error(r);
  }
}

}  // namespace

namespace {

// ---- one instance, many calls: the state kept across calls -------------------
// finish() keeps the operation's buffers for the next call on the instance
// (sketch.cc, giveBack/recycle). Consecutive calls that differ in every way the
// state depends on (sizes, tensors per call, densities, limb counts, modes,
// chunk counts, Inf, empty unions, in place and out of place) must each give
// the exact result: nothing of an earlier call may reach a later one.

struct ReuseCall {
  const char* what;
  std::vector<std::pair<Gen, size_t>> tensors;  // generator, count
  shoal_op_t op = SHOAL_SUM;
};

std::vector<ReuseCall> reuseCalls(int n) {
  const float inf = std::numeric_limits<float>::infinity();
  Gen limbs2 = sparseGen(201, n, 0.02, Overlap::Independent);            // 24-bit values over 2^-20..2^20: K = 2
  Gen limbs2Dense = sparseGen(202, n, 0.5, Overlap::Independent);
  Gen limbs1 = sparseGen(203, n, 0.1, Overlap::Independent, -5, 5);      // K = 1
  Gen wide = [](int r, size_t i) -> float {                              // K = 5, sparse
    return i % 7 ? 0.0f : i % 2 ? 0x1p-140f * float(r + 1) : 0x1p120f * float(r + 1);
  };
  Gen quarters = [](int r, size_t i) -> float { return 0.25f * float(int(hash3(204, r, i) % 64) - 32); };  // dense f32
  Gen sparseQuarters = [=](int r, size_t i) -> float {  // compact f32 values
    return unit(hash3(205, r, i)) < 0.01 ? quarters(r, i) + 9.0f : 0.0f;
  };
  Gen withInf = [=](int r, size_t i) -> float { return i == 333 && r == 1 ? -inf : limbs1(r, i); };
  Gen empty = [](int, size_t) -> float { return 0.0f; };
  return {
      {"sparse, 2 limbs", {{limbs2, 5003}}},
      {"dense after sparse", {{quarters, 5003}}},
      {"small, 1 limb", {{limbs1, 300}}, SHOAL_AVG},
      {"5 limbs", {{wide, 2000}}},
      {"compact f32", {{sparseQuarters, 8000}}},
      {"2 limbs after f32", {{limbs2, 8000}}},
      {"empty", {{empty, 1000}}},
      {"Inf", {{withInf, 700}}},
      {"half dense, 2 limbs", {{limbs2Dense, 5003}}, SHOAL_AVG},
      {"three tensors", {{limbs1, 100}, {quarters, 3000}, {wide, 50}}},
      {"three others", {{wide, 3000}, {empty, 10}, {limbs2, 777}}},
      {"one element", {{limbs1, 1}}},
      {"sparse after dense", {{limbs2, 5003}}},
      {"f32 after limbs", {{sparseQuarters, 5003}}},
  };
}

// Every rank's inputs and the expected outputs of one call.
struct ReuseCase {
  std::vector<std::shared_ptr<const Inputs>> inputs;  // per tensor
  std::vector<std::vector<float>> want;               // per tensor
};

ReuseCase reuseCase(const ReuseCall& call, int n) {
  ReuseCase c;
  for (const auto& [gen, count] : call.tensors) {
    c.inputs.push_back(inputsOf(gen, n, count));
    c.want.push_back(referenceOf(*c.inputs.back(), call.op));
  }
  return c;
}

const char* kReuseOptions[] = {"values=auto", "values=compact", "values=sketch", "values=dense", "chunk=256",
                               "values=sketch,cells=f32", "ratio=20", "index=bloom,expected_density=0.05"};

// Through the table, every rank with an instance of its own (as the driver
// runs it: one call at a time per instance), then all ranks on one instance
// (several operations in flight on it: each must get a state of its own).
TEST(SketchReuse, ConsecutiveCallsThroughTheTableExact) {
  const int n = 4;
  const std::vector<ReuseCall> calls = reuseCalls(n);
  std::vector<ReuseCase> cases;
  for (const ReuseCall& call : calls) cases.push_back(reuseCase(call, n));
  const shoal_compressor_t* table = shoal::compressors::sketch();
  for (const char* options : kReuseOptions) {
    for (bool shared : {false, true}) {
      std::unique_ptr<void, void (*)(void*)> one(nullptr, table->destroy);  // outlives run
      CompressorRounds run(table, n);
      if (shared) {
        const auto pairs = shoal::test::optionPairs(options);
        std::vector<const char*> kp, vp;
        for (const auto& [key, value] : pairs) kp.push_back(key.c_str()), vp.push_back(value.c_str());
        char err[256] = {};
        shoal_compressor_params_t params{sizeof params, int(kp.size()), kp.data(), vp.data(), nullptr, err, sizeof err};
        void* instance = nullptr;
        ASSERT_EQ(table->create(&params, &instance), SHOAL_OK) << err;
        one.reset(instance);
        run.useInstances(std::vector<void*>(n, instance));
      } else {
        ASSERT_EQ(run.create(shoal::test::optionPairs(options)), SHOAL_OK) << run.error(0);
      }
      // Twice through the sequence: its last calls then precede its first ones.
      for (int pass = 0; pass < 2; ++pass) {
        for (size_t k = 0; k < calls.size(); ++k) {
          const ReuseCase& c = cases[k];
          std::vector<CompressorRounds::TensorSpec> specs;
          for (const auto& [gen, count] : calls[k].tensors) specs.push_back({SHOAL_F32, {int64_t(count)}, ""});
          auto fill = [&](int r, int t, void* data) {
            std::memcpy(data, (*c.inputs[t])[r].data(), (*c.inputs[t])[r].size() * sizeof(float));
          };
          const std::string what = std::string(options) + (shared ? ", one instance" : ", an instance a rank") +
                                   ", pass " + std::to_string(pass) + ", call " + std::to_string(k) + " (" +
                                   calls[k].what + ")";
          ASSERT_EQ(run.allreduce(specs, calls[k].op, 10 * pass + k, fill), SHOAL_OK)
              << what << ": " << run.error(run.failedRank());
          for (int r = 0; r < n; ++r)
            for (size_t t = 0; t < specs.size(); ++t) {
              const std::vector<float> got = run.outputAs<float>(r, int(t));
              size_t bad = 0, first = got.size();
              for (size_t i = 0; i < got.size(); ++i)
                if (bitsOf(got[i]) != bitsOf(c.want[t][i])) first = std::min(first, i), ++bad;
              ASSERT_EQ(bad, 0u) << what << ", rank " << r << ", tensor " << t << ", first at " << first << ": got "
                                 << got[first] << ", want " << c.want[t][first];
            }
        }
      }
    }
  }
}

// Through the communicator (one instance per options string and rank), in
// place and out of place alternately, one piece and in chunks.
TEST(SketchReuse, ConsecutiveCallsInPlaceAndOutOfPlaceExact) {
  const int n = 4;
  const std::vector<ReuseCall> calls = reuseCalls(n);
  std::vector<ReuseCase> cases;
  std::vector<size_t> single;  // the one-tensor calls
  for (size_t k = 0; k < calls.size(); ++k) {
    cases.push_back(reuseCase(calls[k], n));
    if (calls[k].tensors.size() == 1) single.push_back(k);
  }
  runRanks(n, [&](int rank, shoal_comm_t comm) {
    for (const char* options : {"values=auto", "chunk=256"}) {
      for (int pass = 0; pass < 2; ++pass) {
        for (size_t j = 0; j < single.size(); ++j) {
          const size_t k = single[j];
          const bool inPlace = (j + pass) % 2 == 0;
          const std::vector<float>& input = (*cases[k].inputs[0])[rank];
          const std::vector<float>& want = cases[k].want[0];
          const std::string what = std::string(options) + ", pass " + std::to_string(pass) + ", " + calls[k].what +
                                   (inPlace ? ", in place" : ", out of place") + ", rank " + std::to_string(rank);
          std::vector<float> data = input, out(input.size(), 12345.0f);
          shoal_allreduce_options_t opts = SHOAL_ALLREDUCE_OPTIONS_INIT;
          opts.compressor = "sketch";
          opts.compressor_options = options;
          opts.compress_min_bytes = 0;
          shoal_tensor_t tin = shoal_tensor_1d(data.data(), data.size(), SHOAL_F32);
          shoal_tensor_t tout = shoal_tensor_1d(out.data(), out.size(), SHOAL_F32);
          ASSERT_EQ(shoal_allreduce_tensor(comm, &tin, inPlace ? &tin : &tout, calls[k].op, &opts), SHOAL_OK)
              << what << ": " << shoal_last_error(comm);
          const std::vector<float>& got = inPlace ? data : out;
          size_t bad = 0, first = got.size();
          for (size_t i = 0; i < got.size(); ++i)
            if (bitsOf(got[i]) != bitsOf(want[i])) first = std::min(first, i), ++bad;
          ASSERT_EQ(bad, 0u) << what << ", first at " << first << ": got " << got[first] << ", want " << want[first];
          if (!inPlace) ASSERT_TRUE(data == input) << what << ": input modified";
        }
      }
    }
  });
}

// A call refused after a corrupted payload (on the helper thread when in
// chunks) leaves its state to the next call: that one is exact, and so is
// another refusal's text.
TEST(SketchReuse, CallAfterARefusedCallExact) {
  const int n = 2;
  const Gen gen = sparseGen(207, n, 0.05, Overlap::Independent);
  const std::shared_ptr<const Inputs> in = inputsOf(gen, n, kChunkedCount);
  const std::vector<float> want = referenceOf(*in, SHOAL_SUM);
  auto fill = [&](int r, int, void* data) { std::memcpy(data, (*in)[r].data(), kChunkedCount * sizeof(float)); };
  auto setWord = [](shoal::test::Delivered& d, size_t i, uint64_t w) { std::memcpy(d.bytes.data() + 8 * i, &w, 8); };
  // The statistics' nonfinite code (the 11th word after the index) made 7: chunk 3's in round 3
  // (read on the helper), or the one piece's in round 0.
  const size_t onePieceIndex = (kChunkedCount + 63) / 64;
  struct Case {
    const char* options;
    shoal::test::Hook corrupt;
  };
  const Case cases[] = {
      {"chunk=64", [&](shoal::test::Delivered& d) { if (d.round == 3 && d.payload == 0) setWord(d, 2 + 10, 7); }},
      {"values=auto", [&](shoal::test::Delivered& d) { if (d.round == 0 && d.payload == 0) setWord(d, onePieceIndex + 10, 7); }},
  };
  for (const Case& c : cases) {
    CompressorRounds run(shoal::compressors::sketch(), n);
    ASSERT_EQ(run.create(shoal::test::optionPairs(c.options)), SHOAL_OK) << run.error(0);
    for (int attempt = 0; attempt < 2; ++attempt) {
      ASSERT_EQ(run.start({{SHOAL_F32, {int64_t(kChunkedCount)}, ""}}, SHOAL_SUM, 0, fill), SHOAL_OK) << run.error(0);
      EXPECT_EQ(run.run(c.corrupt), SHOAL_ERR_INTERNAL) << c.options;
      for (int r = 0; r < n; ++r)
        EXPECT_NE(std::string(run.error(r)).find("statistics"), std::string::npos) << c.options << ": " << run.error(r);
      ASSERT_EQ(run.allreduce({{SHOAL_F32, {int64_t(kChunkedCount)}, ""}}, SHOAL_SUM, 1, fill), SHOAL_OK)
          << c.options << ": " << run.error(run.failedRank());
      for (int r = 0; r < n; ++r) {
        const std::vector<float> got = run.outputAs<float>(r, 0);
        for (size_t i = 0; i < kChunkedCount; ++i)
          ASSERT_EQ(bitsOf(got[i]), bitsOf(want[i])) << c.options << ", attempt " << attempt << ", rank " << r << ", " << i;
      }
    }
  }
}

}  // namespace
