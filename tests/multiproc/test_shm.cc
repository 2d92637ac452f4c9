// The shared-memory path (lib/transport/shm, collectives/allreduce/shm.cc)
// between real processes: the segment is mapped across processes, so each
// job here forks its ranks (file:// store in a fresh folder). A rank reports
// through its exit code and a text file; the parent checks every rank.
//
// Small slots (SHOAL_SHM_MAX_BYTES=1024) put the auto threshold, and the
// pieces of a forced SHOAL_ALGO=shm call, within reach of small counts.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "../harness/dtype_model.h"
#include "comm/communicator.h"
#include "core/error.h"
#include "harness/forked_job.h"
#include "shoal/shoal.h"

namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;
using shoal::test::DType;

constexpr size_t kSlotBytes = 1024;

struct RankResult {
  int exitCode = -1;  // -1: killed by the parent (hung)
  std::string text;   // what the rank wrote
};

struct Job {
  int size = 2;
  double timeoutS = 30;
  const char* algorithm = nullptr;                  // nullptr: auto
  std::vector<std::pair<std::string, std::string>> env;  // set in every rank before init
  // Set in one rank before init, after env (a setting that differs between ranks).
  std::function<std::vector<std::pair<std::string, std::string>>(int rank)> rankEnv;
  double killAfterS = 120;                          // the parent's bound on the whole job
};

// Runs body(rank, comm, out) in `size` forked processes; body returns the exit code.
std::vector<RankResult> runJob(const Job& job,
                               const std::function<int(int rank, shoal_comm_t comm, std::ostream& out)>& body) {
  shoal::test::ForkedJob forked("shm");
  const fs::path dir = forked.dir();
  fs::create_directories(dir / "store");
  std::string store = "file://" + (dir / "store").string();
  std::vector<shoal::test::ForkedRank>& ranks = forked.run(job.size, [&](int rank) {
    std::ofstream out(dir / ("rank" + std::to_string(rank) + ".txt"));
    setenv("SHOAL_SHM_MAX_BYTES", std::to_string(kSlotBytes).c_str(), 1);
    for (const auto& [name, value] : job.env) setenv(name.c_str(), value.c_str(), 1);
    if (job.rankEnv)
      for (const auto& [name, value] : job.rankEnv(rank)) setenv(name.c_str(), value.c_str(), 1);
    shoal_config_t config = SHOAL_CONFIG_INIT;
    config.rank = rank;
    config.world_size = job.size;
    config.store = store.c_str();
    config.timeout_s = job.timeoutS;
    config.algorithm = job.algorithm;
    shoal_comm_t comm = nullptr;
    int code;
    if (shoal_status_t status = shoal_comm_init_config(&config, &comm); status != SHOAL_OK) {
      out << "init failed: " << shoal_status_string(status) << " " << shoal_last_error(nullptr) << "\n";
      code = 2;
    } else {
      code = body(rank, comm, out);
      shoal_comm_destroy(comm);
    }
    out.flush();
    return code;
  }, job.killAfterS);
  std::vector<RankResult> results(job.size);
  for (int rank = 0; rank < job.size; ++rank) {
    results[rank].exitCode = ranks[rank].exitCode;
    results[rank].text = shoal::test::readWholeFile(dir / ("rank" + std::to_string(rank) + ".txt"));
  }
  return results;
}

std::string describe(const std::vector<RankResult>& results) {
  std::string text;
  for (size_t r = 0; r < results.size(); ++r)
    text += "rank " + std::to_string(r) + " exit " + std::to_string(results[r].exitCode) + ": " + results[r].text + "\n";
  return text;
}

bool isBitwise(shoal_op_t op) { return op == SHOAL_BAND || op == SHOAL_BOR || op == SHOAL_BXOR; }

// Rank r's element i: small integers, so that every op's exact result is
// representable in every dtype (avg: multiples of the rank count, so the
// quotient is exact too).
long double inputValue(const DType& t, shoal_op_t op, int rank, int size, size_t i) {
  long double v;
  if (op == SHOAL_PROD) v = 1 + (rank + i) % 2;  // products up to 2^5
  else if (isBitwise(op)) v = static_cast<long double>((rank * 37 + i * 11) % 128);
  else v = static_cast<long double>((rank * 5 + i * 3) % 4);
  if (op == SHOAL_AVG) v *= size;
  if ((op == SHOAL_MIN || op == SHOAL_MAX) && t.isSigned) v -= 2;
  return v;
}

long double reduceValues(shoal_op_t op, long double a, long double b) {
  switch (op) {
    case SHOAL_SUM: case SHOAL_AVG: return a + b;
    case SHOAL_PROD: return a * b;
    case SHOAL_MIN: return std::min(a, b);
    case SHOAL_MAX: return std::max(a, b);
    case SHOAL_BAND: return static_cast<long double>(static_cast<int64_t>(a) & static_cast<int64_t>(b));
    case SHOAL_BOR: return static_cast<long double>(static_cast<int64_t>(a) | static_cast<int64_t>(b));
    default: return static_cast<long double>(static_cast<int64_t>(a) ^ static_cast<int64_t>(b));
  }
}

void put(const DType& t, std::vector<uint8_t>& buffer, size_t i, long double v) {
  uint64_t bits = t.isFloat ? shoal::test::encodeFloat(t, v) : static_cast<uint64_t>(static_cast<int64_t>(v)) & t.mask();
  std::memcpy(buffer.data() + i * t.bytes, &bits, t.bytes);
}

// One allreduce of `count` elements checked against the model; "" or what went wrong.
std::string checkedAllreduce(shoal_comm_t comm, int rank, int size, const DType& t, shoal_op_t op, size_t count,
                             bool inPlace) {
  std::vector<uint8_t> input(count * t.bytes), expected(count * t.bytes), output(count * t.bytes, 0xee);
  for (size_t i = 0; i < count; ++i) {
    put(t, input, i, inputValue(t, op, rank, size, i));
    long double folded = inputValue(t, op, 0, size, i);
    for (int r = 1; r < size; ++r) folded = reduceValues(op, folded, inputValue(t, op, r, size, i));
    if (op == SHOAL_AVG) folded /= size;
    put(t, expected, i, folded);
  }
  if (inPlace) output = input;
  shoal_status_t status =
      shoal_allreduce(comm, inPlace ? output.data() : input.data(), output.data(), count, t.id, op);
  if (status != SHOAL_OK)
    return std::string("allreduce ") + t.name + " " + shoal_op_name(op) + " count " + std::to_string(count) +
           " failed: " + shoal_last_error(comm);
  if (output != expected)
    return std::string("wrong result: ") + t.name + " " + shoal_op_name(op) + " count " + std::to_string(count) +
           (inPlace ? " in place" : " out of place");
  return "";
}

int exactEverywhere(int rank, shoal_comm_t comm, std::ostream& out, int size) {
  for (const DType& t : shoal::test::kDtypes) {
    const size_t atThreshold = kSlotBytes / t.bytes;
    for (int op = 0; op < SHOAL_OP_COUNT; ++op) {
      if (isBitwise(static_cast<shoal_op_t>(op)) && t.isFloat) continue;
      for (size_t count : {size_t(0), size_t(1), size_t(7), atThreshold - 1, atThreshold, atThreshold + 1,
                           3 * atThreshold + 5}) {
        std::string problem =
            checkedAllreduce(comm, rank, size, t, static_cast<shoal_op_t>(op), count, count % 2 == 1);  // both forms
        if (!problem.empty()) {
          out << problem << "\n";
          return 5;
        }
      }
    }
  }
  return 0;
}

class ShmExact : public ::testing::TestWithParam<std::tuple<int, const char*>> {};

TEST_P(ShmExact, EveryDtypeOpAndSizeAroundTheSlot) {
  auto [size, algorithm] = GetParam();
  Job job;
  job.size = size;
  job.algorithm = algorithm;
  auto results = runJob(job, [size = size](int rank, shoal_comm_t comm, std::ostream& out) {
    return exactEverywhere(rank, comm, out, size);
  });
  for (const RankResult& result : results) EXPECT_EQ(result.exitCode, 0) << describe(results);
}

// auto: shm up to the slot, UCX above; shm forced: every size in pieces.
INSTANTIATE_TEST_SUITE_P(Ranks, ShmExact,
                         ::testing::Combine(::testing::Values(1, 2, 3, 4, 5), ::testing::Values("auto", "shm")),
                         [](const ::testing::TestParamInfo<std::tuple<int, const char*>>& info) {
                           return std::to_string(std::get<0>(info.param)) + "ranks_" + std::get<1>(info.param);
                         });

// The slot's layout (lib/transport/shm/segment.h): a 32-byte header with the
// data right behind it, so that a piece of up to 32 bytes shares the header's
// cache line and a longer one runs on into the next lines. Every dtype and op
// at the edges: one element short of the header's line, exactly filling it,
// one element past it (for the 1-byte dtypes: one byte), and the same around
// the end of the second line (96 bytes), in place and out of place; and
// broadcasts of a line's bytes and one more, from every root.
constexpr size_t kHeaderLineBytes = 32;  // SharedSegment::kInlineBytes
constexpr size_t kTwoLinesBytes = kHeaderLineBytes + 64;

int exactAtTheLineEdges(int rank, shoal_comm_t comm, std::ostream& out, int size) {
  for (const DType& t : shoal::test::kDtypes) {
    for (size_t bytes : {kHeaderLineBytes - t.bytes, kHeaderLineBytes, kHeaderLineBytes + t.bytes,
                         kTwoLinesBytes - t.bytes, kTwoLinesBytes, kTwoLinesBytes + t.bytes}) {
      for (int op = 0; op < SHOAL_OP_COUNT; ++op) {
        if (isBitwise(static_cast<shoal_op_t>(op)) && t.isFloat) continue;
        for (bool inPlace : {false, true}) {
          std::string problem =
              checkedAllreduce(comm, rank, size, t, static_cast<shoal_op_t>(op), bytes / t.bytes, inPlace);
          if (!problem.empty()) {
            out << problem << "\n";
            return 5;
          }
        }
      }
    }
  }
  for (size_t bytes : {kHeaderLineBytes, kHeaderLineBytes + 1}) {
    for (int root = 0; root < size; ++root) {
      std::vector<uint8_t> data(bytes, 0);
      if (rank == root)
        for (size_t i = 0; i < bytes; ++i) data[i] = static_cast<uint8_t>(root * 31 + i + 1);
      if (shoal_broadcast(comm, data.data(), data.data(), bytes, SHOAL_U8, root) != SHOAL_OK) {
        out << "broadcast of " << bytes << " bytes from " << root << " failed: " << shoal_last_error(comm) << "\n";
        return 3;
      }
      for (size_t i = 0; i < bytes; ++i)
        if (data[i] != static_cast<uint8_t>(root * 31 + i + 1)) {
          out << "broadcast of " << bytes << " bytes from " << root << ": wrong byte " << i << "\n";
          return 5;
        }
    }
  }
  return 0;
}

TEST(ShmInline, EveryDtypeOpAndPlaceAtTheHeaderLinesEdges) {
  for (int size : {2, 3}) {
    Job job;
    job.size = size;
    auto results = runJob(job, [size](int rank, shoal_comm_t comm, std::ostream& out) {
      return exactAtTheLineEdges(rank, comm, out, size);
    });
    for (const RankResult& result : results) EXPECT_EQ(result.exitCode, 0) << size << " ranks\n" << describe(results);
  }
}

// A call whose arguments differ on one rank fails with MISMATCH on every rank.
void expectMismatchEverywhere(const std::function<void(int rank, shoal_dtype_t& dtype, shoal_op_t& op, size_t& count)>&
                                  vary) {
  Job job;
  job.size = 3;
  auto results = runJob(job, [&](int rank, shoal_comm_t comm, std::ostream& out) {
    shoal_dtype_t dtype = SHOAL_F32;
    shoal_op_t op = SHOAL_SUM;
    size_t count = 16;
    vary(rank, dtype, op, count);
    std::vector<uint8_t> data(count * 8, 0);
    // One good call first: the segment works before the bad one. A rank
    // still finishing it may already see its peers' abort (they moved on and
    // failed): then the good call reports their MISMATCH (api/run.h).
    float warm[4] = {1, 2, 3, 4};
    shoal_status_t status = shoal_allreduce(comm, warm, warm, 4, SHOAL_F32, SHOAL_SUM);
    if (status == SHOAL_OK && warm[0] != 3) {
      out << "good call: wrong result\n";
      return 6;
    }
    if (status == SHOAL_OK) status = shoal_allreduce(comm, data.data(), data.data(), count, dtype, op);
    out << shoal_status_string(status) << " " << shoal_last_error(comm) << "\n";
    return status == SHOAL_ERR_MISMATCH ? 0 : 7;
  });
  for (const RankResult& result : results) {
    EXPECT_EQ(result.exitCode, 0) << describe(results);
    EXPECT_NE(result.text.find("disagree"), std::string::npos) << describe(results);
  }
}

TEST(ShmMismatch, DtypeOnOneRank) {
  expectMismatchEverywhere([](int rank, shoal_dtype_t& dtype, shoal_op_t&, size_t&) {
    if (rank == 1) dtype = SHOAL_I32;
  });
}

TEST(ShmMismatch, OpOnOneRank) {
  expectMismatchEverywhere([](int rank, shoal_dtype_t&, shoal_op_t& op, size_t&) {
    if (rank == 2) op = SHOAL_MAX;
  });
}

TEST(ShmMismatch, CountOnOneRank) {
  expectMismatchEverywhere([](int rank, shoal_dtype_t&, shoal_op_t&, size_t& count) {
    if (rank == 0) count = 17;
  });
}

// Counts on either side of the shared-memory threshold (issues 12 and 17):
// the small ranks wait in the segment, the large ones in UCX (recursive
// doubling, or the ring for the largest count). Every rank must fail with
// MISMATCH, promptly: a segment wait probes the transport for a peer's
// message of the same call with another signature, and the rank that finds
// it tells the others (the segment's abort word, the transport's abort notice).
void expectStraddleMismatch(int size, const std::function<size_t(int rank)>& countOf) {
  Job job;
  job.size = size;
  job.timeoutS = 30;
  auto results = runJob(job, [&](int rank, shoal_comm_t comm, std::ostream& out) {
    float warm[4] = {1, 2, 3, 4};
    shoal_status_t status = shoal_allreduce(comm, warm, warm, 4, SHOAL_F32, SHOAL_SUM);
    if (status != SHOAL_OK) {
      out << "good call failed: " << shoal_last_error(comm) << "\n";
      return 6;
    }
    std::vector<float> data(countOf(rank), 1.0f);
    auto begin = Clock::now();
    status = shoal_allreduce(comm, data.data(), data.data(), data.size(), SHOAL_F32, SHOAL_SUM);
    double seconds = std::chrono::duration<double>(Clock::now() - begin).count();
    out << shoal_status_string(status) << " after " << seconds << " s: " << shoal_last_error(comm) << "\n";
    if (status != SHOAL_ERR_MISMATCH) return 7;
    return seconds < 2.0 ? 0 : 8;  // the deadline is 30 s; the probe runs every 20 ms
  });
  for (const RankResult& result : results) {
    EXPECT_EQ(result.exitCode, 0) << "(7: not MISMATCH, 8: slower than 2 s)\n" << describe(results);
    EXPECT_NE(result.text.find("disagree"), std::string::npos) << describe(results);
  }
  // How long each rank took to fail (docs/reliability-agreement.md quotes these).
  std::string times;
  for (const RankResult& result : results) {
    size_t after = result.text.find(" after ");
    if (after != std::string::npos) times += result.text.substr(after, result.text.find(" s:", after) + 2 - after);
  }
  std::printf("failed%s\n", times.c_str());
}

constexpr size_t kBelow = 16;    // 64 bytes of f32: the segment
constexpr size_t kAbove = 600;   // 2400 bytes: above the 1024-byte slot, recursive doubling over UCX
constexpr size_t kRing = 100000; // 400 KB: the ring over UCX

TEST(ShmStraddle, OneRankAboveTheThreshold) {
  expectStraddleMismatch(2, [](int rank) { return rank == 1 ? kAbove : kBelow; });
}

TEST(ShmStraddle, OneRankBelowTheThreshold) {
  expectStraddleMismatch(2, [](int rank) { return rank == 1 ? kBelow : kAbove; });
}

TEST(ShmStraddle, OneRankOnTheRingTwoInTheSegment) {
  expectStraddleMismatch(3, [](int rank) { return rank == 2 ? kRing : kBelow; });
}

TEST(ShmStraddle, OneRankInTheSegmentThreeOverUcx) {
  expectStraddleMismatch(4, [](int rank) { return rank == 0 ? kBelow : kAbove; });
}

// SHOAL_SHM_MAX_BYTES decides which path a call takes, so ranks must agree on
// it: a difference is MISMATCH at init on every rank, naming the variable.
// (1000 against 1024 bytes gives segments of the same size, so without the
// check a 1010-byte call would straddle; 0 on one rank used to leave rank 0
// waiting for that rank's segment until the deadline.)
void expectThresholdMismatchAtInit(const char* rankOneValue, const char* othersValue = nullptr) {
  Job job;
  job.size = 3;
  job.timeoutS = 30;
  job.rankEnv = [=](int rank) {
    std::vector<std::pair<std::string, std::string>> env;
    if (rank == 1) env.emplace_back("SHOAL_SHM_MAX_BYTES", rankOneValue);
    if (rank != 1 && othersValue) env.emplace_back("SHOAL_SHM_MAX_BYTES", othersValue);
    return env;
  };
  auto begin = Clock::now();
  auto results = runJob(job, [](int, shoal_comm_t, std::ostream& out) {
    out << "init succeeded\n";
    return 0;
  });
  double seconds = std::chrono::duration<double>(Clock::now() - begin).count();
  for (const RankResult& result : results) {
    EXPECT_EQ(result.exitCode, 2) << describe(results);
    EXPECT_NE(result.text.find("SHOAL_ERR_MISMATCH"), std::string::npos) << describe(results);
    EXPECT_NE(result.text.find("SHOAL_SHM_MAX_BYTES"), std::string::npos) << describe(results);
  }
  EXPECT_LT(seconds, 10) << "init waited for the deadline (30 s)";
}

TEST(ShmStraddle, ThresholdDiffersByLessThanTheSegmentsRounding) { expectThresholdMismatchAtInit("1000"); }

TEST(ShmStraddle, ThresholdZeroOnOneRank) { expectThresholdMismatchAtInit("0"); }

// The default, auto, stands for a size chosen by the rank count (2 MiB at 3
// ranks); the check compares sizes, so auto on one rank and the same size
// spelled out on the others agree, and a 1 MiB allreduce runs exact.
TEST(ShmStraddle, AutoAgreesWithTheSizeItStandsFor) {
  Job job;
  job.size = 3;
  job.timeoutS = 30;
  job.rankEnv = [](int rank) {
    return std::vector<std::pair<std::string, std::string>>{
        {"SHOAL_SHM_MAX_BYTES", rank == 1 ? "auto" : "2097152"}};
  };
  auto results = runJob(job, [](int rank, shoal_comm_t comm, std::ostream& out) {
    std::vector<float> data(1 << 18, static_cast<float>(rank + 1));
    if (shoal_allreduce(comm, data.data(), data.data(), data.size(), SHOAL_F32, SHOAL_SUM) != SHOAL_OK) {
      out << "allreduce failed: " << shoal_last_error(comm) << "\n";
      return 1;
    }
    for (float value : data)
      if (value != 6.0f) {
        out << "wrong sum " << value << "\n";
        return 1;
      }
    return 0;
  });
  for (const RankResult& result : results) EXPECT_EQ(result.exitCode, 0) << describe(results);
}

// ...and auto at 3 ranks is not 256 KiB: MISMATCH at init, naming the variable.
TEST(ShmStraddle, AutoAtThreeRanksIsNotTheTwoRankSize) { expectThresholdMismatchAtInit("262144", "auto"); }

// A rank SIGKILLed in the middle of a run of small allreduces: the others
// fail within a fraction of the deadline, naming a dead or aborting rank.
TEST(ShmFailure, KilledRankIsAnErrorOnTheOthersBeforeTheDeadline) {
  Job job;
  job.size = 3;
  job.timeoutS = 60;
  job.killAfterS = 90;
  auto started = Clock::now();
  auto results = runJob(job, [](int rank, shoal_comm_t comm, std::ostream& out) {
    std::vector<float> data(32, 1.0f);
    for (int i = 0;; ++i) {
      if (rank == 2 && i == 200) raise(SIGKILL);
      if (shoal_allreduce(comm, data.data(), data.data(), data.size(), SHOAL_F32, SHOAL_MAX) != SHOAL_OK) {
        out << "call " << i << ": " << shoal_last_error(comm) << "\n";
        return 3;
      }
      if (i > 100000) return 4;  // never: rank 2 dies at 200
    }
  });
  double seconds = std::chrono::duration<double>(Clock::now() - started).count();
  EXPECT_EQ(results[2].exitCode, 128 + SIGKILL) << describe(results);
  for (int rank : {0, 1}) {
    EXPECT_EQ(results[rank].exitCode, 3) << describe(results);
    EXPECT_TRUE(results[rank].text.find("exited or crashed") != std::string::npos ||
                results[rank].text.find("aborted") != std::string::npos)
        << describe(results);
  }
  EXPECT_LT(seconds, 20) << "the survivors waited for the deadline (60 s) instead of noticing the death";
}

// A rank that exits while a peer waits for it in the segment, then a third
// rank that finds a disagreement: the waiting rank reports the disagreement
// (the cause the third rank wrote in the abort word), not "rank 1 exited",
// because it looks kAbortNoticeGraceS (transport.h) for a cause before it
// reports a dead peer. A rank that gave up on a call and exited at once is
// this case (CI, fourteenth session): its peers must report why, not that it left.
TEST(ShmFailure, APeerGoneThenAMismatchIsReportedAsTheMismatch) {
  Job job;
  job.size = 3;
  job.timeoutS = 30;
  job.killAfterS = 60;
  auto results = runJob(job, [](int rank, shoal_comm_t comm, std::ostream& out) {
    if (shoal_barrier(comm) != SHOAL_OK) {
      out << "barrier: " << shoal_last_error(comm) << "\n";
      return 2;
    }
    if (rank == 1) _exit(7);  // gone, with nothing said
    // Rank 0 waits for rank 1 first and sees it gone within 20 ms (the
    // segment's liveness period); rank 2's disagreement comes well inside
    // the grace after that.
    if (rank == 2) std::this_thread::sleep_for(std::chrono::milliseconds(80));
    std::vector<float> data(8, 1.0f);
    shoal_status_t status =
        shoal_allreduce(comm, data.data(), data.data(), data.size(), rank == 2 ? SHOAL_I32 : SHOAL_F32, SHOAL_SUM);
    out << shoal_status_string(status) << ": " << (status == SHOAL_OK ? "" : shoal_last_error(comm)) << "\n";
    return status == SHOAL_ERR_MISMATCH ? 3 : 4;
  });
  EXPECT_EQ(results[1].exitCode, 7) << describe(results);
  for (int rank : {0, 2}) {
    EXPECT_EQ(results[rank].exitCode, 3) << "rank " << rank << " did not report the mismatch\n" << describe(results);
    EXPECT_NE(results[rank].text.find("dtype"), std::string::npos) << describe(results);
  }
}

// A failure the transport finds itself (a probe or size mismatch, a refused
// send) ends in its abort(), which writes the shared segment's abort word
// before the notices leave (transport.h, setBeforeNotices), as
// failCommunicator does: a rank waiting in the segment reads the cause there
// even if the failing rank exits at once. Here rank 0 aborts the transport
// directly (not through failCommunicator), finds its own word written, and
// exits; rank 1, in a small (segment) allreduce, reports the mismatch.
TEST(ShmFailure, ATransportsOwnAbortWritesTheSegmentWordFirst) {
  Job job;
  job.size = 2;
  job.timeoutS = 30;
  job.killAfterS = 60;
  auto results = runJob(job, [](int rank, shoal_comm_t comm, std::ostream& out) {
    if (!comm->shm) {
      out << "no shared segment\n";
      return 2;
    }
    // Rank 1 may still be in this barrier when rank 0 aborts: then the barrier reports it.
    shoal_status_t status = shoal_barrier(comm);
    if (rank == 0 && status != SHOAL_OK) {
      out << "barrier: " << shoal_last_error(comm) << "\n";
      return 2;
    }
    if (rank == 0) {
      comm->transport->abort("a probe found another call (test)", SHOAL_ERR_MISMATCH);
      try {
        comm->shm->checkNotAborted();
        out << "the segment's abort word is not written\n";
        return 4;
      } catch (const shoal::Error& error) {
        out << error.what() << std::endl;                     // flushed: _exit next
        _exit(error.status() == SHOAL_ERR_MISMATCH ? 3 : 5);  // gone at once, as a failing rank may be
      }
    }
    std::vector<float> data(8, 1.0f);
    if (status == SHOAL_OK)
      status = shoal_allreduce(comm, data.data(), data.data(), data.size(), SHOAL_F32, SHOAL_SUM);
    out << shoal_status_string(status) << ": " << (status == SHOAL_OK ? "" : shoal_last_error(comm)) << "\n";
    return status == SHOAL_ERR_MISMATCH ? 3 : 4;
  });
  for (int rank : {0, 1}) {
    EXPECT_EQ(results[rank].exitCode, 3) << "rank " << rank << "\n" << describe(results);
    EXPECT_NE(results[rank].text.find("a probe found another call (test)"), std::string::npos) << describe(results);
  }
}

// More calls than the transport's 12-bit sequence holds, small (shared
// memory) interleaved with large (UCX) allreduces, broadcasts and barriers.
TEST(ShmSequence, ThousandsOfCallsInterleavedWithLargeOnes) {
  Job job;
  job.size = 4;
  job.killAfterS = 240;
  auto results = runJob(job, [](int rank, shoal_comm_t comm, std::ostream& out) {
    const int size = 4;
    std::vector<uint32_t> small(8), large(64 * 1024);
    for (int i = 0; i < 4500; ++i) {
      for (size_t k = 0; k < small.size(); ++k) small[k] = static_cast<uint32_t>(rank + i + k);
      if (shoal_allreduce(comm, small.data(), small.data(), small.size(), SHOAL_U32, SHOAL_SUM) != SHOAL_OK) {
        out << "small " << i << ": " << shoal_last_error(comm) << "\n";
        return 3;
      }
      for (size_t k = 0; k < small.size(); ++k)
        if (small[k] != static_cast<uint32_t>(6 + size * (i + k))) {
          out << "small " << i << " wrong\n";
          return 5;
        }
      if (i % 97 == 0) {
        for (size_t k = 0; k < large.size(); ++k) large[k] = static_cast<uint32_t>(rank * k + i);
        if (shoal_allreduce(comm, large.data(), large.data(), large.size(), SHOAL_U32, SHOAL_SUM) != SHOAL_OK) {
          out << "large " << i << ": " << shoal_last_error(comm) << "\n";
          return 3;
        }
        for (size_t k = 0; k < large.size(); ++k)
          if (large[k] != static_cast<uint32_t>(6 * k + size * i)) {
            out << "large " << i << " wrong\n";
            return 5;
          }
      }
      if (i % 13 == 0) {
        uint32_t value[3] = {0, 0, 0};
        int root = i % size;
        if (rank == root) value[0] = value[1] = value[2] = static_cast<uint32_t>(i);
        if (shoal_broadcast(comm, value, value, 3, SHOAL_U32, root) != SHOAL_OK || shoal_barrier(comm) != SHOAL_OK) {
          out << "broadcast/barrier " << i << ": " << shoal_last_error(comm) << "\n";
          return 3;
        }
        if (value[0] != static_cast<uint32_t>(i) || value[2] != static_cast<uint32_t>(i)) {
          out << "broadcast " << i << " wrong\n";
          return 5;
        }
      }
    }
    return 0;
  });
  for (const RankResult& result : results) EXPECT_EQ(result.exitCode, 0) << describe(results);
}

// SHOAL_ALGO=shm where there is no segment is an error at init, with text.
TEST(ShmRefusal, ForcedWithoutASegmentFailsAtInit) {
  Job job;
  job.size = 2;
  job.algorithm = "shm";
  job.env = {{"SHOAL_SHM_MAX_BYTES", "0"}};
  auto results = runJob(job, [](int, shoal_comm_t, std::ostream&) { return 0; });
  for (const RankResult& result : results) {
    EXPECT_EQ(result.exitCode, 2) << describe(results);
    EXPECT_NE(result.text.find("SHOAL_ALGO=shm needs every rank on one host"), std::string::npos) << describe(results);
  }
}

}  // namespace
