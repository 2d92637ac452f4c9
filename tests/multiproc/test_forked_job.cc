// The launcher options of tests/harness/forked_job.h that the launcher tests
// (test_shoalrun, test_exit_clean, test_shoal_bench, the aggregate daemon)
// rely on: a program's stdout and stderr apart, its environment, an exec
// that fails, and the deadline: the named signal first, SIGKILL after the
// grace for a program that ignores it. Programs are `sh -c` one-liners.
#include <signal.h>

#include <chrono>
#include <cstdlib>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "harness/forked_job.h"

namespace {

using shoal::test::ForkedRank;
using shoal::test::Program;
using shoal::test::runProgram;

Program shell(const std::string& script) { return Program{"/bin/sh", {"-c", script}, {}, {}}; }

TEST(ForkedJob, ProgramOutputAndErrorsApartWithItsExitCode) {
  ForkedRank ended = runProgram(shell("echo out; echo err >&2; printf last; exit 3"), 10);
  EXPECT_EQ(ended.exitCode, 3);
  EXPECT_EQ(ended.output, "out\nlast");
  EXPECT_EQ(ended.errors, "err\n");
  EXPECT_LT(ended.seconds, 10);
}

TEST(ForkedJob, ProgramEnvironmentIsUnsetThenSet) {
  setenv("SHOAL_FORKED_JOB_GONE", "inherited", 1);
  setenv("SHOAL_FORKED_JOB_KEPT", "inherited", 1);
  Program program = shell("echo \"[$SHOAL_FORKED_JOB_GONE] [$SHOAL_FORKED_JOB_KEPT] [$SHOAL_FORKED_JOB_SET]\"");
  program.unset = {"SHOAL_FORKED_JOB_GONE"};
  program.env = {{"SHOAL_FORKED_JOB_SET", "given"}};
  ForkedRank ended = runProgram(program, 10);
  unsetenv("SHOAL_FORKED_JOB_GONE");
  unsetenv("SHOAL_FORKED_JOB_KEPT");
  EXPECT_EQ(ended.exitCode, 0) << ended.errors;
  EXPECT_EQ(ended.output, "[] [inherited] [given]\n");
}

TEST(ForkedJob, AProgramThatCannotBeExecutedSaysWhy) {
  ForkedRank ended = runProgram(Program{"/nonexistent/shoal-program", {}, {}, {}}, 10);
  EXPECT_EQ(ended.exitCode, shoal::test::kExecFailed);
  EXPECT_NE(ended.errors.find("cannot exec /nonexistent/shoal-program: No such file or directory"),
            std::string::npos)
      << ended.errors;
}

TEST(ForkedJob, AtTheDeadlineTheNamedSignalStopsTheProgram) {
  // The trap runs on SIGTERM, writes, and stops its sleep before the program ends.
  const auto begin = std::chrono::steady_clock::now();
  ForkedRank ended = runProgram(shell("trap 'echo terminated; kill $!; exit 0' TERM; sleep 30 & wait"), 1.0, SIGTERM);
  const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - begin).count();
  EXPECT_EQ(ended.exitCode, shoal::test::kKilledAtDeadline);
  EXPECT_EQ(ended.output, "terminated\n");
  EXPECT_LT(took, 4.0) << "SIGTERM should have ended it before the grace ran out";
}

TEST(ForkedJob, AProgramIgnoringTheSignalIsKilledAfterTheGrace) {
  shoal::test::JobOptions options;
  options.deadlineSignal = SIGTERM;
  options.killGraceS = 0.5;
  shoal::test::ForkedJob job("ignores", options);
  const auto begin = std::chrono::steady_clock::now();
  job.start(1, [](int) { return shoal::test::execProgram(shell("trap '' TERM; echo started; exec sleep 30")); });
  std::vector<ForkedRank>& ranks = job.finish(0.5);
  const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - begin).count();
  EXPECT_EQ(ranks[0].exitCode, shoal::test::kKilledAtDeadline);
  EXPECT_EQ(ranks[0].output, "started\n");
  EXPECT_GE(took, 0.5 + 0.5 - 0.05) << "SIGKILL came before the grace";
  EXPECT_LT(took, 5.0);
}

}  // namespace
