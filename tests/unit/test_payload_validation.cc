// Payload validation: every compressor's decode path checks what it reads from
// a received payload (counts, limb numbers, lengths, index bits) before using
// it. Ranks run in lockstep in one thread through the compressor table
// (tests/fuzz/lockstep.h); between rounds a hook corrupts the reduced payload
// as a buggy or hostile rank could, and every rank must refuse it with text
// instead of reading or writing out of bounds (the ASan+UBSan run of this test
// catches what an unchecked path would do). An honest run of each case checks
// that the lockstep itself reduces correctly, so a refusal means the
// corruption was seen.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <iterator>
#include <string>
#include <tuple>
#include <vector>

#include "compressors/sketch/sketch_instance.h"
#include "compressors/sketch/sketch_math.h"
#include "compressors/sketch/sketch_peel.h"
#include "fuzz/lockstep.h"

namespace {

using shoal::fuzz::Delivered;
using shoal::fuzz::Lockstep;
using Options = std::vector<std::pair<std::string, std::string>>;

uint64_t word(const Delivered& d, size_t i) {
  uint64_t w;
  std::memcpy(&w, d.bytes.data() + 8 * i, 8);
  return w;
}
void setWord(Delivered& d, size_t i, uint64_t w) { std::memcpy(d.bytes.data() + 8 * i, &w, 8); }

// Rank r's f32 input: small integers on every third coordinate (shifted per
// rank), so f32 sums are exact and the union is sparse.
void sparseFill(int r, int, void* data, size_t count) {
  auto* x = static_cast<float*>(data);
  for (size_t i = 0; i < count; ++i) x[i] = (i + size_t(r)) % 3 == 0 ? float(int(i % 7) - 3 + r) : 0.0f;
}

// Every rank refused, each with text naming the compressor and `needle`.
void expectRefusedEverywhere(const Lockstep& run, shoal_status_t status, const char* name, const char* needle) {
  EXPECT_EQ(status, SHOAL_ERR_INTERNAL);
  for (int r = 0; r < run.world(); ++r) {
    EXPECT_NE(run.status(r), SHOAL_OK) << "rank " << r << " accepted the corrupted payload";
    const std::string text = run.error(r);
    EXPECT_NE(text.find(name), std::string::npos) << "rank " << r << ": " << text;
    EXPECT_NE(text.find(needle), std::string::npos) << "rank " << r << ": " << text;
  }
}

struct SketchCase {
  Options options;
  size_t count = 200;
  int world = 2;
};

// Runs the sketch on sparseFill inputs with hook; honest (no hook): checks the exact sum.
shoal_status_t runSketch(Lockstep& run, const SketchCase& c, const shoal::fuzz::Hook& hook) {
  EXPECT_EQ(run.create(c.options), SHOAL_OK) << run.error(0);
  const size_t count = c.count;
  EXPECT_EQ(run.start({{SHOAL_F32, {int64_t(count)}, ""}}, SHOAL_SUM, 0,
                      [&](int r, int t, void* data) { sparseFill(r, t, data, count); }),
            SHOAL_OK)
      << run.error(0);
  return run.run(hook);
}

const SketchCase kSketchCases[] = {
    {{}, 200, 2},
    {{{"values", "sketch"}}, 200, 2},
    {{{"values", "compact"}}, 300, 3},
    {{{"ratio", "2"}}, 200, 2},
    {{{"index", "bloom"}, {"expected_density", "0.01"}}, 3000, 2},
};

TEST(PayloadValidation, SketchHonestRunsAreExact) {
  for (const SketchCase& c : kSketchCases) {
    Lockstep run(shoal::compressors::sketch(), c.world);
    ASSERT_EQ(runSketch(run, c, nullptr), SHOAL_OK) << run.error(run.failedRank());
    std::vector<float> a(c.count);
    for (int r = 0; r < c.world; ++r) {
      std::vector<float> x(c.count);
      sparseFill(r, 0, x.data(), c.count);
      for (size_t i = 0; i < c.count; ++i) a[i] += x[i];
    }
    for (int r = 0; r < c.world; ++r)
      EXPECT_EQ(std::memcmp(run.output(r, 0), a.data(), c.count * sizeof(float)), 0) << "rank " << r;
  }
}

// Round 0's payload [0]: the OR-ed index bitmap (count 200: 4 words), then the
// statistics (top + 200, 200 - lowest, nonfinite per tensor) as OR-able codes
// (sketch_instance.h: encodeStatsCodes), [1] with ratio= the pre-sized sketch.
using shoal::compressors::sketch_impl::decodeStatsCodes;
using shoal::compressors::sketch_impl::encodeStatsCodes;
using shoal::compressors::sketch_impl::kThermometerWords;
constexpr size_t kIndexWords200 = 4;

// Rewrites statistics word `index` of the delivered codes to `value` (an
// encodable one: 0, or in the word's thermometer range), the others kept.
void setStatistic(Delivered& d, size_t stride, size_t index, uint64_t value) {
  uint64_t code[16], w[5];
  const size_t words = shoal::compressors::sketch_impl::statsCodeWords(stride);
  ASSERT_LE(words, std::size(code));
  std::memcpy(code, d.bytes.data() + 8 * kIndexWords200, 8 * words);
  char why[200];
  ASSERT_TRUE(decodeStatsCodes(code, stride, w, why, sizeof why)) << why;
  w[index] = value;
  encodeStatsCodes(w, stride, code);
  std::memcpy(d.bytes.data() + 8 * kIndexWords200, code, 8 * words);
}
TEST(PayloadValidation, SketchIndexBitsPastTheCount) {
  Lockstep run(shoal::compressors::sketch(), 2);
  auto status = runSketch(run, {{}, 200, 2}, [](Delivered& d) {
    if (d.round == 0 && d.payload == 0) setWord(d, 3, word(d, 3) | (uint64_t(1) << 63));  // coordinate 255
  });
  expectRefusedEverywhere(run, status, "sketch", "past the tensor's count");
}

TEST(PayloadValidation, SketchStatisticsOutOfRange) {
  // Each: a corruption of the statistics' codes; all name the statistics.
  using Corrupt = std::function<void(Delivered&, size_t stride)>;
  auto codeWord = [](size_t i, uint64_t w) {
    return Corrupt([=](Delivered& d, size_t) { setWord(d, kIndexWords200 + i, w); });
  };
  auto statistic = [](size_t index, uint64_t value) {
    return Corrupt([=](Delivered& d, size_t stride) { setStatistic(d, stride, index, value); });
  };
  const Corrupt corruptions[] = {
      Corrupt([](Delivered& d, size_t) {  // every bit of the top code: 2^170, past 2^127 (once a 424 GB allocation)
        for (size_t i = 0; i < kThermometerWords; ++i) setWord(d, kIndexWords200 + i, ~uint64_t(0));
      }),
      codeWord(1, 1),                                 // a top code with a gap: no OR of honest codes
      codeWord(kThermometerWords + 2, 8),             // a lowest code with a gap
      statistic(1, 0),                                // top set, lowest not
      statistic(1, 200 + 149 + 20),                   // lowest 2^-169: below the f32 range
      codeWord(2 * kThermometerWords, 7),             // nonfinite is 0 or 1
      statistic(0, 200 - 149),                        // top 2^-149: below this rank's own values (the OR covers every rank's)
  };
  for (const Corrupt& corrupt : corruptions) {
    for (const Options& options : {Options{}, Options{{"values", "sketch"}}, Options{{"ratio", "2"}}}) {
      const size_t stride = options.empty() || options[0].first != "ratio" ? 3 : 5;
      Lockstep run(shoal::compressors::sketch(), 2);
      auto status = runSketch(run, {options, 200, 2}, [&](Delivered& d) {
        if (d.round == 0 && d.payload == 0) corrupt(d, stride);
      });
      expectRefusedEverywhere(run, status, "sketch", "statistics");
    }
  }
}

TEST(PayloadValidation, SketchLowestAboveTop) {
  Lockstep run(shoal::compressors::sketch(), 2);
  auto status = runSketch(run, {{}, 200, 2}, [](Delivered& d) {
    if (d.round == 0 && d.payload == 0) {
      setStatistic(d, 3, 0, 200 + 3);    // top 2^3
      setStatistic(d, 3, 1, 200 - 100);  // lowest 2^100
    }
  });
  expectRefusedEverywhere(run, status, "sketch", "above the top bit");
}

TEST(PayloadValidation, SketchUnionWithoutValues) {
  Lockstep run(shoal::compressors::sketch(), 2);
  auto status = runSketch(run, {{}, 200, 2}, [](Delivered& d) {
    if (d.round == 0 && d.payload == 0)
      for (int w = 0; w < 3; ++w) setStatistic(d, 3, size_t(w), 0);
  });
  // This rank's values are not covered by a scale that says no rank has any.
  expectRefusedEverywhere(run, status, "sketch", "statistics");
}

TEST(PayloadValidation, SketchCorruptedCellsFailTheCertificate) {
  // values=sketch: round 1 carries the count sketch's cells. Peeling's course
  // follows from U alone, so it still recovers every member; cells that no
  // member owns then hold what was added to them: the certificate refuses.
  Lockstep run(shoal::compressors::sketch(), 2);
  bool corrupted = false;
  auto status = runSketch(run, {{{"values", "sketch"}}, 200, 2}, [&](Delivered& d) {
    if (d.round == 1 && d.payload == 0) {
      for (size_t i = 0; i < d.bytes.size() / 8; ++i) setWord(d, i, word(d, i) + 12345 * (i + 1));
      corrupted = true;
    }
  });
  ASSERT_TRUE(corrupted);
  expectRefusedEverywhere(run, status, "sketch", "not zero");
}

TEST(PayloadValidation, SketchBloomIndexAllOnesDecodesOrRefuses) {
  // Every coordinate a member (a Bloom filter of ones): a superset whose extra
  // members hold zeros on every rank, so the result is still the exact sum.
  const SketchCase c{{{"index", "bloom"}, {"expected_density", "0.01"}}, 3000, 2};
  Lockstep run(shoal::compressors::sketch(), 2);
  auto status = runSketch(run, c, [](Delivered& d) {
    // The filter's words, not the statistics' codes after them.
    if (d.round == 0 && d.payload == 0)
      std::memset(d.bytes.data(), 0xff, d.bytes.size() - 8 * shoal::compressors::sketch_impl::statsCodeWords(3));
  });
  ASSERT_EQ(status, SHOAL_OK) << run.error(run.failedRank());
  std::vector<float> a(c.count), x(c.count);
  for (int r = 0; r < 2; ++r) {
    sparseFill(r, 0, x.data(), c.count);
    for (size_t i = 0; i < c.count; ++i) a[i] += x[i];
  }
  EXPECT_EQ(std::memcmp(run.output(0, 0), a.data(), c.count * sizeof(float)), 0);
}

TEST(PayloadValidation, SketchPeelRefusesTooManyLimbs) {
  // The peel keeps one member's limbs on the stack: K past that bound is refused, not overflowed.
  const auto g = shoal::sketch::sketchGeometry(8, 1);
  const uint64_t members[] = {1, 5};
  std::vector<uint64_t> cells(64 * 3 * g.part, 0), limbs;
  std::vector<size_t> leftover;
  EXPECT_FALSE(shoal::sketch::peelSketch(members, 2, g, 64, cells.data(), limbs, leftover));
  EXPECT_FALSE(shoal::sketch::peelSketch(members, 2, g, 0, cells.data(), limbs, leftover));
  EXPECT_TRUE(shoal::sketch::peelSketch(members, 2, g, 9, cells.data(), limbs, leftover));
}

TEST(PayloadValidation, SketchLimbsOfAValueBelowTheScaleAreDropped) {
  // Q above the value's lowest bit (a scale no MAX produced): no limbs, no negative shift.
  const auto pair = shoal::sketch::limbPairOf(1.5f, 10, 62);
  EXPECT_EQ(pair.k0, -1);
  uint64_t limbs[2] = {0, 0};
  shoal::sketch::addLimbs(1.5f, 10, 62, 2, limbs, 1);
  EXPECT_EQ(limbs[0], 0u);
  EXPECT_EQ(limbs[1], 0u);
}

TEST(PayloadValidation, SketchReadScale) {
  using shoal::compressors::sketch_impl::readScale;
  using shoal::compressors::sketch_impl::Scale;
  char why[200];
  Scale s;
  const uint64_t honest[3] = {200 + 127, 200 + 149, 1};  // the widest f32 span and an Inf
  ASSERT_TRUE(readScale(honest, 1 << 20, s, why, sizeof why)) << why;
  EXPECT_EQ(s.T, 127);
  EXPECT_EQ(s.Q, -149);
  EXPECT_EQ(s.L, 43);
  EXPECT_EQ(s.K, 7);
  EXPECT_TRUE(s.nonfinite);
  const uint64_t none[3] = {0, 0, 0};
  ASSERT_TRUE(readScale(none, 2, s, why, sizeof why));
  EXPECT_FALSE(s.anyFinite);
  EXPECT_EQ(s.K, 0);
  const uint64_t wild[3] = {~uint64_t(0), ~uint64_t(0), 0};
  EXPECT_FALSE(readScale(wild, 2, s, why, sizeof why));
}

// ---- topk: round 0 gathers every rank's (index, value) pairs -------------------------
shoal_status_t runTopk(Lockstep& run, const shoal::fuzz::Hook& hook, shoal_dtype_t dtype = SHOAL_F32) {
  EXPECT_EQ(run.create({{"k", "5"}, {"ef", "0"}}), SHOAL_OK) << run.error(0);
  EXPECT_EQ(run.start({{dtype, {40}, ""}, {dtype, {3, 7}, ""}}, SHOAL_SUM, 0,
                      [&](int r, int t, void* data) {
                        const size_t n = t == 0 ? 40 : 21;
                        for (size_t i = 0; i < n; ++i) {
                          const double v = double((i * 7 + size_t(r) * 3 + size_t(t)) % 11) - 5.0;
                          if (dtype == SHOAL_F32) static_cast<float*>(data)[i] = float(v);
                          else static_cast<double*>(data)[i] = v;
                        }
                      }),
            SHOAL_OK)
      << run.error(0);
  return run.run(hook);
}

TEST(PayloadValidation, TopkHonestRun) {
  Lockstep run(shoal::compressors::topk(), 3);
  ASSERT_EQ(runTopk(run, nullptr), SHOAL_OK) << run.error(run.failedRank());
}

TEST(PayloadValidation, TopkMalformedGathers) {
  struct Case {
    const char* needle;
    std::function<void(Delivered&)> corrupt;
  };
  const Case cases[] = {
      {"past the", [](Delivered& d) { setWord(d, 2, 61); }},               // rank 0's pair 1: index 61 of 61
      {"past the", [](Delivered& d) { setWord(d, 20, ~uint64_t(0)); }},    // rank 1's first index
      {"not above", [](Delivered& d) { setWord(d, 2, word(d, 0)); }},      // a repeated index
      {"words", [](Delivered& d) { d.counts[1] -= 1; }},                   // an odd count
      {"words", [](Delivered& d) { d.counts[2] = 1000; }},                 // a count past what anyone sends
      {"words", [](Delivered& d) { d.counts[0] = 0; }},                    // a rank that sent nothing
  };
  for (const Case& c : cases) {
    Lockstep run(shoal::compressors::topk(), 3);
    auto status = runTopk(run, [&](Delivered& d) {
      if (d.round == 0) c.corrupt(d);
    });
    expectRefusedEverywhere(run, status, "topk", c.needle);
  }
}

// ---- cast: round 0 sums 16-bit floats; every bit pattern decodes -------------------
TEST(PayloadValidation, CastDecodesAnyBitsAndStopsAfterRoundOne) {
  for (const shoal_compressor_t* table : {shoal::compressors::fp16(), shoal::compressors::bf16()}) {
    Lockstep run(table, 2);
    ASSERT_EQ(run.create({}), SHOAL_OK);
    ASSERT_EQ(run.start({{SHOAL_F32, {64}, ""}}, SHOAL_SUM, 0,
                        [](int r, int, void* data) {
                          for (int i = 0; i < 64; ++i) static_cast<float*>(data)[i] = float(i - r);
                        }),
              SHOAL_OK);
    auto status = run.run([](Delivered& d) {
      for (size_t i = 0; i < d.bytes.size(); ++i) d.bytes[i] = uint8_t(i * 37 + 11);  // NaNs, Infs, subnormals
    });
    EXPECT_EQ(status, SHOAL_OK) << run.error(run.failedRank());
  }
  // A round past the last is refused (a driver bug), not a second decode.
  // (Lockstep::run stops at done: the third round is driven by hand.)
  const shoal_compressor_t* table = shoal::compressors::fp16();
  void* instance = nullptr;
  shoal_compressor_params_t params{};
  params.struct_size = sizeof params;
  ASSERT_EQ(table->create(&params, &instance), SHOAL_OK);
  float in[4] = {1, 2, 3, 4}, out[4];
  shoal_compress_tensor_t tensor{};
  tensor.input = shoal_tensor_1d(in, 4, SHOAL_F32);
  tensor.output = shoal_tensor_1d(out, 4, SHOAL_F32);
  char error[256] = {};
  shoal_compress_op_t op{};
  op.struct_size = sizeof op;
  op.world_size = 1;
  op.op = SHOAL_SUM;
  op.num_tensors = 1;
  op.tensors = &tensor;
  op.error_text = error;
  op.error_text_size = sizeof error;
  void* state = nullptr;
  ASSERT_EQ(table->start(instance, &op, &state), SHOAL_OK);
  shoal_round_t round{};
  round.struct_size = sizeof round;
  round.index = 2;
  EXPECT_EQ(table->round(instance, state, &op, &round), SHOAL_ERR_INTERNAL);
  EXPECT_NE(std::string(error).find("done after round 1"), std::string::npos) << error;
  table->finish(instance, state);
  table->destroy(instance);
}

// ---- powersgd: rounds 0 and 1 sum f32 factors; non-finite factors must not crash ----
TEST(PayloadValidation, PowerSgdNonFiniteFactors) {
  for (int corruptRound : {0, 1}) {
    Lockstep run(shoal::compressors::powersgd(), 2);
    ASSERT_EQ(run.create({{"rank", "2"}, {"start_iter", "0"}}), SHOAL_OK) << run.error(0);
    ASSERT_EQ(run.start({{SHOAL_F32, {16, 12}, "w"}}, SHOAL_SUM, 0,
                        [](int r, int, void* data) {
                          for (int i = 0; i < 16 * 12; ++i)
                            static_cast<float*>(data)[i] = float((i * 5 + r) % 9) - 4.0f;
                        }),
              SHOAL_OK)
        << run.error(0);
    bool corrupted = false;
    auto status = run.run([&](Delivered& d) {
      if (d.round != corruptRound) return;
      const uint32_t bits[] = {0x7fc00000u, 0x7f800000u, 0xff800000u, 0x7f7fffffu};
      for (size_t i = 0; i + 4 <= d.bytes.size(); i += 4) std::memcpy(&d.bytes[i], &bits[(i / 4) % 4], 4);
      corrupted = true;
    });
    EXPECT_TRUE(corrupted);
    // Garbage in, garbage out, the same on every rank: no crash, no sanitizer report.
    EXPECT_EQ(status, SHOAL_OK) << run.error(run.failedRank());
  }
}

// ---- qint8 (the example plugin, built with this test into SHOAL_TEST_PLUGIN_DIR) -------
TEST(PayloadValidation, Qint8BlockMaximumBelowOwnValues) {
  setenv("SHOAL_PLUGIN_PATH", SHOAL_TEST_PLUGIN_DIR, /*overwrite=*/0);
  const shoal_compressor_t* table = nullptr;
  ASSERT_EQ(shoal_compressor_lookup("qint8", &table), SHOAL_OK)
      << "the example plugin qint8 is not in " SHOAL_TEST_PLUGIN_DIR ": " << shoal_last_error(nullptr);
  for (bool corrupt : {false, true}) {
    Lockstep run(table, 2);
    ASSERT_EQ(run.create({{"block", "16"}}), SHOAL_OK) << run.error(0);
    ASSERT_EQ(run.start({{SHOAL_F32, {64}, ""}}, SHOAL_SUM, 0,
                        [](int r, int, void* data) {
                          for (int i = 0; i < 64; ++i) static_cast<float*>(data)[i] = 1e30f * float(i % 5 - 2 + r);
                        }),
              SHOAL_OK);
    auto status = run.run([&](Delivered& d) {
      if (!corrupt || d.round != 0) return;
      const float tiny = 1e-30f;  // x / tiny * levels overflows int64 if quantized
      for (size_t i = 0; i + 4 <= d.bytes.size(); i += 4) std::memcpy(&d.bytes[i], &tiny, 4);
    });
    if (!corrupt) {
      EXPECT_EQ(status, SHOAL_OK) << run.error(run.failedRank());
      continue;
    }
    expectRefusedEverywhere(run, status, "qint8", "block maximum");
  }
}

}  // namespace
