// shoalrun as users see it: the environment each rank gets, prefixed output, fail-fast when a
// rank dies, signal forwarding, and the usage errors. Ranks are small `sh -c` programs.
#include <sched.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <functional>
#include <map>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "harness/forked_job.h"

namespace {

using Clock = std::chrono::steady_clock;
namespace fs = std::filesystem;

const char kShoalrun[] = SHOAL_BIN_DIR "/shoalrun";

struct RunResult {
  int exitCode = -1;    // 128+signal when shoalrun itself died from a signal
  std::string out;
  std::string err;
  double seconds = 0;
};

using shoal::test::readWholeFile;

std::vector<std::string> lines(const std::string& text) {
  std::vector<std::string> result;
  std::stringstream stream(text);
  for (std::string line; std::getline(stream, line);) result.push_back(line);
  return result;
}

class ShoalrunTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string pattern = (fs::temp_directory_path() / "shoalrun_test_XXXXXX").string();
    ASSERT_NE(mkdtemp(pattern.data()), nullptr) << std::strerror(errno);
    dir_ = pattern;
  }

  void TearDown() override {
    std::error_code ignored;
    fs::remove_all(dir_, ignored);
  }

  // Runs shoalrun with `args`, without SHOAL_STORE/SHOAL_TOKEN unless `environment` sets them.
  // `whileRunning` is called with shoalrun's pid once it has started.
  RunResult run(const std::vector<std::string>& args, const std::map<std::string, std::string>& environment = {},
                const std::function<void(pid_t)>& whileRunning = nullptr) {
    shoal::test::Program shoalrun{kShoalrun, args, {"SHOAL_STORE", "SHOAL_TOKEN"}, environment};
    // A hung shoalrun fails the test, not the suite.
    shoal::test::ForkedRank ended = shoal::test::runProgram(shoalrun, 30, SIGKILL, whileRunning);
    if (ended.exitCode == shoal::test::kKilledAtDeadline) ADD_FAILURE() << "shoalrun did not finish within 30 s";
    return RunResult{ended.exitCode, ended.output, ended.errors, ended.seconds};
  }

  // Waits until every file exists (written by ranks once they are running).
  bool waitForFiles(const std::vector<fs::path>& paths, std::chrono::seconds limit = std::chrono::seconds(10)) {
    auto deadline = Clock::now() + limit;
    for (const fs::path& path : paths) {
      while (!fs::exists(path) || fs::file_size(path) == 0) {
        if (Clock::now() > deadline) return false;
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
      }
    }
    return true;
  }

  // Alive means running: a killed sleeper is reparented to init and may stay a zombie until init reaps it.
  static bool isRunning(pid_t pid) {
    if (kill(pid, 0) != 0) return false;
    std::string stat = readWholeFile("/proc/" + std::to_string(pid) + "/stat");
    size_t nameEnd = stat.rfind(')');
    if (nameEnd == std::string::npos || nameEnd + 2 >= stat.size()) return kill(pid, 0) == 0;
    char state = stat[nameEnd + 2];
    return state != 'Z' && state != 'X';
  }

  // The pids the sleeping ranks wrote (pid.<rank>); each must be gone once shoalrun has returned.
  void expectSleepersGone(const std::vector<int>& sleeperRanks) {
    for (int rank : sleeperRanks) {
      fs::path pidFile = dir_ / ("pid." + std::to_string(rank));
      ASSERT_TRUE(fs::exists(pidFile)) << "rank " << rank << " never started its sleeper";
      pid_t sleeper = static_cast<pid_t>(std::stol(readWholeFile(pidFile)));
      // SIGKILL from shoalrun takes effect a moment after shoalrun has reaped the rank itself.
      auto deadline = Clock::now() + std::chrono::seconds(2);
      while (isRunning(sleeper) && Clock::now() < deadline) std::this_thread::sleep_for(std::chrono::milliseconds(10));
      EXPECT_FALSE(isRunning(sleeper)) << "rank " << rank << "'s sleeper (pid " << sleeper << ") survived";
      if (isRunning(sleeper)) kill(sleeper, SIGKILL);
    }
  }

  // A rank body that starts a background `sleep 100` (a child of the rank, so only a process-group
  // kill stops it), records its pid in pid.<rank>, and waits for it.
  std::string sleeperBody() const {
    return "sleep 100 & echo $! > " + (dir_ / "pid.").string() + "$SHOAL_RANK; wait";
  }

  std::string pidFilesOf(const std::vector<int>& ranks) const {
    std::string condition;
    for (int rank : ranks) condition += " [ -s " + (dir_ / ("pid." + std::to_string(rank))).string() + " ] &&";
    return condition + " true";
  }

  fs::path dir_;
};

TEST_F(ShoalrunTest, EachRankGetsItsOwnRankAndTheSharedJobEnvironment) {
  const int worldSize = 4;
  RunResult result = run({"-np", std::to_string(worldSize), "sh", "-c",
                          "echo \"rank=$SHOAL_RANK world=$SHOAL_WORLD_SIZE local=$SHOAL_LOCAL_RANK/$SHOAL_LOCAL_SIZE "
                          "store=$SHOAL_STORE token=$SHOAL_TOKEN\""});
  ASSERT_EQ(result.exitCode, 0) << result.err;

  std::regex pattern(R"(\[(\d+)\] rank=(\d+) world=4 local=(\d+)/4 )"
                     R"(store=(tcp://127\.0\.0\.1:\d+) token=([0-9a-f]{32}))");
  std::set<int> ranksSeen;
  std::set<std::string> stores, tokens;
  for (const std::string& line : lines(result.out)) {
    std::smatch match;
    ASSERT_TRUE(std::regex_match(line, match, pattern)) << "unexpected line: " << line;
    EXPECT_EQ(match[1], match[2]) << "the prefix names the rank: " << line;
    EXPECT_EQ(match[2], match[3]) << "one machine: local rank = rank: " << line;
    ranksSeen.insert(std::stoi(match[2]));
    stores.insert(match[4]);
    tokens.insert(match[5]);
  }
  EXPECT_EQ(ranksSeen, (std::set<int>{0, 1, 2, 3}));
  EXPECT_EQ(stores.size(), 1u) << "every rank must meet at the same store";
  EXPECT_EQ(tokens.size(), 1u) << "every rank must present the same token";
}

TEST_F(ShoalrunTest, KeepsStoreAndTokenAlreadyInTheEnvironment) {
  RunResult result = run({"-np", "2", "--", "sh", "-c", "echo \"$SHOAL_STORE $SHOAL_TOKEN\""},
                         {{"SHOAL_STORE", "tcp://host0:29500"}, {"SHOAL_TOKEN", "given-token"}});
  ASSERT_EQ(result.exitCode, 0) << result.err;
  std::vector<std::string> outLines = lines(result.out);
  std::sort(outLines.begin(), outLines.end());
  EXPECT_EQ(outLines, (std::vector<std::string>{"[0] tcp://host0:29500 given-token",
                                                "[1] tcp://host0:29500 given-token"}));
}

TEST_F(ShoalrunTest, EveryTokenIsFresh) {
  std::string program = "echo $SHOAL_TOKEN";
  RunResult first = run({"-np", "1", "sh", "-c", program});
  RunResult second = run({"-np", "1", "sh", "-c", program});
  ASSERT_EQ(first.exitCode, 0);
  ASSERT_EQ(second.exitCode, 0);
  EXPECT_NE(first.out, second.out);
}

TEST_F(ShoalrunTest, PrefixesStdoutAndStderrSeparatelyIncludingAPartialLastLine) {
  RunResult result = run({"-np", "1", "sh", "-c", "printf 'one\\ntwo\\n\\nlast'; printf 'warn\\nno-newline' >&2"});
  ASSERT_EQ(result.exitCode, 0) << result.err;
  EXPECT_EQ(result.out, "[0] one\n[0] two\n[0] \n[0] last\n");
  EXPECT_EQ(result.err, "[0] warn\n[0] no-newline\n");
}

TEST_F(ShoalrunTest, AllRanksSucceedingExitsZero) {
  RunResult result = run({"-np", "3", "sh", "-c", "exit 0"});
  EXPECT_EQ(result.exitCode, 0) << result.err;
  EXPECT_EQ(result.err, "");
}

TEST_F(ShoalrunTest, ARankExitingNonZeroStopsTheOthersAndGivesItsStatus) {
  // Rank 1 fails only once the other ranks are asleep, so stopping them is what is tested.
  std::string program = "if [ \"$SHOAL_RANK\" = 1 ]; then until" + pidFilesOf({0, 2}) +
                        "; do sleep 0.02; done; echo failing; exit 3; fi; " + sleeperBody();
  RunResult result = run({"-np", "3", "sh", "-c", program});
  EXPECT_EQ(result.exitCode, 3) << result.err;
  EXPECT_LT(result.seconds, 10.0);
  EXPECT_NE(result.err.find("shoalrun: rank 1 exited with status 3"), std::string::npos) << result.err;
  EXPECT_NE(result.out.find("[1] failing\n"), std::string::npos) << result.out;
  expectSleepersGone({0, 2});
}

TEST_F(ShoalrunTest, ARankKilledByASignalStopsTheOthers) {
  std::string program = "if [ \"$SHOAL_RANK\" = 0 ]; then until" + pidFilesOf({1}) +
                        "; do sleep 0.02; done; kill -KILL $$; fi; " + sleeperBody();
  RunResult result = run({"-np", "2", "sh", "-c", program});
  EXPECT_EQ(result.exitCode, 128 + SIGKILL) << result.err;
  EXPECT_LT(result.seconds, 10.0);
  EXPECT_NE(result.err.find("shoalrun: rank 0 killed by signal 9 (SIGKILL)"), std::string::npos) << result.err;
  expectSleepersGone({1});
}

TEST_F(ShoalrunTest, RanksIgnoringSigtermAreKilledAfterTheGracePeriod) {
  std::string program = "trap '' TERM; if [ \"$SHOAL_RANK\" = 1 ]; then until" + pidFilesOf({0}) +
                        "; do sleep 0.02; done; exit 4; fi; " + sleeperBody();
  RunResult result = run({"-np", "2", "sh", "-c", program});
  EXPECT_EQ(result.exitCode, 4) << result.err;
  EXPECT_LT(result.seconds, 10.0);
  expectSleepersGone({0});
}

TEST_F(ShoalrunTest, ForwardsSigtermToTheRanks) {
  std::vector<fs::path> pidFiles{dir_ / "pid.0", dir_ / "pid.1"};
  RunResult result = run({"-np", "2", "sh", "-c", sleeperBody()}, {}, [&](pid_t shoalrun) {
    ASSERT_TRUE(waitForFiles(pidFiles)) << "the ranks did not start";
    kill(shoalrun, SIGTERM);
  });
  EXPECT_EQ(result.exitCode, 128 + SIGTERM) << result.err;
  EXPECT_LT(result.seconds, 10.0);
  expectSleepersGone({0, 1});
}

TEST_F(ShoalrunTest, JobTimeoutStopsTheRanks) {
  RunResult result = run({"-np", "2", "--timeout-s", "0.5", "sh", "-c", sleeperBody()});
  EXPECT_EQ(result.exitCode, 124) << result.err;
  EXPECT_LT(result.seconds, 10.0);
  EXPECT_NE(result.err.find("--timeout-s"), std::string::npos) << result.err;
  expectSleepersGone({0, 1});
}

TEST_F(ShoalrunTest, AProgramThatCannotRunFailsWithTheReason) {
  RunResult result = run({"-np", "2", "/nonexistent/shoal-program", "arg"});
  EXPECT_NE(result.exitCode, 0);
  EXPECT_NE(result.err.find("shoalrun: cannot run '/nonexistent/shoal-program': No such file or directory"),
            std::string::npos)
      << result.err;
  EXPECT_LT(result.seconds, 10.0);
}

TEST_F(ShoalrunTest, BadArgumentsAreUsageErrors) {
  const std::vector<std::vector<std::string>> badArguments = {
      {},
      {"sh", "-c", "true"},            // no -np
      {"-np", "0", "true"},
      {"-np", "-2", "true"},
      {"-np", "two", "true"},
      {"-np"},
      {"-np", "2"},                    // no program
      {"-np", "2", "--"},
      {"--no-such-option", "-np", "2", "true"},
      {"--markdown"},
      {"-np", "2", "--timeout-s", "soon", "true"},
      {"-np", "2", "--bind-to", "sockets", "true"},
      {"-np", "2", "--bind-to"},
  };
  for (const auto& args : badArguments) {
    std::string joined;
    for (const std::string& arg : args) joined += " " + arg;
    RunResult result = run(args);
    EXPECT_EQ(result.exitCode, 2) << "shoalrun" << joined;
    EXPECT_NE(result.err.find("usage: shoalrun"), std::string::npos) << "shoalrun" << joined << ": " << result.err;
  }
}

// Each rank's allowed CPUs as the kernel reports them ("[rank] 0-1").
std::map<int, std::string> cpusOfRanks(const std::string& out) {
  std::map<int, std::string> cpus;
  std::regex pattern(R"(\[(\d+)\] Cpus_allowed_list:\s*(\S+))");
  for (const std::string& line : lines(out)) {
    std::smatch match;
    if (std::regex_match(line, match, pattern)) cpus[std::stoi(match[1])] = match[2];
  }
  return cpus;
}

TEST_F(ShoalrunTest, RanksNoMoreThanCpusGetDisjointCpusUnlessBindToNone) {
  cpu_set_t allowed;
  ASSERT_EQ(sched_getaffinity(0, sizeof(allowed), &allowed), 0);
  const int cpus = CPU_COUNT(&allowed);
  const std::vector<std::string> show = {"sh", "-c", "grep Cpus_allowed_list /proc/self/status"};
  auto withRanks = [&](int ranks, std::vector<std::string> options) {
    std::vector<std::string> args = {"-np", std::to_string(ranks)};
    args.insert(args.end(), options.begin(), options.end());
    args.insert(args.end(), show.begin(), show.end());
    return args;
  };
  if (cpus >= 2) {
    RunResult bound = run(withRanks(2, {}));
    ASSERT_EQ(bound.exitCode, 0) << bound.err;
    std::map<int, std::string> cpusOf = cpusOfRanks(bound.out);
    ASSERT_EQ(cpusOf.size(), 2u) << bound.out;
    EXPECT_NE(cpusOf[0], cpusOf[1]) << "two ranks on " << cpus << " CPUs must not share them: " << bound.out;
  }
  // More ranks than CPUs, or --bind-to none: every rank keeps shoalrun's own CPUs.
  for (const auto& args : {withRanks(cpus + 1, {}), withRanks(2, {"--bind-to", "none"})}) {
    RunResult unbound = run(args);
    ASSERT_EQ(unbound.exitCode, 0) << unbound.err;
    std::map<int, std::string> cpusOf = cpusOfRanks(unbound.out);
    ASSERT_FALSE(cpusOf.empty()) << unbound.out;
    for (const auto& [rank, list] : cpusOf) EXPECT_EQ(list, cpusOf.begin()->second) << unbound.out;
    EXPECT_EQ(CPU_COUNT(&allowed), cpus);
  }
}

TEST_F(ShoalrunTest, HelpMentionsLaunchingBeyondOneMachine) {
  RunResult result = run({"--help"});
  EXPECT_EQ(result.exitCode, 0);
  EXPECT_NE(result.out.find("usage: shoalrun -np N"), std::string::npos);
  EXPECT_NE(result.out.find("mpirun"), std::string::npos);
  // The token travels in the environment (-x NAME), never as a value on a command line.
  EXPECT_NE(result.out.find("-x SHOAL_STORE -x SHOAL_TOKEN"), std::string::npos) << result.out;
}

TEST_F(ShoalrunTest, PrintConfigListsTheVariables) {
  RunResult plain = run({"--print-config"});
  EXPECT_EQ(plain.exitCode, 0) << plain.err;
  EXPECT_NE(plain.out.find("SHOAL_TIMEOUT_S"), std::string::npos) << plain.out;
  EXPECT_NE(plain.out.find("SHOAL_STORE"), std::string::npos) << plain.out;

  RunResult markdown = run({"--print-config", "--markdown"});
  EXPECT_EQ(markdown.exitCode, 0) << markdown.err;
  EXPECT_NE(markdown.out.find("| `SHOAL_TIMEOUT_S` |"), std::string::npos) << markdown.out;
}

TEST_F(ShoalrunTest, ListCompressorsRuns) {
  RunResult result = run({"--list-compressors"});
  EXPECT_EQ(result.exitCode, 0) << result.err;
  EXPECT_NE(result.out.find("compressors:"), std::string::npos) << result.out;
}

}  // namespace
