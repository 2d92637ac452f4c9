// The store and the communicator life cycle in real multi-process jobs:
// rank_worker processes (tests/multiproc/rank_worker.cc) started here through
// ForkedJob (tests/harness/forked_job.h), with the rank variables of shoalrun,
// torchrun, MPICH or PMIx.
//  - a flood of idle connections to rank 0's port does not break a job;
//  - 500 create/destroy cycles, two communicators at once, a reused file:// folder;
//  - rank discovery from torchrun's (and its store rule), PMI's and PMIx's variables;
//  - ranks die with shoalrun when it is SIGKILLed, and the port is freed;
//  - UCX of a loopback-only job listens on loopback only.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <random>
#include <regex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "harness/forked_job.h"

namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;
using Env = std::map<std::string, std::string>;

const char kWorker[] = SHOAL_BIN_DIR "/rank_worker";
const char kShoalrun[] = SHOAL_BIN_DIR "/shoalrun";

double since(Clock::time_point start) { return std::chrono::duration<double>(Clock::now() - start).count(); }

int connectLoopback(int port) {
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_port = htons(static_cast<uint16_t>(port));
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(fd, reinterpret_cast<sockaddr*>(&address), sizeof address) != 0) {
    close(fd);
    return -1;
  }
  return fd;
}

// True when nothing listens on the port any more (a bind succeeds).
bool portFree(int port) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  int one = 1;
  setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_port = htons(static_cast<uint16_t>(port));
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  bool free = bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof address) == 0;
  close(fd);
  return free;
}

using shoal::test::freeLoopbackPort;
using Rank = shoal::test::ForkedRank;  // exitCode -1: killed at the test's deadline; 128 + signal for a signal

class StoreJobs : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_EQ(access(kWorker, X_OK), 0) << kWorker << " is missing: build the rank_worker target";
    job_ = std::make_unique<shoal::test::ForkedJob>("store_jobs");  // its folder also holds file:// stores
    dir_ = job_->dir();
    port_ = freeLoopbackPort();
    token_ = std::to_string(std::random_device()()) + std::to_string(std::random_device()());
  }
  void TearDown() override { job_.reset(); }

  // Starts n workers; env(rank) gives each one's variables (on top of a clean launcher environment).
  std::vector<Rank> start(int n, const std::vector<std::string>& args, const std::function<Env(int)>& env) {
    job_->start(n, [&](int rank) {
      Env vars = env(rank);
      for (const char* name : {"SHOAL_RANK", "SHOAL_WORLD_SIZE", "SHOAL_STORE", "SHOAL_TOKEN", "RANK", "WORLD_SIZE",
                               "MASTER_ADDR", "MASTER_PORT", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE",
                               "PMI_RANK", "PMI_SIZE", "PMIX_RANK", "SLURM_PROCID", "SLURM_NTASKS", "SHOAL_ALGO"})
        unsetenv(name);
      setenv("SHOAL_TIMEOUT_S", "30", 1);
      for (auto& [name, value] : vars) setenv(name.c_str(), value.c_str(), 1);
      // The default descriptor limit, whatever this test raised its own to.
      rlimit limit{1024, 1024};
      getrlimit(RLIMIT_NOFILE, &limit);
      limit.rlim_cur = std::min<rlim_t>(limit.rlim_max, 1024);
      setrlimit(RLIMIT_NOFILE, &limit);
      std::vector<char*> argv{const_cast<char*>(kWorker)};
      for (const std::string& arg : args) argv.push_back(const_cast<char*>(arg.c_str()));
      argv.push_back(nullptr);
      execv(kWorker, argv.data());
      return 251;
    });
    return job_->ranks();
  }

  // Waits for the job start() began, at most deadlineS from its start, then kills what is left.
  std::vector<Rank>& finish(std::vector<Rank>& ranks, double deadlineS) {
    ranks = job_->finish(deadlineS);
    return ranks;
  }

  std::vector<Rank> run(int n, const std::vector<std::string>& args, const std::function<Env(int)>& env,
                        double deadlineS = 120) {
    start(n, args, env);
    return job_->finish(deadlineS);
  }

  Env shoalEnv(int rank, int n) const {
    return {{"SHOAL_RANK", std::to_string(rank)}, {"SHOAL_WORLD_SIZE", std::to_string(n)},
            {"SHOAL_STORE", "tcp://127.0.0.1:" + std::to_string(port_)}, {"SHOAL_TOKEN", token_}};
  }

  static std::string describe(const std::vector<Rank>& ranks) { return shoal::test::describe(ranks); }

  static void expectAllOk(const std::vector<Rank>& ranks) {
    for (size_t r = 0; r < ranks.size(); ++r) EXPECT_EQ(ranks[r].exitCode, 0) << "rank " << r << "\n" << describe(ranks);
  }

  std::unique_ptr<shoal::test::ForkedJob> job_;
  fs::path dir_;
  int port_ = -1;
  std::string token_;
};

TEST_F(StoreJobs, FiveHundredCreateDestroyCycles) {
  auto ranks = run(2, {"cycles", "500"}, [&](int r) { return shoalEnv(r, 2); }, 300);
  expectAllOk(ranks);
  for (const Rank& r : ranks) EXPECT_NE(r.output.find("500 cycles succeeded"), std::string::npos) << describe(ranks);
}

TEST_F(StoreJobs, TwoCommunicatorsAliveAtOnce) {
  auto ranks = run(2, {"two-comms"}, [&](int r) { return shoalEnv(r, 2); });
  expectAllOk(ranks);
}

TEST_F(StoreJobs, AReusedFileStoreFolderServesTheNextJob) {
  std::string url = "file://" + (dir_ / "store").string();
  for (int job = 0; job < 3; ++job) {
    auto ranks = run(2, {"cycles", "3"}, [&](int r) {
      return Env{{"SHOAL_RANK", std::to_string(r)}, {"SHOAL_WORLD_SIZE", "2"}, {"SHOAL_STORE", url}};
    });
    expectAllOk(ranks);
    if (HasFailure()) break;
  }
}

TEST_F(StoreJobs, IdleConnectionFloodDoesNotBreakAJob) {
  constexpr int kFlood = 1100;
  rlimit limit{};
  getrlimit(RLIMIT_NOFILE, &limit);
  limit.rlim_cur = std::min<rlim_t>(limit.rlim_max, 4 * kFlood);
  setrlimit(RLIMIT_NOFILE, &limit);
  ASSERT_GE(limit.rlim_cur, rlim_t{kFlood + 100}) << "this test needs more descriptors than the hard limit allows";
  std::vector<Rank> ranks = start(2, {"cycles", "40"}, [&](int r) { return shoalEnv(r, 2); });
  // Flood rank 0's port as soon as it listens, while the job runs (each rank's limit is 1024).
  std::vector<int> flood;
  for (Clock::time_point begin = Clock::now(); flood.empty() && since(begin) < 20;) {
    int fd = connectLoopback(port_);
    if (fd >= 0) flood.push_back(fd);
    else std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  while (!flood.empty() && flood.size() < kFlood) {
    int fd = connectLoopback(port_);
    if (fd < 0) break;
    flood.push_back(fd);
  }
  EXPECT_EQ(flood.size(), size_t{kFlood});
  finish(ranks, 120);
  for (int fd : flood) close(fd);
  expectAllOk(ranks);
  // The server's warnings about the flood are rate-limited.
  size_t warnings = 0;
  for (size_t at = 0; (at = ranks[0].output.find("WARN", at)) != std::string::npos; ++at) ++warnings;
  EXPECT_LE(warnings, 12u) << ranks[0].output;
}

// Liveness checks must not mistake "this process is out of descriptors" for "the peer died".
TEST_F(StoreJobs, DescriptorExhaustionIsNotAPeerDeath) {
  auto ranks = run(2, {"exhaust-fds"}, [&](int r) { return shoalEnv(r, 2); });
  expectAllOk(ranks);
  EXPECT_NE(ranks[0].output.find("Too many open files"), std::string::npos) << describe(ranks);
}

TEST_F(StoreJobs, TorchrunVariablesAndItsStoreRule) {
  auto ranks = run(2, {"success"}, [&](int r) {
    return Env{{"RANK", std::to_string(r)}, {"WORLD_SIZE", "2"}, {"LOCAL_RANK", std::to_string(r)},
               {"LOCAL_WORLD_SIZE", "2"}, {"MASTER_ADDR", "127.0.0.1"}, {"MASTER_PORT", std::to_string(port_ - 1)},
               {"SHOAL_TOKEN", token_}};
  });
  expectAllOk(ranks);
}

TEST_F(StoreJobs, MpichAndPmixVariables) {
  auto pmi = run(2, {"success"}, [&](int r) {
    Env env = shoalEnv(r, 2);
    env.erase("SHOAL_RANK");
    env.erase("SHOAL_WORLD_SIZE");
    env["PMI_RANK"] = std::to_string(r);
    env["PMI_SIZE"] = "2";
    return env;
  });
  expectAllOk(pmi);
  port_ = freeLoopbackPort();
  auto pmix = run(2, {"success"}, [&](int r) {
    Env env = shoalEnv(r, 2);
    env.erase("SHOAL_RANK");
    env.erase("SHOAL_WORLD_SIZE");
    env["PMIX_RANK"] = std::to_string(r);
    env["OMPI_COMM_WORLD_SIZE"] = "2";  // PMIx gives no size; Open MPI's launcher does
    return env;
  });
  expectAllOk(pmix);
}

TEST_F(StoreJobs, AStoreWithoutARankFailsInsteadOfRunningAlone) {
  auto ranks = run(1, {"success"}, [&](int) { return Env{{"WORLD_SIZE", "4"}, {"SHOAL_TOKEN", token_}}; }, 30);
  EXPECT_EQ(ranks[0].exitCode, 2) << describe(ranks);  // rank_worker: init failed
  EXPECT_NE(ranks[0].output.find("refusing to run alone"), std::string::npos) << describe(ranks);
}

// Which local addresses the processes listen on, from /proc/net/tcp{,6} and their descriptors.
std::vector<std::string> listeningAddresses(const std::vector<pid_t>& pids) {
  std::set<std::string> inodes;
  for (pid_t pid : pids) {
    std::error_code ignored;
    for (const auto& entry : fs::directory_iterator("/proc/" + std::to_string(pid) + "/fd", ignored)) {
      std::string target = fs::read_symlink(entry.path(), ignored).string();
      if (target.rfind("socket:[", 0) == 0) inodes.insert(target.substr(8, target.size() - 9));
    }
  }
  std::vector<std::string> found;
  for (const char* table : {"/proc/net/tcp", "/proc/net/tcp6"}) {
    std::ifstream in(table);
    std::string line;
    std::getline(in, line);
    while (std::getline(in, line)) {
      std::istringstream fields(line);
      std::string slot, local, remote, state, queues, timer, retransmits, uid, timeout, inode;
      fields >> slot >> local >> remote >> state >> queues >> timer >> retransmits >> uid >> timeout >> inode;
      if (state == "0A" && inodes.count(inode)) found.push_back(local);  // 0A: LISTEN
    }
  }
  return found;
}

bool isLoopbackHex(const std::string& local) {
  std::string address = local.substr(0, local.find(':'));
  if (address.size() == 8) return address.substr(6, 2) == "7F";  // 127.x.x.x, little-endian
  return address == "00000000000000000000000001000000";         // ::1
}

TEST_F(StoreJobs, ALoopbackJobListensOnLoopbackOnly) {
  std::vector<Rank> ranks = start(2, {"hold"}, [&](int r) { return shoalEnv(r, 2); });
  Clock::time_point begin = Clock::now();
  auto holding = [&] {
    for (size_t r = 0; r < ranks.size(); ++r)
      if (job_->outputSoFar(static_cast<int>(r)).find("holding") == std::string::npos) return false;
    return true;
  };
  while (!holding() && since(begin) < 30) std::this_thread::sleep_for(std::chrono::milliseconds(50));
  ASSERT_TRUE(holding()) << "the ranks did not start";
  std::vector<std::string> listening = listeningAddresses({ranks[0].pid, ranks[1].pid});
  for (Rank& r : ranks) kill(r.pid, SIGKILL);
  finish(ranks, 10);
  EXPECT_FALSE(listening.empty()) << "the store's own listener should show";
  for (const std::string& local : listening) EXPECT_TRUE(isLoopbackHex(local)) << "listens on " << local;
}

TEST_F(StoreJobs, RanksDieWithShoalrunAndFreeThePort) {
  // shoalrun is the job's one child; its ranks' "holding pid P" lines arrive in its output.
  job_->start(1, [&](int) {
    return shoal::test::execProgram(
        {kShoalrun, {"-np", "2", kWorker, "hold"}, {}, {{"SHOAL_STORE", "tcp://127.0.0.1:" + std::to_string(port_)}}});
  });
  const pid_t launcher = job_->ranks()[0].pid;
  std::vector<pid_t> pids;
  std::string text;
  for (Clock::time_point begin = Clock::now(); pids.size() < 2 && since(begin) < 30;) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    text = job_->outputSoFar(0);
    pids.clear();
    std::smatch match;
    for (auto it = text.cbegin(); std::regex_search(it, text.cend(), match, std::regex("holding pid (\\d+)"));
         it = match[0].second)
      pids.push_back(std::stoi(match[1]));
  }
  ASSERT_EQ(pids.size(), 2u) << text;
  EXPECT_FALSE(portFree(port_)) << "rank 0 should be serving the store";
  kill(launcher, SIGKILL);
  job_->finish(10);
  Clock::time_point killed = Clock::now();
  auto alive = [](pid_t pid) {
    std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
    std::string all((std::istreambuf_iterator<char>(stat)), std::istreambuf_iterator<char>());
    size_t paren = all.rfind(')');
    return paren != std::string::npos && all.size() > paren + 2 && all[paren + 2] != 'Z';
  };
  while ((alive(pids[0]) || alive(pids[1]) || !portFree(port_)) && since(killed) < 5)
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  EXPECT_FALSE(alive(pids[0])) << "rank 0 outlived shoalrun";
  EXPECT_FALSE(alive(pids[1])) << "rank 1 outlived shoalrun";
  EXPECT_TRUE(portFree(port_)) << "the store's port is still held";
  for (pid_t pid : pids)
    if (alive(pid)) kill(pid, SIGKILL);  // do not leave orphans behind a failed test
}

}  // namespace
