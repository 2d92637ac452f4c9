// Exiting without shoal_comm_destroy: a program that returns from main while
// its communicator's async runtime runs must still exit 0 (issue 13.5: the
// engine thread used to keep running collectives while exit() destroyed the
// library's static tables, and died with SIGSEGV).
//
// This executable is both the test and the program under test: started by
// shoalrun with SHOAL_EXIT_TEST_MODE set, main() runs one rank of that mode
// and returns without destroying anything; otherwise it runs the tests, which
// start `shoalrun -np 4 <this executable>` several times.
#include <signal.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "harness/forked_job.h"
#include "shoal/shoal.h"

namespace {

namespace fs = std::filesystem;

const char kShoalrun[] = SHOAL_BIN_DIR "/shoalrun";
const char kModeVariable[] = "SHOAL_EXIT_TEST_MODE";

// ---- The program under test (one rank) ----

int failed(const char* what, shoal_comm_t comm) {
  std::fprintf(stderr, "%s failed: %s\n", what, shoal_last_error(comm));
  return 3;
}

// "return" and "pending" start the async runtime, run blocking and async
// allreduces, and return from main with the communicator alive; "pending"
// also leaves one async request unwaited, as a program that breaks out of its
// loop would. "blocking" never starts the runtime (the tcp store's thread
// still sees its peers leave during exit).
int rankMain(const std::string& mode) {
  shoal_comm_t comm = nullptr;
  if (shoal_comm_init(&comm) != SHOAL_OK) return failed("shoal_comm_init", nullptr);
  if (mode == "blocking") {
    std::vector<float> values(4096, 1.0f);
    for (int step = 0; step < 5; ++step)
      if (shoal_allreduce(comm, values.data(), values.data(), values.size(), SHOAL_F32, SHOAL_SUM) != SHOAL_OK)
        return failed("shoal_allreduce", comm);
    return 0;
  }
  if (shoal_async_start(comm) != SHOAL_OK) return failed("shoal_async_start", comm);
  // Leaked on purpose: a request left pending may still use it during exit.
  std::vector<float>& values = *new std::vector<float>(4096, 1.0f);
  shoal_tensor_t tensor;
  shoal_tensor_init(&tensor, values.data(), values.size(), SHOAL_F32);
  for (int step = 0; step < 5; ++step) {
    if (shoal_allreduce(comm, values.data(), values.data(), values.size(), SHOAL_F32, SHOAL_SUM) != SHOAL_OK)
      return failed("shoal_allreduce", comm);
    shoal_request_t request = nullptr;
    if (shoal_iallreduce(comm, "grad", &tensor, &tensor, SHOAL_AVG, nullptr, &request) != SHOAL_OK)
      return failed("shoal_iallreduce", comm);
    if (shoal_wait(request, 0) != SHOAL_OK) return failed("shoal_wait", comm);
    shoal_request_free(request);
  }
  if (mode == "pending") {
    shoal_request_t request = nullptr;
    // A faster rank may have returned from main already, and its exit finalized the communicator:
    // then this request is refused (SHOAL_ERR_REMOTE, saying so), which a program that never waits
    // for it may ignore. Any other failure still fails the rank.
    const shoal_status_t status =
        shoal_iallreduce(comm, "left-pending", &tensor, &tensor, SHOAL_SUM, nullptr, &request);
    const bool peerFinalized =
        status == SHOAL_ERR_REMOTE && std::strstr(shoal_last_error(comm), "finalized its communicator") != nullptr;
    if (status != SHOAL_OK && !peerFinalized) return failed("shoal_iallreduce", comm);
  } else if (mode != "return") {
    std::fprintf(stderr, "unknown %s '%s'\n", kModeVariable, mode.c_str());
    return 2;
  }
  return 0;  // no shoal_comm_destroy: exit() must stop the runtime itself
}

// ---- The tests ----

struct Outcome {
  int exitCode = -1;  // 128 + signal when shoalrun died from one
  std::string err;
};

// `shoalrun -np <ranks> <this executable>` in the given mode, bounded by 60 s
// (then SIGTERM, which shoalrun forwards to the ranks).
Outcome launch(int ranks, const std::string& mode) {
  const std::string self = fs::read_symlink("/proc/self/exe").string();
  shoal::test::Program shoalrun{kShoalrun, {"-np", std::to_string(ranks), self}, {"SHOAL_STORE", "SHOAL_TOKEN"},
                                {{kModeVariable, mode}, {"SHOAL_TIMEOUT_S", "20"}}};
  shoal::test::ForkedRank ended = shoal::test::runProgram(shoalrun, 60, SIGTERM);
  Outcome outcome{ended.exitCode, ended.errors};
  if (ended.exitCode == shoal::test::kKilledAtDeadline)
    outcome.err = "shoalrun did not finish within 60 s\n" + outcome.err;
  return outcome;
}

class ExitWithoutDestroy : public ::testing::TestWithParam<const char*> {};

// The crash was a race (the engine's next cycle against exit's destructors),
// seen in about one run of three with four ranks: run each mode several times.
TEST_P(ExitWithoutDestroy, EveryRankExitsZero) {
  ASSERT_EQ(access(kShoalrun, X_OK), 0) << kShoalrun << " is missing: build the shoalrun target";
  for (int run = 0; run < 8; ++run) {
    Outcome outcome = launch(4, GetParam());
    ASSERT_EQ(outcome.exitCode, 0) << "run " << run << " of mode " << GetParam() << ":\n" << outcome.err;
    EXPECT_EQ(outcome.err.find("Caught signal"), std::string::npos) << outcome.err;
  }
}

INSTANTIATE_TEST_SUITE_P(Modes, ExitWithoutDestroy, ::testing::Values("return", "pending", "blocking"));

}  // namespace

int main(int argc, char** argv) {
  if (const char* mode = std::getenv(kModeVariable)) return rankMain(mode);
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
