// Shared by the tests of alltoall(v), reduce, gather(v), scatter(v) and
// send/recv: reproducible element bits per dtype, and running a call on n
// ranks to collect every rank's status, text and time.
#pragma once

#include <gtest/gtest.h>

#include <chrono>
#include <cstdint>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "harness/dtype_model.h"
#include "harness/harness.h"
#include "harness/rank_sync.h"

namespace shoal::test {

// Element bits that name (rank, peer, index): moved, never combined, so any
// bit pattern of the dtype's width will do (floats included).
inline uint64_t elementBits(const DType& t, int from, int to, size_t i) { return hash3(from, to, i) & t.mask(); }

inline void storeElement(std::vector<uint8_t>& buffer, const DType& t, size_t i, uint64_t bits) {
  std::memcpy(buffer.data() + i * t.bytes, &bits, t.bytes);  // little endian
}
inline uint64_t loadElement(const std::vector<uint8_t>& buffer, const DType& t, size_t i) {
  uint64_t bits = 0;
  std::memcpy(&bits, buffer.data() + i * t.bytes, t.bytes);
  return bits;
}

// An alltoall's blocks: rank `rank`'s send buffer holds, for each peer `to`,
// the block of `count` elements meant for it; after the call block `from` of
// recv must be what rank `from` meant for this rank.
inline void fillSend(std::vector<uint8_t>& send, const DType& t, int rank, int n, size_t count) {
  send.assign(count * n * t.bytes, 0);
  for (int to = 0; to < n; ++to)
    for (size_t i = 0; i < count; ++i) storeElement(send, t, to * count + i, elementBits(t, rank, to, i));
}

inline void checkReceived(const std::vector<uint8_t>& recv, const DType& t, int rank, int n, size_t count,
                   const std::string& what) {
  int wrong = 0;
  for (int from = 0; from < n && wrong < 5; ++from)
    for (size_t i = 0; i < count && wrong < 5; ++i) {
      uint64_t got = loadElement(recv, t, from * count + i), want = elementBits(t, from, rank, i);
      if (got != want) {
        ++wrong;
        ADD_FAILURE() << what << ": rank " << rank << ", block from " << from << ", element " << i << ": got 0x"
                      << std::hex << got << ", want 0x" << want;
      }
    }
}

struct RankOutcome {
  shoal_status_t status = SHOAL_OK;
  double seconds = 0;
  std::string text;
  shoal_status_t nextStatus = SHOAL_OK;  // of a barrier after the call
};

// Runs call(rank, comm) on n ranks with a short deadline, then a barrier.
inline std::vector<RankOutcome> runOutcomes(int n, double timeoutS,
                                            const std::function<shoal_status_t(int, shoal_comm_t)>& call) {
  std::vector<RankOutcome> outcomes(n);
  runRanks(n, [&](int rank, shoal_comm_t comm) {
    RankOutcome& out = outcomes[rank];
    auto start = std::chrono::steady_clock::now();
    out.status = call(rank, comm);
    out.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    out.text = shoal_last_error(comm);
    out.nextStatus = shoal_barrier(comm);
  }, {nullptr, timeoutS});
  return outcomes;
}

// Every rank failed with `status` within the deadline (plus slack) and with
// text, and the communicator refuses the next call.
inline void expectEveryRank(const std::vector<RankOutcome>& outcomes, shoal_status_t status, double timeoutS,
                            const std::string& what, const char* word = nullptr) {
  for (size_t rank = 0; rank < outcomes.size(); ++rank) {
    const RankOutcome& out = outcomes[rank];
    EXPECT_EQ(out.status, status) << what << ", rank " << rank << ": " << shoal_status_string(out.status) << ": "
                                  << out.text;
    EXPECT_LT(out.seconds, timeoutS + 4) << what << ", rank " << rank;
    EXPECT_FALSE(out.text.empty()) << what << ", rank " << rank;
    if (word) EXPECT_NE(out.text.find(word), std::string::npos) << what << ", rank " << rank << ": " << out.text;
    EXPECT_NE(out.nextStatus, SHOAL_OK) << what << ", rank " << rank << ": the next call succeeded";
  }
}

}  // namespace shoal::test
