// takeSequence (lib/comm/call.h), the one place a round takes its sequence
// number: the numbers are consecutive, every API call takes one (a refused
// call too), and a rank that took one more than its peers (an internal round
// it ran alone, or one they skipped) no longer pairs its next call with
// theirs: every rank fails within the deadline instead of combining unrelated
// data, on the transport (SHOAL_ALGO=ring: its tags carry the number) and on
// the shared segment (auto on one host: its slots carry the call's tag, since
// the segment counts its own rounds).
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <string>
#include <vector>

#include "comm/call.h"
#include "harness/harness.h"

namespace {

using shoal::test::RankOptions;
using shoal::test::runRanks;

constexpr double kTimeoutS = 3;

TEST(TakeSequence, EveryCallTakesOneNumberRefusedOrNot) {
  runRanks(2, [](int, shoal_comm_t comm) {
    const uint64_t first = shoal::takeSequence(*comm);
    EXPECT_EQ(shoal::takeSequence(*comm), first + 1);
    EXPECT_EQ(comm->sequence, first + 2);
    int32_t value = 1, sum = 0;
    ASSERT_EQ(shoal_allreduce(comm, &value, &sum, 1, SHOAL_I32, SHOAL_SUM), SHOAL_OK) << shoal_last_error(comm);
    EXPECT_EQ(comm->sequence, first + 3) << "a plain allreduce takes one number";
    EXPECT_EQ(shoal_allreduce(comm, nullptr, &sum, 1, SHOAL_I32, SHOAL_SUM), SHOAL_ERR_INVALID_ARGUMENT);
    EXPECT_EQ(comm->sequence, first + 4) << "a refused call takes its number too";
    // Both ranks took the same numbers: the next call pairs up.
    ASSERT_EQ(shoal_allreduce(comm, &value, &sum, 1, SHOAL_I32, SHOAL_SUM), SHOAL_OK) << shoal_last_error(comm);
    EXPECT_EQ(sum, 2);
  }, RankOptions{"ring", kTimeoutS});
}

class TakeSequencePaths : public ::testing::TestWithParam<const char*> {};

TEST_P(TakeSequencePaths, ANumberOneRankTookAloneFailsEveryRank) {
  std::vector<shoal_status_t> status(2, SHOAL_OK);
  std::vector<double> seconds(2, 0);
  std::vector<std::string> text(2);
  std::vector<int32_t> sums(2, -1);
  runRanks(2, [&](int rank, shoal_comm_t comm) {
    int32_t value = rank + 1;
    ASSERT_EQ(shoal_allreduce(comm, &value, &sums[rank], 1, SHOAL_I32, SHOAL_SUM), SHOAL_OK)
        << shoal_last_error(comm);
    ASSERT_EQ(sums[rank], 3);
    if (rank == 1) shoal::takeSequence(*comm);  // a round rank 0 did not run
    sums[rank] = -1;
    const auto start = std::chrono::steady_clock::now();
    status[rank] = shoal_allreduce(comm, &value, &sums[rank], 1, SHOAL_I32, SHOAL_SUM);
    seconds[rank] = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    text[rank] = shoal_last_error(comm);
  }, RankOptions{GetParam(), kTimeoutS});
  for (int rank = 0; rank < 2; ++rank) {
    EXPECT_TRUE(status[rank] == SHOAL_ERR_TIMEOUT || status[rank] == SHOAL_ERR_REMOTE ||
                status[rank] == SHOAL_ERR_MISMATCH)
        << "rank " << rank << ": " << shoal_status_string(status[rank]) << ": " << text[rank];
    EXPECT_LT(seconds[rank], kTimeoutS + 4) << "rank " << rank;
    EXPECT_NE(sums[rank], 3) << "rank " << rank << " paired calls of different numbers";
  }
  if (std::string(GetParam()) == "shm") {  // the segment tells at once, with text
    for (int rank = 0; rank < 2; ++rank) {
      EXPECT_LT(seconds[rank], 1.0) << "rank " << rank << ": " << text[rank];
      EXPECT_NE(text[rank].find("different calls"), std::string::npos) << "rank " << rank << ": " << text[rank];
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Paths, TakeSequencePaths, ::testing::Values("ring", "shm"),
                         [](const auto& info) { return std::string(info.param); });

// The same drift at the shared segment's layout edges (lib/transport/shm: a
// piece of up to 32 bytes shares its slot header's cache line, a longer one
// runs on into the next lines): a piece exactly filling the header's line,
// one a byte past it, and the same at the second line's end fail as a
// one-element call does, at once and with text.
TEST(TakeSequenceShm, ADriftIsMismatchAtOnceAtTheHeaderLinesEdges) {
  for (size_t bytes : {size_t(32), size_t(33), size_t(96), size_t(97)}) {
    std::vector<shoal_status_t> status(2, SHOAL_OK);
    std::vector<double> seconds(2, 0);
    std::vector<std::string> text(2);
    std::vector<uint8_t> last(2, 0);
    runRanks(2, [&](int rank, shoal_comm_t comm) {
      std::vector<uint8_t> value(bytes, static_cast<uint8_t>(rank + 1)), sum(bytes, 0);
      ASSERT_EQ(shoal_allreduce(comm, value.data(), sum.data(), bytes, SHOAL_U8, SHOAL_SUM), SHOAL_OK)
          << shoal_last_error(comm);
      ASSERT_EQ(sum[0], 3);
      ASSERT_EQ(sum[bytes - 1], 3);
      if (rank == 1) shoal::takeSequence(*comm);  // a round rank 0 did not run
      std::fill(sum.begin(), sum.end(), 0);
      const auto start = std::chrono::steady_clock::now();
      status[rank] = shoal_allreduce(comm, value.data(), sum.data(), bytes, SHOAL_U8, SHOAL_SUM);
      seconds[rank] = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      text[rank] = shoal_last_error(comm);
      last[rank] = sum[bytes - 1];
    }, RankOptions{"shm", kTimeoutS});
    for (int rank = 0; rank < 2; ++rank) {
      EXPECT_EQ(status[rank], SHOAL_ERR_MISMATCH)
          << bytes << " bytes, rank " << rank << ": " << shoal_status_string(status[rank]) << ": " << text[rank];
      EXPECT_LT(seconds[rank], 1.0) << bytes << " bytes, rank " << rank;
      EXPECT_NE(text[rank].find("different calls"), std::string::npos) << bytes << " bytes, rank " << rank << ": "
                                                                        << text[rank];
      EXPECT_NE(last[rank], 3) << bytes << " bytes, rank " << rank << " paired calls of different numbers";
    }
  }
}

}  // namespace
