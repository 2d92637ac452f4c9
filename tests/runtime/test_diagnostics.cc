// Diagnostics of blocking calls (issue 13.7, 13.8): SHOAL_LOG_LEVEL=info prints the
// communicator summary once per communicator on every rank, debug adds one line per call
// (bytes, algorithm, compressor decision), and SHOAL_TIMELINE records blocking calls with or
// without the async runtime, each exactly once.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include "harness/harness.h"
#include "runtime/async_helpers.h"
#include "runtime/json_lite.h"
#include "shoal/shoal.h"

namespace {

using namespace shoal::test;

// The level is read once per process, at the first log line: set before any test runs.
const bool kDebugLogging = setenv("SHOAL_LOG_LEVEL", "debug", 1) == 0;

bool callOk(shoal_status_t status, shoal_comm_t comm, const std::string& what) {
  if (status == SHOAL_OK) return true;
  ADD_FAILURE() << what << ": " << shoal_status_string(status) << ": " << shoal_last_error(comm);
  return false;
}

std::string readFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

int countMatches(const std::string& text, const std::string& pattern) {
  const std::regex re(pattern);
  return static_cast<int>(std::distance(std::sregex_iterator(text.begin(), text.end(), re), std::sregex_iterator()));
}

// One plain and one fp16-compressed allreduce of 1024 floats, and a broadcast.
void someCalls(int rank, shoal_comm_t comm) {
  std::vector<float> values(1024, static_cast<float>(rank + 1));
  ASSERT_TRUE(callOk(shoal_allreduce(comm, values.data(), values.data(), values.size(), SHOAL_F32, SHOAL_SUM), comm,
                     "allreduce"));
  EXPECT_EQ(values[0], 3.0f);
  shoal_allreduce_options_t options = SHOAL_ALLREDUCE_OPTIONS_INIT;
  options.compressor = "fp16";
  options.compress_min_bytes = 0;
  shoal_tensor_t tensor = shoal_tensor_1d(values.data(), values.size(), SHOAL_F32);
  ASSERT_TRUE(callOk(shoal_allreduce_tensor(comm, &tensor, &tensor, SHOAL_SUM, &options), comm, "fp16 allreduce"));
  EXPECT_EQ(values[0], 6.0f);
  ASSERT_TRUE(callOk(shoal_broadcast(comm, values.data(), values.data(), values.size(), SHOAL_F32, 1), comm, "bcast"));
}

TEST(LogLevels, InfoOncePerCommunicatorDebugOncePerCall) {
  ASSERT_TRUE(kDebugLogging);
  testing::internal::CaptureStderr();
  for (int communicator = 0; communicator < 2; ++communicator) runRanks(2, someCalls);
  const std::string err = testing::internal::GetCapturedStderr();
  for (int rank = 0; rank < 2; ++rank) {
    const std::string me = "INFO \\[pid \\d+\\] rank " + std::to_string(rank) + ": ";
    EXPECT_EQ(countMatches(err, me + "shoal \\d+\\.\\d+\\.\\d+ \\(library version code \\d+\\), rank " +
                                    std::to_string(rank) + " of 2 on host "),
              2)
        << err;
    // Ranks that are threads of one process share a host: small allreduces take the shared segment.
    EXPECT_EQ(countMatches(err, me + "allreduce algorithm auto: shared memory up to 262144 bytes \\(SHOAL_SHM_MAX_BYTES\\), "
                                     "then recursive doubling up to 65536 bytes"),
              2)
        << err;
    EXPECT_EQ(countMatches(err, me + "compressor none \\(SHOAL_COMPRESSOR\\)"), 2) << err;
    EXPECT_EQ(countMatches(err, me + "peer " + std::to_string(1 - rank) + " via ucx \\S+"), 2) << err;
    const std::string debug = "DEBUG \\[pid \\d+\\] rank " + std::to_string(rank) + ": ";
    EXPECT_EQ(countMatches(err, debug + "shoal_allreduce done: 4096 bytes, algorithm shm, uncompressed, "), 2)
        << err;
    EXPECT_EQ(countMatches(err, debug + "shoal_allreduce_tensor done: 4096 bytes, algorithm compressed, compressor "
                                        "fp16: 4096 -> 2048 payload bytes in 1 round \\(ratio 0\\.500\\)"),
              2)
        << err;
    EXPECT_EQ(countMatches(err, debug + "shoal_broadcast done: sent \\d+ bytes"), 2) << err;
  }
  // Same-process peers reach each other over shared memory.
  EXPECT_EQ(countMatches(err, "peer \\d via ucx shared memory"), 4) << err;
}

// SHOAL_SHM_MAX_BYTES=auto (the default) sizes the shared slot by the rank
// count: 256 KiB at 2 ranks, 2 MiB at 3 and more (the segment's reduce-scatter
// form beats the ring there). A 1 MiB allreduce then takes the segment at 3
// ranks, exact, and the ring at 2; an explicit value still wins.
void oneMebibyteAllreduce(int rank, shoal_comm_t comm) {
  std::vector<float> values(1 << 18, static_cast<float>(rank + 1));
  ASSERT_TRUE(callOk(shoal_allreduce(comm, values.data(), values.data(), values.size(), SHOAL_F32, SHOAL_SUM), comm,
                     "1 MiB allreduce"));
  int size = 0;
  ASSERT_EQ(shoal_comm_size(comm, &size), SHOAL_OK);
  const float expected = static_cast<float>(size * (size + 1) / 2);
  for (float value : values) ASSERT_EQ(value, expected);
}

std::string logOf(int ranks, const char* shmMaxBytes) {
  ScopedEnv env{{"SHOAL_SHM_MAX_BYTES", shmMaxBytes}};
  testing::internal::CaptureStderr();
  runRanks(ranks, oneMebibyteAllreduce);
  return testing::internal::GetCapturedStderr();
}

TEST(SharedSlot, AutoSizesTheSlotByRankCount) {
  ASSERT_TRUE(kDebugLogging);
  const std::string done = "shoal_allreduce done: 1048576 bytes, algorithm ";
  std::string err = logOf(3, "auto");
  EXPECT_EQ(countMatches(err, "shared memory up to 2097152 bytes \\(SHOAL_SHM_MAX_BYTES\\)"), 3) << err;
  EXPECT_EQ(countMatches(err, done + "shm,"), 3) << err;
  err = logOf(2, "auto");
  EXPECT_EQ(countMatches(err, "shared memory up to 262144 bytes \\(SHOAL_SHM_MAX_BYTES\\)"), 2) << err;
  EXPECT_EQ(countMatches(err, done + "ring,"), 2) << err;
  err = logOf(3, "262144");
  EXPECT_EQ(countMatches(err, "shared memory up to 262144 bytes \\(SHOAL_SHM_MAX_BYTES\\)"), 3) << err;
  EXPECT_EQ(countMatches(err, done + "ring,"), 3) << err;
}

TEST(LogLevels, DebugOneLinePerAsyncRequest) {
  testing::internal::CaptureStderr();
  runRanks(2, [](int rank, shoal_comm_t comm) {
    std::vector<float> values(1024, static_cast<float>(rank + 1));
    shoal_tensor_t tensor = shoal_tensor_1d(values.data(), values.size(), SHOAL_F32);
    shoal_request_t request = nullptr;
    ASSERT_TRUE(callOk(shoal_iallreduce(comm, "grad.w", &tensor, &tensor, SHOAL_SUM, nullptr, &request), comm, "iar"));
    EXPECT_TRUE(callOk(shoal_wait(request, 0), comm, "wait"));
    shoal_request_free(request);
    EXPECT_EQ(values[0], 3.0f);
  });
  const std::string err = testing::internal::GetCapturedStderr();
  for (int rank = 0; rank < 2; ++rank)
    EXPECT_EQ(countMatches(err, "DEBUG \\[pid \\d+\\] rank " + std::to_string(rank) +
                                    ": async allreduce 'grad.w' done: 4096 bytes, algorithm shm, uncompressed\n"),
              1)
        << err;
}

TEST(Timeline, RecordsBlockingCallsOnceWithAndWithoutTheRuntime) {
  const std::string path =
      (std::filesystem::temp_directory_path() / ("shoal_blocking_timeline_" + std::to_string(getpid()) + ".json"))
          .string();
  std::filesystem::remove(path);
  {
    ScopedEnv env{{"SHOAL_TIMELINE", path}};
    runRanks(2, [](int rank, shoal_comm_t comm) {
      someCalls(rank, comm);  // no async runtime yet: blocking calls run directly
      ASSERT_TRUE(callOk(shoal_async_start(comm), comm, "start"));
      std::vector<float> values(256, 1.0f);  // routed through the engine now
      ASSERT_TRUE(callOk(shoal_allreduce(comm, values.data(), values.data(), values.size(), SHOAL_F32, SHOAL_SUM),
                         comm, "allreduce after start"));
    });
  }
  ASSERT_TRUE(std::filesystem::exists(path)) << "rank 0 should have written " << path;
  const std::string text = readFile(path);
  json::Value root;
  try {
    root = json::parse(text);
  } catch (const std::exception& error) {
    FAIL() << error.what() << "\n" << text.substr(0, 2000);
  }
  ASSERT_EQ(root.kind, json::Value::Kind::Array);
  std::vector<std::pair<std::string, double>> calls;  // (call, bytes or -1), in file order
  for (const json::Value& event : root.items)
    if (event.at("ph").text == "X" && event.at("name").text == "BLOCKING_CALL") {
      const json::Value& args = event.at("args");
      calls.push_back({args.at("call").text, args.has("bytes") ? args.at("bytes").number : -1});
      EXPECT_EQ(args.at("ok").kind, json::Value::Kind::Bool) << text.substr(0, 2000);
    }
  const std::vector<std::pair<std::string, double>> expected = {
      {"shoal_allreduce", 4096}, {"shoal_allreduce_tensor", 4096}, {"shoal_broadcast", -1}, {"shoal_allreduce", 1024}};
  EXPECT_EQ(calls, expected) << text.substr(0, 3000);
  std::filesystem::remove(path);
}

}  // namespace
