// SHOAL_ALGO=aggregate against real shoal-aggd processes on loopback: exact
// sums, ORs and averages over 2 and 4 ranks, sharding over two aggregators,
// several communicators at once, compressor rounds through the aggregator,
// and the failures: a wrong token, a dead or unreachable aggregator, a rank
// that never sends its slot (the aggregator frees it), ranks that disagree on
// a call (MISMATCH on every rank).
#include <gtest/gtest.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "harness/forked_job.h"
#include "harness/harness.h"
#include "shoal/shoal.h"

namespace {

// The fallback notices are info lines (read once per process, before any use).
const bool kInfoLogging = setenv("SHOAL_LOG_LEVEL", "info", 1) == 0;

using shoal::test::RankOptions;
using shoal::test::runRanks;
using Seconds = std::chrono::duration<double>;

// One shoal-aggd process on 127.0.0.1 at a port of its choosing, which it
// prints on its first line of stdout.
class Daemon {
 public:
  explicit Daemon(std::vector<std::string> args = {}, const char* token = "aggregate-test-token")
      : job_("aggd", separateStderr()) {
    std::vector<std::string> argv = {"--listen", "127.0.0.1:0"};
    argv.insert(argv.end(), args.begin(), args.end());
    const shoal::test::Program aggd{std::string(SHOAL_BIN_DIR) + "/shoal-aggd", argv, {}, {{"SHOAL_TOKEN", token}}};
    job_.start(1, [&](int) { return shoal::test::execProgram(aggd); });
    std::string line;
    for (auto start = std::chrono::steady_clock::now();
         std::chrono::steady_clock::now() - start < std::chrono::seconds(10);) {
      line = job_.outputSoFar(0);
      if (line.find('\n') != std::string::npos) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    line = line.substr(0, line.find('\n'));
    const size_t colon = line.rfind(':');
    port_ = colon == std::string::npos ? 0 : std::atoi(line.c_str() + colon + 1);
    EXPECT_GT(port_, 0) << "shoal-aggd printed no listening line within 10 s: '" << line << "'\n"
                        << shoal::test::readWholeFile(job_.errorPath(0));
  }
  void kill() {
    if (job_.ranks()[0].pid > 0) ::kill(job_.ranks()[0].pid, SIGKILL);
    job_.finish(10);
  }
  std::string url() const { return "tcp://127.0.0.1:" + std::to_string(port_); }
  int port() const { return port_; }

 private:
  static shoal::test::JobOptions separateStderr() {
    shoal::test::JobOptions options;
    options.separateStderr = true;  // its log lines must not come before the listening line
    return options;
  }

  shoal::test::ForkedJob job_;  // kills it at the end, if kill() did not
  int port_ = 0;
};

class Aggregate : public ::testing::Test {
 public:
  void SetUp() override {
    setenv("SHOAL_TOKEN", "aggregate-test-token", 1);
    unsetenv("SHOAL_COMPRESSOR");
  }
  void TearDown() override { unsetenv("SHOAL_AGGREGATOR"); }
  static void use(const std::string& list) { setenv("SHOAL_AGGREGATOR", list.c_str(), 1); }
  static RankOptions options(double timeoutS = 20) {
    RankOptions o;
    o.algorithm = "aggregate";
    o.timeoutS = timeoutS;
    return o;
  }
};

// Sums, ORs and averages of several dtypes over counts that span many slots
// (the daemon's slot is 4 KiB here), each checked element by element.
void checkExactResults(int ranks, const std::string& aggregators) {
  setenv("SHOAL_AGGREGATOR", aggregators.c_str(), 1);
  runRanks(ranks, [&](int rank, shoal_comm_t comm) {
    for (size_t count : {size_t{1}, size_t{7}, size_t{1021}, size_t{40009}}) {
      // i64 sums that wrap: every rank adds a value near the top of the range.
      std::vector<int64_t> big(count);
      for (size_t i = 0; i < count; ++i) big[i] = INT64_MAX - static_cast<int64_t>(i) + rank;
      ASSERT_EQ(shoal_allreduce(comm, big.data(), big.data(), count, SHOAL_I64, SHOAL_SUM), SHOAL_OK)
          << shoal_last_error(comm);
      for (size_t i = 0; i < count; ++i) {
        uint64_t expected = 0;
        for (int r = 0; r < ranks; ++r) expected += static_cast<uint64_t>(INT64_MAX - static_cast<int64_t>(i) + r);
        ASSERT_EQ(static_cast<uint64_t>(big[i]), expected) << "i64 sum, element " << i << " of " << count;
      }
      // u64 OR: each rank sets its own bit.
      std::vector<uint64_t> bits(count), orOut(count);
      for (size_t i = 0; i < count; ++i) bits[i] = (uint64_t{1} << (rank + i % 40)) | (i << 50);
      ASSERT_EQ(shoal_allreduce(comm, bits.data(), orOut.data(), count, SHOAL_U64, SHOAL_BOR), SHOAL_OK)
          << shoal_last_error(comm);
      for (size_t i = 0; i < count; ++i) {
        uint64_t expected = 0;
        for (int r = 0; r < ranks; ++r) expected |= (uint64_t{1} << (r + i % 40)) | (i << 50);
        ASSERT_EQ(orOut[i], expected) << "u64 or, element " << i;
      }
      // f32 sum and avg of small integers (exact in any order).
      std::vector<float> values(count), avg(count);
      for (size_t i = 0; i < count; ++i) values[i] = static_cast<float>((i % 97) * (rank + 1));
      ASSERT_EQ(shoal_allreduce(comm, values.data(), avg.data(), count, SHOAL_F32, SHOAL_AVG), SHOAL_OK)
          << shoal_last_error(comm);
      ASSERT_EQ(shoal_allreduce(comm, values.data(), values.data(), count, SHOAL_F32, SHOAL_SUM), SHOAL_OK)
          << shoal_last_error(comm);
      const float weight = ranks * (ranks + 1) / 2.0f;
      for (size_t i = 0; i < count; ++i) {
        ASSERT_EQ(values[i], static_cast<float>(i % 97) * weight) << "f32 sum, element " << i;
        ASSERT_EQ(avg[i], static_cast<float>(i % 97) * weight / ranks) << "f32 avg, element " << i;
      }
      // f16 sum: 1.0 (0x3c00) from every rank gives `ranks` exactly.
      std::vector<uint16_t> halves(count, 0x3c00);
      ASSERT_EQ(shoal_allreduce(comm, halves.data(), halves.data(), count, SHOAL_F16, SHOAL_SUM), SHOAL_OK)
          << shoal_last_error(comm);
      const uint16_t expectedHalf = ranks == 2 ? 0x4000 : 0x4400;  // 2.0 or 4.0
      for (size_t i = 0; i < count; ++i) ASSERT_EQ(halves[i], expectedHalf) << "f16 sum, element " << i;
    }
  }, Aggregate::options());
}

TEST_F(Aggregate, TwoRanksExact) {
  Daemon daemon({"--slot-bytes", "4096"});
  checkExactResults(2, daemon.url());
}

TEST_F(Aggregate, FourRanksExact) {
  Daemon daemon({"--slot-bytes", "4096"});
  checkExactResults(4, daemon.url());
}

TEST_F(Aggregate, TwoAggregatorsShardOneTensor) {
  Daemon first({"--slot-bytes", "4096"}), second({"--slot-bytes", "8192"});
  checkExactResults(4, first.url() + "," + second.url());
}

// Max is not something an aggregator adds: it takes the ring, and works even
// with the aggregator gone, while a sum then fails (so sums did go there).
TEST_F(Aggregate, OtherOpsTakeTheRing) {
  auto daemon = std::make_unique<Daemon>();
  use(daemon->url());
  std::atomic<int> ready{0};
  std::atomic<bool> killed{false};
  runRanks(2, [&](int rank, shoal_comm_t comm) {
    float value = static_cast<float>(rank + 1), sum = 0;
    ASSERT_EQ(shoal_allreduce(comm, &value, &sum, 1, SHOAL_F32, SHOAL_SUM), SHOAL_OK) << shoal_last_error(comm);
    EXPECT_EQ(sum, 3.0f);
    if (++ready == 2) {
      daemon->kill();
      killed = true;
    }
    while (!killed) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    float most = 0;
    ASSERT_EQ(shoal_allreduce(comm, &value, &most, 1, SHOAL_F32, SHOAL_MAX), SHOAL_OK) << shoal_last_error(comm);
    EXPECT_EQ(most, 2.0f);
    // Both ranks are out of the max before either fails the communicator with a sum.
    ++ready;
    while (ready < 4) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    EXPECT_NE(shoal_allreduce(comm, &value, &sum, 1, SHOAL_F32, SHOAL_SUM), SHOAL_OK);
  }, options(10));
}

TEST_F(Aggregate, WrongTokenIsRefusedOnEveryRank) {
  Daemon daemon({}, "the-right-token");
  use(daemon.url());
  setenv("SHOAL_TOKEN", "a-wrong-token", 1);
  runRanks(2, [&](int, shoal_comm_t comm) {
    float value = 1, sum = 0;
    EXPECT_EQ(shoal_allreduce(comm, &value, &sum, 1, SHOAL_F32, SHOAL_SUM), SHOAL_ERR_REMOTE);
    EXPECT_NE(std::string(shoal_last_error(comm)).find("wrong job token"), std::string::npos)
        << shoal_last_error(comm);
  }, options(10));
}

TEST_F(Aggregate, DeadAggregatorIsAnErrorOnEveryRankWithinTheTimeout) {
  Daemon daemon;
  use(daemon.url());
  const double timeoutS = 3;
  std::atomic<int> first{0};
  std::atomic<bool> killed{false};
  std::atomic<int> failures{0};
  runRanks(4, [&](int, shoal_comm_t comm) {
    std::vector<int32_t> data(100000, 1);
    ASSERT_EQ(shoal_allreduce(comm, data.data(), data.data(), data.size(), SHOAL_I32, SHOAL_SUM), SHOAL_OK)
        << shoal_last_error(comm);
    EXPECT_EQ(data[99999], 4);
    if (++first == 4) {
      daemon.kill();
      killed = true;
    }
    while (!killed) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    auto begin = std::chrono::steady_clock::now();
    shoal_status_t status = shoal_allreduce(comm, data.data(), data.data(), data.size(), SHOAL_I32, SHOAL_SUM);
    Seconds took = std::chrono::steady_clock::now() - begin;
    EXPECT_NE(status, SHOAL_OK);
    EXPECT_LT(took.count(), timeoutS + 1) << shoal_last_error(comm);
    if (status != SHOAL_OK) ++failures;
  }, options(timeoutS));
  EXPECT_EQ(failures, 4);
}

TEST_F(Aggregate, UnreachableAggregatorIsAnErrorOnEveryRankWithinTheTimeout) {
  int port;
  {
    Daemon gone;  // a port that was just free, and nobody listens on now
    port = std::atoi(gone.url().substr(gone.url().rfind(':') + 1).c_str());
  }
  use("tcp://127.0.0.1:" + std::to_string(port));
  const double timeoutS = 2;
  std::atomic<int> failures{0};
  runRanks(2, [&](int, shoal_comm_t comm) {
    float value = 1, sum = 0;
    auto begin = std::chrono::steady_clock::now();
    shoal_status_t status = shoal_allreduce(comm, &value, &sum, 1, SHOAL_F32, SHOAL_SUM);
    Seconds took = std::chrono::steady_clock::now() - begin;
    EXPECT_NE(status, SHOAL_OK);
    EXPECT_NE(std::string(shoal_last_error(comm)).find("aggregator"), std::string::npos) << shoal_last_error(comm);
    EXPECT_LT(took.count(), timeoutS + 1);
    if (status != SHOAL_OK) ++failures;
  }, options(timeoutS));
  EXPECT_EQ(failures, 2);
}

// Rank 1 never sends its slot: rank 0 hears from the aggregator (its own
// deadline is shorter) which rank is missing; rank 1's next call fails too;
// and the aggregator's only slot is free again for the next communicator.
TEST_F(Aggregate, MissingRankFailsTheCallAndTheSlotIsFreed) {
  Daemon daemon({"--pool-slots", "1", "--slot-bytes", "1024", "--timeout-s", "1"});
  use(daemon.url());
  std::atomic<bool> rankZeroDone{false};
  runRanks(2, [&](int rank, shoal_comm_t comm) {
    float value = 1, sum = 0;
    if (rank == 0) {
      auto begin = std::chrono::steady_clock::now();
      EXPECT_NE(shoal_allreduce(comm, &value, &sum, 1, SHOAL_F32, SHOAL_SUM), SHOAL_OK);
      Seconds took = std::chrono::steady_clock::now() - begin;
      EXPECT_LT(took.count(), 4.0);
      EXPECT_NE(std::string(shoal_last_error(comm)).find("rank(s) 1 sent nothing"), std::string::npos)
          << shoal_last_error(comm);
      rankZeroDone = true;
    } else {
      while (!rankZeroDone) std::this_thread::sleep_for(std::chrono::milliseconds(5));
      EXPECT_NE(shoal_allreduce(comm, &value, &sum, 1, SHOAL_F32, SHOAL_SUM), SHOAL_OK);
    }
  }, options(5));
  runRanks(2, [&](int, shoal_comm_t comm) {
    std::vector<int32_t> data(5000, 2);  // 20 slots through a pool of one
    ASSERT_EQ(shoal_allreduce(comm, data.data(), data.data(), data.size(), SHOAL_I32, SHOAL_SUM), SHOAL_OK)
        << shoal_last_error(comm);
    EXPECT_EQ(data[4999], 4);
  }, options(5));
}

// Three communicators of 2, 3 and 4 ranks at once through one aggregator with
// a small pool, each with its own data.
TEST_F(Aggregate, SeveralCommunicatorsAtOnce) {
  Daemon daemon({"--pool-slots", "4", "--slot-bytes", "2048"});
  use(daemon.url());
  std::vector<std::thread> jobs;
  for (int ranks : {2, 3, 4}) {
    jobs.emplace_back([ranks] {
      runRanks(ranks, [ranks](int rank, shoal_comm_t comm) {
        for (int call = 0; call < 10; ++call) {
          std::vector<int64_t> data(3000 + call * 17);
          for (size_t i = 0; i < data.size(); ++i) data[i] = static_cast<int64_t>(i) * (rank + 1) + ranks * 1000;
          ASSERT_EQ(shoal_allreduce(comm, data.data(), data.data(), data.size(), SHOAL_I64, SHOAL_SUM), SHOAL_OK)
              << shoal_last_error(comm);
          const int64_t weight = ranks * (ranks + 1) / 2;
          for (size_t i = 0; i < data.size(); ++i)
            ASSERT_EQ(data[i], static_cast<int64_t>(i) * weight + ranks * ranks * 1000) << "job " << ranks;
        }
      }, options());
    });
  }
  for (std::thread& job : jobs) job.join();
}

// Compressor rounds are allreduces of homomorphic payloads (the sketch's OR-ed
// index and integer cells, fp16 casts): they go through the aggregator and
// give the same results as through the ring; with the aggregator gone they fail.
TEST_F(Aggregate, CompressorRoundsGoThroughTheAggregator) {
  auto daemon = std::make_unique<Daemon>();
  use(daemon->url());
  const size_t count = 1 << 16;
  std::atomic<int> phase{0};
  std::atomic<bool> killed{false};
  runRanks(2, [&](int rank, shoal_comm_t comm) {
    for (const char* compressor : {"sketch", "fp16"}) {
      std::vector<float> input(count, 0.0f), output(count, -1.0f);
      for (size_t i = rank; i < count; i += 97) input[i] = static_cast<float>(1 + i % 5);
      shoal_tensor_t in = shoal_tensor_1d(input.data(), count, SHOAL_F32);
      shoal_tensor_t out = shoal_tensor_1d(output.data(), count, SHOAL_F32);
      shoal_allreduce_options_t opts = SHOAL_ALLREDUCE_OPTIONS_INIT;
      opts.compressor = compressor;
      opts.compress_min_bytes = 0;
      ASSERT_EQ(shoal_allreduce_tensor(comm, &in, &out, SHOAL_SUM, &opts), SHOAL_OK) << shoal_last_error(comm);
      for (size_t i = 0; i < count; ++i) {
        float expected = 0;
        for (int r = 0; r < 2; ++r)
          if (i >= static_cast<size_t>(r) && (i - r) % 97 == 0) expected += static_cast<float>(1 + i % 5);
        ASSERT_EQ(output[i], expected) << compressor << " element " << i;
      }
    }
    if (++phase == 2) {
      daemon->kill();
      killed = true;
    }
    while (!killed) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    std::vector<float> input(count, 1.0f), output(count);
    shoal_tensor_t in = shoal_tensor_1d(input.data(), count, SHOAL_F32);
    shoal_tensor_t out = shoal_tensor_1d(output.data(), count, SHOAL_F32);
    shoal_allreduce_options_t opts = SHOAL_ALLREDUCE_OPTIONS_INIT;
    opts.compressor = "fp16";
    opts.compress_min_bytes = 0;
    EXPECT_NE(shoal_allreduce_tensor(comm, &in, &out, SHOAL_SUM, &opts), SHOAL_OK);
  }, options(5));
}

// Ranks that pass different counts get MISMATCH on every rank (the aggregator
// compares every rank's slot with the first), not a hang or a wrong sum.
// A compressor round that gathers (topk's allgatherv) is not a sum the
// aggregator can add: it takes the ring, the result is right, and the log
// says so (the "anything else takes the ring, and the log says so").
TEST_F(Aggregate, GatheringRoundsTakeTheRingAndTheLogSaysSo) {
  ASSERT_TRUE(kInfoLogging);
  auto daemon = std::make_unique<Daemon>();
  use(daemon->url());
  testing::internal::CaptureStderr();
  runRanks(2, [&](int rank, shoal_comm_t comm) {
    const size_t count = 1024;
    std::vector<float> input(count, 0.0f), output(count, -1.0f);
    input[rank] = 1.0f + rank;  // one nonzero per rank: the largest, so topk sends it
    shoal_tensor_t in = shoal_tensor_1d(input.data(), count, SHOAL_F32);
    shoal_tensor_t out = shoal_tensor_1d(output.data(), count, SHOAL_F32);
    shoal_allreduce_options_t opts = SHOAL_ALLREDUCE_OPTIONS_INIT;
    opts.compressor = "topk";
    opts.compress_min_bytes = 0;
    ASSERT_EQ(shoal_allreduce_tensor(comm, &in, &out, SHOAL_SUM, &opts), SHOAL_OK) << shoal_last_error(comm);
    EXPECT_EQ(output[0], 1.0f);
    EXPECT_EQ(output[1], 2.0f);
  }, options(10));
  const std::string err = testing::internal::GetCapturedStderr();
  EXPECT_NE(err.find("SHOAL_ALGO=aggregate: compressor rounds that gather (allgatherv, e.g. topk's) are not sums the "
                     "aggregator adds; they take the ring"),
            std::string::npos)
      << err;
}

TEST_F(Aggregate, MismatchedCountsAreAnErrorOnEveryRank) {
  Daemon daemon({"--slot-bytes", "1024"});
  use(daemon.url());
  std::atomic<int> failures{0};
  runRanks(2, [&](int rank, shoal_comm_t comm) {
    std::vector<int32_t> data(rank == 0 ? 1000 : 1001, 1);
    shoal_status_t status = shoal_allreduce(comm, data.data(), data.data(), data.size(), SHOAL_I32, SHOAL_SUM);
    EXPECT_EQ(status, SHOAL_ERR_MISMATCH) << shoal_last_error(comm);
    EXPECT_NE(std::string(shoal_last_error(comm)).find("disagree"), std::string::npos) << shoal_last_error(comm);
    if (status != SHOAL_OK) ++failures;
  }, options(5));
  EXPECT_EQ(failures, 2);
}

// Ranks that disagree on a call in a way the payload does not show — a dtype
// of the same size, avg against sum (both travel as sums), f32 x N against
// f16 x 2N — get MISMATCH on every rank: each slot carries the digest of its
// call's signature and the aggregator compares them. An op the aggregator
// cannot add (max) takes the ring on its rank, and the ranks at the aggregator
// find that rank's messages by probing the transport: MISMATCH too, on every
// rank, well before the deadline.
void expectMismatchEverywhere(int ranks, const std::function<void(int rank, shoal_dtype_t&, shoal_op_t&,
                                                                  size_t& count)>& vary) {
  Daemon daemon({"--slot-bytes", "1024"});
  Aggregate::use(daemon.url());
  const double timeoutS = 20;
  std::atomic<int> mismatches{0};
  std::atomic<int> slowestMs{0};
  runRanks(ranks, [&](int rank, shoal_comm_t comm) {
    // A good call first: the aggregator is connected and works. A rank still
    // finishing it may already see its peers' abort (they moved on and failed
    // the next call): then the good call reports their MISMATCH.
    int64_t warm = rank;
    auto begin = std::chrono::steady_clock::now();
    shoal_status_t status = shoal_allreduce(comm, &warm, &warm, 1, SHOAL_I64, SHOAL_SUM);
    if (status == SHOAL_OK) {
      EXPECT_EQ(warm, ranks * (ranks - 1) / 2);
      shoal_dtype_t dtype = SHOAL_F32;
      shoal_op_t op = SHOAL_SUM;
      size_t count = 3000;  // 12 slots of 1 KiB
      vary(rank, dtype, op, count);
      std::vector<uint8_t> data(count * 8, 0);
      begin = std::chrono::steady_clock::now();
      status = shoal_allreduce(comm, data.data(), data.data(), count, dtype, op);
    }
    Seconds took = std::chrono::steady_clock::now() - begin;
    EXPECT_EQ(status, SHOAL_ERR_MISMATCH) << "rank " << rank << ": " << shoal_last_error(comm);
    EXPECT_NE(std::string(shoal_last_error(comm)).find("disagree"), std::string::npos) << shoal_last_error(comm);
    EXPECT_LT(took.count(), 5.0) << "rank " << rank << " (the deadline is " << timeoutS << " s)";
    if (status == SHOAL_ERR_MISMATCH) ++mismatches;
    for (int ms = static_cast<int>(took.count() * 1000), seen = slowestMs; ms > seen;)
      if (slowestMs.compare_exchange_weak(seen, ms)) break;
  }, Aggregate::options(timeoutS));
  EXPECT_EQ(mismatches, ranks);
  std::printf("slowest rank failed after %d ms\n", slowestMs.load());  // docs/aggregation.md quotes these
}

TEST_F(Aggregate, SameSizeDtypeOnOneRankIsAMismatchOnEveryRank) {
  expectMismatchEverywhere(3, [](int rank, shoal_dtype_t& dtype, shoal_op_t&, size_t&) {
    if (rank == 1) dtype = SHOAL_I32;
  });
}

TEST_F(Aggregate, HalfTheElementSizeTwiceTheCountIsAMismatchOnEveryRank) {
  expectMismatchEverywhere(2, [](int rank, shoal_dtype_t& dtype, shoal_op_t&, size_t& count) {
    if (rank == 0) dtype = SHOAL_F16, count *= 2;
  });
}

TEST_F(Aggregate, AvgAgainstSumIsAMismatchOnEveryRank) {
  expectMismatchEverywhere(3, [](int rank, shoal_dtype_t&, shoal_op_t& op, size_t&) {
    if (rank == 2) op = SHOAL_AVG;
  });
}

TEST_F(Aggregate, MaxOnOneRankTakesTheRingAndIsAMismatchOnEveryRank) {
  expectMismatchEverywhere(3, [](int rank, shoal_dtype_t&, shoal_op_t& op, size_t&) {
    if (rank == 0) op = SHOAL_MAX;
  });
}

TEST_F(Aggregate, SumOnOneRankAgainstMaxIsAMismatchOnEveryRank) {
  expectMismatchEverywhere(3, [](int rank, shoal_dtype_t&, shoal_op_t& op, size_t&) {
    if (rank != 1) op = SHOAL_MAX;
  });
}
// Strangers on the port (garbage, an oversized hello, a hello that stops
// halfway) are dropped, and the aggregator goes on serving.
TEST_F(Aggregate, StrangersAreDroppedAndServiceGoesOn) {
  Daemon daemon;
  for (const std::string& junk : {std::string("GET / HTTP/1.0\r\n\r\n"), std::string("\xff\xff\xff\x7f"),
                                  std::string("\x10\x00\x00\x00SHAG")}) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in address{};
    address.sin_family = AF_INET;
    address.sin_port = htons(static_cast<uint16_t>(daemon.port()));
    address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ASSERT_EQ(connect(fd, reinterpret_cast<sockaddr*>(&address), sizeof address), 0);
    ASSERT_EQ(send(fd, junk.data(), junk.size(), 0), static_cast<ssize_t>(junk.size()));
    close(fd);
  }
  use(daemon.url());
  runRanks(2, [&](int rank, shoal_comm_t comm) {
    int64_t value = rank + 1;
    ASSERT_EQ(shoal_allreduce(comm, &value, &value, 1, SHOAL_I64, SHOAL_SUM), SHOAL_OK) << shoal_last_error(comm);
    EXPECT_EQ(value, 3);
  }, options(10));
}

// Only rank 1 presents a wrong token (ranks are processes here, since the
// token comes from each process's SHOAL_TOKEN): rank 1 is refused, and rank 0,
// already waiting on the aggregator, fails through the abort well before its
// deadline. Each child exits 0 when it saw what it should.
TEST_F(Aggregate, OneRankWithAWrongTokenFailsEveryRankPromptly) {
  Daemon daemon;
  const std::string store = "tcp://127.0.0.1:" + std::to_string(shoal::test::freeLoopbackPort());
  const double timeoutS = 20;
  shoal::test::ForkedJob job("aggregate");
  std::vector<shoal::test::ForkedRank>& ranks = job.run(2, [&](int rank) -> int {
    setenv("SHOAL_TOKEN", rank == 1 ? "a-wrong-token" : "aggregate-test-token", 1);
    setenv("SHOAL_AGGREGATOR", daemon.url().c_str(), 1);
    shoal_config_t config = SHOAL_CONFIG_INIT;
    config.rank = rank;
    config.world_size = 2;
    config.store = store.c_str();
    config.token = "the-store-token";
    config.timeout_s = timeoutS;
    config.algorithm = "aggregate";
    shoal_comm_t comm = nullptr;
    if (shoal_comm_init_config(&config, &comm) != SHOAL_OK) _exit(10);
    std::vector<float> data(1 << 20, 1.0f);
    if (rank == 1) std::this_thread::sleep_for(std::chrono::milliseconds(300));  // rank 0 waits first
    auto begin = std::chrono::steady_clock::now();
    shoal_status_t status = shoal_allreduce(comm, data.data(), data.data(), data.size(), SHOAL_F32, SHOAL_SUM);
    Seconds took = std::chrono::steady_clock::now() - begin;
    std::string text = shoal_last_error(comm);
    std::fprintf(stderr, "rank %d: status %d after %.2f s: %s\n", rank, status, took.count(), text.c_str());
    if (status == SHOAL_OK) _exit(11);
    if (took.count() > timeoutS / 2) _exit(12);
    if (rank == 1 && text.find("wrong job token") == std::string::npos) _exit(13);
    _exit(0);
  }, 3 * timeoutS);
  for (int rank = 0; rank < 2; ++rank)
    EXPECT_EQ(ranks[rank].exitCode, 0) << "rank " << rank << " (10 init, 11 succeeded, 12 too slow, 13 wrong text, "
                                       << "-1 still running at the deadline, 128+ a signal)\n" << shoal::test::describe(ranks);
}

// The async runtime's fused allreduces go through the aggregator too (its
// negotiation, a bitwise AND, takes the ring): tensors submitted in a
// different order on each rank come back exact.
TEST_F(Aggregate, AsyncFusedAllreducesThroughTheAggregator) {
  Daemon daemon({"--slot-bytes", "4096"});
  use(daemon.url());
  runRanks(2, [&](int rank, shoal_comm_t comm) {
    const int kTensors = 6;
    std::vector<std::vector<int32_t>> data(kTensors);
    std::vector<shoal_tensor_t> tensors(kTensors);
    std::vector<shoal_request_t> requests;
    for (int step = 0; step < 3; ++step) {
      requests.clear();
      for (int k = 0; k < kTensors; ++k) {
        int t = rank == 0 ? k : kTensors - 1 - k;
        data[t].assign(1000 + 333 * t, t + step + rank);
        tensors[t] = shoal_tensor_1d(data[t].data(), data[t].size(), SHOAL_I32);
        shoal_request_t request = nullptr;
        std::string name = "grad" + std::to_string(t);
        ASSERT_EQ(shoal_iallreduce(comm, name.c_str(), &tensors[t], &tensors[t], SHOAL_SUM, nullptr, &request),
                  SHOAL_OK) << shoal_last_error(comm);
        requests.push_back(request);
      }
      ASSERT_EQ(shoal_wait_all(requests.data(), static_cast<int>(requests.size()), 20), SHOAL_OK)
          << shoal_last_error(nullptr);
      for (shoal_request_t request : requests) shoal_request_free(request);
      for (int t = 0; t < kTensors; ++t)
        for (int32_t v : data[t]) ASSERT_EQ(v, 2 * (t + step) + 1) << "tensor " << t << " step " << step;
    }
  }, options());
}

}  // namespace
