// Bruck's alltoall (collectives/alltoall/bruck.cc, SHOAL_ALGO=bruck): every
// block lands bit for bit where it belongs for 1..7 ranks (powers of two and
// not), block sizes 0, 1, odd and larger, dtypes of 1, 2, 4 and 8 bytes, in
// place and not, the tensor form too. The bytes each rank sends prove which
// algorithm ran: Bruck sends block j once per set bit of j, pairwise each
// block once. A count that differs on one rank is MISMATCH on every rank;
// alltoallv stays pairwise; allreduce still works under SHOAL_ALGO=bruck.
#include <gtest/gtest.h>

#include <chrono>
#include <string>
#include <vector>

#include "collectives/exchange.h"
#include "comm/communicator.h"
#include "exchange_test_util.h"

namespace {

using namespace shoal::test;

constexpr shoal::test::RankOptions kBruck{"bruck", 60};

// Blocks a rank sends in one call: Bruck's rounds move block j (1..n-1) once
// per set bit of j; pairwise sends each of the n-1 blocks once.
size_t bruckBlocksSent(int n) {
  size_t blocks = 0;
  for (int j = 1; j < n; ++j) blocks += static_cast<size_t>(__builtin_popcount(static_cast<unsigned>(j)));
  return blocks;
}

TEST(AlltoallBruck, TableAndChoice) {
  EXPECT_STREQ(shoal::selectAlltoall("bruck", true, 1 << 20).name, "bruck");
  EXPECT_TRUE(shoal::selectAlltoall("bruck", true, 8).run == &shoal::alltoallBruck);
  EXPECT_STREQ(shoal::selectAlltoall("bruck", false, 8).name, "pairwise");  // alltoallv: blocks of many sizes
  // auto: Bruck for small send buffers (up to 16 KiB per rank), pairwise above and for alltoallv.
  EXPECT_STREQ(shoal::selectAlltoall("auto", true, 0).name, "bruck");
  EXPECT_STREQ(shoal::selectAlltoall("auto", true, 16 * 1024).name, "bruck");
  EXPECT_STREQ(shoal::selectAlltoall("auto", true, 16 * 1024 + 1).name, "pairwise");
  EXPECT_STREQ(shoal::selectAlltoall("auto", false, 8).name, "pairwise");
  for (const char* other : {"", "ring", "hierarchical", "shm"})
    EXPECT_STREQ(shoal::selectAlltoall(other, true, 8).name, "pairwise") << other;
  ASSERT_EQ(shoal::alltoallAlgorithms().size(), 2u);
  for (const shoal::AlltoallAlgorithm& algorithm : shoal::alltoallAlgorithms())
    EXPECT_GT(std::string(algorithm.description).size(), 20u) << algorithm.name;
}

TEST(AlltoallBruck, EveryRankCountAndBlockSize) {
  for (int n = 1; n <= 7; ++n)
    runRanks(
        n,
        [&](int rank, shoal_comm_t comm) {
          for (shoal_dtype_t id : {SHOAL_U8, SHOAL_F16, SHOAL_F32, SHOAL_F64}) {
            const DType& t = dtypeOf(id);
            for (size_t count : {size_t(0), size_t(1), size_t(2), size_t(3), size_t(7), size_t(100), size_t(1000)}) {
              const std::string what = std::string(t.name) + " x " + std::to_string(count) + ", " +
                                       std::to_string(n) + " ranks";
              std::vector<uint8_t> send, recv(count * n * t.bytes, 0xEE);
              fillSend(send, t, rank, n, count);
              const std::vector<uint8_t> original = send;
              const uint64_t before = comm->transport->bytesSent();
              if (!callOk(shoal_alltoall(comm, send.data(), recv.data(), count, t.id), comm, what)) return;
              EXPECT_EQ(comm->transport->bytesSent() - before, bruckBlocksSent(n) * count * t.bytes)
                  << what << ": not the bytes of Bruck's rounds";
              checkReceived(recv, t, rank, n, count, what);
              EXPECT_EQ(send, original) << what << ": sendbuf changed";
              if (!callOk(shoal_alltoall(comm, send.data(), send.data(), count, t.id), comm, what + " in place"))
                return;
              checkReceived(send, t, rank, n, count, what + " in place");
            }
          }
        },
        kBruck);
}

TEST(AlltoallBruck, TensorForm) {
  const int n = 5;
  const size_t count = 9;
  runRanks(
      n,
      [&](int rank, shoal_comm_t comm) {
        const DType& t = dtypeOf(SHOAL_I32);
        std::vector<uint8_t> send, recv(count * n * t.bytes, 0xEE);
        fillSend(send, t, rank, n, count);
        shoal_tensor_t in = shoal_tensor_1d(send.data(), count * n, SHOAL_I32);
        shoal_tensor_t out = shoal_tensor_1d(recv.data(), count * n, SHOAL_I32);
        const uint64_t before = comm->transport->bytesSent();
        if (!callOk(shoal_alltoall_tensor(comm, &in, &out), comm, "tensor form")) return;
        EXPECT_EQ(comm->transport->bytesSent() - before, bruckBlocksSent(n) * count * t.bytes);
        checkReceived(recv, t, rank, n, count, "tensor form");
      },
      kBruck);
}

// Under SHOAL_ALGO=bruck alltoallv stays pairwise (each block sent once) and
// allreduce chooses as under auto.
TEST(AlltoallBruck, AlltoallvAndAllreduceUnaffected) {
  const int n = 4;
  runRanks(
      n,
      [&](int rank, shoal_comm_t comm) {
        std::vector<size_t> counts(n, 3);
        std::vector<double> send(3 * n), recv(3 * n, -1);
        for (size_t i = 0; i < send.size(); ++i) send[i] = 100 * rank + static_cast<double>(i);
        const uint64_t before = comm->transport->bytesSent();
        if (!callOk(shoal_alltoallv(comm, send.data(), counts.data(), nullptr, recv.data(), counts.data(), nullptr,
                                    SHOAL_F64),
                    comm, "alltoallv"))
          return;
        // Pairwise sends each of the n-1 blocks once (plus the closing barrier's
        // few bytes); Bruck would send bruckBlocksSent(n) = 4 blocks.
        const uint64_t sent = comm->transport->bytesSent() - before;
        EXPECT_GE(sent, (n - 1) * 3 * sizeof(double));
        EXPECT_LT(sent, bruckBlocksSent(n) * 3 * sizeof(double));
        for (int from = 0; from < n; ++from)
          for (size_t i = 0; i < 3; ++i) EXPECT_EQ(recv[from * 3 + i], 100 * from + static_cast<double>(rank * 3 + i));
        std::vector<int64_t> values(1000, rank + 1);
        if (!callOk(shoal_allreduce(comm, values.data(), values.data(), values.size(), SHOAL_I64, SHOAL_SUM), comm,
                    "allreduce"))
          return;
        EXPECT_EQ(values[999], n * (n + 1) / 2);
      },
      kBruck);
}

// The last rank passes another count: MISMATCH on every rank (its
// receivers see its signature; they abort the communicator, which tells the
// others), promptly, and the communicator refuses the next call.
TEST(AlltoallBruck, CountsDifferIsMismatchOnEveryRank) {
  constexpr double kTimeoutS = 3;
  for (int n : {2, 3, 5, 7}) {
    std::vector<RankOutcome> outcomes(n);
    runRanks(
        n,
        [&](int rank, shoal_comm_t comm) {
          std::vector<float> send(8 * n, 1.0f), recv(8 * n);
          RankOutcome& out = outcomes[rank];
          auto start = std::chrono::steady_clock::now();
          out.status = shoal_alltoall(comm, send.data(), recv.data(), rank == n - 1 ? 7 : 8, SHOAL_F32);
          out.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
          out.text = shoal_last_error(comm);
          out.nextStatus = shoal_barrier(comm);
        },
        {"bruck", kTimeoutS});
    expectEveryRank(outcomes, SHOAL_ERR_MISMATCH, kTimeoutS,
                    "bruck alltoall, last rank count 7, " + std::to_string(n) + " ranks");
  }
}

}  // namespace
