// The tensor forms of alltoall(v), reduce, gather(v), scatter(v) and grouped
// send/recv: host tensors against exact values, and the routing of CUDA
// tensors that needs no GPU (tests/cuda runs them on one): which call is
// refused, with what text, on every rank at once, and whether the
// communicator stays usable. Runs in every build.
#include <gtest/gtest.h>

#include <chrono>
#include <functional>
#include <cstdint>
#include <numeric>
#include <string>
#include <vector>

#include "gpu/exchange_route.h"
#include "harness/cuda_routing.h"
#include "harness/harness.h"
#include "harness/rank_sync.h"

namespace {

using shoal::test::callOk;
using shoal::test::cudaTensor;
using shoal::test::cudaUsable;
using shoal::test::expectRefused;
using shoal::test::expectUsable;
using shoal::test::fakeDevicePointer;
using shoal::test::runRanks;
using Clock = std::chrono::steady_clock;

constexpr double kTimeoutS = shoal::test::kRoutingTimeoutS;

int32_t valueOf(int from, int to, size_t i) { return 1000 * from + 100 * to + static_cast<int32_t>(i); }

shoal_tensor_t hostTensor(std::vector<int32_t>& data) { return shoal_tensor_1d(data.data(), data.size(), SHOAL_I32); }

// ---- the count comparison of the per-peer forms ---------------------------------

TEST(CountAgreement, NamesThePairThatDisagrees) {
  // 3 ranks; gathered[p * 3 + q]: bytes rank p sends rank q (4-byte elements).
  std::vector<uint64_t> gathered = {0, 4, 8, 12, 0, 16, 20, 24, 0};
  EXPECT_EQ(shoal::countsDisagreement(1, 3, gathered, {4, 0, 24}, 4), "");
  const std::string text = shoal::countsDisagreement(1, 3, gathered, {4, 0, 28}, 4);
  EXPECT_NE(text.find("rank 2 sends 6 elements to rank 1, which expects 7"), std::string::npos) << text;
  EXPECT_NE(shoal::countsDisagreement(0, 3, gathered, {0, 12, 16}, 4).find("rank 2 sends 5"), std::string::npos);
}

// ---- host tensors through the tensor forms ----------------------------------------

TEST(ExchangeTensors, HostTensorsGiveTheHostResults) {
  const int n = 3;
  runRanks(n, [&](int rank, shoal_comm_t comm) {
    // alltoall: 2 elements per peer.
    std::vector<int32_t> send, recv(2 * n, -1);
    for (int p = 0; p < n; ++p)
      for (size_t i = 0; i < 2; ++i) send.push_back(valueOf(rank, p, i));
    shoal_tensor_t in = hostTensor(send), out = hostTensor(recv);
    if (callOk(shoal_alltoall_tensor(comm, &in, &out), comm, "alltoall"))
      for (int p = 0; p < n; ++p) EXPECT_EQ(recv[2 * p + 1], valueOf(p, rank, 1));
    // alltoallv: (rank + p) % 3 elements to p, packed.
    std::vector<size_t> sendcounts(n), recvcounts(n);
    std::vector<int32_t> vsend, vrecv;
    for (int p = 0; p < n; ++p) {
      sendcounts[p] = (rank + p) % 3;
      recvcounts[p] = (p + rank) % 3;
      for (size_t i = 0; i < sendcounts[p]; ++i) vsend.push_back(valueOf(rank, p, i));
    }
    vrecv.assign(std::accumulate(recvcounts.begin(), recvcounts.end(), size_t(0)), -1);
    in = hostTensor(vsend);
    out = hostTensor(vrecv);
    if (callOk(shoal_alltoallv_tensor(comm, &in, sendcounts.data(), nullptr, &out, recvcounts.data(), nullptr), comm,
               "alltoallv")) {
      size_t at = 0;
      for (int p = 0; p < n; ++p)
        for (size_t i = 0; i < recvcounts[p]; ++i) EXPECT_EQ(vrecv[at++], valueOf(p, rank, i));
    }
    // reduce to root 1 (output NULL elsewhere).
    std::vector<int32_t> mine = {rank, 10 * rank}, reduced(2, -1);
    in = hostTensor(mine);
    out = hostTensor(reduced);
    if (callOk(shoal_reduce_tensor(comm, &in, rank == 1 ? &out : nullptr, SHOAL_SUM, 1), comm, "reduce") &&
        rank == 1) {
      EXPECT_EQ(reduced[0], n * (n - 1) / 2);
      EXPECT_EQ(reduced[1], 10 * n * (n - 1) / 2);
    }
    // gather to root 2.
    std::vector<int32_t> gathered(2 * n, -1);
    out = hostTensor(gathered);
    if (callOk(shoal_gather_tensor(comm, &in, rank == 2 ? &out : nullptr, 2), comm, "gather") && rank == 2)
      for (int r = 0; r < n; ++r) EXPECT_EQ(gathered[2 * r + 1], 10 * r);
    // gatherv to root 0: rank r sends r + 1 elements.
    std::vector<int32_t> part(rank + 1, rank), all(n * (n + 1) / 2, -1);
    std::vector<size_t> counts(n);
    for (int r = 0; r < n; ++r) counts[r] = r + 1;
    in = hostTensor(part);
    out = hostTensor(all);
    if (callOk(shoal_gatherv_tensor(comm, &in, &out, counts.data(), nullptr, 0), comm, "gatherv") && rank == 0)
      EXPECT_EQ(all, (std::vector<int32_t>{0, 1, 1, 2, 2, 2}));
    // scatter from root 0, scatterv from root 1.
    std::vector<int32_t> blocks(2 * n), block(2, -1);
    for (int r = 0; r < n; ++r) blocks[2 * r] = blocks[2 * r + 1] = 7 * r;
    in = hostTensor(blocks);
    out = hostTensor(block);
    if (callOk(shoal_scatter_tensor(comm, rank == 0 ? &in : nullptr, &out, 0), comm, "scatter"))
      EXPECT_EQ(block, (std::vector<int32_t>{7 * rank, 7 * rank}));
    std::vector<int32_t> piece(rank + 1, -1);
    std::vector<int32_t> source = {0, 1, 1, 2, 2, 2};
    in = hostTensor(source);
    out = hostTensor(piece);
    if (callOk(shoal_scatterv_tensor(comm, rank == 1 ? &in : nullptr, counts.data(), nullptr, &out, 1), comm,
               "scatterv"))
      EXPECT_EQ(piece, std::vector<int32_t>(rank + 1, rank));
    // A ring through the grouped tensor form.
    std::vector<int32_t> right = {valueOf(rank, 0, 0)}, left = {-1};
    shoal_p2p_tensor_t ops[2] = {{SHOAL_P2P_SEND, (rank + 1) % n, 5, hostTensor(right)},
                                 {SHOAL_P2P_RECV, (rank + n - 1) % n, 5, hostTensor(left)}};
    if (callOk(shoal_sendrecv_many_tensor(comm, ops, 2), comm, "sendrecv_many_tensor"))
      EXPECT_EQ(left[0], valueOf((rank + n - 1) % n, 0, 0));
  }, {nullptr, kTimeoutS});
}

// Refused alike on every rank (each rank's own check), so no rank waits.
TEST(ExchangeTensors, TensorChecks) {
  const int n = 2;
  runRanks(n, [&](int, shoal_comm_t comm) {
    std::vector<int32_t> five(5), four(4), six(6);
    shoal_tensor_t t5 = hostTensor(five), t4 = hostTensor(four), t6 = hostTensor(six);
    auto refused = [&](shoal_status_t status, const char* words, const char* what) {
      EXPECT_EQ(status, SHOAL_ERR_INVALID_ARGUMENT) << what << ": " << shoal_last_error(comm);
      EXPECT_NE(std::string(shoal_last_error(comm)).find(words), std::string::npos) << what << ": "
                                                                                     << shoal_last_error(comm);
    };
    refused(shoal_alltoall_tensor(comm, &t5, &t5), "not a multiple of the world size 2", "alltoall 5");
    refused(shoal_alltoall_tensor(comm, &t4, &t6), "output has 6 elements; it must hold 4", "alltoall out");
    std::vector<size_t> big = {3, 3};
    refused(shoal_alltoallv_tensor(comm, &t4, big.data(), nullptr, &t6, big.data(), nullptr),
            "sendcounts and sdispls reach element 6 but input has 4", "alltoallv room");
  }, {nullptr, 5});
}

// The rank that refuses a host call fails alone (as the raw-pointer calls);
// a per-peer disagreement between two ranks fails every rank.
TEST(ExchangeTensors, HostCountDisagreementIsAMismatchOnEveryRank) {
  const int n = 3;
  runRanks(n, [&](int rank, shoal_comm_t comm) {
    std::vector<int32_t> send(n, rank), recv(n + 1, -1);
    std::vector<size_t> sendcounts(n, 1), recvcounts(n, 1);
    if (rank == 2) recvcounts[0] = 2;  // rank 0 sends it one
    shoal_tensor_t in = hostTensor(send), out = hostTensor(recv);
    EXPECT_EQ(shoal_alltoallv_tensor(comm, &in, sendcounts.data(), nullptr, &out, recvcounts.data(), nullptr),
              SHOAL_ERR_MISMATCH)
        << "rank " << rank << ": " << shoal_last_error(comm);
  }, {nullptr, kTimeoutS});
}

// ---- CUDA tensors where this build or machine cannot run them -----------------------

TEST(ExchangeRouting, CudaTensorsWithoutCudaAreUnsupportedOnEveryRank) {
  if (cudaUsable()) GTEST_SKIP() << "this build and machine run CUDA calls (tests/cuda covers them)";
  const int n = 3;
  runRanks(n, [&](int rank, shoal_comm_t comm) {
    shoal_tensor_t in = cudaTensor(fakeDevicePointer(0), 6, SHOAL_F32);
    shoal_tensor_t out = cudaTensor(fakeDevicePointer(1), 6, SHOAL_F32);
    shoal_tensor_t big = cudaTensor(fakeDevicePointer(2), 6 * n, SHOAL_F32);
    std::vector<size_t> counts(n, 2), gathered(n, 6);
    struct Case {
      const char* name;
      std::function<shoal_status_t()> call;
    };
    const std::vector<Case> cases = {
        {"shoal_alltoall_tensor", [&] { return shoal_alltoall_tensor(comm, &in, &out); }},
        {"shoal_alltoallv_tensor",
         [&] { return shoal_alltoallv_tensor(comm, &in, counts.data(), nullptr, &out, counts.data(), nullptr); }},
        {"shoal_reduce_tensor", [&] { return shoal_reduce_tensor(comm, &in, &out, SHOAL_MAX, 0); }},
        {"shoal_gather_tensor", [&] { return shoal_gather_tensor(comm, &in, &big, 1); }},
        {"shoal_gatherv_tensor", [&] { return shoal_gatherv_tensor(comm, &in, &big, gathered.data(), nullptr, 2); }},
        {"shoal_scatter_tensor", [&] { return shoal_scatter_tensor(comm, &big, &in, 0); }},
        {"shoal_scatterv_tensor",
         [&] { return shoal_scatterv_tensor(comm, &big, gathered.data(), nullptr, &in, 1); }},
    };
    for (const Case& item : cases) {
      Clock::time_point start = Clock::now();
      expectRefused(item.call(), SHOAL_ERR_UNSUPPORTED, comm, start, {item.name, "CUDA", "host tensors"}, item.name);
    }
    expectUsable(comm, n);
    (void)rank;
  }, {nullptr, kTimeoutS});
}

// One rank's bad argument in a CUDA call reaches the others at once through
// the agreement round, whatever this build can run.
TEST(ExchangeRouting, BadArgumentOfACudaCallFailsEveryRankAtOnce) {
  const int n = 3;
  runRanks(n, [&](int rank, shoal_comm_t comm) {
    shoal_tensor_t in = cudaTensor(fakeDevicePointer(0), 6, SHOAL_F32);
    shoal_tensor_t out = cudaTensor(fakeDevicePointer(1), rank == 1 ? 7 : 6, SHOAL_F32);
    Clock::time_point start = Clock::now();
    shoal_status_t status = shoal_alltoall_tensor(comm, &in, &out);
    if (rank == 1)
      expectRefused(status, SHOAL_ERR_INVALID_ARGUMENT, comm, start, {"output has 7 elements"}, "bad rank");
    else if (cudaUsable())  // its own refusal (the fake pointer) or rank 1's
      expectRefused(status, SHOAL_ERR_INVALID_ARGUMENT, comm, start, {}, "peer of the bad rank");
    else
      expectRefused(status, SHOAL_ERR_UNSUPPORTED, comm, start, {"CUDA"}, "no CUDA here");
    expectUsable(comm, n);
  }, {nullptr, kTimeoutS});
}

// NCCL has no bitwise reduction: a CUDA reduce with one is refused on every
// rank, in every build (the argument checks come before readiness).
TEST(ExchangeRouting, BitwiseReduceOfCudaTensorsIsUnsupportedEverywhere) {
  const int n = 2;
  runRanks(n, [&](int, shoal_comm_t comm) {
    shoal_tensor_t in = cudaTensor(fakeDevicePointer(0), 4, SHOAL_I32);
    shoal_tensor_t out = cudaTensor(fakeDevicePointer(1), 4, SHOAL_I32);
    Clock::time_point start = Clock::now();
    expectRefused(shoal_reduce_tensor(comm, &in, &out, SHOAL_BXOR, 0), SHOAL_ERR_UNSUPPORTED, comm, start,
                  {"NCCL has no bxor reduction", "shoal_allreduce_tensor"}, "bxor");
    expectUsable(comm, n);
  }, {nullptr, kTimeoutS});
}

// Point-to-point has no agreement round: a refused CUDA exchange fails the
// communicator, so both sides report promptly, each with its reason.
TEST(ExchangeRouting, CudaPointToPointWithoutCudaFailsBothSidesAtOnce) {
  if (cudaUsable()) GTEST_SKIP() << "this build and machine run CUDA calls (tests/cuda covers them)";
  runRanks(2, [&](int rank, shoal_comm_t comm) {
    shoal_p2p_tensor_t op = {rank == 0 ? SHOAL_P2P_SEND : SHOAL_P2P_RECV, 1 - rank, 3,
                             cudaTensor(fakeDevicePointer(rank), 8, SHOAL_F32)};
    Clock::time_point start = Clock::now();
    expectRefused(shoal_sendrecv_many_tensor(comm, &op, 1), SHOAL_ERR_UNSUPPORTED, comm, start,
                  {"shoal_sendrecv_many_tensor", "CUDA"}, "CUDA send/recv");
    int value = 1;
    EXPECT_NE(shoal_allreduce(comm, &value, &value, 1, SHOAL_I32, SHOAL_SUM), SHOAL_OK)
        << "the communicator should be failed after a refused point-to-point call";
  }, {nullptr, kTimeoutS});
}

// Mixed memory kinds in one group are refused on the calling rank; its peer
// hears of it through the failed communicator.
TEST(ExchangeRouting, MixedMemoryInOneGroupIsRefused) {
  runRanks(2, [&](int rank, shoal_comm_t comm) {
    std::vector<int32_t> host(4, rank);
    shoal_p2p_tensor_t ops[2] = {{SHOAL_P2P_SEND, 1 - rank, 1, hostTensor(host)},
                                 {SHOAL_P2P_RECV, 1 - rank, 1, cudaTensor(fakeDevicePointer(rank), 4, SHOAL_I32)}};
    Clock::time_point start = Clock::now();
    expectRefused(shoal_sendrecv_many_tensor(comm, ops, 2), SHOAL_ERR_INVALID_ARGUMENT, comm, start,
                  {"different memory kinds"}, "mixed group");
  }, {nullptr, kTimeoutS});
}

}  // namespace
