// shoal_alltoall and shoal_alltoallv: every block lands bit for bit where it
// belongs, for every dtype, 1..5 ranks, zero counts, in place, and per-peer
// counts that differ; a recvcounts/sendcounts disagreement is MISMATCH on
// every rank; bad arguments are refused before any communication.
#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <thread>
#include <vector>

#include "exchange_test_util.h"

namespace {

using namespace shoal::test;

TEST(Alltoall, EveryDtypeRankCountAndCount) {
  for (int n = 1; n <= 5; ++n)
    runRanks(n, [&](int rank, shoal_comm_t comm) {
      for (const DType& t : kDtypes)
        for (size_t count : {size_t(0), size_t(1), size_t(7), size_t(1000)}) {
          const std::string what = std::string(t.name) + " x " + std::to_string(count) + ", " + std::to_string(n) +
                                   " ranks";
          std::vector<uint8_t> send, recv(count * n * t.bytes, 0xEE);
          fillSend(send, t, rank, n, count);
          const std::vector<uint8_t> original = send;
          if (!callOk(shoal_alltoall(comm, send.data(), recv.data(), count, t.id), comm, what)) return;
          checkReceived(recv, t, rank, n, count, what);
          EXPECT_EQ(send, original) << what << ": sendbuf changed";
          // In place: the same buffer holds the send blocks, then the received ones.
          if (!callOk(shoal_alltoall(comm, send.data(), send.data(), count, t.id), comm, what + " in place")) return;
          checkReceived(send, t, rank, n, count, what + " in place");
        }
    });
}

TEST(Alltoall, LargeBlocks) {
  const size_t count = (size_t(1) << 18) + 5;  // 1 MiB + 20 bytes of f32 per peer: the rendezvous path
  runRanks(4, [&](int rank, shoal_comm_t comm) {
    const DType& t = dtypeOf(SHOAL_F32);
    std::vector<uint8_t> send, recv(count * 4 * t.bytes);
    fillSend(send, t, rank, 4, count);
    if (callOk(shoal_alltoall(comm, send.data(), recv.data(), count, t.id), comm, "large"))
      checkReceived(recv, t, rank, 4, count, "large");
  });
}

// Rank r sends (r + 2p) % 4 elements to peer p: every pair has its own size,
// zero included; displacements leave gaps and reverse the block order.
size_t pairCount(int from, int to) { return static_cast<size_t>((from + 2 * to) % 4); }

TEST(Alltoallv, PerPeerCountsAndDisplacements) {
  for (int n = 1; n <= 5; ++n)
    runRanks(n, [&](int rank, shoal_comm_t comm) {
      for (const DType& t : kDtypes)
        for (bool packed : {true, false}) {
          std::vector<size_t> sendcounts(n), sdispls(n), recvcounts(n), rdispls(n);
          size_t sendEnd = 0, recvEnd = 0;
          for (int p = n - 1; p >= 0; --p) {  // reversed order, one element of gap each
            sendcounts[p] = pairCount(rank, p);
            recvcounts[p] = pairCount(p, rank);
            sdispls[p] = sendEnd + (packed ? 0 : 1);
            rdispls[p] = recvEnd + (packed ? 0 : 1);
            sendEnd = sdispls[p] + sendcounts[p];
            recvEnd = rdispls[p] + recvcounts[p];
          }
          std::vector<uint8_t> send((sendEnd + 1) * t.bytes), recv((recvEnd + 1) * t.bytes, 0xEE);
          for (int p = 0; p < n; ++p)
            for (size_t i = 0; i < sendcounts[p]; ++i) storeElement(send, t, sdispls[p] + i, elementBits(t, rank, p, i));
          const std::string what = std::string(t.name) + (packed ? " packed" : " with gaps") + ", " +
                                   std::to_string(n) + " ranks";
          if (!callOk(shoal_alltoallv(comm, send.data(), sendcounts.data(), sdispls.data(), recv.data(),
                                      recvcounts.data(), rdispls.data(), t.id),
                      comm, what))
            return;
          for (int p = 0; p < n; ++p)
            for (size_t i = 0; i < recvcounts[p]; ++i)
              EXPECT_EQ(loadElement(recv, t, rdispls[p] + i), elementBits(t, p, rank, i))
                  << what << ": rank " << rank << ", from " << p << ", element " << i;
          if (!packed) {  // the gaps stay untouched
            for (int p = 0; p < n; ++p)
              EXPECT_EQ(recv[(rdispls[p] - 1) * t.bytes], 0xEE) << what << ": gap before block " << p << " written";
          }
        }
    });
}

TEST(Alltoallv, NullDisplacementsPackAndInPlace) {
  runRanks(3, [&](int rank, shoal_comm_t comm) {
    const DType& t = dtypeOf(SHOAL_I64);
    std::vector<size_t> counts(3, 0);
    for (int p = 0; p < 3; ++p) counts[p] = pairCount(rank, p) == pairCount(p, rank) ? pairCount(rank, p) : 2;
    // Symmetric counts (counts[p] is what p sends back): in place is well defined.
    size_t total = 0;
    for (size_t c : counts) total += c;
    std::vector<uint8_t> buffer(total * t.bytes);
    size_t at = 0;
    for (int p = 0; p < 3; ++p)
      for (size_t i = 0; i < counts[p]; ++i) storeElement(buffer, t, at++, elementBits(t, rank, p, i));
    if (!callOk(shoal_alltoallv(comm, buffer.data(), counts.data(), nullptr, buffer.data(), counts.data(), nullptr,
                                t.id),
                comm, "in place"))
      return;
    at = 0;
    for (int p = 0; p < 3; ++p)
      for (size_t i = 0; i < counts[p]; ++i)
        EXPECT_EQ(loadElement(buffer, t, at++), elementBits(t, p, rank, i)) << "rank " << rank << " from " << p;
  });
}

// ---- disagreements and errors -------------------------------------------------

constexpr double kTimeoutS = 3;

TEST(AlltoallErrors, CountsDifferIsMismatchOnEveryRank) {
  for (int n : {2, 3, 5}) {
    auto outcomes = runOutcomes(n, kTimeoutS, [&](int rank, shoal_comm_t comm) {
      std::vector<float> send(8 * n, 1.0f), recv(8 * n);
      return shoal_alltoall(comm, send.data(), recv.data(), rank == n - 1 ? 7 : 8, SHOAL_F32);
    });
    expectEveryRank(outcomes, SHOAL_ERR_MISMATCH, kTimeoutS, "alltoall, last rank count 7, " + std::to_string(n) +
                                                                 " ranks");
  }
}

TEST(AlltoallErrors, DtypesDifferIsMismatchOnEveryRank) {
  auto outcomes = runOutcomes(3, kTimeoutS, [&](int rank, shoal_comm_t comm) {
    std::vector<int32_t> send(12, 1), recv(12);
    return shoal_alltoall(comm, send.data(), recv.data(), 4, rank == 1 ? SHOAL_U32 : SHOAL_I32);
  });
  expectEveryRank(outcomes, SHOAL_ERR_MISMATCH, kTimeoutS, "alltoall i32 vs u32", "dtype");
}

// One pair disagrees (rank 0 sends 3 elements to rank 1, which expects 2);
// every other pair agrees. Both ends of the pair and the ranks not involved fail.
TEST(AlltoallErrors, AlltoallvOnePairDisagreesIsMismatchOnEveryRank) {
  for (int n : {2, 4}) {
    for (bool more : {true, false}) {
      auto outcomes = runOutcomes(n, kTimeoutS, [&](int rank, shoal_comm_t comm) {
        std::vector<size_t> sendcounts(n, 2), recvcounts(n, 2);
        if (rank == 0) sendcounts[1] = more ? 3 : 1;
        std::vector<double> send(3 * n, 1.0), recv(3 * n);
        return shoal_alltoallv(comm, send.data(), sendcounts.data(), nullptr, recv.data(), recvcounts.data(),
                               nullptr, SHOAL_F64);
      });
      expectEveryRank(outcomes, SHOAL_ERR_MISMATCH, kTimeoutS,
                      std::string("alltoallv rank 0 sends ") + (more ? "3" : "1") + " to rank 1 expecting 2, " +
                          std::to_string(n) + " ranks");
    }
  }
}

// A rank that does not come (it calls only after everyone's deadline): the
// others fail within the deadline naming it, and the late one fails at once.
TEST(AlltoallErrors, AbsentPeerIsAnErrorWithinTheDeadline) {
  auto outcomes = runOutcomes(3, kTimeoutS, [&](int rank, shoal_comm_t comm) {
    if (rank == 1) std::this_thread::sleep_for(std::chrono::duration<double>(kTimeoutS + 1.5));
    std::vector<float> send(6, 1.0f), recv(6);
    return shoal_alltoall(comm, send.data(), recv.data(), 2, SHOAL_F32);
  });
  for (int rank : {0, 2}) {
    EXPECT_TRUE(outcomes[rank].status == SHOAL_ERR_TIMEOUT || outcomes[rank].status == SHOAL_ERR_REMOTE)
        << "rank " << rank << ": " << shoal_status_string(outcomes[rank].status) << ": " << outcomes[rank].text;
    EXPECT_LT(outcomes[rank].seconds, kTimeoutS + 4) << "rank " << rank << ": " << outcomes[rank].text;
  }
  // The first to time out names the absent rank; the other may hear its abort notice first.
  const RankOutcome& first = outcomes[0].status == SHOAL_ERR_TIMEOUT ? outcomes[0] : outcomes[2];
  EXPECT_EQ(first.status, SHOAL_ERR_TIMEOUT) << first.text;
  EXPECT_NE(first.text.find("rank 1"), std::string::npos) << first.text;
  EXPECT_NE(outcomes[1].status, SHOAL_OK);
  EXPECT_LT(outcomes[1].seconds, kTimeoutS + 1.5 + 1.0) << outcomes[1].text;  // its sleep, then at once
}

TEST(AlltoallErrors, InvalidArgumentsRefusedAndNumberTaken) {
  runRanks(2, [&](int, shoal_comm_t comm) {
    float send[4] = {1, 2, 3, 4}, recv[4] = {};
    size_t counts[2] = {2, 2};
    auto refused = [&](shoal_status_t status, const char* word, const char* what) {
      EXPECT_EQ(status, SHOAL_ERR_INVALID_ARGUMENT) << what;
      EXPECT_NE(std::string(shoal_last_error(comm)).find(word), std::string::npos) << what << ": "
                                                                                   << shoal_last_error(comm);
    };
    refused(shoal_alltoall(comm, nullptr, recv, 2, SHOAL_F32), "sendbuf is NULL", "NULL sendbuf");
    refused(shoal_alltoall(comm, send, nullptr, 2, SHOAL_F32), "recvbuf is NULL", "NULL recvbuf");
    refused(shoal_alltoall(comm, send, recv, 2, static_cast<shoal_dtype_t>(99)), "dtype 99", "bad dtype");
    refused(shoal_alltoall(comm, send, send + 1, 2, SHOAL_F32), "overlap", "partial overlap");
    refused(shoal_alltoall(comm, send, recv, SIZE_MAX / 2, SHOAL_F32), "overflows", "huge count");
    refused(shoal_alltoallv(comm, send, nullptr, nullptr, recv, counts, nullptr, SHOAL_F32), "sendcounts is NULL",
            "NULL sendcounts");
    refused(shoal_alltoallv(comm, send, counts, nullptr, recv, nullptr, nullptr, SHOAL_F32), "recvcounts is NULL",
            "NULL recvcounts");
    // Refused calls took their numbers alike on both ranks: the next call pairs up.
    EXPECT_EQ(shoal_alltoall(comm, send, recv, 2, SHOAL_F32), SHOAL_OK) << shoal_last_error(comm);
  });
  // A rank's block to itself with two sizes is refused locally.
  runRanks(1, [&](int, shoal_comm_t comm) {
    float send[2] = {1, 2}, recv[2] = {};
    size_t one = 1, two = 2;
    EXPECT_EQ(shoal_alltoallv(comm, send, &one, nullptr, recv, &two, nullptr, SHOAL_F32), SHOAL_ERR_INVALID_ARGUMENT);
    EXPECT_NE(std::string(shoal_last_error(comm)).find("sendcounts[0] = 1 differs"), std::string::npos)
        << shoal_last_error(comm);
  });
}

}  // namespace
