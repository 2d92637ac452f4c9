#include "harness/forked_job.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iostream>
#include <sstream>
#include <stdexcept>
#include <thread>

namespace shoal::test {
namespace {

namespace fs = std::filesystem;

double now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

int exitCodeOf(int status) { return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status); }

}  // namespace

int freeLoopbackPort() {
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  address.sin_port = 0;  // the kernel picks
  socklen_t length = sizeof address;
  int port = -1;
  if (fd >= 0 && bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof address) == 0 &&
      getsockname(fd, reinterpret_cast<sockaddr*>(&address), &length) == 0)
    port = ntohs(address.sin_port);
  if (fd >= 0) close(fd);
  return port;
}

std::string readWholeFile(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

std::string describe(const std::vector<ForkedRank>& ranks) {
  std::ostringstream out;
  for (size_t r = 0; r < ranks.size(); ++r) {
    out << "--- rank " << r << ": exit " << ranks[r].exitCode << " after " << ranks[r].seconds << " s\n"
        << ranks[r].output;
    if (!ranks[r].errors.empty()) out << "--- rank " << r << "'s stderr:\n" << ranks[r].errors;
  }
  return out.str();
}

int execProgram(const Program& program) {
  for (const std::string& name : program.unset) unsetenv(name.c_str());
  for (const auto& [name, value] : program.env) setenv(name.c_str(), value.c_str(), 1);
  std::vector<char*> argv{const_cast<char*>(program.path.c_str())};
  for (const std::string& arg : program.args) argv.push_back(const_cast<char*>(arg.c_str()));
  argv.push_back(nullptr);
  execv(program.path.c_str(), argv.data());
  std::fprintf(stderr, "cannot exec %s: %s\n", program.path.c_str(), std::strerror(errno));
  return kExecFailed;
}

ForkedJob::ForkedJob(const std::string& name, const JobOptions& options) : options_(options) {
  std::string pattern = (fs::temp_directory_path() / ("shoal_" + name + "_XXXXXX")).string();
  if (mkdtemp(pattern.data()) == nullptr) throw std::runtime_error("ForkedJob: mkdtemp failed for " + pattern);
  dir_ = pattern;
}

ForkedJob::~ForkedJob() {
  for (ForkedRank& rank : ranks_)
    if (rank.pid > 0) kill(rank.pid, SIGKILL);
  for (ForkedRank& rank : ranks_)
    if (rank.pid > 0) waitpid(rank.pid, nullptr, 0);
  std::error_code ignored;
  fs::remove_all(dir_, ignored);
}

fs::path ForkedJob::outputPath(int rank) const { return dir_ / ("rank" + std::to_string(rank) + ".out"); }

fs::path ForkedJob::errorPath(int rank) const { return dir_ / ("rank" + std::to_string(rank) + ".err"); }

std::string ForkedJob::outputSoFar(int rank) const { return readWholeFile(outputPath(rank)); }

void ForkedJob::start(int n, const Child& child) {
  ranks_.assign(n, ForkedRank{});
  startedAt_ = now();
  std::cout.flush();
  std::cerr.flush();
  std::fflush(nullptr);  // or the children inherit this process's buffered text and write it again
  for (int rank = 0; rank < n; ++rank) {
    const std::string out = outputPath(rank).string();
    const std::string err = errorPath(rank).string();
    pid_t pid = fork();
    if (pid == 0) {
      int fd = open(out.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
      int errFd = options_.separateStderr ? open(err.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600) : dup(fd);
      int nullFd = open("/dev/null", O_RDONLY);
      if (fd < 0 || errFd < 0 || nullFd < 0) _exit(250);
      dup2(nullFd, STDIN_FILENO);
      dup2(fd, STDOUT_FILENO);
      dup2(errFd, STDERR_FILENO);
      close(fd);
      close(errFd);
      close(nullFd);
      // An exception must not unwind into the copy of the test that the child is.
      int code = kChildThrew;
      try {
        code = child(rank);
      } catch (const std::exception& e) {
        std::fprintf(stderr, "rank %d: the child threw: %s\n", rank, e.what());
      } catch (...) {
        std::fprintf(stderr, "rank %d: the child threw\n", rank);
      }
      std::cout.flush();
      std::cerr.flush();
      std::fflush(nullptr);
      _exit(code);
    }
    ranks_[rank].pid = pid;
  }
}

std::vector<ForkedRank>& ForkedJob::finish(double deadlineS, const OnExit& onExit) {
  auto running = [&] {
    for (const ForkedRank& rank : ranks_)
      if (rank.pid > 0) return true;
    return false;
  };
  // Reaps what has exited (only our own children, by pid: a test may have
  // other children, a server, to reap itself); true when any had.
  auto reap = [&](bool reportExit) {
    bool reaped = false;
    for (int r = 0; r < static_cast<int>(ranks_.size()); ++r) {
      int status = 0;
      if (ranks_[r].pid <= 0 || waitpid(ranks_[r].pid, &status, WNOHANG) != ranks_[r].pid) continue;
      ranks_[r].exitCode = reportExit ? exitCodeOf(status) : kKilledAtDeadline;
      ranks_[r].seconds = reportExit ? now() - startedAt_ : deadlineS;
      ranks_[r].pid = -1;
      reaped = true;
      if (onExit && reportExit) onExit(ranks_, r);
    }
    return reaped;
  };
  while (running()) {
    if (reap(true)) continue;
    if (now() - startedAt_ > deadlineS) {
      // Past the deadline: the signal the options name, then SIGKILL after the grace.
      for (ForkedRank& rank : ranks_)
        if (rank.pid > 0) kill(rank.pid, options_.deadlineSignal);
      const double graceEnds = now() + (options_.deadlineSignal == SIGKILL ? 0 : options_.killGraceS);
      while (running() && now() < graceEnds) {
        reap(false);
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
      }
      for (ForkedRank& rank : ranks_)
        if (rank.pid > 0) {
          kill(rank.pid, SIGKILL);
          waitpid(rank.pid, nullptr, 0);
          rank.exitCode = kKilledAtDeadline;
          rank.seconds = deadlineS;
          rank.pid = -1;
        }
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  for (int r = 0; r < static_cast<int>(ranks_.size()); ++r) {
    ranks_[r].output = outputSoFar(r);
    if (options_.separateStderr) ranks_[r].errors = readWholeFile(errorPath(r));
  }
  return ranks_;
}

std::vector<ForkedRank>& ForkedJob::run(int n, const Child& child, double deadlineS, const OnExit& onExit) {
  start(n, child);
  return finish(deadlineS, onExit);
}

ForkedRank runProgram(const Program& program, double deadlineS, int deadlineSignal,
                      const std::function<void(pid_t)>& whileRunning) {
  JobOptions options;
  options.separateStderr = true;
  options.deadlineSignal = deadlineSignal;
  ForkedJob job("program", options);
  job.start(1, [&](int) { return execProgram(program); });
  if (whileRunning) whileRunning(job.ranks()[0].pid);
  return job.finish(deadlineS)[0];
}

}  // namespace shoal::test
