// shoal_ireduce_scatter: the async runtime's reduce-scatter (Horovod's
// reducescatter in the background thread). Exact shares for every op on even
// and uneven rows (fewer rows than ranks included), in negotiated order with
// other requests and blocking calls, on split communicators; disagreements
// (collective, dtype, op, shape, different names) an error on every rank;
// a late rank a timeout, a dead one an error with text; refused under join;
// CUDA tensors that cannot run refused on every rank; the argument checks.
//
// The dead-peer test forks its ranks, so it comes first: when the binary runs
// every test in one process, it forks before any other test made threads.
#include <gtest/gtest.h>

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "harness/forked_job.h"
#include "harness/harness.h"
#include "harness/rank_sync.h"
#include "runtime/async_helpers.h"
#include "shoal/shoal.h"

namespace shoal::test {
namespace {

constexpr double kWaitS = 30;

// Rank `rank`'s first row and row count of `rows` over `size` ranks
// (shoal.torch's split, which shoal_ireduce_scatter documents).
std::pair<size_t, size_t> shareOf(size_t rows, int size, int rank) {
  const size_t base = rows / size, extra = rows % size, r = static_cast<size_t>(rank);
  return {r * base + std::min(r, extra), base + (r < extra ? 1 : 0)};
}

// What rank `rank` contributes at element i under op: small integers whose
// reductions are exact in f64 and i32.
int64_t contribution(shoal_op_t op, int rank, size_t i) {
  switch (op) {
    case SHOAL_PROD: return static_cast<int64_t>((rank + i) % 3 + 1);
    case SHOAL_MIN:
    case SHOAL_MAX: return static_cast<int64_t>((i * 7 + static_cast<size_t>(rank) * 3) % 11) - 5;
    case SHOAL_BAND:
    case SHOAL_BOR:
    case SHOAL_BXOR: return (int64_t(1) << ((i + static_cast<size_t>(rank)) % 8)) | (rank + 1);
    default: return (rank + 1) * static_cast<int64_t>(i % 5 + 1) - 3;
  }
}

// The reduction of every rank's contribution at element i.
double expected(shoal_op_t op, int ranks, size_t i) {
  int64_t value = contribution(op, 0, i);
  for (int r = 1; r < ranks; ++r) {
    const int64_t v = contribution(op, r, i);
    switch (op) {
      case SHOAL_PROD: value *= v; break;
      case SHOAL_MIN: value = std::min(value, v); break;
      case SHOAL_MAX: value = std::max(value, v); break;
      case SHOAL_BAND: value &= v; break;
      case SHOAL_BOR: value |= v; break;
      case SHOAL_BXOR: value ^= v; break;
      default: value += v; break;
    }
  }
  return op == SHOAL_AVG ? static_cast<double>(value) / ranks : static_cast<double>(value);
}

// A host buffer of f64 or i32 elements, read and written as numbers.
struct Buffer {
  shoal_dtype_t dtype;
  std::vector<uint8_t> bytes;
  Buffer(shoal_dtype_t d, size_t count) : dtype(d), bytes(count * (d == SHOAL_F64 ? 8 : 4), 0xEE) {}
  size_t count() const { return bytes.size() / (dtype == SHOAL_F64 ? 8 : 4); }
  void put(size_t i, int64_t v) {
    if (dtype == SHOAL_F64) {
      const double d = static_cast<double>(v);
      std::memcpy(bytes.data() + 8 * i, &d, 8);
    } else {
      const int32_t x = static_cast<int32_t>(v);
      std::memcpy(bytes.data() + 4 * i, &x, 4);
    }
  }
  double get(size_t i) const {
    if (dtype == SHOAL_F64) {
      double d;
      std::memcpy(&d, bytes.data() + 8 * i, 8);
      return d;
    }
    int32_t x;
    std::memcpy(&x, bytes.data() + 4 * i, 4);
    return x;
  }
};

size_t elementsOf(const std::vector<int64_t>& shape) {
  size_t n = 1;
  for (int64_t e : shape) n *= static_cast<size_t>(e);
  return n;
}

// ---- a dead peer (forked processes over a tcp store on loopback) -----------------------------

constexpr double kDeadTimeoutS = 2;   // SHOAL_TIMEOUT_S of the ranks
constexpr int kExitSawError = 3;      // the survivor's reduce-scatter failed with text
constexpr int kExitSucceeded = 5;     // the survivor never noticed
constexpr int kExitPending = 6;       // its request was still pending at the deadline
constexpr int kExitUsage = 2;

int deadPeerRank(int rank, const std::string& store) {
  alarm(static_cast<unsigned>(4 * kDeadTimeoutS + 10));  // a hang ends as SIGALRM (exit 128 + 14)
  shoal_config_t config = SHOAL_CONFIG_INIT;
  config.rank = rank;
  config.world_size = 2;
  config.store = store.c_str();
  config.token = "async-reduce-scatter-test";
  config.timeout_s = kDeadTimeoutS;
  shoal_comm_t comm = nullptr;
  if (shoal_comm_init_config(&config, &comm) != SHOAL_OK) {
    std::printf("rank %d: init failed: %s\n", rank, shoal_last_error(nullptr));
    return kExitUsage;
  }
  std::vector<float> in(6, static_cast<float>(rank + 1)), out(3, 0.0f);
  shoal_tensor_t input = tensorOf(in.data(), SHOAL_F32, {6}), output = tensorOf(out.data(), SHOAL_F32, {3});
  shoal_request_t request = nullptr;
  // A first request that both run: the runtime is up on both ranks.
  if (shoal_ireduce_scatter(comm, "rs.first", &input, &output, SHOAL_SUM, &request) != SHOAL_OK ||
      shoal_wait(request, 3 * kDeadTimeoutS) != SHOAL_OK || out[0] != 3.0f) {
    std::printf("rank %d: the first reduce-scatter failed: %s\n", rank, shoal_last_error(nullptr));
    return kExitUsage;
  }
  shoal_request_free(request);
  if (rank == 1) {  // dies while rank 0's next request waits for it
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    std::printf("rank 1: dying on purpose\n");
    std::fflush(stdout);
    _exit(9);
  }
  const auto start = std::chrono::steady_clock::now();
  shoal_status_t status = shoal_ireduce_scatter(comm, "rs.second", &input, &output, SHOAL_SUM, &request);
  if (status != SHOAL_OK) {  // the engine may have noticed the death before the submission
    std::printf("rank 0: reduce-scatter error: refused: %s\n", shoal_last_error(comm));
    return kExitSawError;
  }
  status = shoal_wait(request, 3 * kDeadTimeoutS);
  int done = 0;
  shoal_test(request, &done);
  if (!done) {
    std::printf("rank 0: the request was still pending after %g s\n", 3 * kDeadTimeoutS);
    return kExitPending;
  }
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::printf("rank 0: reduce-scatter error after %.2f s: %s: %s\n", seconds, shoal_status_string(status),
              shoal_request_error(request));
  std::fflush(stdout);
  const bool failed = status != SHOAL_OK && shoal_request_error(request)[0] != '\0';
  shoal_request_free(request);
  shoal_comm_destroy(comm);
  return failed ? kExitSawError : kExitSucceeded;
}

TEST(AsyncReduceScatter, ADeadPeerIsAnErrorWithTextWithinTheDeadline) {
  ForkedJob job("async_reduce_scatter");
  const std::string store = "tcp://127.0.0.1:" + std::to_string(freeLoopbackPort());
  std::vector<ForkedRank> outcomes = job.run(2, [&](int rank) { return deadPeerRank(rank, store); }, 30);
  EXPECT_EQ(outcomes[1].exitCode, 9) << describe(outcomes);
  EXPECT_EQ(outcomes[0].exitCode, kExitSawError)
      << "(5 = never noticed, 6 = still pending, 142 = hung)\n" << describe(outcomes);
  EXPECT_LT(outcomes[0].seconds, 3 * kDeadTimeoutS + 5) << describe(outcomes);
  EXPECT_NE(outcomes[0].output.find("reduce-scatter error"), std::string::npos) << describe(outcomes);
}

// ---- ranks as threads ---------------------------------------------------------------------------

TEST(AsyncReduceScatter, EveryOpOnEvenAndUnevenRowsIsExact) {
  const std::vector<std::vector<int64_t>> shapes = {{6, 2}, {7, 2}, {2, 3}, {5}, {0, 4}};  // at 3 ranks
  const shoal_op_t ops[] = {SHOAL_SUM, SHOAL_AVG, SHOAL_PROD, SHOAL_MIN, SHOAL_MAX, SHOAL_BAND, SHOAL_BOR, SHOAL_BXOR};
  for (int n : {1, 3}) {
    runRanks(n, [&](int rank, shoal_comm_t comm) {
      struct Case {
        shoal_op_t op;
        std::vector<int64_t> shape;
        Buffer in, out;
        std::string name;
        shoal_request_t request = nullptr;
      };
      std::vector<Case> cases;
      for (shoal_op_t op : ops)
        for (const auto& shape : shapes) {
          const bool bitwise = op == SHOAL_BAND || op == SHOAL_BOR || op == SHOAL_BXOR;
          const shoal_dtype_t dtype = bitwise ? SHOAL_I32 : SHOAL_F64;
          const size_t row = shape.size() > 1 ? static_cast<size_t>(shape[1]) : 1;
          const size_t mine = shareOf(static_cast<size_t>(shape[0]), n, rank).second * row;
          cases.push_back({op, shape, Buffer(dtype, elementsOf(shape)), Buffer(dtype, mine),
                           std::string(shoal_op_name(op)) + "." + std::to_string(cases.size())});
        }
      for (Case& c : cases) {
        for (size_t i = 0; i < c.in.count(); ++i) c.in.put(i, contribution(c.op, rank, i));
        shoal_tensor_t input = tensorOf(c.in.bytes.data(), c.in.dtype, c.shape);
        shoal_tensor_t output = tensorOf(c.out.bytes.data(), c.out.dtype, {static_cast<int64_t>(c.out.count())});
        ASSERT_TRUE(callOk(shoal_ireduce_scatter(comm, c.name.c_str(), &input, &output, c.op, &c.request), comm,
                           c.name));
      }
      for (Case& c : cases) {
        ASSERT_EQ(shoal_wait(c.request, kWaitS), SHOAL_OK) << c.name << ": " << shoal_request_error(c.request);
        shoal_request_free(c.request);
        const size_t row = c.shape.size() > 1 ? static_cast<size_t>(c.shape[1]) : 1;
        const size_t first = shareOf(static_cast<size_t>(c.shape[0]), n, rank).first * row;
        for (size_t i = 0; i < c.out.count(); ++i)
          ASSERT_EQ(c.out.get(i), expected(c.op, n, first + i))
              << c.name << " shape [" << c.shape[0] << ", ...] rank " << rank << " element " << i;
        for (size_t i = 0; i < c.in.count(); ++i)  // the input is untouched
          ASSERT_EQ(c.in.get(i), static_cast<double>(contribution(c.op, rank, i))) << c.name;
      }
    });
  }
}

// Ranks submit an allreduce, a reduce-scatter and an alltoall in different
// orders; the runtime runs them in one negotiated order, blocking calls mix in,
// and the same names again (cached) still work.
TEST(AsyncReduceScatter, RunsInOrderWithOtherRequestsAndBlockingCalls) {
  const int n = 3;
  runRanks(n, [&](int rank, shoal_comm_t comm) {
    for (int round = 0; round < 2; ++round) {
      std::vector<float> x(5, float(rank + 1)), rs(8), share(shareOf(4, n, rank).second * 2, -1.0f);
      for (size_t i = 0; i < rs.size(); ++i) rs[i] = float(rank * 10 + static_cast<int>(i) + round);
      std::vector<int32_t> send(n, rank);
      shoal_tensor_t tx = tensorOf(x.data(), SHOAL_F32, {5}), ts = tensorOf(send.data(), SHOAL_I32, {n});
      // Shape [4, 2]: 4 rows over 3 ranks, rows 2/1/1; each output given as [rows, 2].
      shoal_tensor_t trs = tensorOf(rs.data(), SHOAL_F32, {4, 2});
      shoal_tensor_t tout = tensorOf(share.data(), SHOAL_F32, {static_cast<int64_t>(share.size() / 2), 2});
      std::vector<shoal_request_t> requests(3, nullptr);
      for (int step = 0; step < 3; ++step) {
        const int which = (step + rank) % 3;  // another order on every rank
        shoal_status_t status =
            which == 0   ? shoal_iallreduce(comm, "x", &tx, &tx, SHOAL_SUM, nullptr, &requests[0])
            : which == 1 ? shoal_ireduce_scatter(comm, "rs", &trs, &tout, SHOAL_SUM, &requests[1])
                         : shoal_ialltoall(comm, "t", &ts, nullptr, &requests[2]);
        ASSERT_TRUE(callOk(status, comm, "submit"));
      }
      int32_t one = 1, sum = 0;
      EXPECT_TRUE(callOk(shoal_allreduce(comm, &one, &sum, 1, SHOAL_I32, SHOAL_SUM), comm, "blocking"));
      EXPECT_EQ(sum, n);
      ASSERT_EQ(shoal_wait_all(requests.data(), 3, kWaitS), SHOAL_OK) << shoal_last_error(nullptr);
      EXPECT_EQ(x, std::vector<float>(5, float(n * (n + 1) / 2)));
      const size_t first = shareOf(4, n, rank).first * 2;
      for (size_t i = 0; i < share.size(); ++i) {
        float want = 0;
        for (int r = 0; r < n; ++r) want += float(r * 10 + static_cast<int>(first + i) + round);
        EXPECT_EQ(share[i], want) << "round " << round << " rank " << rank << " element " << i;
      }
      for (shoal_request_t r : requests) shoal_request_free(r);
    }
    // The second round's requests were made ready by the cache's bits alone.
    EXPECT_GE(asyncStats(comm).cache_hits, 3u);
  });
}

TEST(AsyncReduceScatter, DisagreementsAreAMismatchOnEveryRank) {
  const int n = 3;
  runRanks(n, [&](int rank, shoal_comm_t comm) {
    std::vector<float> a(6, 1.0f), out(2, 0.0f);
    std::vector<int32_t> ints(6, 1);
    shoal_tensor_t o = tensorOf(out.data(), SHOAL_F32, {2});
    // dtype: rank 1 passes i32 (its output too).
    std::vector<int32_t> intOut(2);
    shoal_tensor_t ta = rank == 1 ? tensorOf(ints.data(), SHOAL_I32, {6}) : tensorOf(a.data(), SHOAL_F32, {6});
    shoal_tensor_t oa = rank == 1 ? tensorOf(intOut.data(), SHOAL_I32, {2}) : o;
    // shape: rank 2 passes [3, 2] (the same elements, 1 row each), the others [6].
    std::vector<float> b(6, 1.0f), outB(2);
    shoal_tensor_t tb = rank == 2 ? tensorOf(b.data(), SHOAL_F32, {3, 2}) : tensorOf(b.data(), SHOAL_F32, {6});
    shoal_tensor_t ob = tensorOf(outB.data(), SHOAL_F32, {2});
    // op: max on rank 0, sum elsewhere.
    std::vector<float> c(6, 1.0f), outC(2);
    shoal_tensor_t tc = tensorOf(c.data(), SHOAL_F32, {6}), oc = tensorOf(outC.data(), SHOAL_F32, {2});
    // collective: an allreduce of the same name on rank 2.
    std::vector<float> d(6, 1.0f), outD(2);
    shoal_tensor_t td = tensorOf(d.data(), SHOAL_F32, {6}), od = tensorOf(outD.data(), SHOAL_F32, {2});
    shoal_request_t ra = nullptr, rb = nullptr, rc = nullptr, rd = nullptr;
    ASSERT_TRUE(callOk(shoal_ireduce_scatter(comm, "a", &ta, &oa, SHOAL_SUM, &ra), comm, "a"));
    ASSERT_TRUE(callOk(shoal_ireduce_scatter(comm, "b", &tb, &ob, SHOAL_SUM, &rb), comm, "b"));
    ASSERT_TRUE(callOk(shoal_ireduce_scatter(comm, "c", &tc, &oc, rank == 0 ? SHOAL_MAX : SHOAL_SUM, &rc), comm, "c"));
    ASSERT_TRUE(callOk(rank == 2 ? shoal_iallreduce(comm, "d", &td, &td, SHOAL_SUM, nullptr, &rd)
                                 : shoal_ireduce_scatter(comm, "d", &td, &od, SHOAL_SUM, &rd),
                       comm, "d"));
    for (auto [request, what] : {std::pair{ra, "dtype"}, std::pair{rb, "shape"}, std::pair{rc, "op max vs sum"},
                                 std::pair{rd, "collective"}}) {
      EXPECT_EQ(shoal_wait(request, kWaitS), SHOAL_ERR_MISMATCH) << "rank " << rank << " " << what << ": "
                                                                  << shoal_request_error(request);
      const std::string text = shoal_request_error(request);
      EXPECT_NE(text.find(what), std::string::npos) << "rank " << rank << ": " << text;
      EXPECT_NE(text.find("reduce-scatter"), std::string::npos) << "rank " << rank << ": " << text;
      shoal_request_free(request);
    }
    // The runtime goes on: agreeing arguments work.
    ASSERT_TRUE(callOk(shoal_ireduce_scatter(comm, "a2", &tc, &oc, SHOAL_SUM, &ra), comm, "a2"));
    EXPECT_EQ(shoal_wait(ra, kWaitS), SHOAL_OK) << shoal_request_error(ra);
    shoal_request_free(ra);
    EXPECT_EQ(outC, std::vector<float>(2, float(n)));
  });
}

// Different names on two ranks: each waits for the other's. SHOAL_STALL_SHUTDOWN_S
// makes that an error on both, naming both calls.
TEST(AsyncReduceScatter, DifferentNamesAreAnErrorOnEveryRankNamingBoth) {
  ScopedEnv env{{"SHOAL_STALL_CHECK_S", "0"}, {"SHOAL_STALL_SHUTDOWN_S", "0.4"}};
  runRanks(2, [&](int rank, shoal_comm_t comm) {
    std::vector<float> in(4, 1.0f), out(2);
    shoal_tensor_t input = tensorOf(in.data(), SHOAL_F32, {4}), output = tensorOf(out.data(), SHOAL_F32, {2});
    shoal_request_t request = nullptr;
    ASSERT_TRUE(callOk(shoal_ireduce_scatter(comm, rank == 0 ? "rs.a" : "rs.b", &input, &output, SHOAL_SUM,
                                             &request), comm, "submit"));
    EXPECT_EQ(shoal_wait(request, kWaitS), SHOAL_ERR_MISMATCH) << "rank " << rank << ": "
                                                                << shoal_request_error(request);
    const std::string text = shoal_request_error(request);
    EXPECT_NE(text.find("'rs.a'"), std::string::npos) << text;
    EXPECT_NE(text.find("'rs.b'"), std::string::npos) << text;
    shoal_request_free(request);
  });
}

TEST(AsyncReduceScatter, ALateRankIsATimeoutNotAHang) {
  RankOptions options;
  options.timeoutS = 5;
  RankBarrier barrier(2);
  runRanks(2, [&](int rank, shoal_comm_t comm) {
    ASSERT_TRUE(callOk(shoal_async_start(comm), comm, "start"));
    std::vector<int32_t> in = {rank, rank + 1, rank + 2}, out(2, -1);
    out.resize(rank == 0 ? 2 : 1);  // 3 rows over 2 ranks: 2 and 1
    shoal_tensor_t input = tensorOf(in.data(), SHOAL_I32, {3});
    shoal_tensor_t output = tensorOf(out.data(), SHOAL_I32, {static_cast<int64_t>(out.size())});
    shoal_request_t request = nullptr;
    if (rank == 0) {
      ASSERT_TRUE(callOk(shoal_ireduce_scatter(comm, "late", &input, &output, SHOAL_SUM, &request), comm, "late"));
      EXPECT_EQ(shoal_wait(request, 0.3), SHOAL_ERR_TIMEOUT) << shoal_last_error(nullptr);
      EXPECT_NE(std::string(shoal_last_error(nullptr)).find("still pending"), std::string::npos)
          << shoal_last_error(nullptr);
    }
    barrier.wait();  // threads only: no shoal call while the name is pending on rank 0 alone
    if (rank == 1)
      ASSERT_TRUE(callOk(shoal_ireduce_scatter(comm, "late", &input, &output, SHOAL_SUM, &request), comm, "late"));
    EXPECT_EQ(shoal_wait(request, kWaitS), SHOAL_OK) << shoal_request_error(request);
    shoal_request_free(request);
    EXPECT_EQ(out, rank == 0 ? std::vector<int32_t>({1, 3}) : std::vector<int32_t>({5}));
  }, options);
}

// Process sets: a reduce-scatter on each half of a split communicator, and one
// on the parent, all through their own runtimes at once.
TEST(AsyncReduceScatter, WorksOnSplitCommunicators) {
  runRanks(4, [&](int rank, shoal_comm_t comm) {
    shoal_comm_t half = nullptr;
    ASSERT_TRUE(callOk(shoal_comm_split(comm, rank % 2, rank, &half), comm, "split"));
    int local = -1;
    ASSERT_TRUE(callOk(shoal_comm_rank(half, &local), half, "rank"));
    // 3 rows of 2 over the pair: 2 rows to its rank 0, 1 to its rank 1.
    std::vector<double> in(6), out(local == 0 ? 4 : 2, -1.0), all(8, double(rank)), mine(2, -1.0);
    for (size_t i = 0; i < in.size(); ++i) in[i] = double(100 * rank + static_cast<int>(i));
    shoal_tensor_t input = tensorOf(in.data(), SHOAL_F64, {3, 2});
    shoal_tensor_t output = tensorOf(out.data(), SHOAL_F64, {static_cast<int64_t>(out.size() / 2), 2});
    shoal_tensor_t wide = tensorOf(all.data(), SHOAL_F64, {8}), narrow = tensorOf(mine.data(), SHOAL_F64, {2});
    shoal_request_t onHalf = nullptr, onWorld = nullptr;
    ASSERT_TRUE(callOk(shoal_ireduce_scatter(half, "half", &input, &output, SHOAL_AVG, &onHalf), half, "half"));
    ASSERT_TRUE(callOk(shoal_ireduce_scatter(comm, "world", &wide, &narrow, SHOAL_MAX, &onWorld), comm, "world"));
    ASSERT_EQ(shoal_wait(onHalf, kWaitS), SHOAL_OK) << shoal_request_error(onHalf);
    ASSERT_EQ(shoal_wait(onWorld, kWaitS), SHOAL_OK) << shoal_request_error(onWorld);
    shoal_request_free(onHalf);
    shoal_request_free(onWorld);
    const int a = rank % 2, b = rank % 2 + 2;  // the pair's global ranks
    const size_t first = local == 0 ? 0 : 4;
    for (size_t i = 0; i < out.size(); ++i)
      EXPECT_EQ(out[i], (100.0 * a + 100.0 * b + 2.0 * static_cast<double>(first + i)) / 2) << "rank " << rank;
    EXPECT_EQ(mine, std::vector<double>(2, 3.0)) << "rank " << rank;
    EXPECT_EQ(shoal_comm_destroy(half), SHOAL_OK);
  });
}

// Join: a joined rank does not stand in for a reduce-scatter (Horovod refuses
// reducescatter with join too): its submitters fail with text, and the joined
// rank's shoal_join returns the same text once every rank joined.
TEST(AsyncReduceScatter, AJoinedRankRefusesItOnEveryRank) {
  runRanks(2, [&](int rank, shoal_comm_t comm) {
    if (rank == 0) {
      int last = -2;
      EXPECT_EQ(shoal_join(comm, kWaitS, &last), SHOAL_ERR_UNSUPPORTED);
      const std::string text = shoal_last_error(comm);
      EXPECT_NE(text.find("while this rank was joined"), std::string::npos) << text;
      EXPECT_NE(text.find("'scattered'"), std::string::npos) << text;
      EXPECT_NE(text.find("cannot stand in for a reduce-scatter"), std::string::npos) << text;
      return;
    }
    std::vector<float> in(4, 1.0f), out(2);
    shoal_tensor_t input = tensorOf(in.data(), SHOAL_F32, {4}), output = tensorOf(out.data(), SHOAL_F32, {2});
    shoal_request_t request = nullptr;
    ASSERT_TRUE(callOk(shoal_ireduce_scatter(comm, "scattered", &input, &output, SHOAL_SUM, &request), comm, "rs"));
    EXPECT_EQ(shoal_wait(request, kWaitS), SHOAL_ERR_UNSUPPORTED) << shoal_request_error(request);
    const std::string text = shoal_request_error(request);
    EXPECT_NE(text.find("rank(s) 0 called shoal_join"), std::string::npos) << text;
    EXPECT_NE(text.find("cannot stand in for a reduce-scatter"), std::string::npos) << text;
    shoal_request_free(request);
    int last = -2;
    EXPECT_EQ(shoal_join(comm, kWaitS, &last), SHOAL_OK) << shoal_last_error(comm);
    EXPECT_EQ(last, 1);
  });
}

TEST(AsyncReduceScatter, ArgumentsAreChecked) {
  runRanks(2, [&](int rank, shoal_comm_t comm) {
    std::vector<float> in(10, 0.0f), out(5);
    shoal_tensor_t input = tensorOf(in.data(), SHOAL_F32, {5, 2});  // rows 3 and 2: 6 and 4 elements
    shoal_request_t request = nullptr;
    auto refused = [&](shoal_status_t status, shoal_status_t want, const char* words) {
      EXPECT_EQ(status, want);
      EXPECT_NE(std::string(shoal_last_error(comm)).find(words), std::string::npos) << shoal_last_error(comm);
      EXPECT_NE(std::string(shoal_last_error(comm)).find("shoal_ireduce_scatter"), std::string::npos)
          << shoal_last_error(comm);
      EXPECT_EQ(request, nullptr);
    };
    shoal_tensor_t wrong = tensorOf(out.data(), SHOAL_F32, {5});  // neither rank's share
    refused(shoal_ireduce_scatter(comm, "wrong", &input, &wrong, SHOAL_SUM, &request), SHOAL_ERR_INVALID_ARGUMENT,
            rank == 0 ? "share of input's 5 rows over 2 ranks is 3 rows of 2 elements"
                      : "share of input's 5 rows over 2 ranks is 2 rows of 2 elements");
    shoal_tensor_t fine = tensorOf(out.data(), SHOAL_F32, {rank == 0 ? 6 : 4});
    std::vector<float> big(6);
    fine.data = big.data();
    shoal_tensor_t scalar = tensorOf(in.data(), SHOAL_F32, {});
    refused(shoal_ireduce_scatter(comm, "scalar", &scalar, &fine, SHOAL_SUM, &request), SHOAL_ERR_INVALID_ARGUMENT,
            "0-dimensional");
    refused(shoal_ireduce_scatter(comm, "bits", &input, &fine, SHOAL_BXOR, &request), SHOAL_ERR_INVALID_ARGUMENT,
            "bxor");
    shoal_tensor_t halfOut = fine;
    halfOut.dtype = SHOAL_F16;
    refused(shoal_ireduce_scatter(comm, "dtype", &input, &halfOut, SHOAL_SUM, &request), SHOAL_ERR_INVALID_ARGUMENT,
            "output dtype half");
    refused(shoal_ireduce_scatter(comm, nullptr, &input, &fine, SHOAL_SUM, &request), SHOAL_ERR_INVALID_ARGUMENT,
            "name is NULL");
    refused(shoal_ireduce_scatter(comm, "null", nullptr, &fine, SHOAL_SUM, &request), SHOAL_ERR_INVALID_ARGUMENT,
            "input is NULL");
    // A build without CUDA refuses CUDA tensors at submission, before their
    // memory is touched (a CUDA build takes them: the next tests).
    if (!shoal_built_with("cuda")) {
      shoal_tensor_t deviceIn = input, deviceOut = fine;
      deviceIn.memory = deviceOut.memory = SHOAL_MEMORY_CUDA;
      refused(shoal_ireduce_scatter(comm, "cuda", &deviceIn, &deviceOut, SHOAL_SUM, &request), SHOAL_ERR_UNSUPPORTED,
              "host");
    }
    // And the right share goes through.
    ASSERT_TRUE(callOk(shoal_ireduce_scatter(comm, "fine", &input, &fine, SHOAL_SUM, &request), comm, "fine"));
    EXPECT_EQ(shoal_wait(request, kWaitS), SHOAL_OK) << shoal_request_error(request);
    shoal_request_free(request);
  });
}

// CUDA tensors in a CUDA build, on the CPU: pointers that are not device
// memory (or no device at all) are refused in the CUDA call's agreement round,
// so the request fails on every rank with the refusing rank's text, on both
// branches of the CUDA path (even rows: ncclReduceScatter; uneven rows and the
// bitwise ops: the CUDA allreduce), and the runtime goes on. The device runs
// are tests/cuda/test_async_cuda.cc (AsyncCudaDevice.ReduceScatter*).
TEST(AsyncReduceScatter, CudaTensorsThatCannotRunFailOnEveryRankAndTheRuntimeGoesOn) {
  if (!shoal_built_with("cuda")) GTEST_SKIP() << "a build without CUDA refuses CUDA tensors at submission (checked above)";
  runRanks(2, [&](int rank, shoal_comm_t comm) {
    struct Case {
      const char* name;
      shoal_dtype_t dtype;
      shoal_op_t op;
      int64_t rows;
    };
    const Case cases[] = {{"even", SHOAL_F32, SHOAL_SUM, 4}, {"uneven", SHOAL_F32, SHOAL_AVG, 5},
                          {"bitwise", SHOAL_I32, SHOAL_BXOR, 4}};
    for (const Case& c : cases) {
      const int64_t share = c.rows / 2 + (rank < c.rows % 2 ? 1 : 0);
      // Never dereferenced: refused before any device work.
      shoal_tensor_t input = tensorOf(reinterpret_cast<void*>(uintptr_t(0x7f0000000000)), c.dtype, {c.rows, 3});
      shoal_tensor_t output = tensorOf(reinterpret_cast<void*>(uintptr_t(0x7f0000100000)), c.dtype, {share, 3});
      input.memory = output.memory = SHOAL_MEMORY_CUDA;
      shoal_request_t request = nullptr;
      ASSERT_TRUE(callOk(shoal_ireduce_scatter(comm, c.name, &input, &output, c.op, &request), comm, c.name));
      const auto start = std::chrono::steady_clock::now();
      const shoal_status_t status = shoal_wait(request, kWaitS);
      const std::string text = shoal_request_error(request);
      EXPECT_TRUE(status == SHOAL_ERR_UNSUPPORTED || status == SHOAL_ERR_INVALID_ARGUMENT)
          << c.name << ": " << shoal_status_string(status) << ": " << text;
      EXPECT_NE(text.find("shoal_ireduce_scatter"), std::string::npos) << text;
      EXPECT_NE(text.find("CUDA"), std::string::npos) << text;
      EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(10)) << c.name << ": waited, " << text;
      shoal_request_free(request);
    }
    // The runtime and the communicator go on: a host reduce-scatter is exact.
    std::vector<float> in(4, static_cast<float>(rank + 1)), out(2);
    shoal_tensor_t input = tensorOf(in.data(), SHOAL_F32, {4}), output = tensorOf(out.data(), SHOAL_F32, {2});
    shoal_request_t request = nullptr;
    ASSERT_TRUE(callOk(shoal_ireduce_scatter(comm, "host", &input, &output, SHOAL_SUM, &request), comm, "host"));
    ASSERT_EQ(shoal_wait(request, kWaitS), SHOAL_OK) << shoal_request_error(request);
    EXPECT_EQ(out, std::vector<float>(2, 3.0f));
    shoal_request_free(request);
  });
}

// Host tensors on one rank and CUDA tensors on the other: the memory kind is
// part of the negotiated metadata, so it is a mismatch on every rank.
TEST(AsyncReduceScatter, HostOnOneRankAndCudaOnTheOtherIsAMismatchEverywhere) {
  if (!shoal_built_with("cuda")) GTEST_SKIP() << "a build without CUDA refuses CUDA tensors at submission";
  runRanks(2, [&](int rank, shoal_comm_t comm) {
    std::vector<float> in(4, 1.0f), out(2);
    shoal_tensor_t input = tensorOf(in.data(), SHOAL_F32, {4}), output = tensorOf(out.data(), SHOAL_F32, {2});
    if (rank == 1) {
      input.data = reinterpret_cast<void*>(uintptr_t(0x7f0000000000));  // never dereferenced
      output.data = reinterpret_cast<void*>(uintptr_t(0x7f0000100000));
      input.memory = output.memory = SHOAL_MEMORY_CUDA;
    }
    shoal_request_t request = nullptr;
    ASSERT_TRUE(callOk(shoal_ireduce_scatter(comm, "mixed", &input, &output, SHOAL_SUM, &request), comm, "mixed"));
    EXPECT_EQ(shoal_wait(request, kWaitS), SHOAL_ERR_MISMATCH) << shoal_request_error(request);
    const std::string text = shoal_request_error(request);
    EXPECT_NE(text.find("memory"), std::string::npos) << text;
    shoal_request_free(request);
  });
}

}  // namespace
}  // namespace shoal::test
