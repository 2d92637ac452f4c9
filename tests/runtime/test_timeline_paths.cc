// SHOAL_TIMELINE with two communicators alive in one process: the first
// writes the path, the second path.1.json, each a closed JSON array; once
// the first is gone, a new communicator writes the path again.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "harness/harness.h"
#include "harness/rank_sync.h"
#include "runtime/async_helpers.h"
#include "shoal/shoal.h"

namespace shoal::test {
namespace {

std::string readFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

bool closedArray(const std::string& text) {
  return text.size() > 4 && text.front() == '[' && text.compare(text.size() - 2, 2, "]\n") == 0;
}

TEST(Timeline, EveryLiveCommunicatorWritesItsOwnFile) {
  const auto dir = std::filesystem::temp_directory_path();
  const std::string stem = "shoal_timeline_paths_" + std::to_string(getpid());
  const std::string first = (dir / (stem + ".json")).string(), second = (dir / (stem + ".1.json")).string();
  std::filesystem::remove(first);
  std::filesystem::remove(second);
  ScopedEnv env{{"SHOAL_TIMELINE", first}};
  runRanks(1, [&](int, shoal_comm_t outer) {
    ASSERT_TRUE(callOk(shoal_async_start(outer), outer, "outer start"));
    runRanks(1, [&](int, shoal_comm_t inner) {
      ASSERT_TRUE(callOk(shoal_async_start(inner), inner, "inner start"));
      float x = 1;
      ASSERT_TRUE(callOk(shoal_allreduce(inner, &x, &x, 1, SHOAL_F32, SHOAL_SUM), inner, "inner allreduce"));
    });
    float y = 2;
    ASSERT_TRUE(callOk(shoal_allreduce(outer, &y, &y, 1, SHOAL_F32, SHOAL_SUM), outer, "outer allreduce"));
  });
  const std::string a = readFile(first), b = readFile(second);
  EXPECT_TRUE(closedArray(a)) << a;
  EXPECT_TRUE(closedArray(b)) << b;
  EXPECT_NE(a.find("shoal_allreduce"), std::string::npos) << a;
  EXPECT_NE(b.find("shoal_allreduce"), std::string::npos) << b;
  // Both closed: the next communicator writes the path itself again.
  std::filesystem::remove(first);
  runRanks(1, [&](int, shoal_comm_t comm) { ASSERT_TRUE(callOk(shoal_async_start(comm), comm, "start")); });
  EXPECT_TRUE(closedArray(readFile(first)));
  std::filesystem::remove(first);
  std::filesystem::remove(second);
}

}  // namespace
}  // namespace shoal::test
