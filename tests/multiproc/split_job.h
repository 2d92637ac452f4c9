// Forked ranks over a tcp store on loopback, for the split and hierarchical
// tests (test_split*.cc) and the agreement tests: each rank joins a
// communicator, runs a body and reports its status and text by a file in the
// job's folder (harness/forked_job.h forks, waits and kills).
#pragma once

#include <chrono>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <map>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "harness/forked_job.h"
#include "shoal/shoal.h"

namespace shoal::test {

using Clock = std::chrono::steady_clock;

constexpr double kTimeoutS = 20;
constexpr double kJobDeadlineS = 60;

struct Outcome {
  int status = 1;  // 1 = the rank never reported
  std::string text;
  double seconds = 0;
};

struct ShoalJobOptions {
  double timeoutS = kTimeoutS;          // SHOAL_TIMEOUT_S of the ranks
  double deadlineS = kJobDeadlineS;     // then the job kills what is left
  std::vector<const char*> unset;       // variables removed in every rank before `environment`
};

// Forks n ranks over a fresh tcp store; each runs body and reports its status
// and text through a file. body returns the status to report; it may _exit.
// `environment(rank)` names variables to set in the rank before it joins.
inline std::vector<Outcome> runJob(int n, const std::function<shoal_status_t(int, shoal_comm_t, std::string&)>& body,
                                   const std::function<std::map<std::string, std::string>(int)>& environment = nullptr,
                                   const ShoalJobOptions& options = {}) {
  ForkedJob job("split");
  const std::string store = "tcp://127.0.0.1:" + std::to_string(freeLoopbackPort());
  std::random_device device;
  const std::string token = std::to_string(device()) + std::to_string(device());
  const auto start = Clock::now();
  job.run(n, [&](int rank) {
    for (const char* name : options.unset) unsetenv(name);
    if (environment)
      for (const auto& [name, value] : environment(rank)) setenv(name.c_str(), value.c_str(), 1);
    shoal_config_t config = SHOAL_CONFIG_INIT;
    config.rank = rank;
    config.world_size = n;
    config.store = store.c_str();
    config.token = token.c_str();
    config.timeout_s = options.timeoutS;
    shoal_comm_t comm = nullptr;
    shoal_status_t status = shoal_comm_init_config(&config, &comm);
    std::string text;
    if (status == SHOAL_OK) status = body(rank, comm, text);
    else text = std::string("init: ") + shoal_last_error(nullptr);
    double seconds = std::chrono::duration<double>(Clock::now() - start).count();
    std::ofstream(job.dir() / ("report" + std::to_string(rank))) << static_cast<int>(status) << "\n" << seconds << "\n" << text;
    if (comm) shoal_comm_destroy(comm);
    return 0;
  }, options.deadlineS);
  std::vector<Outcome> outcomes(n);
  for (int rank = 0; rank < n; ++rank) {
    std::ifstream in(job.dir() / ("report" + std::to_string(rank)));
    if (!(in >> outcomes[rank].status >> outcomes[rank].seconds)) continue;
    std::stringstream rest;
    rest << in.rdbuf();
    outcomes[rank].text = rest.str();
  }
  return outcomes;
}

}  // namespace shoal::test
