// The sketch on dense gradients (issue 19): with two ranks every member's sum
// is one f32 addition, rounded once, so the values travel as f32 (4 bytes a
// member) whatever the span: a dense-gradient tensor then costs the index plus
// dense f32 (~1.03x), not 8 bytes a member (~2x). Still exact: the outputs are
// compared bit for bit with the exact sum rounded once (for two f32 values
// that is the f32 addition itself; avg: the exact half of it). With three ranks
// the rule does not hold, and the payload stays 8 bytes a member, unless the
// user opts out of exactness (exact=0): then 4 bytes a member, summed in f32,
// the same bits on every rank, within f32 reassociation of the exact sum.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "compressors/sketch/sketch_instance.h"
#include "harness/dtype_model.h"
#include "harness/harness.h"
#include "shoal/shoal.h"

namespace {

using shoal::test::mix64;
using shoal::test::runRanks;

uint32_t bitsOf(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
}

// Gradient-like values: every element nonzero, random sign, 24-bit
// significand, exponents over [-25, 10] (a span of 59 bits: beyond f32's 24,
// within long double's 64 for the three-rank reference).
float wideValue(int rank, size_t i) {
  const uint64_t h = mix64(mix64(uint64_t(rank) + 1) ^ i);
  const uint32_t mant = uint32_t(h & 0xffffffu) | 0x800000u;
  const float v = std::ldexp(float(mant), -25 + int((h >> 24) % 36) - 23);
  return (h >> 60) & 1 ? -v : v;
}

// One sketch allreduce of `count` values per rank on n ranks: every rank's output, rank 0's payload bytes.
struct Outputs {
  std::vector<std::vector<float>> perRank;
  size_t payloadBytes = 0;
};

Outputs runKeepingOutputs(int n, size_t count, shoal_op_t op, const std::string& options,
                          float (*value)(int, size_t)) {
  Outputs outputs;
  outputs.perRank.assign(n, std::vector<float>(count, 12345.0f));
  runRanks(n, [&](int rank, shoal_comm_t comm) {
    std::vector<float> in(count);
    for (size_t i = 0; i < count; ++i) in[i] = value(rank, i);
    shoal_allreduce_options_t opts = SHOAL_ALLREDUCE_OPTIONS_INIT;
    opts.compressor = "sketch";
    opts.compressor_options = options.c_str();
    opts.compress_min_bytes = 0;
    shoal_tensor_t tin = shoal_tensor_1d(in.data(), count, SHOAL_F32);
    shoal_tensor_t tout = shoal_tensor_1d(outputs.perRank[rank].data(), count, SHOAL_F32);
    ASSERT_EQ(shoal_allreduce_tensor(comm, &tin, &tout, op, &opts), SHOAL_OK) << shoal_last_error(comm);
    if (rank == 0) {
      shoal_compress_stats_t stats = SHOAL_COMPRESS_STATS_INIT;
      ASSERT_EQ(shoal_last_compress_stats(comm, &stats), SHOAL_OK);
      outputs.payloadBytes = stats.payload_bytes;
    }
  });
  return outputs;
}

struct Outcome {
  size_t payloadBytes = 0;
  size_t badElements = 0;
};

// The same, counting outputs whose bits differ from expected(i) on any rank.
Outcome run(int n, size_t count, shoal_op_t op, const std::string& options, float (*value)(int, size_t),
            const std::vector<float>& expected) {
  Outputs outputs = runKeepingOutputs(n, count, op, options, value);
  Outcome outcome;
  outcome.payloadBytes = outputs.payloadBytes;
  for (int rank = 0; rank < n; ++rank)
    for (size_t i = 0; i < count; ++i)
      if (bitsOf(outputs.perRank[rank][i]) != bitsOf(expected[i]) && ++outcome.badElements <= 3)
        ADD_FAILURE() << n << " ranks, " << options << ", rank " << rank << ", element " << i << ": got "
                      << outputs.perRank[rank][i] << ", want " << expected[i];
  return outcome;
}

TEST(SketchDense, TwoRanksSendF32ValuesExactly) {
  const size_t count = 100003;
  // The index, then the statistics' codes (sketch_instance.h).
  const size_t indexAndStats = (count + 63) / 64 * 8 + 8 * shoal::compressors::sketch_impl::statsCodeWords(3);
  for (shoal_op_t op : {SHOAL_SUM, SHOAL_AVG}) {
    std::vector<float> expected(count);
    for (size_t i = 0; i < count; ++i) {
      // f32 addition is the exact sum rounded once; halving it is exact here
      // (no overflow, no subnormal results at these exponents).
      const float sum = wideValue(0, i) + wideValue(1, i);
      expected[i] = op == SHOAL_AVG ? sum / 2.0f : sum;
    }
    for (const char* options : {"values=auto", "values=compact"}) {
      Outcome o = run(2, count, op, options, wideValue, expected);
      EXPECT_EQ(o.badElements, 0u) << options;
      EXPECT_EQ(o.payloadBytes, indexAndStats + 4 * count) << options << ": index + f32 values";
    }
  }
}

TEST(SketchDense, ThreeRanksKeepEightBytesAMember) {
  // Three wide values need more than one rounding in f32, so the limbs travel.
  // The reference: a long double sum (64-bit significand) of three such values
  // is exact, then rounded once.
  const size_t count = 20011;
  std::vector<float> expected(count);
  for (size_t i = 0; i < count; ++i) {
    long double sum = 0;
    for (int r = 0; r < 3; ++r) sum += wideValue(r, i);
    expected[i] = float(sum);
  }
  Outcome o = run(3, count, SHOAL_SUM, "values=auto", wideValue, expected);
  EXPECT_EQ(o.badElements, 0u);
  EXPECT_GE(o.payloadBytes, 8 * count) << "three ranks cannot send f32 values losslessly";
}

// Every third element zero on every rank, the rest wideValue: a union of two
// thirds of the coordinates, so compact (not dense) values travel.
float twoThirdsWide(int rank, size_t i) { return i % 3 == 0 ? 0.0f : wideValue(rank, i); }

TEST(SketchInexact, ManyRanksSendF32ValuesAndAgreeBitForBit) {
  const size_t count = 30011;
  const size_t indexAndStats = (count + 63) / 64 * 8 + 8 * shoal::compressors::sketch_impl::statsCodeWords(3);
  for (int n : {3, 4}) {
    for (shoal_op_t op : {SHOAL_SUM, SHOAL_AVG}) {
      for (auto* value : {wideValue, twoThirdsWide}) {
        const size_t members = value == wideValue ? count : count - (count + 2) / 3;
        Outputs lossless = runKeepingOutputs(n, count, op, "exact=1", value);
        Outputs f32 = runKeepingOutputs(n, count, op, "exact=0", value);
        EXPECT_GE(lossless.payloadBytes, indexAndStats + 8 * members) << n << " ranks, exact=1: limbs";
        EXPECT_EQ(f32.payloadBytes, indexAndStats + 4 * members) << n << " ranks, exact=0: index + f32 values";
        size_t farOff = 0, differsFromExact = 0;
        for (size_t i = 0; i < count; ++i) {
          long double exact = 0, magnitude = 0;
          for (int r = 0; r < n; ++r) exact += value(r, i), magnitude += std::fabs((long double)value(r, i));
          if (op == SHOAL_AVG) exact /= n, magnitude /= n;
          // f32 sums of n terms in any order: within (n - 1) roundings of 2^-24 of the magnitudes,
          // plus avg's division and the exact reference's own rounding.
          const long double bound = (n + 1) * std::ldexp(1.0L, -24) * magnitude;
          const float got = f32.perRank[0][i];
          if (std::fabs((long double)got - exact) > bound && ++farOff <= 3)
            ADD_FAILURE() << n << " ranks, element " << i << ": " << got << " against the exact " << (double)exact;
          if (bitsOf(lossless.perRank[0][i]) != bitsOf(float(exact))) ++differsFromExact;
          for (int r = 1; r < n; ++r)
            if (bitsOf(f32.perRank[r][i]) != bitsOf(got) && ++farOff <= 3)
              ADD_FAILURE() << n << " ranks, element " << i << ": rank " << r << " got " << f32.perRank[r][i]
                            << ", rank 0 " << got << " (exact=0 must give every rank the same bits)";
        }
        EXPECT_EQ(farOff, 0u);
        // avg at 3 ranks divides the exact sum (long double) once more than the
        // reference's one rounding allows; the sums are the exact ones rounded once.
        if (op == SHOAL_SUM) EXPECT_EQ(differsFromExact, 0u) << n << " ranks: exact=1 must stay bit-exact";
      }
    }
  }
}

// Element 7: +Inf on rank 1 and -Inf on rank 2 (NaN); element 8: +Inf on rank 1 (+Inf).
float withInfinities(float (*value)(int, size_t), int rank, size_t i) {
  const float inf = std::numeric_limits<float>::infinity();
  if (i == 7 && rank == 1) return inf;
  if (i == 7 && rank == 2) return -inf;
  if (i == 8 && rank == 1) return inf;
  return value(rank, i);
}
float sparseWithInfinities(int rank, size_t i) { return withInfinities(twoThirdsWide, rank, i); }
float denseWithInfinities(int rank, size_t i) { return withInfinities(wideValue, rank, i); }

TEST(SketchInexact, NonFiniteValuesKeepTheirOwnWords) {
  // Beside an Inf/NaN, exact=0 sends the f32 values and the specials' words (never the dense data,
  // whose IEEE sum would give another NaN's bits): +Inf meeting -Inf decodes to the NaN 0x7fc00000
  // on every rank, as with exact=1; a lone +Inf stays +Inf; the other elements are finite.
  const size_t count = 4099;
  const size_t indexAndStats = (count + 63) / 64 * 8 + 8 * shoal::compressors::sketch_impl::statsCodeWords(3);
  for (auto* value : {sparseWithInfinities, denseWithInfinities}) {
    const size_t members = value == denseWithInfinities ? count : count - (count + 2) / 3;
    Outputs f32 = runKeepingOutputs(3, count, SHOAL_SUM, "exact=0", value);
    EXPECT_EQ(f32.payloadBytes, indexAndStats + (4 + 8) * members) << "index + f32 values + the specials' words";
    for (int r = 0; r < 3; ++r) {
      EXPECT_EQ(bitsOf(f32.perRank[r][7]), 0x7fc00000u) << "rank " << r;
      EXPECT_EQ(bitsOf(f32.perRank[r][8]), 0x7f800000u) << "rank " << r;
      for (size_t i = 0; i < count; ++i)
        if (i != 7 && i != 8) ASSERT_TRUE(std::isfinite(f32.perRank[r][i])) << "rank " << r << ", element " << i;
    }
  }
}

TEST(SketchInexact, ExactTakesOnlyOneOrZero) {
  runRanks(2, [&](int, shoal_comm_t comm) {
    std::vector<float> buffer(64, 1.0f);
    shoal_allreduce_options_t opts = SHOAL_ALLREDUCE_OPTIONS_INIT;
    opts.compressor = "sketch";
    opts.compressor_options = "exact=yes";
    opts.compress_min_bytes = 0;
    shoal_tensor_t t = shoal_tensor_1d(buffer.data(), buffer.size(), SHOAL_F32);
    EXPECT_EQ(shoal_allreduce_tensor(comm, &t, &t, SHOAL_SUM, &opts), SHOAL_ERR_INVALID_ARGUMENT);
    EXPECT_NE(std::string(shoal_last_error(comm)).find("exact='yes' is not 1"), std::string::npos)
        << shoal_last_error(comm);
  });
}

float negativeZero(int, size_t) { return -0.0f; }
float sparseOrNegativeZero(int rank, size_t i) { return i % 97 == 0 ? wideValue(rank, i) : -0.0f; }

TEST(SketchDense, BloomFalsePositivesOfNegativeZerosSumToPlusZero) {
  // A saturated Bloom filter lists coordinates where both ranks hold -0; their
  // f32 values must still sum to +0 (the exact sum of zeros), not -0 + -0 = -0.
  const size_t count = 50021;
  std::vector<float> expected(count);
  for (size_t i = 0; i < count; ++i) {
    const float sum = sparseOrNegativeZero(0, i) + sparseOrNegativeZero(1, i);
    expected[i] = sum == 0.0f ? 0.0f : sum;
  }
  Outcome o = run(2, count, SHOAL_SUM, "values=compact,index=bloom,expected_density=0.00001", sparseOrNegativeZero,
                  expected);
  EXPECT_EQ(o.badElements, 0u);
  std::vector<float> zeros(count, 0.0f);
  o = run(2, count, SHOAL_SUM, "values=auto", negativeZero, zeros);
  EXPECT_EQ(o.badElements, 0u);
}

}  // namespace
