// shoal_send, shoal_recv and shoal_sendrecv_many: bits arrive exactly for every
// dtype and size (eager and rendezvous), in order per (peer, tag), around and
// between collectives; a receive whose count or dtype differs fails on both
// sides; a missing peer is an error within the deadline; bad arguments are
// refused on the calling rank and fail its waiting peer at once.
#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <functional>
#include <thread>
#include <vector>

#include "exchange_test_util.h"

namespace {

using namespace shoal::test;

std::vector<uint8_t> pattern(const DType& t, int from, int to, size_t count) {
  std::vector<uint8_t> data(count * t.bytes);
  for (size_t i = 0; i < count; ++i) storeElement(data, t, i, elementBits(t, from, to, i));
  return data;
}

TEST(SendRecv, EveryDtypeAndSize) {
  runRanks(2, [&](int rank, shoal_comm_t comm) {
    for (const DType& t : kDtypes)
      for (size_t count : {size_t(0), size_t(1), size_t(1000), (size_t(1) << 18) + 3}) {
        const std::string what = std::string(t.name) + " x " + std::to_string(count);
        if (rank == 0) {
          std::vector<uint8_t> data = pattern(t, 0, 1, count);
          callOk(shoal_send(comm, data.data(), count, t.id, 1, 7), comm, what);
        } else {
          std::vector<uint8_t> data(count * t.bytes, 0xEE);
          if (callOk(shoal_recv(comm, data.data(), count, t.id, 0, 7), comm, what))
            EXPECT_EQ(data, pattern(t, 0, 1, count)) << what;
        }
      }
  });
}

// Pipeline stages: every rank passes to its right and hears from its left in
// one grouped call (each rank sends first: separate blocking calls would wait
// for each other), with several messages and tags per direction.
TEST(SendRecv, GroupedRingAnyRankCount) {
  for (int n = 2; n <= 5; ++n)
    runRanks(n, [&](int rank, shoal_comm_t comm) {
      const DType& t = dtypeOf(SHOAL_F64);
      const int right = (rank + 1) % n, left = (rank + n - 1) % n;
      std::vector<std::vector<uint8_t>> out, in;
      std::vector<shoal_p2p_t> ops;
      for (int k = 0; k < 3; ++k) {
        out.push_back(pattern(t, rank, right * 10 + k, 50 + k));
        in.emplace_back((50 + k) * t.bytes, 0xEE);
      }
      for (int k = 0; k < 3; ++k) {
        ops.push_back({SHOAL_P2P_RECV, left, k, in[k].data(), size_t(50 + k), t.id});
        ops.push_back({SHOAL_P2P_SEND, right, k, out[k].data(), size_t(50 + k), t.id});
      }
      if (!callOk(shoal_sendrecv_many(comm, ops.data(), static_cast<int>(ops.size())), comm, "ring")) return;
      for (int k = 0; k < 3; ++k)
        EXPECT_EQ(in[k], pattern(t, left, rank * 10 + k, 50 + k)) << n << " ranks, rank " << rank << ", tag " << k;
    });
}

TEST(SendRecv, OrderPerPeerAndTagAndMixedWithCollectives) {
  runRanks(3, [&](int rank, shoal_comm_t comm) {
    const DType& t = dtypeOf(SHOAL_I32);
    // Four messages with one tag from rank 0 to rank 2, received in one group: they keep their order.
    std::vector<std::vector<uint8_t>> buffers;
    std::vector<shoal_p2p_t> ops;
    for (int k = 0; k < 4; ++k) {
      buffers.push_back(rank == 0 ? pattern(t, 0, 100 + k, 16) : std::vector<uint8_t>(16 * t.bytes));
      if (rank != 1) ops.push_back({rank == 0 ? SHOAL_P2P_SEND : SHOAL_P2P_RECV, rank == 0 ? 2 : 0, 3,
                                    buffers[k].data(), 16, t.id});
    }
    ASSERT_TRUE(callOk(shoal_sendrecv_many(comm, ops.data(), static_cast<int>(ops.size())), comm, "ordered"));
    if (rank == 2)
      for (int k = 0; k < 4; ++k) EXPECT_EQ(buffers[k], pattern(t, 0, 100 + k, 16)) << "message " << k;
    // Collectives between point-to-point calls, on all ranks, keep working;
    // rank 1 made no point-to-point call and still pairs up.
    int32_t value = rank + 1, sum = 0;
    ASSERT_TRUE(callOk(shoal_allreduce(comm, &value, &sum, 1, SHOAL_I32, SHOAL_SUM), comm, "allreduce"));
    EXPECT_EQ(sum, 6);
    if (rank == 1) ASSERT_TRUE(callOk(shoal_send(comm, &sum, 1, SHOAL_I32, 0, SHOAL_TAG_MAX), comm, "tag max"));
    if (rank == 0) {
      int32_t got = 0;
      ASSERT_TRUE(callOk(shoal_recv(comm, &got, 1, SHOAL_I32, 1, SHOAL_TAG_MAX), comm, "tag max"));
      EXPECT_EQ(got, 6);
    }
    ASSERT_TRUE(callOk(shoal_barrier(comm), comm, "barrier"));
  });
}

// Collective sequence numbers wrap (2^11 in the tag) with point-to-point calls
// in between whose user tags equal the collectives' number bits: both kinds
// keep pairing up and carrying their own values.
TEST(SendRecv, CollectiveSequenceWrapsAroundPendingTags) {
  runRanks(2, [&](int rank, shoal_comm_t comm) {
    for (int i = 0; i < 2100; ++i) {
      int32_t value = i + rank, sum = 0;
      ASSERT_TRUE(callOk(shoal_allreduce(comm, &value, &sum, 1, SHOAL_I32, SHOAL_SUM), comm, "allreduce"));
      ASSERT_EQ(sum, 2 * i + 1) << "call " << i;
      if (i % 700 == 0) {
        int32_t out = 1000 + i, in = -1;
        shoal_p2p_t ops[2] = {{SHOAL_P2P_SEND, 1 - rank, i % 2048, &out, 1, SHOAL_I32},
                              {SHOAL_P2P_RECV, 1 - rank, i % 2048, &in, 1, SHOAL_I32}};
        ASSERT_TRUE(callOk(shoal_sendrecv_many(comm, ops, 2), comm, "sendrecv"));
        ASSERT_EQ(in, 1000 + i);
      }
    }
  });
}

// ---- errors -----------------------------------------------------------------

constexpr double kTimeoutS = 3;

void expectBothMismatch(size_t sendCount, shoal_dtype_t sendType, size_t recvCount, shoal_dtype_t recvType,
                        const std::string& what) {
  auto outcomes = runOutcomes(2, kTimeoutS, [&](int rank, shoal_comm_t comm) {
    std::vector<uint8_t> data(64);
    return rank == 0 ? shoal_send(comm, data.data(), sendCount, sendType, 1, 4)
                     : shoal_recv(comm, data.data(), recvCount, recvType, 0, 4);
  });
  expectEveryRank(outcomes, SHOAL_ERR_MISMATCH, kTimeoutS, what, "same count and dtype");
}

TEST(SendRecvErrors, CountDiffersFailsBothSides) {
  expectBothMismatch(5, SHOAL_F32, 4, SHOAL_F32, "send 5 f32, receive 4");
  expectBothMismatch(3, SHOAL_F32, 4, SHOAL_F32, "send 3 f32, receive 4");
  expectBothMismatch(0, SHOAL_F32, 1, SHOAL_F32, "send 0 f32, receive 1");
}

TEST(SendRecvErrors, DtypeDiffersWithEqualBytesFailsBothSides) {
  expectBothMismatch(4, SHOAL_F32, 4, SHOAL_I32, "send 4 f32, receive 4 i32");
  expectBothMismatch(4, SHOAL_U8, 2, SHOAL_F16, "send 4 u8, receive 2 f16");
}

TEST(SendRecvErrors, AbsentPeerAndSendSendAreErrorsWithinTheDeadline) {
  auto outcomes = runOutcomes(2, kTimeoutS, [&](int rank, shoal_comm_t comm) {
    float value = 1;
    if (rank == 1) {  // never receives; waits past rank 0's deadline before its closing barrier
      std::this_thread::sleep_for(std::chrono::duration<double>(kTimeoutS + 1.5));
      return SHOAL_OK;
    }
    return shoal_send(comm, &value, 1, SHOAL_F32, 1, 0);
  });
  EXPECT_EQ(outcomes[0].status, SHOAL_ERR_TIMEOUT) << outcomes[0].text;
  EXPECT_LT(outcomes[0].seconds, kTimeoutS + 4);
  EXPECT_NE(outcomes[0].text.find("rank 1"), std::string::npos) << outcomes[0].text;
  // Both send first: each waits for the other's receive until the deadline.
  outcomes = runOutcomes(2, kTimeoutS, [&](int rank, shoal_comm_t comm) {
    float value = 1;
    return shoal_send(comm, &value, 1, SHOAL_F32, 1 - rank, 0);
  });
  for (int rank = 0; rank < 2; ++rank) {
    EXPECT_TRUE(outcomes[rank].status == SHOAL_ERR_TIMEOUT || outcomes[rank].status == SHOAL_ERR_REMOTE)
        << rank << ": " << outcomes[rank].text;
    EXPECT_LT(outcomes[rank].seconds, kTimeoutS + 4);
  }
}

// Point-to-point has no agreement round, so a refused call fails the
// communicator: rank 0 makes each bad call and reports it; rank 1, receiving
// from rank 0, fails at once (well before the deadline) with rank 0's reason;
// both ranks' next calls fail (docs/collectives.md).
TEST(SendRecvErrors, InvalidArgumentsFailThePeerAtOnce) {
  using Bad = std::function<shoal_status_t(shoal_comm_t, float*)>;
  const std::vector<std::pair<const char*, Bad>> cases = {
      {"peer 2 is not a rank", [](shoal_comm_t comm, float* v) { return shoal_send(comm, v, 1, SHOAL_F32, 2, 0); }},
      {"peer -1", [](shoal_comm_t comm, float* v) { return shoal_send(comm, v, 1, SHOAL_F32, -1, 0); }},
      {"is this rank", [](shoal_comm_t comm, float* v) { return shoal_recv(comm, v, 1, SHOAL_F32, 0, 0); }},
      {"tag -1", [](shoal_comm_t comm, float* v) { return shoal_send(comm, v, 1, SHOAL_F32, 1, -1); }},
      {"out of range",
       [](shoal_comm_t comm, float* v) { return shoal_send(comm, v, 1, SHOAL_F32, 1, SHOAL_TAG_MAX + 1); }},
      {"buf is NULL", [](shoal_comm_t comm, float*) { return shoal_recv(comm, nullptr, 2, SHOAL_F32, 1, 0); }},
      {"dtype 42",
       [](shoal_comm_t comm, float* v) { return shoal_send(comm, v, 2, static_cast<shoal_dtype_t>(42), 1, 0); }},
      {"ops is NULL", [](shoal_comm_t comm, float*) { return shoal_sendrecv_many(comm, nullptr, 2); }},
      {"n is -1", [](shoal_comm_t comm, float*) { return shoal_sendrecv_many(comm, nullptr, -1); }},
      {"ops[0]: kind 7",
       [](shoal_comm_t comm, float* v) {
         shoal_p2p_t bad{static_cast<shoal_p2p_kind_t>(7), 1, 0, v, 1, SHOAL_F32};
         return shoal_sendrecv_many(comm, &bad, 1);
       }},
  };
  for (const auto& [words, bad] : cases) {
    auto outcomes = runOutcomes(2, kTimeoutS, [&, bad = bad](int rank, shoal_comm_t comm) {
      float value[2] = {};
      return rank == 0 ? bad(comm, value) : shoal_recv(comm, value, 1, SHOAL_F32, 0, 0);
    });
    EXPECT_EQ(outcomes[0].status, SHOAL_ERR_INVALID_ARGUMENT) << words << ": " << outcomes[0].text;
    EXPECT_NE(outcomes[0].text.find(words), std::string::npos) << words << ": " << outcomes[0].text;
    EXPECT_EQ(outcomes[1].status, SHOAL_ERR_REMOTE) << words << ": " << outcomes[1].text;
    EXPECT_NE(outcomes[1].text.find("rank 0 refused its point-to-point call"), std::string::npos)
        << words << ": " << outcomes[1].text;
    EXPECT_NE(outcomes[1].text.find(words), std::string::npos) << words << ": " << outcomes[1].text;
    EXPECT_LT(outcomes[1].seconds, kTimeoutS / 2) << words << ": the peer waited";
    for (int rank = 0; rank < 2; ++rank)
      EXPECT_EQ(outcomes[rank].nextStatus, SHOAL_ERR_REMOTE) << words << ", rank " << rank << "'s next call";
  }
}

// An empty group is no refusal: the communicator still works.
TEST(SendRecvErrors, EmptyGroupIsFine) {
  runRanks(2, [&](int, shoal_comm_t comm) {
    EXPECT_EQ(shoal_sendrecv_many(comm, nullptr, 0), SHOAL_OK) << shoal_last_error(comm);
    EXPECT_EQ(shoal_barrier(comm), SHOAL_OK) << shoal_last_error(comm);
  });
}

}  // namespace
