// The ring's index math (collectives/common/ring.h), checked by bookkeeping
// alone: every rank count 1..9, every step, every rank. Each rank holds, per
// block, the multiset of ranks whose contribution it carries; the steps move
// and merge those sets as the host and device rings move and combine data.
#include <gtest/gtest.h>

#include <map>
#include <vector>

#include "collectives/common/ring.h"

namespace {

using shoal::ring::allgatherStep;
using shoal::ring::blockOf;
using shoal::ring::reduceScatterStep;

// contributions[r][b][c]: how often rank c's contribution is in rank r's copy of block b.
using Contributions = std::vector<std::vector<std::map<int, int>>>;

Contributions start(int n) {
  Contributions held(n, std::vector<std::map<int, int>>(n));
  for (int r = 0; r < n; ++r)
    for (int b = 0; b < n; ++b) held[r][b][r] = 1;
  return held;
}

TEST(RingMath, NeighboursAndWrap) {
  for (int n = 1; n <= 9; ++n)
    for (int r = 0; r < n; ++r) {
      EXPECT_EQ(shoal::ring::rightOf(shoal::ring::leftOf(r, n), n), r);
      EXPECT_EQ(shoal::ring::leftOf(r, n), (r + n - 1) % n);
      EXPECT_EQ(shoal::ring::wrap(r - 3 * n, n), r);
    }
}

// What rank r receives in step s is what its left neighbour sends in step s.
TEST(RingMath, EveryReceiveMatchesTheLeftNeighboursSend) {
  for (int n = 1; n <= 9; ++n)
    for (int step = 0; step + 1 < n; ++step)
      for (int r = 0; r < n; ++r) {
        int left = shoal::ring::leftOf(r, n);
        EXPECT_EQ(reduceScatterStep(r, n, step).receiveBlock, reduceScatterStep(left, n, step).sendBlock)
            << "n " << n << " step " << step << " rank " << r;
        EXPECT_EQ(allgatherStep(r, n, step).receiveBlock, allgatherStep(left, n, step).sendBlock)
            << "n " << n << " step " << step << " rank " << r;
      }
}

// After reduce-scatter, block b of rank b holds every rank's contribution
// exactly once (a block combined twice or skipped shows as a count != 1); and
// the block a rank sends in step s+1 is the one it combined in step s,
// which is what lets the host ring forward segments as they are added.
TEST(RingMath, ReduceScatterReducesEveryBlockOnceFromEveryRank) {
  for (int n = 1; n <= 9; ++n) {
    Contributions held = start(n);
    for (int step = 0; step + 1 < n; ++step) {
      Contributions sent(n, std::vector<std::map<int, int>>(n));
      for (int r = 0; r < n; ++r) {
        int block = reduceScatterStep(r, n, step).sendBlock;
        sent[r][block] = held[r][block];
        if (step > 0) EXPECT_EQ(block, reduceScatterStep(r, n, step - 1).receiveBlock) << "n " << n << " rank " << r;
      }
      for (int r = 0; r < n; ++r) {
        int block = reduceScatterStep(r, n, step).receiveBlock;
        for (const auto& [from, times] : sent[shoal::ring::leftOf(r, n)][block]) held[r][block][from] += times;
      }
    }
    for (int b = 0; b < n; ++b) {
      ASSERT_EQ(held[b][b].size(), static_cast<size_t>(n)) << "n " << n << ": block " << b << " misses a rank";
      for (const auto& [from, times] : held[b][b])
        EXPECT_EQ(times, 1) << "n " << n << ": block " << b << " has rank " << from << "'s contribution " << times
                            << " times";
    }
  }
}

// Allgather from "rank b owns block b": every rank ends with every block, each
// received once, and nobody overwrites its own block.
TEST(RingMath, AllgatherCoversEveryBlockOnEveryRank) {
  for (int n = 1; n <= 9; ++n) {
    // owner[r][b]: whose block b rank r holds (-1: none yet).
    std::vector<std::vector<int>> owner(n, std::vector<int>(n, -1));
    std::vector<std::vector<int>> received(n, std::vector<int>(n, 0));
    for (int r = 0; r < n; ++r) owner[r][r] = r;
    for (int step = 0; step + 1 < n; ++step) {
      std::vector<int> sent(n);
      for (int r = 0; r < n; ++r) {
        int block = allgatherStep(r, n, step).sendBlock;
        EXPECT_EQ(owner[r][block], block) << "n " << n << " step " << step << ": rank " << r
                                          << " sends block " << block << " before holding it";
        sent[r] = owner[r][block];
      }
      for (int r = 0; r < n; ++r) {
        int block = allgatherStep(r, n, step).receiveBlock;
        EXPECT_NE(block, r) << "n " << n << ": rank " << r << " receives over its own block";
        owner[r][block] = sent[shoal::ring::leftOf(r, n)];
        ++received[r][block];
      }
    }
    for (int r = 0; r < n; ++r)
      for (int b = 0; b < n; ++b) {
        EXPECT_EQ(owner[r][b], b) << "n " << n << ": rank " << r << " lacks block " << b;
        EXPECT_EQ(received[r][b], b == r ? 0 : 1) << "n " << n << ": rank " << r << ", block " << b;
      }
  }
}

// The blocks tile the buffer in order and differ by at most one element.
TEST(RingMath, BlocksTileTheBuffer) {
  for (int n = 1; n <= 9; ++n)
    for (size_t count : {size_t(0), size_t(1), size_t(2), size_t(8), size_t(9), size_t(10), size_t(1001)}) {
      size_t next = 0;
      for (int b = 0; b < n; ++b) {
        shoal::ring::Block block = blockOf(count, n, b);
        EXPECT_EQ(block.offset, next) << "n " << n << " count " << count << " block " << b;
        EXPECT_TRUE(block.count == count / n || block.count == count / n + 1) << "n " << n << " count " << count;
        next += block.count;
      }
      EXPECT_EQ(next, count) << "n " << n << " count " << count;
    }
}

}  // namespace
