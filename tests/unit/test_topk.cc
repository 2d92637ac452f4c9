// The topk built-in compressor: selection, rank-order summation, error
// feedback, options, tensor state, and the table driven directly (fused
// tensors, count 0, mixed dtypes). References are computed here independently
// of compressors/topk (a stable sort by fabs, not the bit-key selection).
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "compressors/topk/topk_math.h"
#include "harness/compressor_rounds.h"
#include "harness/dtype_model.h"
#include "harness/harness.h"
#include "shoal/compressor.h"
#include "shoal/shoal.h"

namespace {

using shoal::test::CompressorRounds;
using shoal::test::runRanks;

bool contains(const std::string& haystack, const std::string& needle) {
  return haystack.find(needle) != std::string::npos;
}

template <typename T>
constexpr shoal_dtype_t dtypeOf() {
  return sizeof(T) == 4 ? SHOAL_F32 : SHOAL_F64;
}

// Deterministic data: splitmix64 of (seed, rank, step, index) -> [-1, 1), or an
// integer in [-64, 64] (whose sums are exact in any order).
using shoal::test::mix64;  // splitmix64 (harness/dtype_model.h)

double uniform(uint64_t seed, int rank, int step, size_t i) {
  uint64_t h = mix64(seed ^ mix64(uint64_t(rank) * 1000003u ^ mix64(uint64_t(step) * 7919u ^ mix64(i))));
  return double(h >> 11) * 0x1.0p-52 - 1.0;
}

template <typename T>
std::vector<T> gradient(uint64_t seed, int rank, int step, size_t count, bool integers = false) {
  std::vector<T> g(count);
  for (size_t i = 0; i < count; ++i) {
    double u = uniform(seed, rank, step, i);
    g[i] = integers ? T(std::floor(u * 64.5)) : T(u);
  }
  return g;
}

// The reference selection: a stable sort by magnitude (NaN first), so ties keep index order.
template <typename T>
std::vector<size_t> referenceTopK(const std::vector<T>& v, size_t k) {
  std::vector<size_t> index(v.size());
  std::iota(index.begin(), index.end(), size_t{0});
  std::stable_sort(index.begin(), index.end(), [&](size_t a, size_t b) {
    bool nanA = std::isnan(v[a]), nanB = std::isnan(v[b]);
    if (nanA || nanB) return nanA && !nanB;
    return std::fabs(v[a]) > std::fabs(v[b]);
  });
  index.resize(std::min(k, v.size()));
  return index;
}

// Every rank's error feedback, simulated.
template <typename T>
struct Reference {
  int n;
  size_t count, k;
  bool ef;
  std::vector<std::vector<T>> error;      // e per rank (zeros with ef = 0)
  std::vector<std::vector<T>> sent;       // last step's sent values per rank (0 elsewhere)
  std::vector<std::vector<T>> corrected;  // last step's g' = g + e_old per rank

  Reference(int n_, size_t count_, size_t k_, bool ef_)
      : n(n_), count(count_), k(k_), ef(ef_), error(n_, std::vector<T>(count_, T(0))), sent(n_), corrected(n_) {}

  std::vector<T> step(const std::vector<std::vector<T>>& g, bool avg) {
    std::vector<T> out(count, T(0));
    for (int r = 0; r < n; ++r) {
      std::vector<T> gp(count);
      for (size_t i = 0; i < count; ++i) gp[i] = g[r][i] + error[r][i];
      corrected[r] = gp;
      sent[r].assign(count, T(0));
      for (size_t i : referenceTopK(gp, k)) {
        sent[r][i] = gp[i];
        out[i] += gp[i];
        gp[i] = T(0);
      }
      if (ef) error[r] = gp;
    }
    if (avg)
      for (T& x : out) x /= T(n);
    return out;
  }
};

template <typename T>
bool sameBits(const std::vector<T>& a, const std::vector<T>& b, std::string* where = nullptr) {
  if (a.size() != b.size()) {
    if (where) *where = "sizes differ";
    return false;
  }
  for (size_t i = 0; i < a.size(); ++i)
    if (std::memcmp(&a[i], &b[i], sizeof(T)) != 0) {
      if (where)
        *where = "element " + std::to_string(i) + ": " + std::to_string(double(a[i])) + " vs " +
                 std::to_string(double(b[i]));
      return false;
    }
  return true;
}

shoal_allreduce_options_t topkOptions(const char* options, const char* name) {
  shoal_allreduce_options_t opts = SHOAL_ALLREDUCE_OPTIONS_INIT;
  opts.compressor = "topk";
  opts.compressor_options = options;
  opts.name = name;
  opts.compress_min_bytes = 0;
  return opts;
}

template <typename T>
shoal_status_t allreduce(shoal_comm_t comm, const std::vector<T>& in, std::vector<T>& out, shoal_op_t op,
                         const char* options, const char* name) {
  shoal_tensor_t input = shoal_tensor_1d(const_cast<T*>(in.data()), in.size(), dtypeOf<T>());
  shoal_tensor_t output = shoal_tensor_1d(out.data(), out.size(), dtypeOf<T>());
  shoal_allreduce_options_t opts = topkOptions(options, name);
  return shoal_allreduce_tensor(comm, &input, &output, op, &opts);
}

template <typename T>
shoal_status_t allreduceInPlace(shoal_comm_t comm, std::vector<T>& data, shoal_op_t op, const char* options,
                                const char* name) {
  shoal_tensor_t tensor = shoal_tensor_1d(data.data(), data.size(), dtypeOf<T>());
  shoal_allreduce_options_t opts = topkOptions(options, name);
  return shoal_allreduce_tensor(comm, &tensor, &tensor, op, &opts);
}

// The saved error vector of a tensor (status through *status).
template <typename T>
std::vector<T> savedError(shoal_comm_t comm, const char* options, const char* name, shoal_status_t* status) {
  size_t bytes = 0;
  *status = shoal_compressor_state_save(comm, "topk", options, name, nullptr, &bytes);
  if (*status != SHOAL_OK) return {};
  std::vector<T> e(bytes / sizeof(T));
  EXPECT_EQ(bytes % sizeof(T), 0u);
  *status = shoal_compressor_state_save(comm, "topk", options, name, e.data(), &bytes);
  return e;
}

// ---- the per-element logic (topk_math.h) ------------------------------------------

// The packed f32 selection word and the (key, index) order agree, and the key
// orders magnitudes with every NaN above +inf and +0 == -0.
TEST(TopkMath, KeysAndWordsAgree) {
  const float nan = std::numeric_limits<float>::quiet_NaN(), inf = std::numeric_limits<float>::infinity();
  const float denormal = std::numeric_limits<float>::denorm_min(), tiny = std::numeric_limits<float>::min();
  const std::vector<float> values = {0.0f, -0.0f, denormal, -denormal, tiny, 1.0f, -1.0f, 1.5f, -2.0f,
                                     std::numeric_limits<float>::max(), inf, -inf, nan, -nan, 1.0f, 0.0f};
  for (uint32_t a = 0; a < values.size(); ++a)
    for (uint32_t b = 0; b < values.size(); ++b) {
      if (a == b) continue;
      float x = values[a], y = values[b];
      bool before = shoal::topk::selectedBefore(shoal::topk::magnitudeKey(x), a, shoal::topk::magnitudeKey(y), b);
      bool expected = std::isnan(x) != std::isnan(y) ? std::isnan(x)
                      : (std::isnan(x) || std::fabs(x) == std::fabs(y)) ? a < b
                                                                          : std::fabs(x) > std::fabs(y);
      EXPECT_EQ(before, expected) << a << " vs " << b;
      EXPECT_EQ(shoal::topk::selectionWord(x, a) > shoal::topk::selectionWord(y, b), expected) << a << " vs " << b;
      double dx = x, dy = y;
      EXPECT_EQ(shoal::topk::selectedBefore(shoal::topk::magnitudeKey(dx), a, shoal::topk::magnitudeKey(dy), b),
                expected)
          << a << " vs " << b;
    }
  for (uint32_t i : {0u, 1u, 4099u, 0xffffffffu})
    EXPECT_EQ(shoal::topk::selectionIndex(shoal::topk::selectionWord(2.0f, i)), i);
  uint64_t pair[2];
  shoal::topk::packPair(pair, 12345, -3.25f);
  EXPECT_EQ(pair[0], 12345u);
  EXPECT_EQ(pair[1] >> 32, 0u);
  EXPECT_EQ(shoal::topk::wordValue<float>(pair[1]), -3.25f);
  shoal::topk::packPair(pair, 7, -0.1);
  EXPECT_EQ(shoal::topk::wordValue<double>(pair[1]), -0.1);
}

// ---- the table and its options ----------------------------------------------------

const shoal_compressor_t* topkTable() {
  const shoal_compressor_t* table = nullptr;
  EXPECT_EQ(shoal_compressor_lookup("topk", &table), SHOAL_OK) << shoal_last_error(nullptr);
  return table;
}

// create() with "k=v" pairs; error text through *text.
shoal_status_t createWith(const std::vector<std::pair<std::string, std::string>>& options, void** instance,
                          std::string* text) {
  const shoal_compressor_t* table = topkTable();
  std::vector<const char*> keys, values;
  for (auto& [k, v] : options) {
    keys.push_back(k.c_str());
    values.push_back(v.c_str());
  }
  char error[512] = {};
  shoal_compressor_params_t params{};
  params.struct_size = sizeof params;
  params.num_options = int(keys.size());
  params.keys = keys.data();
  params.values = values.data();
  params.error_text = error;
  params.error_text_size = sizeof error;
  shoal_status_t status = table->create(&params, instance);
  *text = error;
  return status;
}

TEST(Topk, TableDeclaresItself) {
  const shoal_compressor_t* table = topkTable();
  ASSERT_NE(table, nullptr);
  EXPECT_STREQ(table->name, "topk");
#if SHOAL_WITH_CUDA
  EXPECT_EQ(table->caps, SHOAL_CAP_HOST | SHOAL_CAP_STATEFUL | SHOAL_CAP_CUDA);  // GPU kernels in this build
#else
  EXPECT_EQ(table->caps, SHOAL_CAP_HOST | SHOAL_CAP_STATEFUL);
#endif
  EXPECT_EQ(table->error_kind, SHOAL_ERROR_FEEDBACK);
  EXPECT_EQ(table->dtypes, (1u << SHOAL_F32) | (1u << SHOAL_F64));
  EXPECT_TRUE(contains(table->options_help, "k=") && contains(table->options_help, "ratio=") &&
              contains(table->options_help, "ef="));
  EXPECT_NE(table->save_tensor_state, nullptr);
  EXPECT_NE(table->load_tensor_state, nullptr);
  EXPECT_NE(table->destroy_tensor_state, nullptr);
}

TEST(Topk, RefusesBadOptions) {
  struct Case {
    std::vector<std::pair<std::string, std::string>> options;
    std::vector<std::string> mentions;
  };
  const std::vector<Case> cases = {
      {{{"k", "0"}}, {"k", ">= 1", "'0'"}},
      {{{"k", "-3"}}, {"k"}},
      {{{"k", "2.5"}}, {"k"}},
      {{{"k", ""}}, {"k"}},
      {{{"ratio", "0"}}, {"ratio", "(0, 1]"}},
      {{{"ratio", "1.5"}}, {"ratio", "(0, 1]", "1.5"}},
      {{{"ratio", "-0.1"}}, {"ratio"}},
      {{{"ratio", "nan"}}, {"ratio"}},
      {{{"ratio", "0.1x"}}, {"ratio"}},
      {{{"k", "4"}, {"ratio", "0.1"}}, {"k", "ratio", "not both"}},
      {{{"foo", "1"}}, {"foo", "k=", "ratio=", "ef="}},
      {{{"ef", "2"}}, {"ef", "0 or 1"}},
  };
  for (const Case& c : cases) {
    void* instance = nullptr;
    std::string text;
    EXPECT_EQ(createWith(c.options, &instance, &text), SHOAL_ERR_INVALID_ARGUMENT) << c.options[0].first;
    for (const std::string& mention : c.mentions)
      EXPECT_TRUE(contains(text, mention)) << "'" << text << "' should mention '" << mention << "'";
  }
  for (auto good : std::vector<std::vector<std::pair<std::string, std::string>>>{
           {}, {{"k", "1"}}, {{"ratio", "1"}}, {{"ratio", "1e-6"}}, {{"k", "5"}, {"ef", "0"}}, {{"ef", "1"}}}) {
    void* instance = nullptr;
    std::string text;
    EXPECT_EQ(createWith(good, &instance, &text), SHOAL_OK) << text;
    topkTable()->destroy(instance);
  }

  // And through the API: the call fails on every rank, the communicator stays usable.
  runRanks(2, [](int, shoal_comm_t comm) {
    std::vector<float> in(16, 1.0f), out(16);
    const std::vector<std::pair<const char*, const char*>> bad = {{"k=0", "option k"},
                                                                  {"ratio=0", "option ratio"},
                                                                  {"ratio=1.5", "(0, 1]"},
                                                                  {"k=2,ratio=0.5", "not both"},
                                                                  {"foo=1", "'foo'"}};
    for (auto [options, mention] : bad) {
      EXPECT_EQ(allreduce(comm, in, out, SHOAL_SUM, options, "w"), SHOAL_ERR_INVALID_ARGUMENT) << options;
      std::string error = shoal_last_error(comm);
      EXPECT_TRUE(contains(error, "topk") && contains(error, mention)) << error;
    }
    EXPECT_EQ(allreduce(comm, in, out, SHOAL_SUM, "k=16", "w"), SHOAL_OK) << shoal_last_error(comm);
    EXPECT_EQ(out, std::vector<float>(16, 2.0f));
  });
}

TEST(Topk, UnnamedTensorsGetAKey) {
  runRanks(2, [](int, shoal_comm_t comm) {
    std::vector<float> in(8, 1.0f), out(8);
    // With error feedback the residual is kept by name; an unnamed call's name is derived from its
    // output buffer, dtype and shape (issue 13.2; tests/compressors/test_unnamed_state.cc).
    EXPECT_EQ(allreduce(comm, in, out, SHOAL_SUM, "k=2", nullptr), SHOAL_OK) << shoal_last_error(comm);
    // Without it topk keeps nothing between calls: an unnamed tensor is fine.
    EXPECT_EQ(allreduce(comm, in, out, SHOAL_SUM, "k=8,ef=0", nullptr), SHOAL_OK) << shoal_last_error(comm);
    EXPECT_EQ(out, std::vector<float>(8, 2.0f));
    EXPECT_EQ(allreduce(comm, in, out, SHOAL_SUM, "k=8", "w"), SHOAL_OK) << shoal_last_error(comm);
    EXPECT_EQ(out, std::vector<float>(8, 2.0f));
  });
}

// ---- against the reference ------------------------------------------------------------

struct SweepCase {
  const char* options;
  size_t count;
  size_t k;  // what the options mean for count
  bool ef;
  shoal_op_t op;
  bool inPlace;
};

std::vector<SweepCase> sweepCases() {
  std::vector<SweepCase> cases;
  for (size_t count : {size_t{1}, size_t{7}, size_t{4099}}) {
    auto ceilRatio = [count](double ratio) { return std::max<size_t>(1, size_t(std::ceil(ratio * double(count)))); };
    cases.push_back({"k=3", count, std::min<size_t>(3, count), true, SHOAL_SUM, false});
    cases.push_back({"k=3", count, std::min<size_t>(3, count), true, SHOAL_AVG, true});
    cases.push_back({"ratio=0.5", count, ceilRatio(0.5), true, SHOAL_SUM, true});
    cases.push_back({"", count, ceilRatio(0.01), true, SHOAL_SUM, false});  // default ratio=0.01, ef=1
    cases.push_back({"k=5,ef=0", count, std::min<size_t>(5, count), false, SHOAL_SUM, false});
    cases.push_back({"k=100000", count, count, true, SHOAL_AVG, false});  // k >= count: everything sent
  }
  return cases;
}

template <typename T>
void sweep(int n, int rank, shoal_comm_t comm) {
  const int kSteps = 3;
  int caseNumber = 0;
  for (const SweepCase& c : sweepCases()) {
    std::string name = std::string("w") + (sizeof(T) == 4 ? "f" : "d") + std::to_string(caseNumber++);
    Reference<T> reference(n, c.count, c.k, c.ef);
    for (int step = 0; step < kSteps; ++step) {
      std::vector<std::vector<T>> g(n);
      for (int r = 0; r < n; ++r) g[r] = gradient<T>(17 + caseNumber, r, step, c.count);
      std::vector<T> expected = reference.step(g, c.op == SHOAL_AVG);
      std::vector<T> out(c.count, T(-7));
      shoal_status_t status;
      if (c.inPlace) {
        out = g[rank];
        status = allreduceInPlace(comm, out, c.op, c.options, name.c_str());
      } else {
        status = allreduce(comm, g[rank], out, c.op, c.options, name.c_str());
      }
      const std::string what = "options '" + std::string(c.options) + "' count " + std::to_string(c.count) +
                               " step " + std::to_string(step) + " rank " + std::to_string(rank) + "/" +
                               std::to_string(n) + (c.op == SHOAL_AVG ? " avg" : " sum") +
                               (c.inPlace ? " in place" : "");
      ASSERT_EQ(status, SHOAL_OK) << what << ": " << shoal_last_error(comm);
      std::string where;
      EXPECT_TRUE(sameBits(out, expected, &where)) << what << ": " << where;
      EXPECT_LE(std::count_if(out.begin(), out.end(), [](T x) { return x != T(0); }), ptrdiff_t(n * c.k)) << what;
      shoal_status_t saveStatus;
      std::vector<T> e = savedError<T>(comm, c.options, name.c_str(), &saveStatus);
      if (c.ef) {
        ASSERT_EQ(saveStatus, SHOAL_OK) << what << ": " << shoal_last_error(comm);
        EXPECT_TRUE(sameBits(e, reference.error[rank], &where)) << what << " residual: " << where;
      } else {
        EXPECT_EQ(saveStatus, SHOAL_ERR_NOT_FOUND) << what << ": ef=0 keeps no residual";
      }
    }
  }
}

class TopkRanks : public ::testing::TestWithParam<int> {};

TEST_P(TopkRanks, MatchesReferenceF32) {
  int n = GetParam();
  runRanks(n, [n](int rank, shoal_comm_t comm) { sweep<float>(n, rank, comm); }, {nullptr, 30});
}

TEST_P(TopkRanks, MatchesReferenceF64) {
  int n = GetParam();
  runRanks(n, [n](int rank, shoal_comm_t comm) { sweep<double>(n, rank, comm); }, {nullptr, 30});
}

// k = count with integer-valued data: the exact sum, whatever the order.
TEST_P(TopkRanks, ExactWhenEverythingIsSent) {
  int n = GetParam();
  runRanks(n, [n](int rank, shoal_comm_t comm) {
    for (size_t count : {size_t{1}, size_t{7}, size_t{4099}}) {
      std::string options = "k=" + std::to_string(count);
      for (int step = 0; step < 2; ++step) {
        std::vector<long double> exact(count, 0);
        for (int r = 0; r < n; ++r) {
          std::vector<double> g = gradient<double>(5, r, step, count, true);
          for (size_t i = 0; i < count; ++i) exact[i] += g[i];
        }
        std::vector<float> in = gradient<float>(5, rank, step, count, true), out(count);
        ASSERT_EQ(allreduce(comm, in, out, SHOAL_SUM, options.c_str(), "exact32"), SHOAL_OK) << shoal_last_error(comm);
        std::vector<double> in64 = gradient<double>(5, rank, step, count, true), out64(count);
        ASSERT_EQ(allreduce(comm, in64, out64, SHOAL_SUM, options.c_str(), "exact64"), SHOAL_OK)
            << shoal_last_error(comm);
        for (size_t i = 0; i < count; ++i) {
          EXPECT_EQ(out[i], float(exact[i])) << i;
          EXPECT_EQ(out64[i], double(exact[i])) << i;
        }
        // Nothing is left behind.
        shoal_status_t status;
        std::vector<float> e = savedError<float>(comm, options.c_str(), "exact32", &status);
        ASSERT_EQ(status, SHOAL_OK);
        EXPECT_EQ(e, std::vector<float>(count, 0.0f));
      }
    }
  });
}

// Error feedback conserves mass: per rank out_r (n = 1) + e_new == g + e_old, and
// for n > 1 the sum over ranks of sent_r = g + e_old - e_new is the output, with
// the same bits on every rank.
TEST_P(TopkRanks, ErrorFeedbackConserves) {
  const int n = GetParam();
  const size_t count = 1031, k = 10;
  const int kSteps = 5;
  // [step][rank]: output, g + e_old, e_new
  std::vector<std::vector<std::vector<float>>> outs(kSteps, std::vector<std::vector<float>>(n)), corrected = outs,
                                                                                                 residual = outs;
  runRanks(n, [&](int rank, shoal_comm_t comm) {
    std::vector<float> e(count, 0.0f);
    for (int step = 0; step < kSteps; ++step) {
      std::vector<float> g = gradient<float>(99, rank, step, count), out(count);
      ASSERT_EQ(allreduce(comm, g, out, SHOAL_SUM, "k=10", "cons"), SHOAL_OK) << shoal_last_error(comm);
      shoal_status_t status;
      std::vector<float> eNew = savedError<float>(comm, "k=10", "cons", &status);
      ASSERT_EQ(status, SHOAL_OK) << shoal_last_error(comm);
      ASSERT_EQ(eNew.size(), count);
      std::vector<float> gp(count);
      for (size_t i = 0; i < count; ++i) gp[i] = g[i] + e[i];
      outs[step][rank] = out;
      corrected[step][rank] = gp;
      residual[step][rank] = eNew;
      e = eNew;
    }
  });
  if (::testing::Test::HasFailure()) return;
  for (int step = 0; step < kSteps; ++step) {
    std::vector<float> total(count, 0.0f);
    for (int r = 0; r < n; ++r) {
      size_t sentCount = 0;
      for (size_t i = 0; i < count; ++i) {
        float sent = corrected[step][r][i] - residual[step][r][i];
        // Exactly one of sent and e_new is nonzero (or both zero): the split is exact.
        EXPECT_TRUE(residual[step][r][i] == 0.0f || sent == 0.0f) << "step " << step << " rank " << r << " " << i;
        EXPECT_EQ(sent + residual[step][r][i], corrected[step][r][i]);
        if (residual[step][r][i] == 0.0f && corrected[step][r][i] != 0.0f) ++sentCount;
        total[i] += sent;
      }
      EXPECT_EQ(sentCount, k) << "step " << step << " rank " << r;
      if (n == 1) {
        for (size_t i = 0; i < count; ++i)
          EXPECT_EQ(outs[step][0][i] + residual[step][0][i], corrected[step][0][i]) << i;
      }
      std::string where;
      EXPECT_TRUE(sameBits(outs[step][r], outs[step][0], &where)) << "rank " << r << " differs: " << where;
    }
    std::string where;
    EXPECT_TRUE(sameBits(outs[step][0], total, &where)) << "step " << step << ": " << where;
  }
}

INSTANTIATE_TEST_SUITE_P(Ranks, TopkRanks, ::testing::Values(1, 2, 3, 5),
                         [](const ::testing::TestParamInfo<int>& info) { return std::to_string(info.param); });

// ---- details ------------------------------------------------------------------------

TEST(Topk, TiesGoToTheLowerIndex) {
  runRanks(1, [](int, shoal_comm_t comm) {
    // |2| at 4 and 5, |1| at 0..3: k = 3 keeps 4, 5 and the lowest-index 1 (index 0).
    std::vector<float> g = {1, -1, 1, -1, 2, -2, 0.5f, -0.0f};
    std::vector<float> out(g.size());
    ASSERT_EQ(allreduce(comm, g, out, SHOAL_SUM, "k=3,ef=0", "ties"), SHOAL_OK) << shoal_last_error(comm);
    EXPECT_EQ(out, (std::vector<float>{1, 0, 0, 0, 2, -2, 0, 0}));
    // Zeros tie too (+0 and -0 alike): k = 2 keeps 3.0 and the zero at index 0.
    std::vector<double> z = {0.0, -0.0, 0.0, 3.0}, zout(4);
    ASSERT_EQ(allreduce(comm, z, zout, SHOAL_SUM, "k=2,ef=0", "zeros"), SHOAL_OK) << shoal_last_error(comm);
    EXPECT_EQ(zout, (std::vector<double>{0, 0, 0, 3}));
  });
  // Across ranks: each rank's own ties, summed.
  runRanks(3, [](int rank, shoal_comm_t comm) {
    std::vector<double> g(6, double(rank + 1));  // all tied: every rank keeps indices 0 and 1
    std::vector<double> out(6);
    ASSERT_EQ(allreduce(comm, g, out, SHOAL_SUM, "k=2", "ties"), SHOAL_OK) << shoal_last_error(comm);
    EXPECT_EQ(out, (std::vector<double>{6, 6, 0, 0, 0, 0}));
    // Next step: the residual (rank+1 at 2..5) plus the same g ties again at 2..5 (2*(rank+1)), ahead of 0, 1.
    ASSERT_EQ(allreduce(comm, g, out, SHOAL_SUM, "k=2", "ties"), SHOAL_OK) << shoal_last_error(comm);
    EXPECT_EQ(out, (std::vector<double>{0, 0, 12, 12, 0, 0}));
  });
}

TEST(Topk, NanCountsAsLargest) {
  runRanks(1, [](int, shoal_comm_t comm) {
    const float nan = std::numeric_limits<float>::quiet_NaN(), inf = std::numeric_limits<float>::infinity();
    std::vector<float> g = {1, -nan, 3, -inf, nan}, out(5);
    ASSERT_EQ(allreduce(comm, g, out, SHOAL_SUM, "k=2,ef=0", "nan"), SHOAL_OK) << shoal_last_error(comm);
    EXPECT_TRUE(std::isnan(out[1]) && std::isnan(out[4]));  // both NaNs, before -inf
    EXPECT_EQ(out[0], 0.0f);
    EXPECT_EQ(out[2], 0.0f);
    EXPECT_EQ(out[3], 0.0f);
    ASSERT_EQ(allreduce(comm, g, out, SHOAL_SUM, "k=3,ef=0", "nan"), SHOAL_OK) << shoal_last_error(comm);
    EXPECT_EQ(out[3], -inf);
  });
}

TEST(Topk, WithoutErrorFeedbackNothingIsKept) {
  runRanks(2, [](int rank, shoal_comm_t comm) {
    const size_t count = 257;
    for (int step = 0; step < 3; ++step) {
      std::vector<std::vector<float>> g = {gradient<float>(3, 0, step, count), gradient<float>(3, 1, step, count)};
      std::vector<float> out(count), expected(count, 0.0f);
      for (int r = 0; r < 2; ++r)
        for (size_t i : referenceTopK(g[r], 4)) expected[i] += g[r][i];
      ASSERT_EQ(allreduce(comm, g[rank], out, SHOAL_SUM, "k=4,ef=0", "noef"), SHOAL_OK) << shoal_last_error(comm);
      std::string where;
      EXPECT_TRUE(sameBits(out, expected, &where)) << "step " << step << ": " << where;
      size_t bytes = 0;
      EXPECT_EQ(shoal_compressor_state_save(comm, "topk", "k=4,ef=0", "noef", nullptr, &bytes), SHOAL_ERR_NOT_FOUND);
    }
    float state[4] = {};
    EXPECT_NE(shoal_compressor_state_load(comm, "topk", "k=4,ef=0", "noef", state, sizeof state), SHOAL_OK);
  });
}

TEST(Topk, RatioKeepsCeilOfTheFraction) {
  runRanks(1, [](int, shoal_comm_t comm) {
    auto kept = [&](const char* options, size_t count) {
      std::vector<double> g(count), out(count);
      for (size_t i = 0; i < count; ++i) g[i] = double(i + 1);
      EXPECT_EQ(allreduce(comm, g, out, SHOAL_SUM, options, (std::string("r") + options).c_str()), SHOAL_OK)
          << shoal_last_error(comm);
      return size_t(std::count_if(out.begin(), out.end(), [](double x) { return x != 0; }));
    };
    EXPECT_EQ(kept("ratio=0.07", 100), 7u);  // 0.07 * 100 is 7.000000000000001 in doubles
    EXPECT_EQ(kept("ratio=0.071", 100), 8u);
    EXPECT_EQ(kept("ratio=0.0001", 100), 1u);
    EXPECT_EQ(kept("ratio=1", 100), 100u);
    EXPECT_EQ(kept("ratio=0.5", 7), 4u);
    EXPECT_EQ(kept("k=9", 4), 4u);
  });
}

TEST(Topk, StateSavesAndLoads) {
  runRanks(1, [](int, shoal_comm_t comm) {
    const size_t count = 64;
    std::vector<float> g = gradient<float>(11, 0, 0, count), out(count);
    ASSERT_EQ(allreduce(comm, g, out, SHOAL_SUM, "k=4", "a"), SHOAL_OK) << shoal_last_error(comm);
    shoal_status_t status;
    std::vector<float> e = savedError<float>(comm, "k=4", "a", &status);
    ASSERT_EQ(status, SHOAL_OK);
    ASSERT_EQ(e.size(), count);
    // Layout: the error vector, g with the 4 sent elements zeroed.
    std::vector<float> expected = g;
    for (size_t i : referenceTopK(g, 4)) expected[i] = 0;
    EXPECT_EQ(e, expected);

    // A buffer too small is refused.
    size_t small = 8;
    EXPECT_NE(shoal_compressor_state_save(comm, "topk", "k=4", "a", e.data(), &small), SHOAL_OK);

    // Load into a fresh name: its first call starts from that residual.
    std::vector<float> loaded(count);
    for (size_t i = 0; i < count; ++i) loaded[i] = float(i % 5) * 0.25f;
    ASSERT_EQ(shoal_compressor_state_load(comm, "topk", "k=4", "b", loaded.data(), count * sizeof(float)), SHOAL_OK)
        << shoal_last_error(comm);
    ASSERT_EQ(allreduce(comm, g, out, SHOAL_SUM, "k=4", "b"), SHOAL_OK) << shoal_last_error(comm);
    Reference<float> reference(1, count, 4, true);
    reference.error[0] = loaded;
    std::vector<float> expectedOut = reference.step({g}, false);
    EXPECT_EQ(out, expectedOut);
    EXPECT_EQ(savedError<float>(comm, "k=4", "b", &status), reference.error[0]);

    // Loading into an existing state needs its size.
    EXPECT_EQ(shoal_compressor_state_load(comm, "topk", "k=4", "b", loaded.data(), 8 * sizeof(float)),
              SHOAL_ERR_INVALID_ARGUMENT);
    EXPECT_EQ(shoal_compressor_state_load(comm, "topk", "k=4", "b", loaded.data(), count * sizeof(float)), SHOAL_OK);
    EXPECT_EQ(savedError<float>(comm, "k=4", "b", &status), loaded);

    // A state loaded for a fresh name with the wrong size is refused by the first call, with the reason.
    ASSERT_EQ(shoal_compressor_state_load(comm, "topk", "k=4", "c", loaded.data(), 10 * sizeof(float)), SHOAL_OK);
    EXPECT_EQ(allreduce(comm, g, out, SHOAL_SUM, "k=4", "c"), SHOAL_ERR_INVALID_ARGUMENT);
    EXPECT_TRUE(contains(shoal_last_error(comm), "'c'") && contains(shoal_last_error(comm), "40 bytes"))
        << shoal_last_error(comm);

    // A name keeps its shape and dtype.
    std::vector<float> other(count + 1, 1.0f), otherOut(count + 1);
    EXPECT_EQ(allreduce(comm, other, otherOut, SHOAL_SUM, "k=4", "a"), SHOAL_ERR_INVALID_ARGUMENT);
    EXPECT_TRUE(contains(shoal_last_error(comm), "'a'")) << shoal_last_error(comm);
    std::vector<double> wider(count, 1.0), widerOut(count);
    EXPECT_EQ(allreduce(comm, wider, widerOut, SHOAL_SUM, "k=4", "a"), SHOAL_ERR_INVALID_ARGUMENT);
    // ...and the communicator still works.
    EXPECT_EQ(allreduce(comm, g, out, SHOAL_SUM, "k=4", "a"), SHOAL_OK) << shoal_last_error(comm);
  });
}

TEST(Topk, CountZeroThroughTheApi) {
  runRanks(2, [](int, shoal_comm_t comm) {
    std::vector<float> in, out;
    float dummy = 0;
    shoal_tensor_t input = shoal_tensor_1d(&dummy, 0, SHOAL_F32);
    shoal_tensor_t output = shoal_tensor_1d(&dummy, 0, SHOAL_F32);
    shoal_allreduce_options_t opts = topkOptions("k=2", "empty");
    EXPECT_EQ(shoal_allreduce_tensor(comm, &input, &output, SHOAL_SUM, &opts), SHOAL_OK) << shoal_last_error(comm);
  });
}

// The table driven as the driver would for a fused group (harness/compressor_rounds.h):
// several tensors (count 0, f32 and f64 mixed) in one payload, n ranks simulated,
// two steps so the error feedback carries over.
TEST(Topk, FusedTensorsInOnePayload) {
  const shoal_compressor_t* table = topkTable();
  ASSERT_NE(table, nullptr);
  const int n = 3;
  const size_t k = 2;
  const std::vector<size_t> counts = {0, 5, 7, 1, 0};
  const std::vector<shoal_dtype_t> dtypes = {SHOAL_F32, SHOAL_F32, SHOAL_F64, SHOAL_F32, SHOAL_F64};
  const int tensors = int(counts.size());
  std::vector<CompressorRounds::TensorSpec> specs;
  for (int t = 0; t < tensors; ++t) specs.push_back({dtypes[t], {int64_t(counts[t])}, "t" + std::to_string(t)});

  CompressorRounds rounds(table, n);
  ASSERT_EQ(rounds.create({{"k", "2"}}), SHOAL_OK) << rounds.error(rounds.failedRank());
  rounds.observe([&](int rank, const shoal_round_t& round) {
    if (round.index != 0) return;
    EXPECT_EQ(round.done, 0) << "rank " << rank;
    ASSERT_EQ(round.num_payloads, 1) << "rank " << rank;
    EXPECT_EQ(round.payloads[0].collective, SHOAL_COLLECTIVE_ALLGATHERV);
    EXPECT_EQ(round.payloads[0].dtype, SHOAL_U64);
    EXPECT_EQ(round.payloads[0].count, 2 * (0 + 2 + 2 + 1 + 0));  // min(k, count) pairs per tensor, 2 words each
  });
  for (int step = 0; step < 2; ++step) {
    auto fill = [&](int rank, int t, void* data) {
      if (counts[t] == 0) return;  // an empty tensor has no buffer (memcpy with NULL is undefined)
      if (dtypes[t] == SHOAL_F32) {
        std::vector<float> g = gradient<float>(t, rank, step, counts[t]);
        std::memcpy(data, g.data(), g.size() * sizeof(float));
      } else {
        std::vector<double> g = gradient<double>(t, rank, step, counts[t]);
        std::memcpy(data, g.data(), g.size() * sizeof(double));
      }
    };
    ASSERT_EQ(rounds.allreduce(specs, SHOAL_SUM, uint64_t(step), fill), SHOAL_OK)
        << rounds.error(rounds.failedRank());
    EXPECT_EQ(rounds.rounds(), 1) << "one allgatherv, then done";
  }
  // Reference over both steps, per tensor.
  for (int t = 0; t < tensors; ++t) {
    if (dtypes[t] == SHOAL_F32) {
      Reference<float> reference(n, counts[t], k, true);
      std::vector<float> expected;
      for (int step = 0; step < 2; ++step) {
        std::vector<std::vector<float>> g(n);
        for (int r = 0; r < n; ++r) g[r] = gradient<float>(t, r, step, counts[t]);
        expected = reference.step(g, false);
      }
      for (int r = 0; r < n; ++r) {
        std::string where;
        EXPECT_TRUE(sameBits(rounds.outputAs<float>(r, t), expected, &where))
            << "tensor " << t << " rank " << r << ": " << where;
      }
    } else {
      Reference<double> reference(n, counts[t], k, true);
      std::vector<double> expected;
      for (int step = 0; step < 2; ++step) {
        std::vector<std::vector<double>> g(n);
        for (int r = 0; r < n; ++r) g[r] = gradient<double>(t, r, step, counts[t]);
        expected = reference.step(g, false);
      }
      for (int r = 0; r < n; ++r) {
        std::string where;
        EXPECT_TRUE(sameBits(rounds.outputAs<double>(r, t), expected, &where))
            << "tensor " << t << " rank " << r << ": " << where;
      }
    }
  }
}

}  // namespace
