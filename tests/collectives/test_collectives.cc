// Correctness of every collective against values computed independently of
// the library, over {1, 2, 3, 4, 5, 8} ranks x {ring, tree}.
//
// Exactness: inputs are integers chosen so that every partial result is
// exactly representable in every dtype (sum/avg: -4..4, prod: 0, +-1, +-2,
// min/max: integers within the dtype's significand), so the result does not
// depend on the reduction order and is checked bit for bit. Integer sum and
// prod also get full-width hashed values, which wrap modulo 2^bits (checked
// through uint64 arithmetic truncated to the width). avg is the (wrapped) sum
// divided once by the world size: truncation toward zero for integers, one
// rounding to nearest even for floats. Expected values are computed here in
// uint64 / long double with an encoder/decoder of the IEEE formats written for
// this test (not the library's toHalf/toBFloat16).
//
// Time budget (2 cores, ranks as threads; the whole executable takes about
// 1-1.5 minutes): counts {0, 1, 7, 1000} run for every dtype x op, in place
// and out of place; the large count 2^20+3 runs only for a subset of pairs
// (kBigAllreduce, and three reduce_scatter pairs), and is skipped for 8 ranks
// with tree and doubling: they move the whole 4 MB buffer in every round and
// would add ~15 s each (5 ranks covers their large count, including the
// non-power-of-two paths); allgather and reduce_scatter do not depend on the
// algorithm (ring x 8 ranks covers the large count at that width). Broadcast
// runs the large count for every root everywhere.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cinttypes>
#include <cmath>
#include <condition_variable>
#include <cstring>
#include <functional>
#include <mutex>
#include <sstream>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "harness/dtype_model.h"
#include "harness/harness.h"
#include "harness/rank_sync.h"

namespace {

using namespace shoal::test;

constexpr size_t kBig = (size_t(1) << 20) + 3;
const size_t kSmallCounts[] = {0, 1, 7, 1000};

const shoal_op_t kOps[] = {SHOAL_SUM, SHOAL_AVG, SHOAL_PROD, SHOAL_MIN, SHOAL_MAX, SHOAL_BAND, SHOAL_BOR, SHOAL_BXOR};
const char* opName(shoal_op_t op) {
  static const char* names[] = {"sum", "avg", "prod", "min", "max", "band", "bor", "bxor"};
  return names[op];
}
bool isBitwise(shoal_op_t op) { return op == SHOAL_BAND || op == SHOAL_BOR || op == SHOAL_BXOR; }
bool validPair(const DType& t, shoal_op_t op) { return !(t.isFloat && isBitwise(op)); }

std::string show(const DType& t, uint64_t bits) {
  char text[96];
  if (t.isFloat) {
    std::snprintf(text, sizeof text, "%.21Lg (0x%" PRIx64 ")", decodeFloat(t, bits), bits);
  } else if (t.isSigned) {
    std::snprintf(text, sizeof text, "%" PRId64 " (0x%" PRIx64 ")", signExtend(t, bits), bits);
  } else {
    std::snprintf(text, sizeof text, "%" PRIu64 " (0x%" PRIx64 ")", bits, bits);
  }
  return text;
}

inline uint64_t loadBits(const uint8_t* buffer, size_t i, size_t bytes) {
  uint64_t v = 0;
  std::memcpy(&v, buffer + i * bytes, bytes);  // little endian
  return v;
}
inline void storeBits(uint8_t* buffer, size_t i, size_t bytes, uint64_t v) { std::memcpy(buffer + i * bytes, &v, bytes); }

// ---- inputs -------------------------------------------------------------------

long double floatInput(const DType& t, shoal_op_t op, int rank, uint64_t h) {
  switch (op) {
    case SHOAL_SUM:
    case SHOAL_AVG: return static_cast<long double>(static_cast<int>(h % 9) - 4);
    case SHOAL_PROD: {
      unsigned k = h % 64;
      return k == 0 ? 0.0L : k < 48 ? 1.0L : k < 56 ? 2.0L : k < 60 ? -1.0L : -2.0L;
    }
    default: {  // min / max: distinct per rank (low 3 bits = rank), exact in the significand
      uint64_t span = t.mant >= 52 ? uint64_t(1) << 40 : t.mant >= 23 ? uint64_t(1) << 20 : t.mant >= 10 ? 256 : 32;
      return static_cast<long double>((h % span) * 8 + static_cast<uint64_t>(rank)) -
             static_cast<long double>(span * 4);
    }
  }
}

uint64_t intInput(const DType& t, shoal_op_t op, int rank, size_t index, uint64_t h) {
  switch (op) {
    case SHOAL_SUM:
      if (index % 4 == 0) return h;  // full width: the sum wraps
      [[fallthrough]];
    case SHOAL_AVG: return t.isSigned ? static_cast<uint64_t>(static_cast<int64_t>(h % 9) - 4) : h % 5;
    case SHOAL_PROD: {
      if (index % 3 == 0) return h;  // full width: the product wraps
      unsigned k = h % 64;
      return k == 0 ? 0 : k < 48 ? 1 : k < 56 ? 2 : k < 60 ? ~uint64_t(0) : ~uint64_t(1);  // 0, 1, 2, -1, -2
    }
    case SHOAL_MIN:
    case SHOAL_MAX:
      if (t.bytes == 1) return (h % 32) * 8 + static_cast<uint64_t>(rank) - (t.isSigned ? 128 : 0);
      return (h & ~uint64_t(7)) | static_cast<uint64_t>(rank);
    case SHOAL_BAND: return h | mix64(h) | mix64(h + 1);    // dense, so the AND is not all zeros
    case SHOAL_BOR: return h & mix64(h) & mix64(h + 1);     // sparse, so the OR is not all ones
    default: return h;                                      // bxor
  }
}

uint64_t inputBits(const DType& t, shoal_op_t op, int rank, size_t index, uint64_t salt) {
  uint64_t h = hash3(salt, static_cast<uint64_t>(rank), index);
  if (t.isFloat) return encodeFloat(t, floatInput(t, op, rank, h));
  return intInput(t, op, rank, index, h) & t.mask();
}

// The reduction over ranks 0..n-1 of one element whose input on rank r is
// inputOf(r), as the dtype's bits.
template <typename InputOf>
uint64_t reducedBits(const DType& t, shoal_op_t op, int n, InputOf&& inputOf) {
  if (t.isFloat) {
    long double acc = decodeFloat(t, inputOf(0));
    for (int r = 1; r < n; ++r) {
      long double x = decodeFloat(t, inputOf(r));
      switch (op) {
        case SHOAL_SUM: case SHOAL_AVG: acc += x; break;
        case SHOAL_PROD: acc *= x; break;
        case SHOAL_MIN: acc = std::min(acc, x); break;
        case SHOAL_MAX: acc = std::max(acc, x); break;
        default: std::abort();
      }
    }
    if (op == SHOAL_AVG) acc /= n;
    return encodeFloat(t, roundToFormat(t, acc));
  }
  uint64_t acc = inputOf(0);
  for (int r = 1; r < n; ++r) {
    uint64_t x = inputOf(r);
    switch (op) {
      case SHOAL_SUM: case SHOAL_AVG: acc += x; break;  // uint64 wraps; truncation keeps it mod 2^bits
      case SHOAL_PROD: acc *= x; break;
      case SHOAL_MIN:
      case SHOAL_MAX: {
        bool less = t.isSigned ? signExtend(t, x) < signExtend(t, acc) : x < acc;
        if (less == (op == SHOAL_MIN)) acc = x;
        break;
      }
      case SHOAL_BAND: acc &= x; break;
      case SHOAL_BOR: acc |= x; break;
      case SHOAL_BXOR: acc ^= x; break;
      default: std::abort();
    }
    acc &= t.mask();
  }
  acc &= t.mask();
  if (op == SHOAL_AVG) {
    if (t.isSigned) acc = static_cast<uint64_t>(signExtend(t, acc) / n);  // C++ division truncates toward zero
    else acc = acc / static_cast<uint64_t>(n);
  }
  return acc & t.mask();
}

// The reduction of element `index` over ranks 0..n-1, as the dtype's bits, from
// the input buffers the ranks passed (each filled with inputBits): every input
// is computed once, by its rank.
uint64_t expectedBits(const DType& t, shoal_op_t op, const std::vector<const uint8_t*>& inputs, size_t index) {
  return reducedBits(t, op, static_cast<int>(inputs.size()), [&](int r) { return loadBits(inputs[r], index, t.bytes); });
}

// ---- checking -----------------------------------------------------------------

// Compares element bits of `got` with expected(i); reports the first mismatch
// and how many there were. Returns true when all match.
template <typename Expected>
bool checkElements(const std::string& what, const DType& t, const uint8_t* got, size_t count, Expected&& expected) {
  size_t mismatches = 0, first = 0;
  uint64_t firstGot = 0, firstWant = 0;
  for (size_t i = 0; i < count; ++i) {
    uint64_t g = loadBits(got, i, t.bytes), w = expected(i);
    if (g != w) {
      if (mismatches++ == 0) first = i, firstGot = g, firstWant = w;
    }
  }
  if (mismatches == 0) return true;
  ADD_FAILURE() << what << ": " << mismatches << " of " << count << " elements differ; first at index " << first
                << ": got " << show(t, firstGot) << ", expected " << show(t, firstWant);
  return false;
}

// The expected bits of a case whose result is the same on every rank
// (allgather, broadcast), computed once by all ranks together, each rank a
// slice, instead of by every rank: the same bits for an n-th of the hashing.
// check() compares a result with them in one memcmp and, where it differs,
// goes element by element (checkElements) to report the first difference.
// Every rank calls fill() once per case, then check() any number of times.
class SharedExpected {
 public:
  template <typename Case, typename Bytes>
  SharedExpected(int n, const std::vector<Case>& cases, Bytes&& bytesOf) : n_(n), barrier_(n) {
    size_t largest = 0;
    for (const auto& [dtype, count] : cases) largest = std::max(largest, bytesOf(dtypeOf(dtype), count));
    bits_.resize(largest);
  }
  template <typename Expected>
  void fill(int rank, const DType& t, size_t count, Expected&& expected) {
    barrier_.wait();  // every rank is done checking against the previous case
    for (size_t i = count * rank / n_; i < count * (rank + 1) / n_; ++i)
      storeBits(bits_.data(), i, t.bytes, expected(i));
    barrier_.wait();  // every slice is written
  }
  template <typename Expected>
  void check(const std::string& what, const DType& t, const uint8_t* got, size_t count, Expected&& expected) {
    if (count == 0 || std::memcmp(got, bits_.data(), count * t.bytes) == 0) return;
    if (checkElements(what, t, got, count, expected))
      ADD_FAILURE() << what << ": the result differs from the shared expected bits, which differ from expected()";
  }

 private:
  int n_;
  RankBarrier barrier_;
  std::vector<uint8_t> bits_;
};


std::string caseName(const char* collective, const DType& t, const char* op, size_t count, bool inPlace, int rank) {
  std::ostringstream out;
  out << collective << " " << t.name << " " << op << " count " << count << (inPlace ? " in place" : " out of place")
      << ", rank " << rank;
  return out.str();
}

uint64_t saltOf(const DType& t, shoal_op_t op, size_t count) {
  return hash3(static_cast<uint64_t>(t.id), static_cast<uint64_t>(op), count);
}

// ---- the parametrised suite --------------------------------------------------------

using Param = std::tuple<int, std::string>;

class Collectives : public ::testing::TestWithParam<Param> {
 protected:
  int ranks() const { return std::get<0>(GetParam()); }
  const char* algorithm() const { return std::get<1>(GetParam()).c_str(); }
  bool bigCounts() const { return !(ranks() == 8 && std::get<1>(GetParam()) != "ring"); }
  void run(const std::function<void(int, shoal_comm_t)>& body) { runRanks(ranks(), body, {algorithm(), 120}); }
};

// Allreduce and broadcast depend on SHOAL_ALGO; they also run with "doubling"
// (recursive doubling; broadcast then picks tree or chain by size, as auto).
// Allgather, reduce_scatter and barrier have one algorithm each.
class CollectivesAllAlgorithms : public Collectives {};

// Large-count allreduce pairs (every pair runs at the small counts).
const std::pair<shoal_dtype_t, shoal_op_t> kBigAllreduce[] = {
    {SHOAL_F32, SHOAL_SUM}, {SHOAL_F16, SHOAL_SUM}, {SHOAL_I64, SHOAL_MAX}, {SHOAL_U8, SHOAL_BXOR},
    {SHOAL_F64, SHOAL_AVG}, {SHOAL_BF16, SHOAL_PROD}, {SHOAL_I32, SHOAL_SUM}};

TEST_P(CollectivesAllAlgorithms, Allreduce) {
  const int n = ranks();
  struct Case { const DType* t; shoal_op_t op; size_t count; };
  std::vector<Case> cases;
  for (size_t count : kSmallCounts)
    for (const DType& t : kDtypes)
      for (shoal_op_t op : kOps)
        if (validPair(t, op)) cases.push_back({&t, op, count});
  if (bigCounts())
    for (auto [dtype, op] : kBigAllreduce) cases.push_back({&dtypeOf(dtype), op, kBig});

  RankBarrier barrier(n);
  std::vector<uint64_t> expected;
  size_t largest = 0;
  for (const Case& c : cases) largest = std::max(largest, c.count);
  expected.resize(largest);
  std::vector<const uint8_t*> inputs(n);  // each rank's input of the current case (expected values)
  const uint8_t* rank0Out = nullptr;
  const uint8_t* rank0In = nullptr;

  run([&](int rank, shoal_comm_t comm) {
    std::vector<uint8_t> input, send, recv;
    for (const Case& c : cases) {
      const DType& t = *c.t;
      const size_t bytes = c.count * t.bytes;
      const uint64_t salt = saltOf(t, c.op, c.count);
      barrier.wait();  // everyone is done with the previous case's shared values
      input.resize(bytes);
      for (size_t i = 0; i < c.count; ++i) storeBits(input.data(), i, t.bytes, inputBits(t, c.op, rank, i, salt));
      inputs[rank] = input.data();
      barrier.wait();  // every rank's input is published
      for (size_t i = c.count * rank / n; i < c.count * (rank + 1) / n; ++i)
        expected[i] = expectedBits(t, c.op, inputs, i);
      send = input;
      recv.assign(bytes, 0xa5);

      std::string what = caseName("allreduce", t, opName(c.op), c.count, false, rank);
      bool outOk = callOk(shoal_allreduce(comm, send.data(), recv.data(), c.count, t.id, c.op), comm, what);
      if (rank == 0) rank0Out = recv.data();
      barrier.wait();  // expected values and rank 0's result are ready
      if (outOk) {
        checkElements(what, t, recv.data(), c.count, [&](size_t i) { return expected[i]; });
        EXPECT_TRUE(send == input) << what << ": sendbuf was modified";
        EXPECT_TRUE(bytes == 0 || std::memcmp(recv.data(), rank0Out, bytes) == 0) << what << ": result differs from rank 0's";
      }

      what = caseName("allreduce", t, opName(c.op), c.count, true, rank);
      send = input;
      bool inOk = callOk(shoal_allreduce(comm, send.data(), send.data(), c.count, t.id, c.op), comm, what);
      if (rank == 0) rank0In = send.data();
      barrier.wait();
      if (inOk) {
        checkElements(what, t, send.data(), c.count, [&](size_t i) { return expected[i]; });
        EXPECT_TRUE(bytes == 0 || std::memcmp(send.data(), rank0In, bytes) == 0) << what << ": result differs from rank 0's";
      }
    }
    barrier.wait();
  });
}

// Inexact inputs (random floats): the result depends on the reduction order,
// yet every rank must end with the same bits, close to the exact sum.
TEST_P(CollectivesAllAlgorithms, AllreduceInexactFloatsAreBitIdenticalAcrossRanks) {
  const int n = ranks();
  struct Case { shoal_dtype_t dtype; shoal_op_t op; size_t count; };
  std::vector<Case> cases;
  for (shoal_dtype_t dtype : {SHOAL_F16, SHOAL_BF16, SHOAL_F32, SHOAL_F64})
    for (shoal_op_t op : {SHOAL_SUM, SHOAL_AVG})
      for (size_t count : {size_t(7), size_t(1000), size_t(65537)}) cases.push_back({dtype, op, count});

  RankBarrier barrier(n);
  const uint8_t* rank0 = nullptr;
  run([&](int rank, shoal_comm_t comm) {
    std::vector<uint8_t> buffer;
    for (const Case& c : cases) {
      const DType& t = dtypeOf(c.dtype);
      const uint64_t salt = saltOf(t, c.op, c.count) ^ 0x1234;
      auto value = [&](int r, size_t i) {  // uniform in [-1, 1), rounded to the dtype
        uint64_t h = hash3(salt, static_cast<uint64_t>(r), i);
        return roundToFormat(t, std::ldexp(static_cast<long double>(h >> 11), -52) - 1);
      };
      barrier.wait();
      buffer.resize(c.count * t.bytes);
      for (size_t i = 0; i < c.count; ++i) storeBits(buffer.data(), i, t.bytes, encodeFloat(t, value(rank, i)));
      std::string what = caseName("allreduce (inexact)", t, opName(c.op), c.count, true, rank);
      bool ok = callOk(shoal_allreduce(comm, buffer.data(), buffer.data(), c.count, t.id, c.op), comm, what);
      if (rank == 0) rank0 = buffer.data();
      barrier.wait();
      if (!ok) continue;
      EXPECT_TRUE(buffer.empty() || std::memcmp(buffer.data(), rank0, buffer.size()) == 0) << what << ": result differs from rank 0's";
      if (rank != 0) continue;  // the others match rank 0 bit for bit
      // Each of the n-1 combining steps and the final division round once by at most
      // half an ulp of a partial result bounded by sum |x|.
      const long double unit = std::ldexp(1.0L, -t.mant - 1);
      size_t bad = 0, first = 0;
      long double firstGot = 0, firstWant = 0;
      for (size_t i = 0; i < c.count; ++i) {
        long double exact = 0, magnitude = 0;
        for (int r = 0; r < n; ++r) exact += value(r, i), magnitude += std::fabs(value(r, i));
        if (c.op == SHOAL_AVG) exact /= n, magnitude /= n;
        long double got = decodeFloat(t, loadBits(buffer.data(), i, t.bytes));
        long double tolerance = 2 * (n + 1) * unit * magnitude + std::ldexp(1.0L, 2 - t.bias() - t.mant);
        if (!(std::fabs(got - exact) <= tolerance) && bad++ == 0) first = i, firstGot = got, firstWant = exact;
      }
      EXPECT_EQ(bad, 0u) << what << ": first element outside the rounding bound at index " << first << ": got "
                         << double(firstGot) << ", exact " << double(firstWant);
      if (n != 2) continue;
      // Two ranks: one combining step, so the bits are determined. a + b is
      // computed in f32 for f16/bf16 (rounded to f32, then once to the dtype,
      // ties to even); avg then halves the stored sum and rounds again.
      const DType& f32 = dtypeOf(SHOAL_F32);
      checkElements(what + " (2 ranks: exact rounding)", t, buffer.data(), c.count, [&](size_t i) {
        long double sum = value(0, i) + value(1, i);  // exact in long double
        if (t.bytes == 2) sum = roundToFormat(f32, sum);
        sum = roundToFormat(t, sum);
        if (c.op == SHOAL_AVG) sum = roundToFormat(t, sum / 2);
        return encodeFloat(t, sum);
      });
    }
    barrier.wait();
  });
}

uint64_t gatherBits(const DType& t, int rank, size_t index) {
  return hash3(0x9a7e, static_cast<uint64_t>(rank), index) & t.mask();
}

TEST_P(Collectives, Allgather) {
  const int n = ranks();
  std::vector<std::pair<shoal_dtype_t, size_t>> cases;
  for (size_t count : kSmallCounts)
    for (shoal_dtype_t dtype : {SHOAL_U8, SHOAL_F16, SHOAL_I32, SHOAL_F64}) cases.push_back({dtype, count});
  if (bigCounts()) cases.push_back({SHOAL_U8, kBig});
  SharedExpected want(n, cases, [n](const DType& t, size_t count) { return count * n * t.bytes; });
  run([&](int rank, shoal_comm_t comm) {
    std::vector<uint8_t> send, recv;
    for (auto [dtype, count] : cases) {
      const DType& t = dtypeOf(dtype);
      const size_t block = count * t.bytes;
      send.resize(block);
      for (size_t i = 0; i < count; ++i) storeBits(send.data(), i, t.bytes, gatherBits(t, rank, i));
      const std::vector<uint8_t> input = send;
      auto expected = [&, count = count](size_t i) { return gatherBits(t, static_cast<int>(i / count), i % count); };
      want.fill(rank, t, count * n, expected);

      std::string what = caseName("allgather", t, "-", count, false, rank);
      recv.assign(block * n, 0xa5);
      if (callOk(shoal_allgather(comm, send.data(), recv.data(), count, t.id), comm, what)) {
        want.check(what, t, recv.data(), count * n, expected);
        EXPECT_TRUE(send == input) << what << ": sendbuf was modified";
      }

      what = caseName("allgather", t, "-", count, true, rank);
      recv.assign(block * n, 0xa5);
      if (block > 0) std::memcpy(recv.data() + rank * block, input.data(), block);
      if (callOk(shoal_allgather(comm, recv.data() + rank * block, recv.data(), count, t.id), comm, what))
        want.check(what, t, recv.data(), count * n, expected);
    }
  });
}

// recvcounts patterns for allgatherv: uneven, with zeros.
std::vector<std::vector<size_t>> allgathervCounts(int n) {
  std::vector<std::vector<size_t>> patterns;
  std::vector<size_t> uneven(n), oneRank(n, 0), none(n, 0), ramp(n);
  for (int r = 0; r < n; ++r) {
    uneven[r] = r % 3 == 1 ? 0 : static_cast<size_t>(r * 37 + 5) % 1000;
    ramp[r] = static_cast<size_t>(r) * 1001 + 3;
  }
  oneRank[n - 1] = 777;
  patterns.push_back(uneven);
  patterns.push_back(oneRank);
  patterns.push_back(none);
  patterns.push_back(ramp);
  return patterns;
}

TEST_P(Collectives, Allgatherv) {
  const int n = ranks();
  run([&](int rank, shoal_comm_t comm) {
    int patternIndex = 0;
    for (const std::vector<size_t>& counts : allgathervCounts(n)) {
      for (shoal_dtype_t dtype : {SHOAL_U8, SHOAL_I32, SHOAL_F64}) {
        const DType& t = dtypeOf(dtype);
        // Layouts: packed (displs NULL), and reversed rank order with gaps of 3 elements.
        std::vector<size_t> packed(n), reversed(n);
        size_t total = 0;
        for (int r = 0; r < n; ++r) packed[r] = total, total += counts[r];
        size_t place = 3;
        for (int r = n - 1; r >= 0; --r) reversed[r] = place, place += counts[r] + 3;
        for (bool withDispls : {false, true}) {
          const std::vector<size_t>& offsets = withDispls ? reversed : packed;
          const size_t extent = withDispls ? place : total;
          const uint64_t sentinel = 0xa5a5a5a5a5a5a5a5ull & t.mask();
          auto expected = [&](size_t i) -> uint64_t {
            for (int r = 0; r < n; ++r)
              if (i >= offsets[r] && i < offsets[r] + counts[r]) return gatherBits(t, r, i - offsets[r]);
            return sentinel;  // gaps stay untouched
          };
          const size_t mine = counts[rank];
          std::vector<uint8_t> send(mine * t.bytes);
          for (size_t i = 0; i < mine; ++i) storeBits(send.data(), i, t.bytes, gatherBits(t, rank, i));
          for (bool inPlace : {false, true}) {
            std::ostringstream what;
            what << "allgatherv " << t.name << " pattern " << patternIndex << (withDispls ? " with displs" : " packed")
                 << (inPlace ? " in place" : " out of place") << ", rank " << rank;
            std::vector<uint8_t> recv(extent * t.bytes, 0xa5);
            uint8_t* own = recv.data() + offsets[rank] * t.bytes;
            const void* sendbuf = send.data();
            if (inPlace) {
              if (!send.empty()) std::memcpy(own, send.data(), send.size());
              sendbuf = own;
            } else if (mine == 0) {
              sendbuf = nullptr;  // allowed: nothing to send
            }
            if (callOk(shoal_allgatherv(comm, sendbuf, mine, recv.data(), counts.data(),
                                        withDispls ? offsets.data() : nullptr, t.id),
                       comm, what.str()))
              checkElements(what.str(), t, recv.data(), extent, expected);
          }
        }
      }
      ++patternIndex;
    }
  });
}

TEST_P(CollectivesAllAlgorithms, Broadcast) {
  const int n = ranks();
  std::vector<std::pair<shoal_dtype_t, size_t>> cases;
  for (size_t count : kSmallCounts)
    for (shoal_dtype_t dtype : {SHOAL_U8, SHOAL_BF16, SHOAL_F32, SHOAL_I64}) cases.push_back({dtype, count});
  cases.push_back({SHOAL_F32, kBig});  // 4 MB: several pipelining segments of the chain
  SharedExpected want(n, cases, [](const DType& t, size_t count) { return count * t.bytes; });
  run([&](int rank, shoal_comm_t comm) {
    std::vector<uint8_t> send, recv;
    for (int root = 0; root < n; ++root) {
      for (auto [dtype, count] : cases) {
        const DType& t = dtypeOf(dtype);
        const uint64_t salt = hash3(static_cast<uint64_t>(root), count, static_cast<uint64_t>(dtype));
        auto expected = [&](size_t i) { return hash3(salt, 7, i) & t.mask(); };
        want.fill(rank, t, count, expected);
        for (bool inPlace : {false, true}) {
          std::ostringstream what;
          what << "broadcast " << t.name << " count " << count << " root " << root
               << (inPlace ? " in place" : " out of place") << ", rank " << rank;
          recv.assign(count * t.bytes, 0xa5);
          send.assign(count * t.bytes, 0x5a);
          const void* sendbuf = nullptr;  // only read on root
          if (rank == root) {
            uint8_t* source = inPlace ? recv.data() : send.data();
            for (size_t i = 0; i < count; ++i) storeBits(source, i, t.bytes, expected(i));
            sendbuf = source;
          }
          std::vector<uint8_t> input = send;
          if (callOk(shoal_broadcast(comm, sendbuf, recv.data(), count, t.id, root), comm, what.str())) {
            want.check(what.str(), t, recv.data(), count, expected);
            EXPECT_TRUE(send == input) << what.str() << ": sendbuf was modified";
          }
        }
      }
    }
  });
}

TEST_P(Collectives, ReduceScatter) {
  const int n = ranks();
  struct Case { const DType* t; shoal_op_t op; size_t recvcount; };
  std::vector<Case> cases;
  for (size_t count : kSmallCounts)
    for (const DType& t : kDtypes)
      for (shoal_op_t op : kOps)
        if (validPair(t, op)) cases.push_back({&t, op, count});
  if (bigCounts()) {
    // About 2^20 elements in all, so a block is not a multiple of anything convenient.
    const size_t recvcount = kBig / static_cast<size_t>(n) + 1;
    cases.push_back({&dtypeOf(SHOAL_F32), SHOAL_SUM, recvcount});
    cases.push_back({&dtypeOf(SHOAL_U8), SHOAL_BXOR, recvcount});
    cases.push_back({&dtypeOf(SHOAL_I64), SHOAL_MIN, recvcount});
  }
  RankBarrier barrier(n);
  std::vector<const uint8_t*> inputs(n);  // each rank's input of the current case (expected values)
  run([&](int rank, shoal_comm_t comm) {
    std::vector<uint8_t> input, send, recv;
    std::vector<uint64_t> expected;
    for (const Case& c : cases) {
      const DType& t = *c.t;
      const size_t total = c.recvcount * n, block = c.recvcount * t.bytes;
      const uint64_t salt = saltOf(t, c.op, c.recvcount) ^ 0x5c;
      barrier.wait();  // everyone is done reading the previous case's inputs
      input.resize(total * t.bytes);
      for (size_t j = 0; j < total; ++j) storeBits(input.data(), j, t.bytes, inputBits(t, c.op, rank, j, salt));
      inputs[rank] = input.data();
      barrier.wait();  // every rank's input is published
      expected.resize(c.recvcount);
      for (size_t i = 0; i < c.recvcount; ++i) expected[i] = expectedBits(t, c.op, inputs, rank * c.recvcount + i);
      auto want = [&](size_t i) { return expected[i]; };

      std::string what = caseName("reduce_scatter", t, opName(c.op), c.recvcount, false, rank);
      send = input;
      recv.assign(block, 0xa5);
      if (callOk(shoal_reduce_scatter(comm, send.data(), recv.data(), c.recvcount, t.id, c.op), comm, what)) {
        checkElements(what, t, recv.data(), c.recvcount, want);
        EXPECT_TRUE(send == input) << what << ": sendbuf was modified";
      }

      what = caseName("reduce_scatter", t, opName(c.op), c.recvcount, true, rank);
      send = input;
      uint8_t* own = send.data() + rank * block;
      if (callOk(shoal_reduce_scatter(comm, send.data(), own, c.recvcount, t.id, c.op), comm, what))
        checkElements(what, t, own, c.recvcount, want);

      // The tensor form on host tensors (the same host path, so one count: every dtype and op), out of place.
      if (c.recvcount != 7) continue;
      what = caseName("reduce_scatter_tensor", t, opName(c.op), c.recvcount, false, rank);
      send = input;
      recv.assign(block, 0xa5);
      const shoal_tensor_t in = shoal_tensor_1d(send.data(), total, t.id);
      const shoal_tensor_t out = shoal_tensor_1d(recv.data(), c.recvcount, t.id);
      if (callOk(shoal_reduce_scatter_tensor(comm, &in, &out, c.op), comm, what)) {
        checkElements(what, t, recv.data(), c.recvcount, want);
        EXPECT_TRUE(send == input) << what << ": the input was modified";
      }
    }
  });
}

// No rank leaves a barrier before every rank has arrived: each rank counts
// itself in (after a rank- and round-dependent delay) just before the barrier.
TEST_P(Collectives, Barrier) {
  const int n = ranks();
  constexpr int kRounds = 30;
  std::atomic<int> arrived{0};
  run([&](int rank, shoal_comm_t comm) {
    for (int round = 0; round < kRounds; ++round) {
      std::this_thread::sleep_for(std::chrono::microseconds(hash3(rank, round, 1) % 3000));
      arrived.fetch_add(1);
      if (!callOk(shoal_barrier(comm), comm, "shoal_barrier")) return;
      int seen = arrived.load();
      // Everyone arrived at this round; nobody can be past the next round's barrier.
      EXPECT_GE(seen, n * (round + 1)) << "rank " << rank << " left barrier " << round << " early";
      EXPECT_LE(seen, n * (round + 2)) << "rank " << rank << " round " << round;
    }
  });
}

std::string paramName(const ::testing::TestParamInfo<Param>& info) {
  return std::to_string(std::get<0>(info.param)) + "ranks_" + std::get<1>(info.param);
}
INSTANTIATE_TEST_SUITE_P(Ranks, Collectives,
                         ::testing::Combine(::testing::Values(1, 2, 3, 4, 5, 8),
                                            ::testing::Values(std::string("ring"), std::string("tree"))),
                         paramName);
INSTANTIATE_TEST_SUITE_P(Ranks, CollectivesAllAlgorithms,
                         ::testing::Combine(::testing::Values(1, 2, 3, 4, 5, 8),
                                            ::testing::Values(std::string("ring"), std::string("tree"),
                                                              std::string("doubling"), std::string("shm"))),
                         paramName);

// The self-made float model must agree with the dtypes' definitions where C++ has them.
TEST(FloatModel, MatchesNativeFloatAndDouble) {
  // The generic code path (used for f16/bf16), run on the f32/f64 layouts.
  const DType f32{SHOAL_DTYPE_COUNT, "f32-generic", 4, true, true, 23, 8};
  const DType f64{SHOAL_DTYPE_COUNT, "f64-generic", 8, true, true, 52, 11};
  for (float v : {0.0f, -0.0f, 1.0f, -2.5f, 3.0e-39f, 1.0e38f, 0.1f}) {
    uint32_t bits;
    std::memcpy(&bits, &v, 4);
    EXPECT_EQ(encodeFloat(f32, v), bits) << v;
    EXPECT_EQ(decodeFloat(f32, bits), static_cast<long double>(v)) << v;
  }
  for (double v : {1.0, -7.25, 1e-310, 0.1}) {
    uint64_t bits;
    std::memcpy(&bits, &v, 8);
    EXPECT_EQ(encodeFloat(f64, v), bits) << v;
  }
  const DType& f16 = dtypeOf(SHOAL_F16);
  EXPECT_EQ(encodeFloat(f16, 1.0L), 0x3c00u);
  EXPECT_EQ(encodeFloat(f16, -2.0L), 0xc000u);
  EXPECT_EQ(encodeFloat(f16, 65504.0L), 0x7bffu);
  EXPECT_EQ(encodeFloat(f16, std::ldexp(1.0L, -24)), 0x0001u);
  EXPECT_EQ(roundToFormat(f16, 2049.0L), 2048.0L);  // tie to even
  EXPECT_EQ(roundToFormat(f16, 2051.0L), 2052.0L);
  const DType& bf16 = dtypeOf(SHOAL_BF16);
  EXPECT_EQ(encodeFloat(bf16, 1.0L), 0x3f80u);
  EXPECT_EQ(roundToFormat(bf16, 257.0L), 256.0L);
  EXPECT_EQ(decodeFloat(bf16, 0xc040u), -3.0L);
  EXPECT_EQ(roundToFormat(f32, 1.0L / 3), static_cast<long double>(1.0f / 3.0f));
  EXPECT_EQ(roundToFormat(f64, 1.0L / 3), static_cast<long double>(1.0 / 3.0));
  EXPECT_EQ(roundToFormat(f32, 1.0L + std::ldexp(1.0L, -24)), 1.0L);  // tie to even
  EXPECT_EQ(roundToFormat(f32, 1.0L + 3 * std::ldexp(1.0L, -24)), 1.0L + std::ldexp(1.0L, -22));
}

}  // namespace
