// The conformance suite every compressor must pass: built-ins and the plugins
// found on SHOAL_PLUGIN_PATH, whatever plugin::Registry::current() lists when
// the tests are registered (so `SHOAL_PLUGIN_PATH=<dir> test_conformance`
// covers a plugin without recompiling). SHOAL_CONFORMANCE_REQUIRE="qint8,topk"
// (commas or spaces) makes the suite fail when a named compressor is missing,
// so CI can insist that a plugin was really found; any plugin the registry
// refused fails the suite too.
//
// Per compressor (tests named <compressor>_<n>ranks), one communicator set per
// rank count n in {1, 2, 3, 5}, and inside it every case: count {0, 1, 7, 4099,
// 2^20+3} x every dtype the compressor declares (its `dtypes` bits) x op {sum,
// avg} x {out of place, in place}. Stateful compressors (SHOAL_CAP_STATEFUL or
// SHOAL_ERROR_FEEDBACK) run 3 steps per case on the same tensor name, with
// fresh inputs each step, so their state carries over (e_old != 0 matters).
// Options: compress_min_bytes = 0, a tensor name per case, compressor_options
// NULL with SHOAL_COMPRESSOR_OPTS unset (kOptionOverrides gives a compressor
// options when its defaults are not testable; none needs them so far).
//
// Inputs are seeded by (compressor, case, step, rank, element). Floats: for
// EXACT compressors, multiples of 1/4 in +-[0.5, 8] (every partial sum of up to
// 5 ranks is exact in every float dtype, bf16 included, so the result cannot
// depend on the reduction order); for the others, uniform in +-[0.5, 8] rounded
// to the dtype (normal numbers in every 16-bit format, no subnormals).
// Integers: -8..8 (unsigned: 0..8), so no sum wraps.
//
// Checks, on every rank and every case:
//  - SHOAL_ERROR_EXACT: the output bits equal the exact result (sum in long
//    double, avg = sum / n rounded once; integer avg truncates toward zero).
//  - SHOAL_ERROR_RELATIVE: |out_i - exact_i| <= error_bound * n * sum_r |x_r,i|
//    (avg: exact and magnitude divided by n), exact in long double.
//  - SHOAL_ERROR_FEEDBACK: with e_old/e_new each rank's error vector read through
//    shoal_compressor_state_save before/after the call (the layout starts with
//    the error vector in the tensor's dtype; no state yet = zeros),
//    out_i == sum_r (g_r,i + e_old_r,i - e_new_r,i) (avg: / n) up to rounding:
//    2 (n + 2) u sum_r (|g| + |e_old| + |e_new|) with u the dtype's unit
//    roundoff (~1e-6 n sum for f32; exact for integers). The state saved after
//    step s must be the state found before step s + 1 (state persists).
//  - every rank holds the same output bits as rank 0;
//  - out of place: the input is not modified;
//  - compressed calls (count > 0) report the compressor in
//    shoal_last_compress_stats, input_bytes = the tensor's bytes and, for every
//    compressor other than "none" and n > 1, payload_bytes > 0 (one rank may
//    legitimately finish without a round: qint8 copies its input).
// Then, per declared dtype: a tensor below compress_min_bytes goes uncompressed
// (stats say "none", result exact) while one of exactly compress_min_bytes is
// compressed; a scalar (ndim 0) tensor works; a stateful compressor refuses an
// unnamed tensor (SHOAL_ERR_INVALID_ARGUMENT), a stateless one takes it; and
// "nonsense_key=1" is refused on every rank with SHOAL_ERR_INVALID_ARGUMENT or
// SHOAL_ERR_NOT_FOUND and a message, after which the communicator still works.
// A separate suite checks each table's declarations (error kind vs caps, bound,
// dtypes, state functions).
//
// Time budget (2 cores, ranks as threads): the large count 2^20+3 runs only with
// 2 ranks, and per dtype only as sum out of place and avg in place (the
// large-message paths of ring/tree are covered by the collectives suite; here
// it exercises the compressors' own large buffers); every other count runs at
// every rank count, both ops, both placements. About 30 s for the built-ins
// and qint8 on an idle 2-core machine (most of it the large count).
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cinttypes>
#include <cmath>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <mutex>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

#include "core/config.h"
#include "harness/dtype_model.h"
#include "harness/harness.h"
#include "harness/rank_sync.h"
#include "plugin/registry.h"
#include "shoal/compressor.h"

namespace {

// In the project's build, the example plugin (built into SHOAL_TEST_PLUGIN_DIR)
// is part of the suite and required, unless the caller chose otherwise. Runs
// before the parameter generators read the registry.
#ifdef SHOAL_TEST_PLUGIN_DIR
const bool kExamplePluginDefaults = [] {
  setenv("SHOAL_PLUGIN_PATH", SHOAL_TEST_PLUGIN_DIR, /*overwrite=*/0);
  setenv("SHOAL_CONFORMANCE_REQUIRE", "qint8", /*overwrite=*/0);
  return true;
}();
#endif

using namespace shoal::test;

// Cleared before any test runs: compressor_options NULL means "from the environment".
const bool kEnvironmentCleared = [] {
  unsetenv("SHOAL_COMPRESSOR_OPTS");
  unsetenv("SHOAL_COMPRESSOR");
  return true;
}();

// Options for compressors whose defaults cannot be tested ("name" -> "k=v,...").
const std::map<std::string, std::string> kOptionOverrides = {};

const char* optionsFor(const std::string& compressor) {
  auto found = kOptionOverrides.find(compressor);
  return found == kOptionOverrides.end() ? nullptr : found->second.c_str();
}

constexpr size_t kBig = (size_t(1) << 20) + 3;
// A matrix-shaped tensor too, [96, 150]: low-rank compressors (powersgd) compress
// only tensors of two or more dimensions.
constexpr int64_t kMatrixRows = 96, kMatrixCols = 150;
constexpr size_t kMatrix = kMatrixRows * kMatrixCols;
const size_t kCounts[] = {0, 1, 7, 4099, kMatrix, kBig};
const shoal_op_t kOps[] = {SHOAL_SUM, SHOAL_AVG};

// ---- hashing -------------------------------------------------------------------

uint64_t hashText(const std::string& text) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : text) h = (h ^ c) * 1099511628211ull;
  return h;
}

inline uint64_t loadBits(const uint8_t* buffer, size_t i, size_t bytes) {
  uint64_t v = 0;
  std::memcpy(&v, buffer + i * bytes, bytes);  // little endian
  return v;
}
inline void storeBits(uint8_t* buffer, size_t i, size_t bytes, uint64_t v) { std::memcpy(buffer + i * bytes, &v, bytes); }

// The value of element bits (integers: as signed or unsigned numbers).
long double valueOf(const DType& t, uint64_t bits) {
  if (t.isFloat) return decodeFloat(t, bits);
  if (t.isSigned) return static_cast<long double>(signExtend(t, bits));
  return static_cast<long double>(bits);
}

// Bits of an integral (integers) or representable (floats) value.
uint64_t bitsOf(const DType& t, long double v) {
  if (t.isFloat) return encodeFloat(t, v);
  return static_cast<uint64_t>(static_cast<int64_t>(v)) & t.mask();
}

std::string show(const DType& t, uint64_t bits) {
  char text[96];
  std::snprintf(text, sizeof text, "%.12Lg (0x%" PRIx64 ")", valueOf(t, bits), bits);
  return text;
}

// ---- inputs ---------------------------------------------------------------------

// Element i of rank r's input for a case seeded by `salt`. `dyadic`: multiples of
// 1/4 (exact sums) instead of values using the dtype's whole significand.
long double inputValue(const DType& t, bool dyadic, uint64_t salt, int rank, size_t i) {
  uint64_t h = hash3(salt, static_cast<uint64_t>(rank), i);
  if (!t.isFloat) return t.isSigned ? static_cast<long double>(static_cast<int>(h % 17) - 8) : h % 9;
  long double sign = (h >> 63) ? -1.0L : 1.0L;
  if (dyadic) return sign * static_cast<long double>(2 + (h >> 8) % 31) / 4;  // 0.5 .. 8
  long double unit = std::ldexp(static_cast<long double>((h >> 8) & ((uint64_t(1) << 53) - 1)), -53);  // [0, 1)
  return roundToFormat(t, sign * (0.5L + 7.5L * unit));
}

// ---- helpers ----------------------------------------------------------------------


// Counts elements that fail a check and remembers the first.
struct Tally {
  size_t bad = 0, first = 0;
  std::string detail;
  template <typename Describe>
  void fail(size_t i, Describe&& describe) {
    if (bad++ == 0) first = i, detail = describe();
  }
  void report(const std::string& what, const std::string& check, size_t count) const {
    if (bad == 0) return;
    ADD_FAILURE() << what << ": " << check << ": " << bad << " of " << count << " elements fail; first at index "
                  << first << ": " << detail;
  }
};

std::string fmtLd(long double v) {
  char text[64];
  std::snprintf(text, sizeof text, "%.12Lg", v);
  return text;
}

const char* opName(shoal_op_t op) { return op == SHOAL_SUM ? "sum" : "avg"; }
const char* kindName(shoal_error_kind_t kind) {
  switch (kind) {
    case SHOAL_ERROR_EXACT: return "EXACT";
    case SHOAL_ERROR_RELATIVE: return "RELATIVE";
    case SHOAL_ERROR_FEEDBACK: return "FEEDBACK";
  }
  return "unknown";
}

std::vector<std::string> registeredCompressors() {
  (void)kEnvironmentCleared;
  std::vector<std::string> names;
  for (const shoal::plugin::Entry& entry : shoal::plugin::Registry::current().entries())
    names.push_back(entry.table->name);
  return names;
}

const shoal_compressor_t* tableOf(const std::string& name) {
  const shoal_compressor_t* table = nullptr;
  if (shoal_compressor_lookup(name.c_str(), &table) != SHOAL_OK) return nullptr;
  return table;
}

std::vector<const DType*> declaredDtypes(const shoal_compressor_t& table) {
  std::vector<const DType*> result;
  for (const DType& t : kDtypes)
    if ((table.dtypes >> t.id) & 1u) result.push_back(&t);
  return result;
}

shoal_tensor_t tensorOf(void* data, size_t count, const DType& t) {
  shoal_tensor_t tensor = shoal_tensor_1d(data, count, t.id);
  if (count == kMatrix) {
    tensor.ndim = 2;
    tensor.shape[0] = kMatrixRows;
    tensor.shape[1] = kMatrixCols;
  }
  return tensor;
}

// ---- the registry -------------------------------------------------------------------

TEST(ConformanceRegistry, RequiredCompressorsAreRegistered) {
  const std::string required = shoal::config::getString("SHOAL_CONFORMANCE_REQUIRE");
  std::vector<std::string> names = registeredCompressors();
  std::string listed;
  for (const std::string& name : names) listed += (listed.empty() ? "" : ", ") + name;
  std::string refused;
  for (const std::string& refusal : shoal::plugin::Registry::current().refusals()) refused += "; refused " + refusal;
  if (required.empty()) GTEST_SKIP() << "SHOAL_CONFORMANCE_REQUIRE is unset; registered: " << listed;
  std::string text = required;
  std::replace(text.begin(), text.end(), ',', ' ');
  std::istringstream words(text);
  std::string want;
  while (words >> want)
    EXPECT_NE(std::find(names.begin(), names.end(), want), names.end())
        << "SHOAL_CONFORMANCE_REQUIRE names compressor '" << want << "', which is not registered (SHOAL_PLUGIN_PATH='"
        << (std::getenv("SHOAL_PLUGIN_PATH") ? std::getenv("SHOAL_PLUGIN_PATH") : "") << "'); registered: " << listed
        << refused;
}

TEST(ConformanceRegistry, NoPluginOnThePathIsRefused) {
  for (const std::string& refusal : shoal::plugin::Registry::current().refusals())
    ADD_FAILURE() << "compressor plugin refused: " << refusal;
}

// ---- each table's declarations ---------------------------------------------------------

class Declaration : public ::testing::TestWithParam<std::string> {};

TEST_P(Declaration, IsConsistent) {
  const shoal_compressor_t* table = tableOf(GetParam());
  ASSERT_NE(table, nullptr) << shoal_last_error(nullptr);
  const shoal_compressor_t& t = *table;
  EXPECT_EQ(GetParam(), t.name);
  EXPECT_NE(t.caps & SHOAL_CAP_HOST, 0u) << "the suite tests host tensors; every compressor must take them";
  EXPECT_NE(t.dtypes, 0u) << "declares no dtype";
  EXPECT_EQ(t.dtypes >> SHOAL_DTYPE_COUNT, 0u) << "declares dtype bits beyond SHOAL_DTYPE_COUNT";
  EXPECT_TRUE(t.error_kind == SHOAL_ERROR_EXACT || t.error_kind == SHOAL_ERROR_RELATIVE ||
              t.error_kind == SHOAL_ERROR_FEEDBACK)
      << "unknown error_kind " << static_cast<int>(t.error_kind);
  EXPECT_EQ((t.caps & SHOAL_CAP_LOSSLESS) != 0, t.error_kind == SHOAL_ERROR_EXACT)
      << "SHOAL_CAP_LOSSLESS must be set exactly when error_kind is SHOAL_ERROR_EXACT";
  if (t.error_kind == SHOAL_ERROR_RELATIVE) {
    EXPECT_TRUE(std::isfinite(t.error_bound) && t.error_bound > 0 && t.error_bound < 1)
        << "a RELATIVE compressor needs a bound in (0, 1); got " << t.error_bound;
  }
  if (t.error_kind == SHOAL_ERROR_FEEDBACK) {
    EXPECT_NE(t.caps & SHOAL_CAP_STATEFUL, 0u) << "error feedback keeps per-tensor state: declare SHOAL_CAP_STATEFUL";
    EXPECT_NE(t.save_tensor_state, nullptr) << "error feedback: save_tensor_state is needed to check it";
  }
  if (t.caps & SHOAL_CAP_STATEFUL) {
    EXPECT_NE(t.destroy_tensor_state, nullptr) << "stateful: destroy_tensor_state frees the state";
    EXPECT_EQ(t.save_tensor_state == nullptr, t.load_tensor_state == nullptr)
        << "save_tensor_state and load_tensor_state come together";
  }
  EXPECT_NE(t.description, nullptr);
  EXPECT_NE(t.options_help, nullptr) << "options_help may be \"\" but not NULL";
}

std::string declarationName(const ::testing::TestParamInfo<std::string>& info) { return info.param; }
INSTANTIATE_TEST_SUITE_P(Compressors, Declaration, ::testing::ValuesIn(registeredCompressors()), declarationName);

// ---- the allreduce behaviour -------------------------------------------------------------

using Param = std::tuple<std::string, int>;

class Conformance : public ::testing::TestWithParam<Param> {
 protected:
  const std::string& compressor() const { return std::get<0>(GetParam()); }
  int ranks() const { return std::get<1>(GetParam()); }
};

// What the ranks of one test share: pointers to each rank's buffers for the
// current case, published before a barrier and read after it.
struct Shared {
  explicit Shared(int n) : barrier(n), out(n), eOld(n), eNew(n), inputs(n), ok(n, 1) {}
  RankBarrier barrier;
  std::vector<const uint8_t*> out, eOld, eNew;
  // Each rank's input values as inputValue() gave them (the check sums them instead of
  // computing every rank's inputs again: the same numbers, once).
  std::vector<const long double*> inputs;
  std::vector<char> ok;
  bool allOk() const { return std::all_of(ok.begin(), ok.end(), [](char c) { return c != 0; }); }
};

// Reads this rank's error vector (count elements of t) for `name`; "no state
// yet" gives zeros and sets *found = false.
bool readErrorVector(shoal_comm_t comm, const std::string& compressor, const char* options, const std::string& name,
                     const DType& t, size_t count, std::vector<uint8_t>& error, bool* found, const std::string& what) {
  error.assign(count * t.bytes, 0);
  *found = false;
  size_t bytes = 0;
  shoal_status_t status = shoal_compressor_state_save(comm, compressor.c_str(), options, name.c_str(), nullptr, &bytes);
  if (status == SHOAL_ERR_NOT_FOUND) return true;
  if (!callOk(status, comm, what + ": shoal_compressor_state_save (size)")) return false;
  if (bytes < count * t.bytes) {
    ADD_FAILURE() << what << ": saved state is " << bytes << " bytes, less than the error vector (" << count * t.bytes
                  << " bytes) it must start with";
    return false;
  }
  std::vector<uint8_t> state(bytes);
  size_t size = bytes;
  if (!callOk(shoal_compressor_state_save(comm, compressor.c_str(), options, name.c_str(), state.data(), &size), comm,
              what + ": shoal_compressor_state_save"))
    return false;
  std::memcpy(error.data(), state.data(), count * t.bytes);
  *found = true;
  return true;
}

TEST_P(Conformance, Allreduce) {
  const int n = ranks();
  const std::string& name = compressor();
  const shoal_compressor_t* table = tableOf(name);
  ASSERT_NE(table, nullptr) << shoal_last_error(nullptr);
  const shoal_error_kind_t kind = table->error_kind;
  const bool feedback = kind == SHOAL_ERROR_FEEDBACK;
  const bool stateful = feedback || (table->caps & SHOAL_CAP_STATEFUL);
  const int steps = stateful ? 3 : 1;
  const bool dyadic = kind == SHOAL_ERROR_EXACT;
  const char* options = optionsFor(name);
  const bool isNone = name == "none";

  struct Case { const DType* t; shoal_op_t op; size_t count; bool inPlace; };
  std::vector<Case> cases;
  for (size_t count : kCounts) {
    if (count == kBig && n != 2) continue;  // see the time budget above
    for (const DType* t : declaredDtypes(*table))
      for (shoal_op_t op : kOps)
        for (bool inPlace : {false, true})
          if (count != kBig || inPlace == (op == SHOAL_AVG))  // large: sum out of place, avg in place
            cases.push_back({t, op, count, inPlace});
  }

  Shared shared(n);
  runRanks(
      n,
      [&](int rank, shoal_comm_t comm) {
        std::vector<uint8_t> in, out, inCopy, eOld, eNew, ePrev;
        std::vector<long double> values;  // this rank's inputs (Shared::inputs)
        for (size_t caseIndex = 0; caseIndex < cases.size(); ++caseIndex) {
          const Case& c = cases[caseIndex];
          const DType& t = *c.t;
          const size_t bytes = c.count * t.bytes;
          std::ostringstream label;
          label << "conformance/" << t.name << "/" << opName(c.op) << "/" << c.count << "/"
                << (c.inPlace ? "in_place" : "out_of_place");
          const std::string tensorName = label.str();
          bool prevFound = false;
          for (int step = 0; step < steps; ++step) {
            std::ostringstream whatStream;
            whatStream << name << " " << kindName(kind) << ", " << n << " ranks, " << t.name << " " << opName(c.op)
                       << " count " << c.count << (c.inPlace ? " in place" : " out of place") << ", step " << step
                       << ", rank " << rank;
            const std::string what = whatStream.str();
            const uint64_t salt = hash3(hashText(name + "|" + tensorName), static_cast<uint64_t>(step), 0xc0f);
            in.resize(bytes);
            values.resize(c.count);
            for (size_t i = 0; i < c.count; ++i) {
              values[i] = inputValue(t, dyadic, salt, rank, i);
              storeBits(in.data(), i, t.bytes, bitsOf(t, values[i]));
            }
            uint8_t* outData = in.data();
            if (!c.inPlace) {
              inCopy = in;
              out.assign(bytes, 0xa5);
              outData = out.data();
            }
            bool ok = true, foundOld = false, foundNew = false;
            if (feedback) {
              ok = readErrorVector(comm, name, options, tensorName, t, c.count, eOld, &foundOld, what + " (before)");
              if (ok && step > 0 && c.count > 0) {
                EXPECT_TRUE(foundOld && prevFound) << what << ": the state saved after step " << step - 1
                                                  << " is gone before step " << step;
                EXPECT_TRUE(eOld == ePrev) << what << ": the state changed between calls";
              }
            }

            shoal_allreduce_options_t opts = SHOAL_ALLREDUCE_OPTIONS_INIT;
            opts.name = tensorName.c_str();
            opts.compressor = name.c_str();
            opts.compressor_options = options;
            opts.compress_min_bytes = 0;
            shoal_tensor_t input = tensorOf(in.data(), c.count, t), output = tensorOf(outData, c.count, t);
            ok = ok && callOk(shoal_allreduce_tensor(comm, &input, &output, c.op, &opts), comm, what);

            if (ok && c.count > 0) {
              shoal_compress_stats_t stats = SHOAL_COMPRESS_STATS_INIT;
              if (callOk(shoal_last_compress_stats(comm, &stats), comm, what + ": shoal_last_compress_stats")) {
                EXPECT_STREQ(stats.compressor, name.c_str()) << what << ": stats name another compressor";
                EXPECT_EQ(stats.input_bytes, bytes) << what << ": stats input_bytes";
                // One rank may finish without a round (e.g. qint8 copies its input).
                if (!isNone && n > 1) {
                  EXPECT_GT(stats.payload_bytes, 0u) << what << ": a compressed call moved no payload";
                }
              }
            }
            if (ok && feedback) {
              ok = readErrorVector(comm, name, options, tensorName, t, c.count, eNew, &foundNew, what + " (after)");
              if (ok && c.count > 0 && !foundNew) {
                ADD_FAILURE() << what << ": no state after a compressed call of an error-feedback compressor";
                ok = false;
              }
              ePrev = eNew;
              prevFound = foundNew;
            }

            shared.out[rank] = outData;
            shared.inputs[rank] = values.data();
            shared.eOld[rank] = eOld.data();
            shared.eNew[rank] = eNew.data();
            shared.ok[rank] = ok;
            shared.barrier.wait();  // every rank's buffers are published
            if (!shared.allOk() || shared.barrier.broken()) return;  // later cases would only repeat the failure

            if (!c.inPlace) {
              EXPECT_TRUE(in == inCopy) << what << ": the input was modified";
            }
            if (bytes > 0)  // (memcmp with the NULL data of an empty vector is undefined)
              EXPECT_EQ(std::memcmp(outData, shared.out[0], bytes), 0) << what << ": output differs from rank 0's";

            // This rank checks elements [lo, hi) against every rank's inputs.
            const size_t lo = c.count * rank / n, hi = c.count * (rank + 1) / n;
            Tally tally;
            for (size_t i = lo; i < hi; ++i) {
              const uint64_t gotBits = loadBits(outData, i, t.bytes);
              const long double got = valueOf(t, gotBits);
              long double sum = 0, magnitude = 0;
              for (int r = 0; r < n; ++r) {
                long double x = shared.inputs[r][i];
                sum += x;
                magnitude += std::fabs(x);
                if (feedback) {
                  long double eo = valueOf(t, loadBits(shared.eOld[r], i, t.bytes));
                  long double en = valueOf(t, loadBits(shared.eNew[r], i, t.bytes));
                  sum += eo - en;
                  magnitude += std::fabs(eo) + std::fabs(en);
                }
              }
              if (kind == SHOAL_ERROR_EXACT) {
                uint64_t want;
                if (t.isFloat) {
                  want = encodeFloat(t, roundToFormat(t, c.op == SHOAL_AVG ? sum / n : sum));
                } else {
                  int64_t total = static_cast<int64_t>(sum);
                  want = bitsOf(t, static_cast<long double>(c.op == SHOAL_AVG ? total / n : total));
                }
                if (gotBits != want)
                  tally.fail(i, [&] { return "got " + show(t, gotBits) + ", exact " + show(t, want); });
                continue;
              }
              long double exact = sum, tolerance;
              if (c.op == SHOAL_AVG) exact /= n, magnitude /= n;
              if (kind == SHOAL_ERROR_RELATIVE) {
                tolerance = static_cast<long double>(table->error_bound) * n * magnitude;
              } else {  // feedback: summation-order rounding only
                tolerance = 2 * (n + 2) * t.unitRoundoff() * magnitude;
                if (!t.isFloat && c.op == SHOAL_AVG) tolerance = 1;  // integer avg truncates
              }
              if (!(std::fabs(got - exact) <= tolerance))
                tally.fail(i, [&] {
                  return "got " + show(t, gotBits) + ", expected " + fmtLd(exact) + " +- " + fmtLd(tolerance) +
                         " (off by " + fmtLd(std::fabs(got - exact)) + ")";
                });
            }
            tally.report(what, feedback ? "out == sum_r (g + e_old - e_new)"
                                        : kind == SHOAL_ERROR_EXACT ? "bits == exact result"
                                                                    : "within error_bound * n * sum |x|",
                         c.count);
            shared.barrier.wait();  // done reading the other ranks' buffers
          }
        }
      },
      {nullptr, 60});
}

// Thresholds, scalars, names, and refused options.
TEST_P(Conformance, EdgeCases) {
  const int n = ranks();
  const std::string& name = compressor();
  const shoal_compressor_t* table = tableOf(name);
  ASSERT_NE(table, nullptr) << shoal_last_error(nullptr);
  const bool stateful = table->error_kind == SHOAL_ERROR_FEEDBACK || (table->caps & SHOAL_CAP_STATEFUL);
  const char* options = optionsFor(name);
  const std::vector<const DType*> dtypes = declaredDtypes(*table);
  RankBarrier barrier(n);
  std::vector<const uint8_t*> rank0(1);

  runRanks(
      n,
      [&](int rank, shoal_comm_t comm) {
        const std::string where = name + ", " + std::to_string(n) + " ranks, rank " + std::to_string(rank);
        for (const DType* tp : dtypes) {
          const DType& t = *tp;
          const size_t count = 7, bytes = count * t.bytes;
          const uint64_t salt = hash3(hashText(name), t.id, 0xed9e);
          std::vector<uint8_t> data(bytes);
          auto fill = [&] {
            for (size_t i = 0; i < count; ++i)
              storeBits(data.data(), i, t.bytes, bitsOf(t, inputValue(t, true, salt, rank, i)));
          };
          auto exactBits = [&](size_t i) {
            long double sum = 0;
            for (int r = 0; r < n; ++r) sum += inputValue(t, true, salt, r, i);
            return bitsOf(t, t.isFloat ? roundToFormat(t, sum) : sum);
          };
          shoal_allreduce_options_t opts = SHOAL_ALLREDUCE_OPTIONS_INIT;
          opts.compressor = name.c_str();
          opts.compressor_options = options;
          std::string tensorName = std::string("edge/") + t.name;
          opts.name = tensorName.c_str();
          shoal_tensor_t tensor = tensorOf(data.data(), count, t);
          shoal_compress_stats_t stats = SHOAL_COMPRESS_STATS_INIT;

          // Below the threshold: uncompressed, so the plain (exact, with these inputs) sum.
          std::string what = where + ", " + t.name + " 7 elements below compress_min_bytes";
          fill();
          opts.compress_min_bytes = static_cast<long long>(bytes) + 1;
          if (callOk(shoal_allreduce_tensor(comm, &tensor, &tensor, SHOAL_SUM, &opts), comm, what)) {
            for (size_t i = 0; i < count; ++i)
              EXPECT_EQ(loadBits(data.data(), i, t.bytes), exactBits(i)) << what << ": element " << i;
            if (callOk(shoal_last_compress_stats(comm, &stats), comm, what)) {
              EXPECT_STREQ(stats.compressor, "none") << what << ": went compressed";
              EXPECT_EQ(stats.payload_bytes, 0u) << what;
            }
          }
          // Exactly at the threshold: compressed ("smaller tensors go uncompressed").
          what = where + ", " + t.name + " 7 elements at compress_min_bytes";
          fill();
          opts.compress_min_bytes = static_cast<long long>(bytes);
          if (callOk(shoal_allreduce_tensor(comm, &tensor, &tensor, SHOAL_SUM, &opts), comm, what) &&
              callOk(shoal_last_compress_stats(comm, &stats), comm, what)) {
            EXPECT_STREQ(stats.compressor, name.c_str()) << what << ": went uncompressed";
          }

          // A scalar (ndim 0) is one element.
          what = where + ", " + t.name + " scalar (ndim 0)";
          fill();
          opts.compress_min_bytes = 0;
          std::string scalarName = tensorName + "/scalar";
          opts.name = scalarName.c_str();
          shoal_tensor_t scalar = tensor;
          scalar.ndim = 0;
          scalar.shape[0] = 0;
          if (callOk(shoal_allreduce_tensor(comm, &scalar, &scalar, SHOAL_SUM, &opts), comm, what)) {
            long double got = valueOf(t, loadBits(data.data(), 0, t.bytes));
            long double want = valueOf(t, exactBits(0));
            long double magnitude = 0;
            for (int r = 0; r < n; ++r) magnitude += std::fabs(inputValue(t, true, salt, r, 0));
            if (table->error_kind == SHOAL_ERROR_EXACT)
              EXPECT_EQ(got, want) << what;
            else if (table->error_kind == SHOAL_ERROR_RELATIVE)
              EXPECT_LE(std::fabs(got - want), table->error_bound * n * magnitude) << what;
            else
              EXPECT_TRUE(std::isfinite(got)) << what;
            for (size_t i = 1; i < count; ++i)
              EXPECT_EQ(loadBits(data.data(), i, t.bytes), bitsOf(t, inputValue(t, true, salt, rank, i)))
                  << what << ": wrote past the scalar, element " << i;
          }

          // Unnamed tensors: a stateful compressor's state is keyed by the output
          // buffer, dtype and shape (issue 13.2), so every compressor takes them.
          what = where + ", " + t.name + " unnamed tensor";
          fill();
          opts.name = nullptr;
          shoal_status_t status = shoal_allreduce_tensor(comm, &tensor, &tensor, SHOAL_SUM, &opts);
          if (stateful) {
            callOk(status, comm, what);
          } else if (callOk(status, comm, what) && table->error_kind == SHOAL_ERROR_EXACT) {
            for (size_t i = 0; i < count; ++i)
              EXPECT_EQ(loadBits(data.data(), i, t.bytes), exactBits(i)) << what << ": element " << i;
          }
          opts.name = tensorName.c_str();

          // Unknown options (once, with the first dtype): refused on every rank with a
          // message naming them; the communicator still works afterwards.
          if (tp != dtypes.front()) continue;
          what = where + ", " + t.name + " options 'nonsense_key=1'";
          fill();
          opts.compressor_options = "nonsense_key=1";
          status = shoal_allreduce_tensor(comm, &tensor, &tensor, SHOAL_SUM, &opts);
          EXPECT_TRUE(status == SHOAL_ERR_INVALID_ARGUMENT || status == SHOAL_ERR_NOT_FOUND)
              << what << ": got " << shoal_status_string(status) << " (" << shoal_last_error(comm) << ")";
          if (status != SHOAL_OK) {
            EXPECT_NE(std::string(shoal_last_error(comm)).find("nonsense_key"), std::string::npos)
                << what << ": the error text does not name the option: '" << shoal_last_error(comm) << "'";
          }
          barrier.wait();
          opts.compressor_options = options;
          what = where + ", " + t.name + " a call after the refused one";
          fill();
          bool ok = callOk(shoal_allreduce_tensor(comm, &tensor, &tensor, SHOAL_SUM, &opts), comm, what);
          if (rank == 0) rank0[0] = ok ? data.data() : nullptr;
          barrier.wait();
          if (ok && rank0[0] != nullptr) {
            EXPECT_EQ(std::memcmp(data.data(), rank0[0], bytes), 0) << what << ": output differs from rank 0's";
          }
          barrier.wait();
        }
      },
      {nullptr, 60});
}

std::string paramName(const ::testing::TestParamInfo<Param>& info) {
  return std::get<0>(info.param) + "_" + std::to_string(std::get<1>(info.param)) + "ranks";
}
INSTANTIATE_TEST_SUITE_P(Compressors, Conformance,
                         ::testing::Combine(::testing::ValuesIn(registeredCompressors()), ::testing::Values(1, 2, 3, 5)),
                         paramName);

}  // namespace
