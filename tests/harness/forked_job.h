// Ranks as real processes (Gloo's multiproc_test idea): fork N children, give
// each a file for its stdout and stderr, wait for all of them with a deadline
// (signalling what is left), and hand back each one's exit status, time and
// output. The multi-process tests (tests/multiproc, the async and aggregate
// failure tests) build on it; what a child does, exec a program (execProgram)
// or run a body and _exit, is theirs. A launcher test that runs one program
// (shoalrun, shoal-bench) uses runProgram.
#pragma once

#include <sys/types.h>

#include <csignal>
#include <filesystem>
#include <functional>
#include <map>
#include <string>
#include <vector>

namespace shoal::test {

// A TCP port on 127.0.0.1 that was free a moment ago (the kernel picked it).
// It is released before the call returns, so another process could take it
// first: rare enough for tests, and a failure then names the port.
int freeLoopbackPort();

// exitCode of a child still running at the deadline (the job stopped it).
constexpr int kKilledAtDeadline = -1;
// exitCode of a child whose function threw (250: it could not open its output).
constexpr int kChildThrew = 252;
// exitCode of a child whose exec failed (execProgram wrote why on its stderr).
constexpr int kExecFailed = 251;

struct ForkedRank {
  pid_t pid = -1;                    // while it runs; -1 once reaped
  int exitCode = kKilledAtDeadline;  // its exit status, or 128 + the signal that ended it
  double seconds = 0;                // from the job's start to its exit (the deadline if stopped there)
  std::string output;                // its stdout, and its stderr unless the job keeps that apart
  std::string errors;                // its stderr when the job keeps it apart (JobOptions)
};

struct JobOptions {
  // Each child's stderr into errorPath(k) (ForkedRank::errors), not beside its stdout.
  bool separateStderr = false;
  // What a child still running at the deadline gets: SIGKILL, or SIGTERM for a
  // launcher that should stop its own children first. SIGKILL follows if it
  // has not exited killGraceS later.
  int deadlineSignal = SIGKILL;
  double killGraceS = 5;
};

// A program for a child to exec: arguments after argv[0], and the variables
// to remove from and set in the environment it inherits.
struct Program {
  std::string path;
  std::vector<std::string> args;
  std::vector<std::string> unset;
  std::map<std::string, std::string> env;
};

// In a child: adjusts the environment and execs the program. Returns only
// when exec failed: kExecFailed, with the reason on stderr.
int execProgram(const Program& program);

class ForkedJob {
 public:
  using Child = std::function<int(int rank)>;
  using OnExit = std::function<void(std::vector<ForkedRank>& ranks, int exited)>;

  // Makes a private folder (mkdtemp) for the outputs and whatever else the
  // children and the test want to leave there; `name` goes into its name.
  explicit ForkedJob(const std::string& name = "job", const JobOptions& options = {});
  // Kills and reaps children still running, removes the folder.
  ~ForkedJob();
  ForkedJob(const ForkedJob&) = delete;
  ForkedJob& operator=(const ForkedJob&) = delete;

  // Forks n children (before which stdio is flushed, so no buffered text is
  // written twice). Child k gets stdin from /dev/null and stdout and stderr
  // into outputPath(k) (stderr into errorPath(k) if the options say so), runs
  // child(k), flushes stdio and _exits with what it returned; it may exec
  // instead. Starts the clock of `seconds` and `finish`.
  void start(int n, const Child& child);

  // Waits until every child has exited or `deadlineS` has passed since start
  // (then stops the rest as the options say: exitCode kKilledAtDeadline).
  // onExit runs after each exit, e.g. to stop a stalled rank once another one
  // reported. Reads every output.
  std::vector<ForkedRank>& finish(double deadlineS, const OnExit& onExit = nullptr);

  // start + finish.
  std::vector<ForkedRank>& run(int n, const Child& child, double deadlineS, const OnExit& onExit = nullptr);

  std::vector<ForkedRank>& ranks() { return ranks_; }
  const std::filesystem::path& dir() const { return dir_; }
  std::filesystem::path outputPath(int rank) const;
  std::filesystem::path errorPath(int rank) const;
  // What child `rank` wrote so far (for a child that is still running too).
  std::string outputSoFar(int rank) const;

 private:
  std::filesystem::path dir_;
  JobOptions options_;
  std::vector<ForkedRank> ranks_;
  double startedAt_ = 0;  // steady clock, seconds
};

// Runs one program as one child with its stdout and stderr apart, to its end
// or the deadline (exitCode kKilledAtDeadline: the test should fail, saying
// so). whileRunning(pid) runs once it started, e.g. to send it a signal.
ForkedRank runProgram(const Program& program, double deadlineS, int deadlineSignal = SIGKILL,
                      const std::function<void(pid_t)>& whileRunning = nullptr);

// Every rank's exit code, time and output, for a failure message.
std::string describe(const std::vector<ForkedRank>& ranks);

// The whole contents of a file ("" when it cannot be read).
std::string readWholeFile(const std::filesystem::path& path);

}  // namespace shoal::test
