#include "harness/forked_job.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
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
  for (size_t r = 0; r < ranks.size(); ++r)
    out << "--- rank " << r << ": exit " << ranks[r].exitCode << " after " << ranks[r].seconds << " s\n"
        << ranks[r].output;
  return out.str();
}

ForkedJob::ForkedJob(const std::string& name) {
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

std::string ForkedJob::outputSoFar(int rank) const { return readWholeFile(outputPath(rank)); }

void ForkedJob::start(int n, const Child& child) {
  ranks_.assign(n, ForkedRank{});
  startedAt_ = now();
  std::cout.flush();
  std::cerr.flush();
  std::fflush(nullptr);  // or the children inherit this process's buffered text and write it again
  for (int rank = 0; rank < n; ++rank) {
    const std::string out = outputPath(rank).string();
    pid_t pid = fork();
    if (pid == 0) {
      int fd = open(out.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
      int nullFd = open("/dev/null", O_RDONLY);
      if (fd < 0 || nullFd < 0) _exit(250);
      dup2(nullFd, STDIN_FILENO);
      dup2(fd, STDOUT_FILENO);
      dup2(fd, STDERR_FILENO);
      close(fd);
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
  while (running()) {
    bool reaped = false;
    // Only our own children, by pid: a test may have other children (a server) to reap itself.
    for (int r = 0; r < static_cast<int>(ranks_.size()); ++r) {
      int status = 0;
      if (ranks_[r].pid <= 0 || waitpid(ranks_[r].pid, &status, WNOHANG) != ranks_[r].pid) continue;
      ranks_[r].exitCode = exitCodeOf(status);
      ranks_[r].seconds = now() - startedAt_;
      ranks_[r].pid = -1;
      reaped = true;
      if (onExit) onExit(ranks_, r);
    }
    if (reaped) continue;
    if (now() - startedAt_ > deadlineS) {
      for (ForkedRank& rank : ranks_)
        if (rank.pid > 0) kill(rank.pid, SIGKILL);
      for (ForkedRank& rank : ranks_)
        if (rank.pid > 0) {
          waitpid(rank.pid, nullptr, 0);
          rank.exitCode = kKilledAtDeadline;
          rank.seconds = deadlineS;
          rank.pid = -1;
        }
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  for (int r = 0; r < static_cast<int>(ranks_.size()); ++r) ranks_[r].output = outputSoFar(r);
  return ranks_;
}

std::vector<ForkedRank>& ForkedJob::run(int n, const Child& child, double deadlineS, const OnExit& onExit) {
  start(n, child);
  return finish(deadlineS, onExit);
}

}  // namespace shoal::test
