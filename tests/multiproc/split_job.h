// Forked ranks over a tcp store on loopback, for the split and hierarchical
// tests (test_split*.cc): each rank reports its status and text by a file.
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "shoal/shoal.h"

namespace shoal::test {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

constexpr double kTimeoutS = 20;
constexpr double kJobDeadlineS = 60;

struct Outcome {
  int status = 1;  // 1 = the rank never reported
  std::string text;
  double seconds = 0;
};

inline int freePort() {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t length = sizeof address;
  int port = -1;
  if (bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof address) == 0 &&
      getsockname(fd, reinterpret_cast<sockaddr*>(&address), &length) == 0)
    port = ntohs(address.sin_port);
  close(fd);
  return port;
}

// Forks n ranks over a fresh tcp store; each runs body and reports its status
// and text through a file. body returns the status to report; it may _exit.
// `environment(rank)` names variables to set in the rank before it joins.
inline std::vector<Outcome> runJob(int n, const std::function<shoal_status_t(int, shoal_comm_t, std::string&)>& body,
                                   const std::function<std::map<std::string, std::string>(int)>& environment = nullptr) {
  std::string pattern = (fs::temp_directory_path() / "shoal_split_XXXXXX").string();
  if (mkdtemp(pattern.data()) == nullptr) return {};
  const fs::path dir = pattern;
  const std::string store = "tcp://127.0.0.1:" + std::to_string(freePort());
  std::random_device device;
  const std::string token = std::to_string(device()) + std::to_string(device());
  const auto start = Clock::now();
  std::vector<pid_t> pids(n, -1);
  for (int rank = 0; rank < n; ++rank) {
    pid_t pid = fork();
    if (pid == 0) {
      if (environment)
        for (const auto& [name, value] : environment(rank)) setenv(name.c_str(), value.c_str(), 1);
      shoal_config_t config = SHOAL_CONFIG_INIT;
      config.rank = rank;
      config.world_size = n;
      config.store = store.c_str();
      config.token = token.c_str();
      config.timeout_s = kTimeoutS;
      shoal_comm_t comm = nullptr;
      shoal_status_t status = shoal_comm_init_config(&config, &comm);
      std::string text;
      if (status == SHOAL_OK) status = body(rank, comm, text);
      else text = std::string("init: ") + shoal_last_error(nullptr);
      double seconds = std::chrono::duration<double>(Clock::now() - start).count();
      std::ofstream(dir / std::to_string(rank)) << static_cast<int>(status) << "\n" << seconds << "\n" << text;
      if (comm) shoal_comm_destroy(comm);
      _exit(0);
    }
    pids[rank] = pid;
  }
  for (int rank = 0; rank < n; ++rank) {
    for (;;) {
      int wstatus = 0;
      if (waitpid(pids[rank], &wstatus, WNOHANG) == pids[rank]) break;
      if (Clock::now() - start > std::chrono::duration<double>(kJobDeadlineS)) {
        kill(pids[rank], SIGKILL);
        waitpid(pids[rank], &wstatus, 0);
        break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  }
  std::vector<Outcome> outcomes(n);
  for (int rank = 0; rank < n; ++rank) {
    std::ifstream in(dir / std::to_string(rank));
    if (!(in >> outcomes[rank].status >> outcomes[rank].seconds)) continue;
    std::stringstream rest;
    rest << in.rdbuf();
    outcomes[rank].text = rest.str();
  }
  std::error_code ignored;
  fs::remove_all(dir, ignored);
  return outcomes;
}

}  // namespace shoal::test
