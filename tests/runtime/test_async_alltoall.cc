// shoal_ialltoall: the async runtime's alltoall (Horovod's alltoall in the
// background thread). Exact values for even and per-peer blocks (zeros
// included), in negotiated order with allreduces submitted in different
// orders on different ranks, mixed with blocking calls, disagreements as
// MISMATCH on every rank, a missing rank as TIMEOUT, and the argument checks.
#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include "harness/harness.h"
#include "harness/rank_sync.h"
#include "runtime/async_helpers.h"
#include "shoal/shoal.h"

namespace shoal::test {
namespace {

constexpr double kWaitS = 30;

// The value rank `from` sends rank `to` as its i-th element: names both.
int32_t valueOf(int from, int to, size_t i) { return 1000 * from + 100 * to + static_cast<int32_t>(i); }

// Elements rank `from` sends rank `to` in the per-peer tests (zero for some pairs).
size_t countOf(int from, int to) { return static_cast<size_t>((from + 2 * to) % 3); }

// The received data and per-rank counts of a completed request.
struct Result {
  std::vector<int32_t> data;
  std::vector<size_t> counts;
};

Result resultOf(shoal_request_t request, int size) {
  Result result;
  const void* data = nullptr;
  size_t count = 0;
  result.counts.assign(size, 99);
  EXPECT_EQ(shoal_request_alltoall_result(request, &data, &count, result.counts.data()), SHOAL_OK)
      << shoal_last_error(nullptr);
  result.data.resize(count);
  if (count > 0) std::memcpy(result.data.data(), data, count * sizeof(int32_t));
  // shoal_request_alltoall_copy gives the same bytes into a caller's buffer (a
  // binding's tensor), and refuses one too small for them.
  std::vector<int32_t> copied(count + 1, -7);
  EXPECT_EQ(shoal_request_alltoall_copy(request, copied.data(), count * sizeof(int32_t)), SHOAL_OK)
      << shoal_last_error(nullptr);
  EXPECT_EQ(std::vector<int32_t>(copied.begin(), copied.begin() + count), result.data);
  EXPECT_EQ(copied.back(), -7) << "the copy wrote past the result";
  if (count > 0) {
    EXPECT_EQ(shoal_request_alltoall_copy(request, copied.data(), count * sizeof(int32_t) - 1),
              SHOAL_ERR_INVALID_ARGUMENT);
    EXPECT_NE(std::string(shoal_last_error(nullptr)).find("pass a buffer of at least that size"), std::string::npos)
        << shoal_last_error(nullptr);
    EXPECT_EQ(shoal_request_alltoall_copy(request, nullptr, count * sizeof(int32_t)), SHOAL_ERR_INVALID_ARGUMENT);
  }
  return result;
}

TEST(AsyncAlltoall, EvenAndPerPeerBlocksAreExact) {
  for (int n : {1, 3}) {
    runRanks(n, [&](int rank, shoal_comm_t comm) {
      // Even: 2 elements per peer, shape [n, 2].
      std::vector<int32_t> even;
      for (int p = 0; p < n; ++p)
        for (size_t i = 0; i < 2; ++i) even.push_back(valueOf(rank, p, i));
      shoal_tensor_t evenTensor = tensorOf(even.data(), SHOAL_I32, {n, 2});
      // Per peer: countOf(rank, p) elements to rank p.
      std::vector<int32_t> uneven;
      std::vector<size_t> sendcounts;
      for (int p = 0; p < n; ++p) {
        sendcounts.push_back(countOf(rank, p));
        for (size_t i = 0; i < countOf(rank, p); ++i) uneven.push_back(valueOf(rank, p, i));
      }
      shoal_tensor_t unevenTensor = tensorOf(uneven.data(), SHOAL_I32, {static_cast<int64_t>(uneven.size())});
      shoal_request_t a = nullptr, b = nullptr;
      ASSERT_TRUE(callOk(shoal_ialltoall(comm, "even", &evenTensor, nullptr, &a), comm, "even"));
      ASSERT_TRUE(callOk(shoal_ialltoall(comm, "uneven", &unevenTensor, sendcounts.data(), &b), comm, "uneven"));
      ASSERT_EQ(shoal_wait(a, kWaitS), SHOAL_OK) << shoal_request_error(a);
      ASSERT_EQ(shoal_wait(b, kWaitS), SHOAL_OK) << shoal_request_error(b);
      Result got = resultOf(a, n);
      std::vector<int32_t> want;
      for (int p = 0; p < n; ++p)
        for (size_t i = 0; i < 2; ++i) want.push_back(valueOf(p, rank, i));
      EXPECT_EQ(got.data, want) << "even, rank " << rank;
      EXPECT_EQ(got.counts, std::vector<size_t>(n, 2));
      got = resultOf(b, n);
      want.clear();
      std::vector<size_t> wantCounts;
      for (int p = 0; p < n; ++p) {
        wantCounts.push_back(countOf(p, rank));
        for (size_t i = 0; i < countOf(p, rank); ++i) want.push_back(valueOf(p, rank, i));
      }
      EXPECT_EQ(got.data, want) << "per peer, rank " << rank;
      EXPECT_EQ(got.counts, wantCounts);
      // The input is untouched, and a second round under the same names works (cached names).
      EXPECT_EQ(even[0], valueOf(rank, 0, 0));
      shoal_request_free(a);
      shoal_request_free(b);
      ASSERT_TRUE(callOk(shoal_ialltoall(comm, "uneven", &unevenTensor, sendcounts.data(), &b), comm, "again"));
      ASSERT_EQ(shoal_wait(b, kWaitS), SHOAL_OK) << shoal_request_error(b);
      EXPECT_EQ(resultOf(b, n).data, want);
      shoal_request_free(b);
    });
  }
}

// Ranks submit an allreduce, an alltoall and an allreduce in different orders;
// the runtime runs them in one negotiated order, and blocking calls still mix in.
TEST(AsyncAlltoall, RunsInOrderWithOtherRequests) {
  const int n = 3;
  runRanks(n, [&](int rank, shoal_comm_t comm) {
    std::vector<float> x(5, float(rank + 1)), y(7, 2.0f);
    std::vector<int32_t> send;
    for (int p = 0; p < n; ++p) send.push_back(valueOf(rank, p, 0));
    shoal_tensor_t tx = tensorOf(x.data(), SHOAL_F32, {5}), ty = tensorOf(y.data(), SHOAL_F32, {7});
    shoal_tensor_t ts = tensorOf(send.data(), SHOAL_I32, {n});
    std::vector<shoal_request_t> requests(3, nullptr);
    for (int step = 0; step < 3; ++step) {
      const int which = (step + rank) % 3;  // another order on every rank
      shoal_status_t status =
          which == 0   ? shoal_iallreduce(comm, "x", &tx, &tx, SHOAL_SUM, nullptr, &requests[0])
          : which == 1 ? shoal_ialltoall(comm, "t", &ts, nullptr, &requests[1])
                       : shoal_iallreduce(comm, "y", &ty, &ty, SHOAL_MAX, nullptr, &requests[2]);
      ASSERT_TRUE(callOk(status, comm, "submit"));
    }
    int32_t one = 1, sum = 0;
    EXPECT_TRUE(callOk(shoal_allreduce(comm, &one, &sum, 1, SHOAL_I32, SHOAL_SUM), comm, "blocking"));
    EXPECT_EQ(sum, n);
    ASSERT_EQ(shoal_wait_all(requests.data(), 3, kWaitS), SHOAL_OK) << shoal_last_error(nullptr);
    EXPECT_EQ(x, std::vector<float>(5, float(n * (n + 1) / 2)));
    EXPECT_EQ(y, std::vector<float>(7, 2.0f));
    std::vector<int32_t> want;
    for (int p = 0; p < n; ++p) want.push_back(valueOf(p, rank, 0));
    EXPECT_EQ(resultOf(requests[1], n).data, want);
    // A result is only for alltoall requests.
    const void* data = nullptr;
    size_t count = 0;
    EXPECT_EQ(shoal_request_alltoall_result(requests[0], &data, &count, nullptr), SHOAL_ERR_INVALID_ARGUMENT);
    EXPECT_NE(std::string(shoal_last_error(nullptr)).find("not an alltoall"), std::string::npos)
        << shoal_last_error(nullptr);
    int32_t room[8];
    EXPECT_EQ(shoal_request_alltoall_copy(requests[0], room, sizeof room), SHOAL_ERR_INVALID_ARGUMENT);
    EXPECT_NE(std::string(shoal_last_error(nullptr)).find("shoal_request_alltoall_copy: request 'x' is a"),
              std::string::npos)
        << shoal_last_error(nullptr);
    for (shoal_request_t r : requests) shoal_request_free(r);
  });
}

TEST(AsyncAlltoall, DisagreementsAreAMismatchOnEveryRank) {
  const int n = 3;
  runRanks(n, [&](int rank, shoal_comm_t comm) {
    std::vector<int32_t> a(6, rank), b(6, rank), c(6, rank);
    // dtype: rank 1 calls its data u32.
    shoal_tensor_t ta = tensorOf(a.data(), rank == 1 ? SHOAL_U32 : SHOAL_I32, {6});
    // shape of the even form: rank 2 passes [3, 2], the others [6].
    shoal_tensor_t tb = rank == 2 ? tensorOf(b.data(), SHOAL_I32, {3, 2}) : tensorOf(b.data(), SHOAL_I32, {6});
    // even on rank 0, per peer elsewhere.
    shoal_tensor_t tc = tensorOf(c.data(), SHOAL_I32, {6});
    std::vector<size_t> counts(n, 2);
    shoal_request_t ra = nullptr, rb = nullptr, rc = nullptr;
    ASSERT_TRUE(callOk(shoal_ialltoall(comm, "a", &ta, nullptr, &ra), comm, "a"));
    ASSERT_TRUE(callOk(shoal_ialltoall(comm, "b", &tb, nullptr, &rb), comm, "b"));
    ASSERT_TRUE(callOk(shoal_ialltoall(comm, "c", &tc, rank == 0 ? nullptr : counts.data(), &rc), comm, "c"));
    for (auto [request, what] : {std::pair{ra, "dtype"}, std::pair{rb, "shape"}, std::pair{rc, "collective"}}) {
      EXPECT_EQ(shoal_wait(request, kWaitS), SHOAL_ERR_MISMATCH) << "rank " << rank << " " << what << ": "
                                                                  << shoal_request_error(request);
      EXPECT_NE(std::string(shoal_request_error(request)).find(what), std::string::npos)
          << "rank " << rank << ": " << shoal_request_error(request);
      const void* data = nullptr;
      size_t count = 0;
      EXPECT_EQ(shoal_request_alltoall_result(request, &data, &count, nullptr), SHOAL_ERR_MISMATCH);
      EXPECT_EQ(shoal_request_alltoall_copy(request, a.data(), 0), SHOAL_ERR_MISMATCH);  // a failed request has none
      shoal_request_free(request);
    }
    // The runtime goes on: the same names with agreeing arguments work.
    ta = tensorOf(a.data(), SHOAL_I32, {6});
    ASSERT_TRUE(callOk(shoal_ialltoall(comm, "a2", &ta, nullptr, &ra), comm, "a2"));
    EXPECT_EQ(shoal_wait(ra, kWaitS), SHOAL_OK) << shoal_request_error(ra);
    shoal_request_free(ra);
  });
}

TEST(AsyncAlltoall, AMissingRankIsATimeoutNotAHang) {
  RankOptions options;
  options.timeoutS = 5;
  RankBarrier barrier(2);
  runRanks(2, [&](int rank, shoal_comm_t comm) {
    ASSERT_TRUE(callOk(shoal_async_start(comm), comm, "start"));
    std::vector<int32_t> a(4, rank);
    shoal_tensor_t ta = tensorOf(a.data(), SHOAL_I32, {4});
    shoal_request_t request = nullptr;
    if (rank == 0) {
      ASSERT_TRUE(callOk(shoal_ialltoall(comm, "lonely", &ta, nullptr, &request), comm, "lonely"));
      EXPECT_EQ(shoal_wait(request, 0.5), SHOAL_ERR_TIMEOUT) << shoal_last_error(nullptr);
      const void* data = nullptr;
      size_t count = 0;
      EXPECT_EQ(shoal_request_alltoall_result(request, &data, &count, nullptr), SHOAL_ERR_INVALID_ARGUMENT);
      EXPECT_NE(std::string(shoal_last_error(nullptr)).find("still pending"), std::string::npos);
      EXPECT_EQ(shoal_request_alltoall_copy(request, a.data(), sizeof(int32_t) * a.size()),
                SHOAL_ERR_INVALID_ARGUMENT);
    }
    barrier.wait();  // threads only: no shoal call while the name is pending on rank 0 alone
    // Rank 1 submits it late: the request then completes on both.
    if (rank == 1) ASSERT_TRUE(callOk(shoal_ialltoall(comm, "lonely", &ta, nullptr, &request), comm, "late"));
    EXPECT_EQ(shoal_wait(request, kWaitS), SHOAL_OK) << shoal_request_error(request);
    std::vector<int32_t> want = {0, 0, 1, 1};
    EXPECT_EQ(resultOf(request, 2).data, want);
    shoal_request_free(request);
  }, options);
}

TEST(AsyncAlltoall, ArgumentsAreChecked) {
  runRanks(2, [&](int, shoal_comm_t comm) {
    std::vector<int32_t> a(5, 0);
    shoal_tensor_t odd = tensorOf(a.data(), SHOAL_I32, {5});
    shoal_request_t request = nullptr;
    auto refused = [&](shoal_status_t status, const char* words) {
      EXPECT_EQ(status, SHOAL_ERR_INVALID_ARGUMENT);
      EXPECT_NE(std::string(shoal_last_error(comm)).find(words), std::string::npos) << shoal_last_error(comm);
      EXPECT_EQ(request, nullptr);
    };
    refused(shoal_ialltoall(comm, "odd", &odd, nullptr, &request), "not a multiple of the world size 2");
    std::vector<size_t> tooMany = {3, 3}, tooFew = {1, 1};
    refused(shoal_ialltoall(comm, "many", &odd, tooMany.data(), &request), "add up to more than");
    refused(shoal_ialltoall(comm, "few", &odd, tooFew.data(), &request), "add up to 2 but input has 5");
    refused(shoal_ialltoall(comm, nullptr, &odd, tooFew.data(), &request), "name is NULL");
    refused(shoal_ialltoall(comm, "null", nullptr, nullptr, &request), "input is NULL");
    EXPECT_EQ(shoal_request_alltoall_result(nullptr, nullptr, nullptr, nullptr), SHOAL_ERR_INVALID_ARGUMENT);
    EXPECT_EQ(shoal_request_alltoall_copy(nullptr, a.data(), 4), SHOAL_ERR_INVALID_ARGUMENT);
    // Without CUDA in the build the async runtime refuses CUDA tensors; a CUDA
    // build takes them (runtime.AsyncCuda.* and tests/cuda cover that path: a
    // host pointer marked as device memory must not be submitted there).
    if (!shoal_built_with("cuda")) {
      shoal_tensor_t device = odd;
      device.memory = SHOAL_MEMORY_CUDA;
      std::vector<size_t> fine = {2, 3};
      EXPECT_EQ(shoal_ialltoall(comm, "cuda", &device, fine.data(), &request), SHOAL_ERR_UNSUPPORTED);
    }
  });
}

}  // namespace
}  // namespace shoal::test
