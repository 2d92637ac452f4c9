// shoal-bench --memory cuda for every collective (reduce and reduce_scatter
// with the ops NCCL has): inputs made on the host, copied to the device, run through the tensor calls over NCCL, copied
// back and checked element by element (-c 1), out of place and in place.
// Exit 0 means every element was right. One rank per device, at most two
// (NCCL takes one rank per device); skips without a device.
#include <gtest/gtest.h>

#include <algorithm>
#include <csignal>
#include <string>
#include <vector>

#include "cuda_test_util.h"
#include "harness/forked_job.h"

namespace {

const std::string kBin = SHOAL_BIN_DIR;

TEST(ShoalBenchCuda, EveryCollectiveRunsAndChecksOnDeviceBuffers) {
#ifndef SHOAL_TEST_HAVE_BENCH
  GTEST_SKIP() << "shoal-bench is not built here (SHOAL_BUILD_BENCH=OFF)";
#endif
  std::string why;
  const int devices = shoal::cuda::deviceCount(&why);
  if (devices == 0) GTEST_SKIP() << "no CUDA device: " << why;
  const std::string ranks = std::to_string(std::min(devices, 2));
  struct Case {
    std::vector<std::string> args;
  };
  const std::vector<Case> cases = {
      {{"allreduce", "-d", "float"}}, {{"allreduce", "-d", "int32", "-o", "bxor"}},
      {{"allgather"}},                {{"broadcast", "-r", ranks == "2" ? "1" : "0"}},
      {{"reduce_scatter", "-d", "float"}}, {{"reduce_scatter", "-d", "int32", "-o", "min"}},
      {{"alltoall"}},                 {{"sendrecv"}},
      {{"reduce", "-d", "int32", "-o", "max"}}, {{"gather"}},
      {{"scatter"}}};
  for (const Case& c : cases) {
    std::vector<std::string> args{"-np", ranks, kBin + "/shoal-bench"};
    args.insert(args.end(), c.args.begin(), c.args.end());
    for (const char* a : {"-b", "1K", "-e", "1M", "-f", "32", "-n", "2", "-w", "1", "-c", "1", "--memory", "cuda"})
      args.push_back(a);
    shoal::test::Program program{kBin + "/shoalrun", args, {"SHOAL_STORE", "SHOAL_TOKEN", "SHOAL_COMPRESSOR"}, {}};
    const shoal::test::ForkedRank ended = shoal::test::runProgram(program, 120, SIGTERM);
    EXPECT_EQ(ended.exitCode, 0) << c.args[0] << "\n" << ended.output << ended.errors;
    EXPECT_NE(ended.output.find("Out of bounds values : 0 OK"), std::string::npos) << c.args[0] << "\n"
                                                                                   << ended.output;
  }
}

}  // namespace
