// A rank killed in the middle of an async step: every pending request on the
// survivors must fail, with text, within the deadline (SHOAL_TIMEOUT_S plus
// slack), and later submissions must fail at once. Ranks are processes forked
// from this test (before it creates any thread) over a tcp store on loopback.
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <numeric>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "harness/forked_job.h"
#include "runtime/async_helpers.h"
#include "shoal/shoal.h"

namespace shoal::test {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

constexpr int kWorld = 3;
constexpr double kTimeoutS = 5;      // SHOAL_TIMEOUT_S of the ranks
constexpr double kReportS = 20;      // survivors must have exited by then
constexpr int kExitSawErrors = 3;    // every pending request failed, later ones too
constexpr int kExitAllSucceeded = 5; // the survivor never noticed
constexpr int kExitPending = 6;      // a request was still pending at the deadline
constexpr int kExitUsage = 2;

// One rank: steps of 40 named tensors in a shuffled order; the victim dies
// after submitting half of step 3's tensors.
int runRank(int rank, const std::string& store, int victim, bool bySignal, bool whileIdle) {
  alarm(static_cast<unsigned>(4 * kTimeoutS + 10));  // a hang ends as SIGALRM (exit 128 + 14)
  shoal_config_t config = SHOAL_CONFIG_INIT;
  config.rank = rank;
  config.world_size = kWorld;
  config.store = store.c_str();
  config.token = "async-failure-test";
  config.timeout_s = kTimeoutS;
  shoal_comm_t comm = nullptr;
  if (shoal_comm_init_config(&config, &comm) != SHOAL_OK) {
    std::printf("rank %d: init failed: %s\n", rank, shoal_last_error(nullptr));
    return kExitUsage;
  }
  constexpr size_t kTensors = 40;
  std::vector<std::vector<float>> data(kTensors, std::vector<float>(5000));
  std::vector<size_t> order(kTensors);
  std::iota(order.begin(), order.end(), 0);
  std::mt19937 random(static_cast<uint32_t>(rank + 1));
  bool refused = false;
  for (int step = 0; step < 50; ++step) {
    std::shuffle(order.begin(), order.end(), random);
    std::vector<shoal_request_t> requests;
    if (whileIdle && step == 3) {  // between steps: every runtime idles, none has a request in flight
      if (rank == victim) {
        std::printf("rank %d: dying on purpose while idle, before step %d\n", rank, step);
        std::fflush(stdout);
        if (bySignal) raise(SIGKILL);
        _exit(9);
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(500));
    }
    for (size_t k = 0; k < kTensors; ++k) {
      if (!whileIdle && rank == victim && step == 3 && k == kTensors / 2) {
        std::printf("rank %d: dying on purpose in step %d\n", rank, step);
        std::fflush(stdout);
        if (bySignal) raise(SIGKILL);
        _exit(9);
      }
      const size_t t = order[k];
      std::fill(data[t].begin(), data[t].end(), static_cast<float>(rank));
      shoal_tensor_t tensor = tensorOf(data[t].data(), SHOAL_F32, {5000});
      std::string name = "grad." + std::to_string(t);
      shoal_request_t request = nullptr;
      if (shoal_iallreduce(comm, name.c_str(), &tensor, &tensor, SHOAL_SUM, nullptr, &request) != SHOAL_OK) {
        std::printf("rank %d: submission refused in step %d: %s\n", rank, step, shoal_last_error(comm));
        refused = true;
        break;
      }
      requests.push_back(request);
    }
    const auto deadline = Clock::now() + std::chrono::duration<double>(3 * kTimeoutS);
    shoal_status_t status = shoal_wait_all(requests.data(), static_cast<int>(requests.size()), 3 * kTimeoutS);
    if (status == SHOAL_OK && requests.size() == kTensors) {
      for (shoal_request_t r : requests) shoal_request_free(r);
      continue;
    }
    // Every request must be complete by now (failed or not); none pending.
    int failed = 0;
    for (shoal_request_t r : requests) {
      int done = 0;
      shoal_status_t one = SHOAL_OK;
      while ((one = shoal_test(r, &done)) == SHOAL_OK && !done && Clock::now() < deadline)
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
      if (!done) {
        std::printf("rank %d: a request was still pending after %g s\n", rank, 3 * kTimeoutS);
        return kExitPending;
      }
      if (one != SHOAL_OK) {
        if (failed++ == 0) std::printf("rank %d: step %d: request failed: %s\n", rank, step, shoal_request_error(r));
      }
      shoal_request_free(r);
    }
    std::vector<float> later(4);
    shoal_tensor_t tensor = tensorOf(later.data(), SHOAL_F32, {4});
    shoal_request_t request = nullptr;
    shoal_status_t again = shoal_iallreduce(comm, "later", &tensor, &tensor, SHOAL_SUM, nullptr, &request);
    if (again == SHOAL_OK) again = shoal_wait(request, 3 * kTimeoutS);
    std::printf("rank %d: %d requests failed; a later one: %s: %s\n", rank, failed, shoal_status_string(again),
                again == SHOAL_OK ? "" : (request ? shoal_request_error(request) : shoal_last_error(comm)));
    std::fflush(stdout);
    shoal_comm_destroy(comm);
    // The runtime may stop before this rank's next submission (while idle,
    // or when this rank lags and its engine already failed a round with the
    // victim's peers): the refusal, with its cause, is then the failure.
    return (failed > 0 || refused) && again != SHOAL_OK ? kExitSawErrors : kExitAllSucceeded;
  }
  shoal_comm_destroy(comm);
  return kExitAllSucceeded;
}

using Outcome = ForkedRank;  // exitCode (128 + signal; -1 killed at the deadline), seconds, output

std::vector<Outcome> runJob(int victim, bool bySignal, bool whileIdle = false) {
  ForkedJob job("async_failure");
  const std::string store = "tcp://127.0.0.1:" + std::to_string(freeLoopbackPort());
  return job.run(kWorld, [&](int rank) { return runRank(rank, store, victim, bySignal, whileIdle); }, 60);
}

class KilledRank : public ::testing::TestWithParam<std::tuple<int, bool>> {};

TEST_P(KilledRank, FailsEveryPendingRequestWithinTheDeadline) {
  const auto [victim, bySignal] = GetParam();
  std::vector<Outcome> outcomes = runJob(victim, bySignal);
  if (std::getenv("SHOAL_TEST_VERBOSE")) std::fprintf(stderr, "%s", describe(outcomes).c_str());
  EXPECT_EQ(outcomes[victim].exitCode, bySignal ? 128 + SIGKILL : 9) << describe(outcomes);
  for (int rank = 0; rank < kWorld; ++rank) {
    if (rank == victim) continue;
    EXPECT_EQ(outcomes[rank].exitCode, kExitSawErrors)
        << "rank " << rank << " (5 = never noticed, 6 = a request stayed pending, 142 = hung)\n" << describe(outcomes);
    EXPECT_LT(outcomes[rank].seconds, kReportS) << describe(outcomes);
    const std::string& output = outcomes[rank].output;
    EXPECT_TRUE(output.find("request failed: ") != std::string::npos ||
                (output.find("submission refused") != std::string::npos &&
                 output.find("rank " + std::to_string(victim) + " (pid") != std::string::npos))
        << describe(outcomes);
  }
}

// A rank killed between steps, while every runtime idles (no round runs, so
// no collective notices): the survivors' engines notice it while they look
// for a peer's round, and the next step fails at once with the cause.
TEST(KilledRankWhileIdle, FailsTheNextStepWithTheCause) {
  std::vector<Outcome> outcomes = runJob(1, true, true);
  if (std::getenv("SHOAL_TEST_VERBOSE")) std::fprintf(stderr, "%s", describe(outcomes).c_str());
  EXPECT_EQ(outcomes[1].exitCode, 128 + SIGKILL) << describe(outcomes);
  for (int rank : {0, 2}) {
    EXPECT_EQ(outcomes[rank].exitCode, kExitSawErrors) << "rank " << rank << "\n" << describe(outcomes);
    EXPECT_LT(outcomes[rank].seconds, kReportS) << describe(outcomes);
    EXPECT_NE(outcomes[rank].output.find("rank 1 (pid "), std::string::npos) << describe(outcomes);
    // Noticed by the idle engine itself, before the step: the submission is refused.
    EXPECT_NE(outcomes[rank].output.find("submission refused in step 3"), std::string::npos) << describe(outcomes);
  }
}

INSTANTIATE_TEST_SUITE_P(Victims, KilledRank,
                         ::testing::Values(std::make_tuple(1, true), std::make_tuple(0, false)),
                         [](const ::testing::TestParamInfo<std::tuple<int, bool>>& info) {
                           return "rank" + std::to_string(std::get<0>(info.param)) +
                                  (std::get<1>(info.param) ? "_sigkill" : "_exit");
                         });

}  // namespace
}  // namespace shoal::test
