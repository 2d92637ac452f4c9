// shoal_reduce, shoal_gather(v) and shoal_scatter(v): exact values for every
// dtype (reduce: every op valid on it), every root of 1..5 ranks, zero counts,
// in place on root; disagreements (root, count, per-rank counts) are MISMATCH
// on every rank; bad arguments are refused before any communication.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "exchange_test_util.h"

namespace {

using namespace shoal::test;

// Small integers: every partial sum, product, min and max is exact in every
// dtype, so the expected value does not depend on the reduction order.
int64_t inputValue(const DType& t, shoal_op_t op, int rank, size_t i) {
  const uint64_t h = hash3(rank, i, op);
  if (op == SHOAL_PROD) return t.isSigned ? int64_t(h % 3) - 1 : int64_t(h % 2) + 1;  // -1..1 or 1..2
  if (!t.isSigned) return int64_t(h % 5);
  return int64_t(h % 9) - 4;
}

uint64_t encode(const DType& t, long double v) {
  if (t.isFloat) return encodeFloat(t, v);
  return static_cast<uint64_t>(static_cast<int64_t>(v)) & t.mask();
}

// The reduction of n ranks' inputs, computed here in long double.
uint64_t expected(const DType& t, shoal_op_t op, int n, size_t i) {
  long double acc = inputValue(t, op, 0, i);
  for (int r = 1; r < n; ++r) {
    long double v = inputValue(t, op, r, i);
    int64_t a = static_cast<int64_t>(acc), b = static_cast<int64_t>(v);
    switch (op) {
      case SHOAL_SUM: case SHOAL_AVG: acc += v; break;
      case SHOAL_PROD: acc *= v; break;
      case SHOAL_MIN: acc = std::min(acc, v); break;
      case SHOAL_MAX: acc = std::max(acc, v); break;
      case SHOAL_BAND: acc = static_cast<long double>(static_cast<int64_t>((a & b))); break;
      case SHOAL_BOR: acc = static_cast<long double>(a | b); break;
      case SHOAL_BXOR: acc = static_cast<long double>(a ^ b); break;
      default: break;
    }
  }
  if (op == SHOAL_AVG) {
    if (t.isFloat) return encodeFloat(t, roundToFormat(t, acc / n));
    return encode(t, static_cast<long double>(static_cast<int64_t>(acc) / n));  // truncates toward zero
  }
  return encode(t, acc);
}

bool validPair(const DType& t, shoal_op_t op) {
  return !(t.isFloat && (op == SHOAL_BAND || op == SHOAL_BOR || op == SHOAL_BXOR));
}

TEST(Reduce, EveryDtypeOpRootAndRankCount) {
  const shoal_op_t ops[] = {SHOAL_SUM, SHOAL_AVG, SHOAL_PROD, SHOAL_MIN, SHOAL_MAX, SHOAL_BAND, SHOAL_BOR, SHOAL_BXOR};
  for (int n = 1; n <= 5; ++n)
    runRanks(n, [&](int rank, shoal_comm_t comm) {
      for (const DType& t : kDtypes)
        for (shoal_op_t op : ops) {
          if (!validPair(t, op)) continue;
          for (size_t count : {size_t(0), size_t(1), size_t(33)})
            for (int root = 0; root < n; ++root) {
              const std::string what = std::string(t.name) + " op " + std::to_string(op) + " x " +
                                       std::to_string(count) + ", root " + std::to_string(root) + " of " +
                                       std::to_string(n);
              std::vector<uint8_t> send(count * t.bytes), recv(count * t.bytes, 0xEE);
              for (size_t i = 0; i < count; ++i) storeElement(send, t, i, encode(t, inputValue(t, op, rank, i)));
              const std::vector<uint8_t> original = send, untouched = recv;
              // In place on root every other call.
              const bool inPlace = rank == root && count % 2 == 1 && root % 2 == 0;
              void* out = inPlace ? send.data() : recv.data();
              if (!callOk(shoal_reduce(comm, send.data(), out, count, t.id, op, root), comm, what)) return;
              const std::vector<uint8_t>& result = inPlace ? send : recv;
              if (rank == root) {
                for (size_t i = 0; i < count; ++i)
                  EXPECT_EQ(loadElement(result, t, i), expected(t, op, n, i)) << what << ", element " << i;
              } else {
                EXPECT_EQ(recv, untouched) << what << ": recvbuf written on a non-root rank";
              }
              if (!inPlace) EXPECT_EQ(send, original) << what << ": sendbuf changed";
            }
        }
    });
}

TEST(Reduce, LargeCountAndNullRecvOffRoot) {
  const size_t count = (size_t(1) << 20) + 3;
  runRanks(3, [&](int rank, shoal_comm_t comm) {
    std::vector<int32_t> send(count), recv(rank == 1 ? count : 0);
    for (size_t i = 0; i < count; ++i) send[i] = static_cast<int32_t>(i % 1000) * (rank + 1);
    if (!callOk(shoal_reduce(comm, send.data(), rank == 1 ? recv.data() : nullptr, count, SHOAL_I32, SHOAL_SUM, 1),
                comm, "large"))
      return;
    if (rank == 1)
      for (size_t i = 0; i < count; i += 4099) ASSERT_EQ(recv[i], static_cast<int32_t>(i % 1000) * 6) << i;
  });
}

// ---- gather, scatter -----------------------------------------------------------

TEST(Gather, EveryDtypeRootAndRankCount) {
  for (int n = 1; n <= 5; ++n)
    runRanks(n, [&](int rank, shoal_comm_t comm) {
      for (const DType& t : kDtypes)
        for (size_t count : {size_t(0), size_t(1), size_t(9)})
          for (int root = 0; root < n; ++root) {
            const std::string what = std::string(t.name) + " x " + std::to_string(count) + ", root " +
                                     std::to_string(root) + " of " + std::to_string(n);
            std::vector<uint8_t> send(count * t.bytes), recv(count * n * t.bytes, 0xEE);
            for (size_t i = 0; i < count; ++i) storeElement(send, t, i, elementBits(t, rank, root, i));
            // Root gathers in place when count is odd: its block already sits in recvbuf.
            const bool inPlace = rank == root && count % 2 == 1;
            if (inPlace) std::memcpy(recv.data() + root * count * t.bytes, send.data(), send.size());
            const void* in = inPlace ? recv.data() + root * count * t.bytes : send.data();
            if (!callOk(shoal_gather(comm, in, rank == root ? recv.data() : nullptr, count, t.id, root), comm, what))
              return;
            if (rank != root) continue;
            for (int from = 0; from < n; ++from)
              for (size_t i = 0; i < count; ++i)
                EXPECT_EQ(loadElement(recv, t, from * count + i), elementBits(t, from, root, i))
                    << what << ", from " << from << ", element " << i;
          }
    });
}

TEST(Scatter, EveryDtypeRootAndRankCount) {
  for (int n = 1; n <= 5; ++n)
    runRanks(n, [&](int rank, shoal_comm_t comm) {
      for (const DType& t : kDtypes)
        for (size_t count : {size_t(0), size_t(1), size_t(9)})
          for (int root = 0; root < n; ++root) {
            const std::string what = std::string(t.name) + " x " + std::to_string(count) + ", root " +
                                     std::to_string(root) + " of " + std::to_string(n);
            std::vector<uint8_t> send(rank == root ? count * n * t.bytes : 0), recv(count * t.bytes, 0xEE);
            if (rank == root)
              for (int to = 0; to < n; ++to)
                for (size_t i = 0; i < count; ++i) storeElement(send, t, to * count + i, elementBits(t, root, to, i));
            const bool inPlace = rank == root && count % 2 == 1;
            void* out = inPlace ? send.data() + root * count * t.bytes : recv.data();
            if (!callOk(shoal_scatter(comm, rank == root ? send.data() : nullptr, out, count, t.id, root), comm, what))
              return;
            const uint8_t* got = static_cast<const uint8_t*>(out);
            for (size_t i = 0; i < count; ++i) {
              uint64_t bits = 0;
              std::memcpy(&bits, got + i * t.bytes, t.bytes);
              EXPECT_EQ(bits, elementBits(t, root, rank, i)) << what << ", rank " << rank << ", element " << i;
            }
          }
    });
}

// Rank r contributes r + 1 elements (rank 2: none), placed in reverse order with gaps.
TEST(GathervScatterv, PerRankCountsAndDisplacements) {
  for (int n = 1; n <= 5; ++n)
    runRanks(n, [&](int rank, shoal_comm_t comm) {
      const DType& t = dtypeOf(SHOAL_U64);
      auto countOf = [](int r) { return r == 2 ? size_t(0) : size_t(r + 1); };
      std::vector<size_t> counts(n), displs(n);
      size_t end = 0;
      for (int r = n - 1; r >= 0; --r) {
        counts[r] = countOf(r);
        displs[r] = end + 1;
        end = displs[r] + counts[r];
      }
      for (int root = 0; root < n; ++root) {
        const std::string what = "root " + std::to_string(root) + " of " + std::to_string(n);
        std::vector<uint8_t> mine(countOf(rank) * t.bytes), all(end * t.bytes, 0xEE);
        for (size_t i = 0; i < countOf(rank); ++i) storeElement(mine, t, i, elementBits(t, rank, root, i));
        if (!callOk(shoal_gatherv(comm, mine.data(), countOf(rank), all.data(), counts.data(), displs.data(), t.id,
                                  root),
                    comm, "gatherv " + what))
          return;
        if (rank == root)
          for (int r = 0; r < n; ++r)
            for (size_t i = 0; i < counts[r]; ++i)
              EXPECT_EQ(loadElement(all, t, displs[r] + i), elementBits(t, r, root, i)) << "gatherv " << what;
        // Back again: root scatters the gathered blocks.
        std::vector<uint8_t> back(countOf(rank) * t.bytes, 0xEE);
        if (!callOk(shoal_scatterv(comm, all.data(), counts.data(), displs.data(), back.data(), countOf(rank), t.id,
                                   root),
                    comm, "scatterv " + what))
          return;
        if (rank == root) EXPECT_EQ(back, mine) << "scatterv " << what;
      }
    });
}

// ---- disagreements and errors -------------------------------------------------

constexpr double kTimeoutS = 3;

TEST(RootedErrors, RootDiffersIsMismatchOnEveryRank) {
  auto outcomes = runOutcomes(3, kTimeoutS, [&](int rank, shoal_comm_t comm) {
    std::vector<float> send(4, 1.0f), recv(12);
    return shoal_gather(comm, send.data(), recv.data(), 4, SHOAL_F32, rank == 1 ? 1 : 0);
  });
  expectEveryRank(outcomes, SHOAL_ERR_MISMATCH, kTimeoutS, "gather, rank 1 names root 1", "root");
  outcomes = runOutcomes(3, kTimeoutS, [&](int rank, shoal_comm_t comm) {
    std::vector<float> send(4, 1.0f), recv(4);
    return shoal_reduce(comm, send.data(), recv.data(), 4, SHOAL_F32, SHOAL_SUM, rank == 2 ? 2 : 0);
  });
  expectEveryRank(outcomes, SHOAL_ERR_MISMATCH, kTimeoutS, "reduce, rank 2 names root 2", "root");
}

TEST(RootedErrors, CountDiffersIsMismatchOnEveryRank) {
  auto outcomes = runOutcomes(4, kTimeoutS, [&](int rank, shoal_comm_t comm) {
    std::vector<int32_t> send(40, 1), recv(40);
    return shoal_reduce(comm, send.data(), recv.data(), rank == 3 ? 9 : 10, SHOAL_I32, SHOAL_SUM, 0);
  });
  expectEveryRank(outcomes, SHOAL_ERR_MISMATCH, kTimeoutS, "reduce, a leaf's count 9");
  outcomes = runOutcomes(3, kTimeoutS, [&](int rank, shoal_comm_t comm) {
    std::vector<int32_t> send(30, 1), recv(30);
    return shoal_scatter(comm, send.data(), recv.data(), rank == 2 ? 9 : 10, SHOAL_I32, 0);
  });
  expectEveryRank(outcomes, SHOAL_ERR_MISMATCH, kTimeoutS, "scatter, rank 2 count 9");
}

// Root expects 2 elements from rank 1, which sends 3 (or 1): the root sees the
// size, and rank 1 and the others fail with it (the closing round).
TEST(RootedErrors, VCountsDisagreeIsMismatchOnEveryRank) {
  for (int more : {1, -1}) {
    auto outcomes = runOutcomes(3, kTimeoutS, [&](int rank, shoal_comm_t comm) {
      std::vector<size_t> counts(3, 2);
      std::vector<double> send(3, 1.0), recv(9);
      return shoal_gatherv(comm, send.data(), rank == 1 ? 2 + more : 2, recv.data(), counts.data(), nullptr,
                           SHOAL_F64, 0);
    });
    expectEveryRank(outcomes, SHOAL_ERR_MISMATCH, kTimeoutS, "gatherv, rank 1 sends " + std::to_string(2 + more));
    outcomes = runOutcomes(3, kTimeoutS, [&](int rank, shoal_comm_t comm) {
      std::vector<size_t> counts(3, 2);
      std::vector<double> send(9, 1.0), recv(3);
      return shoal_scatterv(comm, send.data(), counts.data(), nullptr, recv.data(), rank == 1 ? 2 + more : 2,
                            SHOAL_F64, 0);
    });
    expectEveryRank(outcomes, SHOAL_ERR_MISMATCH, kTimeoutS, "scatterv, rank 1 expects " + std::to_string(2 + more));
  }
}

TEST(RootedErrors, InvalidArgumentsRefusedAndNumberTaken) {
  runRanks(2, [&](int rank, shoal_comm_t comm) {
    float send[4] = {1, 2, 3, 4}, recv[8] = {};
    auto refused = [&](shoal_status_t status, const char* word, const char* what) {
      EXPECT_EQ(status, SHOAL_ERR_INVALID_ARGUMENT) << what;
      EXPECT_NE(std::string(shoal_last_error(comm)).find(word), std::string::npos) << what << ": "
                                                                                   << shoal_last_error(comm);
    };
    refused(shoal_reduce(comm, send, recv, 4, SHOAL_F32, SHOAL_SUM, 2), "root 2 is not a rank", "reduce root 2");
    refused(shoal_reduce(comm, send, recv, 4, SHOAL_F32, SHOAL_SUM, -1), "root -1", "reduce root -1");
    refused(shoal_reduce(comm, send, recv, 4, SHOAL_F32, SHOAL_BXOR, 0), "bitwise", "bxor on f32");
    refused(shoal_reduce(comm, nullptr, recv, 4, SHOAL_F32, SHOAL_SUM, 0), "sendbuf is NULL", "reduce NULL send");
    refused(shoal_gather(comm, send, recv, 4, SHOAL_F32, 5), "root 5", "gather root 5");
    refused(shoal_gather(comm, nullptr, recv, 4, SHOAL_F32, 0), "NULL", "gather NULL send");
    refused(shoal_scatter(comm, send, nullptr, 2, SHOAL_F32, 0), "recvbuf is NULL", "scatter NULL recv");
    refused(shoal_gatherv(comm, send, 1, recv, nullptr, nullptr, SHOAL_F32, rank), rank == 0 ? "recvcounts" : "NULL",
            "gatherv NULL recvcounts on root");
    refused(shoal_scatterv(comm, send, nullptr, nullptr, recv, 1, SHOAL_F32, rank), rank == 0 ? "sendcounts" : "NULL",
            "scatterv NULL sendcounts on root");
    refused(shoal_scatter(comm, nullptr, recv, 2, SHOAL_F32, rank), "sendbuf (on root) is NULL",
            "scatter NULL send on root");
    refused(shoal_reduce(comm, send, nullptr, 4, SHOAL_F32, SHOAL_SUM, rank), "recvbuf (on root) is NULL",
            "reduce NULL recv on root");
    // Every refusal took its number alike on both ranks: the next call pairs up.
    EXPECT_EQ(shoal_reduce(comm, send, recv, 4, SHOAL_F32, SHOAL_SUM, 1), SHOAL_OK) << shoal_last_error(comm);
    if (rank == 1) EXPECT_EQ(recv[3], 8.0f);
  });
}

}  // namespace
