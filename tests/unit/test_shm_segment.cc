// The shared segment's reduce-scatter form of an allreduce piece
// (collectives/allreduce/shm.cc, N >= 3, pieces of kScatterMinBytes and more):
// each rank reduces its share of the piece from every slot in rank order,
// publishes it in a second round, and copies the others' shares.
//  - the bits: floats whose sum depends on the order come out as the
//    rank-order fold ((x0 + x1) + x2) + ..., identical on every rank;
//  - the second round: a rank that gives up, declares another call, or goes
//    silent between the two rounds fails every rank (abort word, MISMATCH,
//    deadline), never a hang, never a result.
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "bootstrap/store.h"
#include "collectives/collectives.h"
#include "harness/harness.h"
#include "transport/shm/segment.h"

namespace {

using Clock = std::chrono::steady_clock;

// Rank r's element i: magnitudes 2^-20 .. 2^20 and both signs, so that the
// sum's rounding depends on the order in which ranks are combined.
template <typename T>
T orderSensitive(int rank, size_t i) {
  const int exponent = static_cast<int>((rank * 5 + i * 3) % 41) - 20;
  const T mantissa = T(1) + T((i * 7 + rank * 13) % 97) / T(97);
  return ((rank + i) % 3 == 0 ? T(-1) : T(1)) * std::ldexp(mantissa, exponent);
}

template <typename T>
std::vector<T> rankOrderFold(int size, size_t count, bool reverse) {
  std::vector<T> folded(count);
  for (size_t i = 0; i < count; ++i) {
    T sum = orderSensitive<T>(reverse ? size - 1 : 0, i);
    for (int step = 1; step < size; ++step) sum += orderSensitive<T>(reverse ? size - 1 - step : step, i);
    folded[i] = sum;
  }
  return folded;
}

template <typename T>
void expectRankOrderBitsOnEveryRank(int size, size_t count, shoal_dtype_t dtype) {
  ASSERT_TRUE(shoal::allreduceShmScatters(count * sizeof(T), size))
      << count << " elements at " << size << " ranks do not take the reduce-scatter form: this test would not test it";
  const std::vector<T> expected = rankOrderFold<T>(size, count, false);
  // The data must tell orders apart, else the test could not fail.
  const std::vector<T> reversed = rankOrderFold<T>(size, count, true);
  size_t orderMatters = 0;
  for (size_t i = 0; i < count; ++i) orderMatters += std::memcmp(&expected[i], &reversed[i], sizeof(T)) != 0;
  ASSERT_GT(orderMatters, count / 100) << "the inputs' sum hardly depends on the order";

  std::vector<std::vector<T>> results(size);
  shoal::test::runRanks(size, [&](int rank, shoal_comm_t comm) {
    std::vector<T> send(count), recv(count, T(0));
    for (size_t i = 0; i < count; ++i) send[i] = orderSensitive<T>(rank, i);
    std::vector<T> inPlace = send;
    ASSERT_EQ(shoal_allreduce(comm, send.data(), recv.data(), count, dtype, SHOAL_SUM), SHOAL_OK)
        << shoal_last_error(comm);
    ASSERT_EQ(shoal_allreduce(comm, inPlace.data(), inPlace.data(), count, dtype, SHOAL_SUM), SHOAL_OK)
        << shoal_last_error(comm);
    EXPECT_EQ(std::memcmp(recv.data(), inPlace.data(), count * sizeof(T)), 0)
        << "rank " << rank << ": in place differs";
    results[rank] = std::move(recv);
  }, {"shm", 60});
  for (int rank = 0; rank < size; ++rank) {
    ASSERT_EQ(results[rank].size(), count) << "rank " << rank;
    size_t wrong = 0, first = count;
    for (size_t i = 0; i < count; ++i)
      if (std::memcmp(&results[rank][i], &expected[i], sizeof(T)) != 0 && wrong++ == 0) first = i;
    EXPECT_EQ(wrong, 0u) << size << " ranks, " << count << " elements: rank " << rank << " has " << wrong
                         << " elements that are not the rank-order fold's bits, the first at " << first;
  }
}

TEST(ShmReduceScatter, RankOrderBitsOnEveryRankF32) {
  // One piece, a piece whose shares do not split evenly into cache lines,
  // more than the 256 KiB slot (two pieces), and a full two-round piece
  // followed by a short last piece (16,380 B) that takes the one-round form.
  for (int size : {3, 4, 5})
    for (size_t count : {size_t(16384), size_t(20011), size_t(100003), size_t(65536 + 4095)})
      expectRankOrderBitsOnEveryRank<float>(size, count, SHOAL_F32);
}

TEST(ShmReduceScatter, RankOrderBitsOnEveryRankF64) {
  for (int size : {3, 4}) expectRankOrderBitsOnEveryRank<double>(size, 5003, SHOAL_F64);
}

// Below: the segment itself, three threads, without a communicator, so that
// rank 2 can stop between the two rounds of one piece.

// No messages: the segment's waits only ask a transport whether it was aborted.
class SilentTransport final : public shoal::Transport {
 public:
  SilentTransport(int rank, int size) : rank_(rank), size_(size) {}
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  const char* name() const override { return "silent"; }
  Request isend(int, uint64_t, const void*, size_t) override { shoal::fail(SHOAL_ERR_INTERNAL, "no messages here"); }
  Request irecv(int, uint64_t, void*, size_t) override { shoal::fail(SHOAL_ERR_INTERNAL, "no messages here"); }
  void waitAll(Request*, size_t, shoal::Deadline) override { shoal::fail(SHOAL_ERR_INTERNAL, "no messages here"); }
  void waitAny(Request*, size_t, shoal::Deadline) override { shoal::fail(SHOAL_ERR_INTERNAL, "no messages here"); }
  void checkNotAborted() override {}
  void abort(const std::string&, shoal_status_t) override {}
  bool failed() const override { return false; }
  uint64_t bytesSent() const override { return 0; }
  std::string failure() const override { return ""; }

 private:
  int rank_, size_;
};

enum class Rank2 { Aborts, DeclaresAnotherCount, IsSilent };

struct Outcome {
  shoal_status_t status = SHOAL_OK;
  std::string text;
  double seconds = 0;
};

constexpr int kRanks = 3;
constexpr size_t kCount = 16384;  // f32: 64 KiB, one piece of the reduce-scatter form
constexpr double kDeadlineS = 2;

// A good call on every rank, then one where ranks 0 and 1 run the allreduce and
// rank 2 publishes the first round only, then does `what`.
std::vector<Outcome> secondRoundFails(Rank2 what) {
  const std::string store = shoal::test::freshMemoryStore();
  std::vector<Outcome> outcomes(kRanks);
  std::vector<std::thread> threads;
  for (int rank = 0; rank < kRanks; ++rank) {
    threads.emplace_back([&, rank] {
      Outcome& outcome = outcomes[rank];
      auto begin = Clock::now();
      try {
        auto storeOfRank = shoal::makeStore({store, rank, kRanks});
        std::string whyNot;
        auto segment = shoal::SharedSegment::open(*storeOfRank, "test/", rank, kRanks, 256 << 10, 30, &whyNot);
        if (!segment) shoal::fail(SHOAL_ERR_INTERNAL, "no segment: {}", whyNot);
        SilentTransport transport(rank, kRanks);
        shoal::Scratch scratch;
        const shoal::Reducer sum(SHOAL_F32, SHOAL_SUM);
        std::vector<float> send(kCount, float(rank + 1)), recv(kCount, 0);
        for (uint64_t sequence : {1, 2}) {
          shoal::Context context(transport, rank, kRanks, sequence, shoal::CallDeadline(kDeadlineS), 1 << 20, scratch,
                                 0x1234);
          context.shm = segment.get();
          begin = Clock::now();
          if (sequence == 1 || rank != 2) {
            shoal::allreduceShmOutOfPlace(context, send.data(), recv.data(), kCount, sum);
            if (recv[0] != 6 || recv[kCount - 1] != 6) shoal::fail(SHOAL_ERR_INTERNAL, "wrong sum {}", recv[0]);
            continue;
          }
          // Rank 2: the first round as the algorithm declares it, then not the second.
          segment->exchange({context.tagBase, kCount, 0, "allreduce"}, send.data(), kCount * sizeof(float), transport,
                            context.deadline);
          if (what == Rank2::Aborts) {
            segment->abort("rank 2 gives up between the rounds", SHOAL_ERR_REMOTE);
            shoal::fail(SHOAL_ERR_REMOTE, "gave up");
          }
          if (what == Rank2::DeclaresAnotherCount)
            segment->exchangeWritten({context.tagBase, kCount + 1, 0, "allreduce (reduced shares)"},
                                     kCount * sizeof(float), 0, transport, context.deadline);
          outcome.text = "rank 2 stayed silent";
        }
      } catch (const shoal::Error& error) {
        outcome.status = error.status();
        outcome.text = error.what();
      }
      outcome.seconds = std::chrono::duration<double>(Clock::now() - begin).count();
    });
  }
  for (std::thread& thread : threads) thread.join();
  return outcomes;
}

std::string describe(const std::vector<Outcome>& outcomes) {
  std::string text;
  for (size_t r = 0; r < outcomes.size(); ++r)
    text += "rank " + std::to_string(r) + ": " + shoal_status_string(outcomes[r].status) + " after " +
            std::to_string(outcomes[r].seconds) + " s: " + outcomes[r].text + "\n";
  return text;
}

TEST(ShmReduceScatter, AnAbortBetweenTheRoundsFailsEveryRank) {
  auto outcomes = secondRoundFails(Rank2::Aborts);
  for (int rank = 0; rank < 2; ++rank) {
    EXPECT_EQ(outcomes[rank].status, SHOAL_ERR_REMOTE) << describe(outcomes);
    EXPECT_NE(outcomes[rank].text.find("rank 2 gives up between the rounds"), std::string::npos) << describe(outcomes);
    EXPECT_LT(outcomes[rank].seconds, kDeadlineS) << "waited for the deadline\n" << describe(outcomes);
  }
  EXPECT_EQ(outcomes[2].status, SHOAL_ERR_REMOTE) << describe(outcomes);
}

TEST(ShmReduceScatter, AMismatchInTheSecondRoundFailsEveryRank) {
  auto outcomes = secondRoundFails(Rank2::DeclaresAnotherCount);
  for (int rank = 0; rank < kRanks; ++rank) {
    EXPECT_EQ(outcomes[rank].status, SHOAL_ERR_MISMATCH) << describe(outcomes);
    EXPECT_TRUE(outcomes[rank].text.find("disagree") != std::string::npos ||
                outcomes[rank].text.find("reports") != std::string::npos)
        << describe(outcomes);
    EXPECT_LT(outcomes[rank].seconds, kDeadlineS) << "waited for the deadline\n" << describe(outcomes);
  }
}

TEST(ShmReduceScatter, ASilentRankInTheSecondRoundIsATimeoutNotAHang) {
  auto outcomes = secondRoundFails(Rank2::IsSilent);
  for (int rank = 0; rank < 2; ++rank) {
    // The first to time out aborts; the other may read that word first.
    EXPECT_TRUE(outcomes[rank].status == SHOAL_ERR_TIMEOUT || outcomes[rank].status == SHOAL_ERR_REMOTE)
        << describe(outcomes);
    EXPECT_NE(outcomes[rank].text.find("rank 2"), std::string::npos) << describe(outcomes);
    EXPECT_LT(outcomes[rank].seconds, kDeadlineS + 3) << describe(outcomes);
  }
}

}  // namespace
