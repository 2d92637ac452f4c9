// What the async runtime tells its user: the Chrome-trace timeline (parsed
// as JSON, phases checked per tensor) and stall inspection (the warning names
// the tensors and the missing ranks; SHOAL_STALL_SHUTDOWN_S makes it an error
// on every rank).
#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "harness/harness.h"
#include "harness/rank_sync.h"
#include "runtime/async_helpers.h"
#include "runtime/json_lite.h"
#include "shoal/shoal.h"

namespace shoal::test {
namespace {

constexpr double kWaitS = 60;

std::string readFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

TEST(Timeline, IsValidJsonWithEveryPhasePerTensor) {
  const std::string path =
      (std::filesystem::temp_directory_path() / ("shoal_timeline_" + std::to_string(getpid()) + ".json")).string();
  std::filesystem::remove(path);
  constexpr int kRanks = 3;
  {
    ScopedEnv env{{"SHOAL_TIMELINE", path}, {"SHOAL_CYCLE_TIME_MS", "200"}};
    RankBarrier barrier(kRanks);
    runRanks(kRanks, [&](int rank, shoal_comm_t comm) {
      ASSERT_TRUE(callOk(shoal_async_start(comm), comm, "start"));
      barrier.wait();  // the next cycle is 200 ms away: every submission below lands in it
      std::vector<std::vector<float>> plain(6, std::vector<float>(50, 1.0f)), cast(4, std::vector<float>(64, 2.0f));
      std::vector<float> mine(3, static_cast<float>(rank)), gathered(3 * kRanks), shared(9, 1.0f);
      std::vector<shoal_request_t> requests(12);
      int n = 0;
      for (size_t t = 0; t < plain.size(); ++t) {
        shoal_tensor_t tensor = tensorOf(plain[t].data(), SHOAL_F32, {50});
        std::string name = "plain." + std::to_string(t);
        ASSERT_TRUE(callOk(shoal_iallreduce(comm, name.c_str(), &tensor, &tensor, SHOAL_SUM, nullptr, &requests[n++]), comm, name));
      }
      shoal_async_options_t options = SHOAL_ASYNC_OPTIONS_INIT;
      options.compressor = "fp16";
      options.compress_min_bytes = 0;
      for (size_t t = 0; t < cast.size(); ++t) {
        shoal_tensor_t tensor = tensorOf(cast[t].data(), SHOAL_F32, {8, 8});
        std::string name = "cast." + std::to_string(t);
        ASSERT_TRUE(callOk(shoal_iallreduce(comm, name.c_str(), &tensor, &tensor, SHOAL_AVG, &options, &requests[n++]), comm, name));
      }
      shoal_tensor_t in = tensorOf(mine.data(), SHOAL_F32, {3});
      ASSERT_TRUE(callOk(shoal_iallgather(comm, "gathered", &in, gathered.data(), &requests[n++]), comm, "gather"));
      shoal_tensor_t bcast = tensorOf(shared.data(), SHOAL_F32, {9});
      ASSERT_TRUE(callOk(shoal_ibroadcast(comm, "shared", &bcast, 1, &requests[n++]), comm, "bcast"));
      waitAndFree(requests, kWaitS, "timeline step");
      EXPECT_TRUE(callOk(shoal_barrier(comm), comm, "barrier"));  // a blocking call, run by the engine
      EXPECT_EQ(plain[0][0], 3.0f);
      EXPECT_EQ(cast[0][0], 2.0f);
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
  std::map<int, std::string> rowNames;                   // tid -> tensor
  std::map<std::string, std::set<std::string>> phases;   // tensor -> phases
  std::map<std::string, double> compressedBytes;
  for (const json::Value& event : root.items) {
    ASSERT_EQ(event.kind, json::Value::Kind::Object);
    ASSERT_TRUE(event.has("name") && event.has("ph")) << text.substr(0, 500);
    if (event.at("ph").text == "M" && event.at("name").text == "thread_name")
      rowNames[static_cast<int>(event.at("tid").number)] = event.at("args").at("name").text;
  }
  for (const json::Value& event : root.items) {
    if (event.at("ph").text != "X") continue;
    ASSERT_TRUE(event.has("ts") && event.has("dur") && event.has("tid") && event.has("pid"));
    EXPECT_GE(event.at("ts").number, 0);
    EXPECT_GE(event.at("dur").number, 0);
    const int tid = static_cast<int>(event.at("tid").number);
    ASSERT_TRUE(rowNames.count(tid)) << "an event on a row without a thread_name record";
    const std::string& tensor = rowNames[tid];
    phases[tensor].insert(event.at("name").text);
    if (event.at("name").text == "COMPRESSED_ALLREDUCE") compressedBytes[tensor] = event.at("args").at("bytes").number;
  }
  for (int t = 0; t < 6; ++t) {
    const std::string name = "plain." + std::to_string(t);
    for (const char* phase : {"NEGOTIATE", "QUEUE", "MEMCPY_IN_FUSION", "ALLREDUCE", "MEMCPY_OUT_FUSION"})
      EXPECT_TRUE(phases[name].count(phase)) << name << " lacks " << phase;
  }
  for (int t = 0; t < 4; ++t) {
    const std::string name = "cast." + std::to_string(t);
    for (const char* phase : {"NEGOTIATE", "QUEUE", "ENCODE", "COMPRESSED_ALLREDUCE", "DECODE"})
      EXPECT_TRUE(phases[name].count(phase)) << name << " lacks " << phase;
    // One fp16 payload for the four fused tensors: 4 x 64 halves.
    EXPECT_EQ(compressedBytes[name], 4 * 64 * 2) << name;
  }
  for (const char* phase : {"NEGOTIATE", "QUEUE", "ALLGATHER"}) EXPECT_TRUE(phases["gathered"].count(phase)) << phase;
  for (const char* phase : {"NEGOTIATE", "QUEUE", "BROADCAST"}) EXPECT_TRUE(phases["shared"].count(phase)) << phase;
  EXPECT_TRUE(phases["__shoal_blocking_call"].count("BLOCKING_CALL"));
  std::filesystem::remove(path);
}

TEST(Timeline, AnUnwritablePathIsAnErrorOnEveryRank) {
  ScopedEnv env{{"SHOAL_TIMELINE", "/nonexistent-dir/for/shoal/timeline.json"}};
  runRanks(2, [&](int rank, shoal_comm_t comm) {
    EXPECT_EQ(shoal_async_start(comm), SHOAL_ERR_SYSTEM) << "rank " << rank;
    EXPECT_NE(std::string(shoal_last_error(comm)).find("SHOAL_TIMELINE"), std::string::npos) << shoal_last_error(comm);
  });
}

TEST(Stall, WarningNamesTheTensorsAndTheMissingRanks) {
  ScopedEnv env{{"SHOAL_STALL_CHECK_S", "0.3"}, {"SHOAL_STALL_SHUTDOWN_S", "0"}};
  constexpr int kRanks = 4;
  testing::internal::CaptureStderr();
  runRanks(kRanks, [&](int rank, shoal_comm_t comm) {
    std::vector<float> a(4, 1.0f), b(4, 1.0f);
    shoal_tensor_t ta = tensorOf(a.data(), SHOAL_F32, {4}), tb = tensorOf(b.data(), SHOAL_F32, {4});
    ASSERT_TRUE(callOk(shoal_async_start(comm), comm, "start"));
    // Ranks 1 and 3 submit 1.2 s late: a stall of "late.a" and "late.b" meanwhile.
    if (rank == 1 || rank == 3) std::this_thread::sleep_for(std::chrono::milliseconds(1200));
    std::vector<shoal_request_t> requests(2);
    ASSERT_TRUE(callOk(shoal_iallreduce(comm, "late.a", &ta, &ta, SHOAL_SUM, nullptr, &requests[0]), comm, "a"));
    ASSERT_TRUE(callOk(shoal_iallreduce(comm, "late.b", &tb, &tb, SHOAL_SUM, nullptr, &requests[1]), comm, "b"));
    waitAndFree(requests, kWaitS, "late tensors");
    EXPECT_EQ(a[0], 4.0f);  // a stall warning is only a warning
  });
  const std::string log = testing::internal::GetCapturedStderr();
  EXPECT_NE(log.find("'late.a' (missing ranks 1, 3; submitted by 0, 2;"), std::string::npos) << log;
  EXPECT_NE(log.find("'late.b' (missing ranks 1, 3; submitted by 0, 2;"), std::string::npos) << log;
  EXPECT_NE(log.find("SHOAL_STALL_CHECK_S"), std::string::npos) << log;
}

TEST(Stall, ShutdownTimeMakesItAnErrorOnEveryRank) {
  ScopedEnv env{{"SHOAL_STALL_CHECK_S", "0.2"}, {"SHOAL_STALL_SHUTDOWN_S", "0.6"}};
  constexpr int kRanks = 4;
  RankBarrier barrier(kRanks);
  testing::internal::CaptureStderr();
  const auto start = std::chrono::steady_clock::now();
  runRanks(kRanks, [&](int rank, shoal_comm_t comm) {
    std::vector<float> a(4, 1.0f);
    shoal_tensor_t ta = tensorOf(a.data(), SHOAL_F32, {4});
    ASSERT_TRUE(callOk(shoal_async_start(comm), comm, "start"));
    shoal_request_t request = nullptr;
    if (rank == 0 || rank == 2) {
      ASSERT_TRUE(callOk(shoal_iallreduce(comm, "never.everywhere", &ta, &ta, SHOAL_SUM, nullptr, &request), comm, "a"));
      EXPECT_EQ(shoal_wait(request, kWaitS), SHOAL_ERR_TIMEOUT) << "rank " << rank;
      std::string text = shoal_request_error(request);
      EXPECT_NE(text.find("'never.everywhere' (missing ranks 1, 3; submitted by 0, 2;"), std::string::npos) << text;
      EXPECT_NE(text.find("SHOAL_STALL_SHUTDOWN_S"), std::string::npos) << text;
      shoal_request_free(request);
    }
    barrier.wait();
    // Ranks 1 and 3 never submitted it: their runtime stopped too, with the same reason.
    // (Their engine may still be finishing that cycle: then the request fails instead of the submission.)
    shoal_status_t status = shoal_iallreduce(comm, "afterwards", &ta, &ta, SHOAL_SUM, nullptr, &request);
    std::string text = shoal_last_error(comm);
    if (status == SHOAL_OK) {
      status = shoal_wait(request, kWaitS);
      text = shoal_request_error(request);
      shoal_request_free(request);
    }
    EXPECT_EQ(status, SHOAL_ERR_TIMEOUT) << "rank " << rank;
    EXPECT_NE(text.find("'never.everywhere' (missing ranks 1, 3"), std::string::npos) << text;
    // Blocking calls fail as well (the engine owns the communicator).
    EXPECT_NE(shoal_barrier(comm), SHOAL_OK);
  });
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_LT(seconds, 10) << "the stall should end the runtime soon after SHOAL_STALL_SHUTDOWN_S";
  const std::string log = testing::internal::GetCapturedStderr();
  EXPECT_NE(log.find("'never.everywhere' (missing ranks 1, 3"), std::string::npos) << log;
}

TEST(Stall, ABlockingCallOtherRanksNeverMakeFailsAfterTheTimeout) {
  constexpr int kRanks = 2;
  RankBarrier barrier(kRanks);
  RankOptions options;
  options.timeoutS = 1.5;
  runRanks(kRanks, [&](int rank, shoal_comm_t comm) {
    ASSERT_TRUE(callOk(shoal_async_start(comm), comm, "start"));
    if (rank == 0) {
      const auto start = std::chrono::steady_clock::now();
      shoal_status_t status = shoal_barrier(comm);
      const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      EXPECT_EQ(status, SHOAL_ERR_TIMEOUT);
      EXPECT_NE(std::string(shoal_last_error(comm)).find("blocking call shoal_barrier (missing ranks 1"),
                std::string::npos)
          << shoal_last_error(comm);
      EXPECT_LT(seconds, 8);
    }
    barrier.wait();
  }, options);
}

}  // namespace
}  // namespace shoal::test
