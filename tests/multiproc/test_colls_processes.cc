// alltoall, reduce, gather, scatter and send/recv across processes (the
// in-process tests run ranks as threads): shoal-bench checks every value
// exactly under shoalrun, and a rank process that dies in the middle of an
// alltoall loop or of a send/recv exchange makes the others fail within the
// deadline instead of hanging.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include "harness/forked_job.h"
#include "shoal/shoal.h"

namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

std::string runCommand(const std::string& command, int* status) {
  std::string output;
  FILE* pipe = popen((command + " 2>&1").c_str(), "r");
  if (pipe == nullptr) return "popen failed";
  char chunk[4096];
  while (size_t n = fread(chunk, 1, sizeof chunk, pipe)) output.append(chunk, n);
  *status = pclose(pipe);
  return output;
}

TEST(CollsProcesses, BenchValuesExactOnThreeProcesses) {
  const std::string bin = SHOAL_BIN_DIR;
  if (!fs::exists(bin + "/shoal-bench") || !fs::exists(bin + "/shoalrun"))
    GTEST_SKIP() << "shoal-bench or shoalrun is not built in " << bin;
  for (const char* coll : {"alltoall", "sendrecv", "reduce", "gather", "scatter"})
    for (const char* dtype : {"float", "int8", "uint64", "half"}) {
      int status = 0;
      const std::string command = bin + "/shoalrun -np 3 --timeout-s 60 -- " + bin + "/shoal-bench " + coll +
                                  " -d " + dtype + " -b 3 -e 300K -f 10 -n 2 -w 1 -r 1";
      const std::string output = runCommand(command, &status);
      EXPECT_EQ(status, 0) << command << "\n" << output;
      EXPECT_NE(output.find("Out of bounds values : 0 OK"), std::string::npos) << command << "\n" << output;
    }
}

// Forks n rank processes over a file store; rank `victim` runs `before` calls
// of `step` and then exits abruptly. Returns each survivor's exit code: 0 when
// it got an error within the deadline (+ slack), 1 when a call succeeded
// after the death would have to show, 2 when it took too long.
using Step = shoal_status_t (*)(shoal_comm_t comm, int rank, int n);

std::vector<int> deathDuring(int n, int victim, Step step) {
  shoal::test::ForkedJob job("colls");
  fs::create_directories(job.dir() / "store");
  const std::string store = "file://" + (job.dir() / "store").string();
  constexpr double kTimeoutS = 4;
  constexpr double kJobDeadlineS = 60;  // then the job kills what is left (exit code -1)
  std::vector<shoal::test::ForkedRank>& ranks = job.run(n, [&](int rank) -> int {
    shoal_config_t config = SHOAL_CONFIG_INIT;
    config.rank = rank;
    config.world_size = n;
    config.store = store.c_str();
    config.timeout_s = kTimeoutS;
    shoal_comm_t comm = nullptr;
    if (shoal_comm_init_config(&config, &comm) != SHOAL_OK) _exit(3);
    for (int i = 0;; ++i) {
      if (rank == victim && i == 3) _exit(9);  // no goodbye: as a crash
      auto start = Clock::now();
      shoal_status_t status = step(comm, rank, n);
      double seconds = std::chrono::duration<double>(Clock::now() - start).count();
      if (status != SHOAL_OK) _exit(seconds < kTimeoutS + 4 ? 0 : 2);
      if (i > 1000) _exit(1);
    }
  }, kJobDeadlineS);
  std::vector<int> codes(n, -1);
  for (int rank = 0; rank < n; ++rank) codes[rank] = ranks[rank].exitCode;
  return codes;
}

shoal_status_t alltoallStep(shoal_comm_t comm, int, int n) {
  std::vector<float> send(size_t(n) * 4096, 1.0f), recv(size_t(n) * 4096);
  return shoal_alltoall(comm, send.data(), recv.data(), 4096, SHOAL_F32);
}

// A ring of sendrecv_many (pipeline stages passing activations on).
shoal_status_t ringStep(shoal_comm_t comm, int rank, int n) {
  std::vector<double> out(1000, rank), in(1000);
  shoal_p2p_t ops[2] = {{SHOAL_P2P_RECV, (rank + n - 1) % n, 1, in.data(), in.size(), SHOAL_F64},
                        {SHOAL_P2P_SEND, (rank + 1) % n, 1, out.data(), out.size(), SHOAL_F64}};
  return shoal_sendrecv_many(comm, ops, 2);
}

TEST(CollsProcesses, DeadRankDuringAlltoall) {
  std::vector<int> codes = deathDuring(3, 1, alltoallStep);
  EXPECT_EQ(codes[1], 9);
  EXPECT_EQ(codes[0], 0) << "rank 0: 1 = kept succeeding, 2 = error too late, 3 = init failed, -1 = still running at the deadline";
  EXPECT_EQ(codes[2], 0) << "rank 2: 1 = kept succeeding, 2 = error too late, 3 = init failed, -1 = still running at the deadline";
}

TEST(CollsProcesses, DeadRankDuringSendRecvRing) {
  std::vector<int> codes = deathDuring(3, 2, ringStep);
  EXPECT_EQ(codes[2], 9);
  EXPECT_EQ(codes[0], 0) << "rank 0: 1 = kept succeeding, 2 = error too late, 3 = init failed, -1 = still running at the deadline";
  EXPECT_EQ(codes[1], 0) << "rank 1: 1 = kept succeeding, 2 = error too late, 3 = init failed, -1 = still running at the deadline";
}

}  // namespace
