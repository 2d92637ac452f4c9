// shoal-bench and shoalrun as a new user meets them (issue 13.3, 13.7, 13.8, 13.9): nccl-tests'
// flags (-a averaging, -c N checks), --algo, the -J JSON schema, --shape for PowerSGD, the
// effective and payload bandwidths, --version, the timeline of a blocking-call program, and
// SHOAL_LOG_LEVEL=info's summary once per communicator. Every run is `shoalrun -np 2`.
#include <signal.h>

#include <cstdlib>
#include <filesystem>
#include <map>
#include <regex>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "harness/forked_job.h"
#include "runtime/json_lite.h"

namespace {

namespace fs = std::filesystem;
using shoal::test::json::Value;

const std::string kBin = SHOAL_BIN_DIR;

struct Outcome {
  int exitCode = -1;
  std::string out, err;
};

using shoal::test::readWholeFile;

class ShoalBench : public ::testing::Test {
 protected:
  void SetUp() override {
#ifndef SHOAL_TEST_HAVE_BENCH
    GTEST_SKIP() << "shoal-bench is not built here (SHOAL_BUILD_BENCH=OFF)";
#endif
    std::string pattern = (fs::temp_directory_path() / "shoal_bench_test_XXXXXX").string();
    ASSERT_NE(mkdtemp(pattern.data()), nullptr);
    dir_ = pattern;
  }
  void TearDown() override {
    std::error_code ignored;
    if (!dir_.empty()) fs::remove_all(dir_, ignored);
  }

  // Runs `program args` (a path under the bin dir) with extra environment, bounded by 120 s
  // (then SIGTERM, which shoalrun forwards to its ranks).
  Outcome run(const std::string& program, const std::vector<std::string>& args,
              const std::map<std::string, std::string>& environment = {}) {
    shoal::test::Program command{kBin + "/" + program, args,
                                 {"SHOAL_STORE", "SHOAL_TOKEN", "SHOAL_COMPRESSOR", "SHOAL_COMPRESSOR_OPTS",
                                  "SHOAL_LOG_LEVEL", "SHOAL_TIMELINE", "SHOAL_ALGO"},
                                 environment};
    shoal::test::ForkedRank ended = shoal::test::runProgram(command, 120, SIGTERM);
    if (ended.exitCode == shoal::test::kKilledAtDeadline) ADD_FAILURE() << program << " did not finish within 120 s";
    return Outcome{ended.exitCode, ended.output, ended.errors};
  }

  // shoalrun -np 2 shoal-bench args -J file: the parsed document (a failure when it is not one).
  Value bench(std::vector<std::string> args, const std::map<std::string, std::string>& environment = {}) {
    const std::string json = (dir_ / "bench.json").string();
    std::vector<std::string> all{"-np", "2", kBin + "/shoal-bench"};
    all.insert(all.end(), args.begin(), args.end());
    all.insert(all.end(), {"-J", json});
    last_ = run("shoalrun", all, environment);
    EXPECT_EQ(last_.exitCode, 0) << last_.out << last_.err;
    try {
      return shoal::test::json::parse(readWholeFile(json));
    } catch (const std::exception& error) {
      ADD_FAILURE() << "not JSON: " << error.what() << "\n" << readWholeFile(json).substr(0, 2000);
      return {};
    }
  }

  fs::path dir_;
  Outcome last_;
};

TEST_F(ShoalBench, JsonFollowsNcclTestsSchemaAndAveragingModes) {
  for (int average : {1, 3}) {
    Value doc = bench({"-b", "64K", "-e", "256K", "-f", "4", "-n", "2", "-w", "1", "-c", "2", "-a",
                       std::to_string(average)});
    ASSERT_EQ(doc.kind, Value::Kind::Object);
    EXPECT_EQ(doc.at("version").number, 3);
    for (const char* key : {"start_time", "end_time", "args", "env", "config", "results", "out_of_bounds",
                            "average_bus_bandwidth", "errors"})
      EXPECT_TRUE(doc.has(key)) << key;
    const Value& config = doc.at("config");
    EXPECT_EQ(config.at("validation").number, 2);  // -c 2: two checked iterations
    EXPECT_EQ(config.at("iterations").number, 2);
    EXPECT_EQ(config.at("minimum_bytes").number, 65536);
    EXPECT_EQ(config.at("step_factor").number, 4);
    EXPECT_EQ(config.at("average").number, average);
    EXPECT_EQ(config.at("devices").items.size(), 2u);
    for (const Value& variable : doc.at("env").items) EXPECT_EQ(variable.text.rfind("SHOAL_TOKEN=", 0), std::string::npos);
    ASSERT_EQ(doc.at("results").items.size(), 2u);
    for (const Value& row : doc.at("results").items) {
      EXPECT_EQ(row.at("type").text, "float");
      EXPECT_EQ(row.at("redop").text, "sum");
      EXPECT_EQ(row.at("root").text, "    -1");
      for (const char* mode : {"out_of_place", "in_place"}) {
        const Value& r = row.at(mode);
        for (const char* key : {"time", "alg_bw", "bus_bw", "nwrong", "time_avg", "time_max", "time_min", "time_rank0"})
          ASSERT_TRUE(r.has(key)) << mode << " lacks " << key;
        EXPECT_EQ(r.at("nwrong").number, 0);
        EXPECT_LE(r.at("time_min").number, r.at("time_avg").number);
        EXPECT_LE(r.at("time_avg").number, r.at("time_max").number);
        EXPECT_DOUBLE_EQ(r.at("time").number, r.at(average == 3 ? "time_max" : "time_avg").number);
        EXPECT_NEAR(r.at("alg_bw").number, row.at("size").number / 1e3 / r.at("time").number, 1e-4);
        EXPECT_NEAR(r.at("bus_bw").number, r.at("alg_bw").number, 1e-4);  // 2(n-1)/n = 1 at n = 2
      }
    }
    EXPECT_EQ(doc.at("out_of_bounds").at("count").number, 0);
    const std::string said = average == 3 ? "# time: the slowest rank's mean time per iteration (-a 3"
                                          : "# time: the average over ranks of each rank's mean time per iteration (-a 1";
    EXPECT_NE(last_.out.find(said), std::string::npos) << last_.out;
  }
}

TEST_F(ShoalBench, AlgorithmIsDashDashAlgoAndDashAIsAveraging) {
  Outcome bad = run("shoalrun", {"-np", "2", kBin + "/shoal-bench", "-a", "ring", "-b", "1K", "-e", "1K"});
  EXPECT_EQ(bad.exitCode, 2) << bad.out << bad.err;
  EXPECT_NE(bad.err.find("--algo ring"), std::string::npos) << bad.err;
  Value doc = bench({"--algo", "ring", "-b", "1M", "-e", "1M", "-n", "2", "-w", "1"});
  EXPECT_EQ(doc.at("config").at("algorithm").text, "ring");
  Outcome unknown = run("shoalrun", {"-np", "2", kBin + "/shoal-bench", "--algo", "bogus", "-b", "1K", "-e", "1K"});
  EXPECT_NE(unknown.exitCode, 0);
  EXPECT_NE(unknown.err.find("bogus"), std::string::npos) << unknown.err;
}

// PowerSGD compresses matrices only: on --shape 256x256 the ratio is above 1, on a 1-D tensor
// of the same size it is exactly 1 (sent uncompressed), and the report shows both.
TEST_F(ShoalBench, ShapeLetsPowerSgdCompress) {
  Value doc = bench({"--shape", "256x256,65536", "--compressor", "powersgd", "-n", "2", "-w", "1"});
  ASSERT_EQ(doc.at("results").items.size(), 2u);
  const Value& matrix = doc.at("results").items[0];
  const Value& vector = doc.at("results").items[1];
  EXPECT_EQ(matrix.at("shape").text, "256x256");
  EXPECT_EQ(matrix.at("count").number, 65536);
  EXPECT_GT(matrix.at("out_of_place").at("ratio").number, 4.0);
  EXPECT_DOUBLE_EQ(vector.at("out_of_place").at("ratio").number, 1.0);
  EXPECT_EQ(doc.at("out_of_bounds").at("count").number, 0);
  EXPECT_NE(last_.out.find("# shape 256x256: 1 tensor of 65536 elements"), std::string::npos) << last_.out;
}

TEST_F(ShoalBench, ShapeResNet50IsOneRowOfItsTensors) {
  Value doc = bench({"--shape", "resnet50", "-n", "1", "-w", "0", "-c", "0"});
  ASSERT_EQ(doc.at("results").items.size(), 1u);
  const Value& row = doc.at("results").items[0];
  EXPECT_EQ(row.at("tensors").number, 161);
  EXPECT_EQ(row.at("count").number, 25557032);
  EXPECT_EQ(row.at("size").number, 4.0 * 25557032);
  EXPECT_EQ(row.at("out_of_place").at("nwrong").kind, Value::Kind::Null);  // -c 0: not checked
}

// With a compressor, busbw is the effective (uncompressed) figure, labelled, and the payload's
// bandwidth is reported beside it.
TEST_F(ShoalBench, CompressorReportsEffectiveAndPayloadBandwidth) {
  Value doc = bench({"-b", "1M", "-e", "1M", "-n", "2", "-w", "1", "--compressor", "topk", "--copts", "ratio=0.01"});
  const Value& r = doc.at("results").items.at(0).at("out_of_place");
  EXPECT_GT(r.at("ratio").number, 10);
  EXPECT_NEAR(r.at("bus_bw").number, 1048576 / 1e3 / r.at("time").number, 1e-4);  // uncompressed bytes
  EXPECT_LT(r.at("payload_bus_bw").number, r.at("bus_bw").number / 10);
  EXPECT_NE(last_.out.find("Avg bus bandwidth    : "), std::string::npos);
  EXPECT_NE(last_.out.find("(effective: uncompressed bytes over the time)"), std::string::npos) << last_.out;
  EXPECT_NE(last_.out.find("Avg payload bus bandwidth"), std::string::npos) << last_.out;
}

TEST_F(ShoalBench, VersionsOfBothTools) {
  Outcome bench = run("shoal-bench", {"--version"});
  EXPECT_EQ(bench.exitCode, 0);
  EXPECT_TRUE(std::regex_search(bench.out, std::regex("^shoal-bench \\d+\\.\\d+\\.\\d+ .*running libshoal \\d+\\.\\d+\\.\\d+")))
      << bench.out;
  Outcome shoalrun = run("shoalrun", {"--version"});
  EXPECT_EQ(shoalrun.exitCode, 0);
  EXPECT_TRUE(std::regex_search(shoalrun.out, std::regex("^shoalrun \\d+\\.\\d+\\.\\d+ \\(libshoal \\d+\\.\\d+\\.\\d+\\)")))
      << shoalrun.out;
  // The srun and mpirun examples pass the token through the environment, never as a value.
  Outcome help = run("shoalrun", {"--help"});
  EXPECT_NE(help.out.find("-x SHOAL_TOKEN prog"), std::string::npos) << help.out;
  EXPECT_NE(help.out.find("srun -n 16 prog"), std::string::npos) << help.out;
  EXPECT_EQ(help.out.find("SHOAL_TOKEN=<"), std::string::npos) << help.out;
}

// A program of blocking calls only (shoal-bench) writes a timeline: one BLOCKING_CALL event per
// call, and SHOAL_LOG_LEVEL=info prints each rank's summary exactly once.
TEST_F(ShoalBench, TimelineAndInfoSummaryOfABlockingProgram) {
  const std::string timeline = (dir_ / "trace.json").string();
  bench({"-b", "4K", "-e", "4K", "-n", "3", "-w", "1", "-c", "1"},
        {{"SHOAL_TIMELINE", timeline}, {"SHOAL_LOG_LEVEL", "info"}});
  Value trace;
  try {
    trace = shoal::test::json::parse(readWholeFile(timeline));
  } catch (const std::exception& error) {
    FAIL() << "the timeline is not JSON: " << error.what() << "\n" << readWholeFile(timeline).substr(0, 1000);
  }
  std::map<std::string, int> calls;
  for (const Value& event : trace.items)
    if (event.at("ph").text == "X" && event.at("name").text == "BLOCKING_CALL") ++calls[event.at("args").at("call").text];
  // Per mode: 1 warm-up + 3 timed + 1 checked allreduce_tensor calls, twice.
  EXPECT_GE(calls["shoal_allreduce_tensor"], 10) << readWholeFile(timeline).substr(0, 2000);
  EXPECT_GE(calls["shoal_barrier"], 2);
  for (int rank = 0; rank < 2; ++rank) {
    const std::regex summary("\\[" + std::to_string(rank) + "\\] shoal INFO \\[pid \\d+\\] rank " +
                             std::to_string(rank) + ": shoal \\d+\\.\\d+\\.\\d+ ");
    const auto n = std::distance(std::sregex_iterator(last_.err.begin(), last_.err.end(), summary), std::sregex_iterator());
    EXPECT_EQ(n, 1) << last_.err;
  }
  EXPECT_NE(last_.err.find("peer 1 via ucx shared memory"), std::string::npos) << last_.err;
}

// --memory cuda takes every collective (each has a CUDA tensor form in the C API) and refuses
// the bitwise ops of reduce and reduce_scatter (NCCL has none) in the options (exit 2, the
// reason, before any communicator). Accepted ones then need a CUDA build and a device: here
// (one rank, no launcher) they either run (a device: every checked element right, exit 0) or
// stop with the runtime's --memory cuda reason (exit 1), never with a usage error. tests/cuda/test_shoal_bench_cuda.cc runs them on a device.
TEST_F(ShoalBench, MemoryCudaTakesEveryCollectiveWithACudaForm) {
  const std::map<std::string, std::string> oneRank{
      {"SHOAL_RANK", "0"}, {"SHOAL_WORLD_SIZE", "1"}, {"SHOAL_STORE", "memory://shoal-bench-cuda-options"}};
  const std::vector<std::string> sweep{"-b", "64", "-e", "64", "-n", "1", "-w", "0", "-c", "1", "--memory", "cuda"};
  auto benchOf = [&](std::vector<std::string> args) {
    args.insert(args.end(), sweep.begin(), sweep.end());
    return run("shoal-bench", args, oneRank);
  };
  Outcome refused = benchOf({"reduce_scatter", "-d", "int32", "-o", "bxor"});
  EXPECT_EQ(refused.exitCode, 2) << refused.err;
  EXPECT_NE(refused.err.find("--memory cuda: reduce_scatter on CUDA memory is ncclReduceScatter, which has no band, "
                             "bor or bxor"),
            std::string::npos)
      << refused.err;
  refused = benchOf({"reduce", "-d", "int32", "-o", "bor"});
  EXPECT_EQ(refused.exitCode, 2) << refused.err;
  EXPECT_NE(refused.err.find("ncclReduce, which has no band, bor or bxor"), std::string::npos) << refused.err;

  const std::vector<std::vector<std::string>> takes = {
      {"allreduce"}, {"allgather"}, {"broadcast"}, {"reduce_scatter"}, {"reduce_scatter", "-o", "max"},
      {"alltoall"},  {"sendrecv"},  {"reduce"},    {"gather"},         {"scatter"}};
  for (const std::vector<std::string>& args : takes) {
    const std::string coll = args[0];
    const Outcome accepted = benchOf(args);
    EXPECT_NE(accepted.exitCode, 2) << coll << ": refused as a usage error\n" << accepted.err;
    if (accepted.exitCode == 0) continue;  // ran on a device, every element right
    EXPECT_EQ(accepted.exitCode, 1) << coll << "\n" << accepted.err;
    EXPECT_NE(accepted.err.find("--memory cuda: "), std::string::npos) << coll << "\n" << accepted.err;
    EXPECT_EQ(accepted.err.find("shoal-bench -h"), std::string::npos) << coll << "\n" << accepted.err;
  }
}

}  // namespace
