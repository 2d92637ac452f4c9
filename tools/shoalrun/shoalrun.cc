// shoalrun: starts N local ranks of a shoal program with the rendezvous environment
// (SHOAL_RANK, SHOAL_WORLD_SIZE, SHOAL_STORE, SHOAL_TOKEN, ...), forwards their output with a
// "[rank] " prefix, and fails fast: when one rank fails, the others are stopped and shoalrun
// exits non-zero within seconds. Beyond one machine, users launch with mpirun or srun.
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <sched.h>
#include <sys/resource.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "shoal/shoal.h"

namespace {

using Clock = std::chrono::steady_clock;

constexpr int kUsageExit = 2;
constexpr int kCannotRunExit = 127;      // as the shell reports a command it cannot run
constexpr int kJobTimeoutExit = 124;     // as timeout(1) reports it
constexpr auto kKillGrace = std::chrono::seconds(3);
// After the last rank exits, output still held by its leftover children gets this long to arrive.
constexpr auto kDrainGrace = std::chrono::seconds(1);
// A line longer than this is forwarded in pieces so a rank that never writes '\n' cannot
// make shoalrun hold unbounded memory.
constexpr size_t kMaxLineBytes = 1 << 20;

const char kUsage[] =
    "usage: shoalrun -np N [--timeout-s S] [--bind-to cores|none] [--] prog [args...]\n"
    "       shoalrun --print-config [--markdown]\n"
    "       shoalrun --list-compressors\n"
    "       shoalrun --version\n";

const char kHelp[] =
    "\n"
    "Starts N ranks of prog on this machine, each with SHOAL_RANK, SHOAL_WORLD_SIZE,\n"
    "SHOAL_LOCAL_RANK, SHOAL_LOCAL_SIZE, SHOAL_STORE (tcp://127.0.0.1:<free port>, unless\n"
    "SHOAL_STORE is already set) and SHOAL_TOKEN (a fresh random token, unless already set).\n"
    "Every line a rank writes is forwarded with a \"[rank] \" prefix, stdout to stdout and\n"
    "stderr to stderr. Rank 0 reads shoalrun's stdin unless it is a terminal; the others\n"
    "read /dev/null.\n"
    "\n"
    "When a rank exits non-zero or is killed by a signal, shoalrun says so, sends SIGTERM\n"
    "to the other ranks (and their children), SIGKILL 3 s later, and exits with that\n"
    "rank's status (128+signal for a signal). SIGINT and SIGTERM are forwarded to the\n"
    "ranks; a second one kills them.\n"
    "\n"
    "options:\n"
    "  -np N, -n N          number of ranks to start (N >= 1)\n"
    "  --timeout-s S        stop the job if it is still running after S seconds (exit 124)\n"
    "  --bind-to cores|none cores (default): when the ranks are no more than the CPUs shoalrun may\n"
    "                       use, each rank gets its own equal share of them (2 ranks on 8 CPUs: 4\n"
    "                       each), as mpirun binds; two ranks left on one core by the scheduler wait\n"
    "                       for each other's time slice (about 12 us per small allreduce instead of\n"
    "                       0.5). none: leave placement to the scheduler\n"
    "  --print-config       list every SHOAL_* variable with its default, value and meaning\n"
    "  --markdown           with --print-config: print a Markdown table\n"
    "  --list-compressors   list the compressors: built-ins and plugins on SHOAL_PLUGIN_PATH\n"
    "  --version            shoalrun's version and the loaded libshoal's\n"
    "  -h, --help           this text\n"
    "\n"
    "Beyond one machine, launch with mpirun or srun and pass the store and token through the\n"
    "environment (a token on the command line is visible to every local user in ps):\n"
    "  export SHOAL_STORE=tcp://host0:29500 SHOAL_TOKEN=$(openssl rand -hex 16)\n"
    "  mpirun -np 16 -H host0:8,host1:8 -x SHOAL_STORE -x SHOAL_TOKEN prog\n"
    "  srun -n 16 prog\n"
    "shoal reads the rank and world size from the launcher there: SHOAL_*, torchrun's RANK/WORLD_SIZE,\n"
    "OMPI_COMM_WORLD_*, PMI_RANK/PMI_SIZE, PMIX_RANK or SLURM_*, in that order (docs/reliability-store.md).\n";

struct Options {
  int worldSize = 0;
  std::optional<double> jobTimeoutSeconds;
  bool printConfig = false;
  bool markdown = false;
  bool listCompressors = false;
  bool help = false;
  bool version = false;
  bool bindToCores = true;
  std::vector<std::string> command;
};

[[noreturn]] void usageError(const std::string& problem) {
  std::fprintf(stderr, "shoalrun: %s\n%sTry 'shoalrun --help' for more.\n", problem.c_str(), kUsage);
  std::exit(kUsageExit);
}

std::optional<long long> parseInteger(const std::string& text) {
  if (text.empty()) return std::nullopt;
  char* end = nullptr;
  errno = 0;
  long long value = std::strtoll(text.c_str(), &end, 10);
  if (errno != 0 || *end != '\0') return std::nullopt;
  return value;
}

std::optional<double> parsePositiveSeconds(const std::string& text) {
  if (text.empty()) return std::nullopt;
  char* end = nullptr;
  errno = 0;
  double value = std::strtod(text.c_str(), &end);
  if (errno != 0 || *end != '\0' || !(value > 0) || value > 1e9) return std::nullopt;
  return value;
}

Options parseArguments(int argc, char** argv) {
  Options options;
  bool worldSizeGiven = false;
  int index = 1;
  auto valueOf = [&](const std::string& flag) -> std::string {
    if (index + 1 >= argc) usageError(flag + " needs a value");
    return argv[++index];
  };
  for (; index < argc; ++index) {
    std::string arg = argv[index];
    if (arg == "--") {
      ++index;
      break;
    }
    if (arg.empty() || arg[0] != '-') break;  // the program starts here
    if (arg == "-np" || arg == "-n" || arg == "--np") {
      std::string text = valueOf(arg);
      auto value = parseInteger(text);
      if (!value || *value < 1 || *value > 4096) {
        usageError("-np needs a number of ranks from 1 to 4096, not '" + text + "'");
      }
      options.worldSize = static_cast<int>(*value);
      worldSizeGiven = true;
    } else if (arg == "--timeout-s") {
      std::string text = valueOf(arg);
      options.jobTimeoutSeconds = parsePositiveSeconds(text);
      if (!options.jobTimeoutSeconds) usageError("--timeout-s needs a positive number of seconds, not '" + text + "'");
    } else if (arg == "--bind-to") {
      const std::string text = valueOf(arg);
      if (text != "cores" && text != "none") usageError("--bind-to takes cores or none, not '" + text + "'");
      options.bindToCores = text == "cores";
    } else if (arg == "--print-config") {
      options.printConfig = true;
    } else if (arg == "--markdown") {
      options.markdown = true;
    } else if (arg == "--list-compressors") {
      options.listCompressors = true;
    } else if (arg == "-h" || arg == "--help") {
      options.help = true;
    } else if (arg == "--version") {
      options.version = true;
    } else {
      usageError("unknown option '" + arg + "'");
    }
  }
  for (; index < argc; ++index) options.command.emplace_back(argv[index]);

  if (options.help || options.version || options.printConfig || options.listCompressors) {
    if (options.markdown && !options.printConfig) usageError("--markdown goes with --print-config");
    return options;
  }
  if (options.markdown) usageError("--markdown goes with --print-config");
  if (!worldSizeGiven) usageError("missing -np N (the number of ranks)");
  if (options.command.empty()) usageError("missing the program to run");
  return options;
}

// --- environment -------------------------------------------------------------------------

// Asks the kernel for a free port. Rank 0 binds it moments later; another process could take it
// in between, which then shows as a clear store error on rank 0 rather than a hang.
int findFreeLoopbackPort() {
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  address.sin_port = 0;
  socklen_t length = sizeof(address);
  int port = -1;
  if (bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)) == 0 &&
      getsockname(fd, reinterpret_cast<sockaddr*>(&address), &length) == 0) {
    port = ntohs(address.sin_port);
  }
  close(fd);
  return port;
}

std::optional<std::string> makeRandomToken() {
  unsigned char bytes[16];
  int fd = open("/dev/urandom", O_RDONLY | O_CLOEXEC);
  if (fd < 0) return std::nullopt;
  size_t got = 0;
  while (got < sizeof(bytes)) {
    ssize_t n = read(fd, bytes + got, sizeof(bytes) - got);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    got += static_cast<size_t>(n);
  }
  close(fd);
  if (got != sizeof(bytes)) return std::nullopt;
  static const char kHex[] = "0123456789abcdef";
  std::string token;
  for (unsigned char byte : bytes) {
    token += kHex[byte >> 4];
    token += kHex[byte & 0xf];
  }
  return token;
}

bool isSetAndNonEmpty(const char* name) {
  const char* value = std::getenv(name);
  return value != nullptr && value[0] != '\0';
}

// --- signals -----------------------------------------------------------------------------

// Handlers write the signal number into this pipe so the poll() loop sees signals as input.
int signalPipe[2] = {-1, -1};

void onSignal(int signalNumber) {
  int savedErrno = errno;
  unsigned char byte = static_cast<unsigned char>(signalNumber);
  [[maybe_unused]] ssize_t ignored = write(signalPipe[1], &byte, 1);
  errno = savedErrno;
}

void installSignalHandlers() {
  if (pipe2(signalPipe, O_CLOEXEC | O_NONBLOCK) != 0) {
    std::perror("shoalrun: pipe");
    std::exit(1);
  }
  struct sigaction action{};
  action.sa_handler = onSignal;
  sigemptyset(&action.sa_mask);
  action.sa_flags = SA_RESTART;
  for (int signalNumber : {SIGCHLD, SIGINT, SIGTERM, SIGHUP}) sigaction(signalNumber, &action, nullptr);
  // A closed stdout (shoalrun ... | head) must not kill shoalrun before it stops the ranks.
  signal(SIGPIPE, SIG_IGN);
}

std::string signalName(int signalNumber) {
  struct Named {
    int number;
    const char* name;
  };
  static const Named kNames[] = {
      {SIGHUP, "SIGHUP"},   {SIGINT, "SIGINT"},   {SIGQUIT, "SIGQUIT"}, {SIGILL, "SIGILL"},   {SIGTRAP, "SIGTRAP"},
      {SIGABRT, "SIGABRT"}, {SIGBUS, "SIGBUS"},   {SIGFPE, "SIGFPE"},   {SIGKILL, "SIGKILL"}, {SIGUSR1, "SIGUSR1"},
      {SIGSEGV, "SIGSEGV"}, {SIGUSR2, "SIGUSR2"}, {SIGPIPE, "SIGPIPE"}, {SIGALRM, "SIGALRM"}, {SIGTERM, "SIGTERM"},
      {SIGXCPU, "SIGXCPU"}, {SIGXFSZ, "SIGXFSZ"}, {SIGSYS, "SIGSYS"},
  };
  for (const Named& named : kNames) {
    if (named.number == signalNumber) return named.name;
  }
  const char* description = strsignal(signalNumber);
  return description ? description : "unknown signal";
}

// --- ranks -------------------------------------------------------------------------------

void writeAll(int fd, const char* data, size_t size) {
  while (size > 0) {
    ssize_t n = write(fd, data, size);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;  // our own output is gone (EPIPE); keep running so the ranks still get stopped
    data += n;
    size -= static_cast<size_t>(n);
  }
}

// One of a rank's output pipes: bytes arrive in pieces, lines leave whole with the prefix.
struct OutputStream {
  int fd = -1;             // read end; -1 once closed
  int destination = -1;    // STDOUT_FILENO or STDERR_FILENO
  std::string pending;     // bytes after the last '\n' seen

  void forward(const std::string& prefix, const char* data, size_t size) {
    pending.append(data, size);
    std::string out;
    size_t lineStart = 0;
    for (;;) {
      size_t newline = pending.find('\n', lineStart);
      if (newline == std::string::npos) break;
      out += prefix;
      out.append(pending, lineStart, newline + 1 - lineStart);
      lineStart = newline + 1;
    }
    pending.erase(0, lineStart);
    if (pending.size() >= kMaxLineBytes) {
      out += prefix + pending + "\n";
      pending.clear();
    }
    if (!out.empty()) writeAll(destination, out.data(), out.size());
  }

  // At EOF a last line without '\n' still gets its prefix and a line end.
  void flushPartialLine(const std::string& prefix) {
    if (pending.empty()) return;
    std::string out = prefix + pending + "\n";
    pending.clear();
    writeAll(destination, out.data(), out.size());
  }

  void close(const std::string& prefix) {
    flushPartialLine(prefix);
    if (fd >= 0) ::close(fd);
    fd = -1;
  }
};

struct Rank {
  int index = 0;
  pid_t pid = -1;       // also its process group id
  bool reaped = false;
  int waitStatus = 0;
  std::string prefix;   // "[3] "
  OutputStream streams[2];

  bool outputOpen() const { return streams[0].fd >= 0 || streams[1].fd >= 0; }
};

struct LaunchSettings {
  int worldSize = 0;
  std::string store;   // empty: keep SHOAL_STORE from the environment
  std::string token;   // empty: keep SHOAL_TOKEN from the environment
  bool rankZeroReadsStdin = false;
  // Each rank's CPUs (--bind-to cores); empty: no binding.
  std::vector<cpu_set_t> rankCpus;
};

// Splits the CPUs this process may use into worldSize equal, disjoint shares
// in CPU order (the remainder unused), or none when there are fewer CPUs than
// ranks: oversubscribed ranks are better left to the scheduler.
std::vector<cpu_set_t> shareCpus(int worldSize) {
  cpu_set_t allowed;
  CPU_ZERO(&allowed);
  if (sched_getaffinity(0, sizeof(allowed), &allowed) != 0) return {};
  std::vector<int> cpus;
  for (int cpu = 0; cpu < CPU_SETSIZE; ++cpu)
    if (CPU_ISSET(cpu, &allowed)) cpus.push_back(cpu);
  if (worldSize <= 0 || static_cast<int>(cpus.size()) < worldSize) return {};
  const size_t each = cpus.size() / worldSize;
  std::vector<cpu_set_t> shares(worldSize);
  for (int rank = 0; rank < worldSize; ++rank) {
    CPU_ZERO(&shares[rank]);
    for (size_t i = 0; i < each; ++i) CPU_SET(cpus[rank * each + i], &shares[rank]);
  }
  return shares;
}

[[noreturn]] void childExecFailed(int reportFd) {
  int error = errno;
  [[maybe_unused]] ssize_t ignored = write(reportFd, &error, sizeof(error));
  _exit(kCannotRunExit);
}

// Runs in the forked child, up to execvp. The parent is single-threaded, so setenv is safe here.
[[noreturn]] void execRank(const LaunchSettings& settings, int rankIndex, int stdoutFd, int stderrFd, int reportFd,
                           const std::vector<std::string>& command, pid_t launcher) {
  // A rank dies with shoalrun, even when shoalrun is SIGKILLed and cannot stop it: an orphan would run on
  // and hold the store's port. (The setting survives exec; shoalrun is single-threaded, so "the thread
  // that forked" is shoalrun itself.) If shoalrun died before prctl took effect, exit now.
  if (prctl(PR_SET_PDEATHSIG, SIGKILL) != 0 || getppid() != launcher) _exit(kCannotRunExit);
  for (int signalNumber : {SIGCHLD, SIGINT, SIGTERM, SIGHUP, SIGPIPE}) signal(signalNumber, SIG_DFL);
  sigset_t none;
  sigemptyset(&none);
  sigprocmask(SIG_SETMASK, &none, nullptr);
  // Its own process group: stopping the rank also stops whatever it started.
  setpgid(0, 0);

  if (!(rankIndex == 0 && settings.rankZeroReadsStdin)) {
    int devNull = open("/dev/null", O_RDONLY);
    if (devNull < 0 || dup2(devNull, STDIN_FILENO) < 0) childExecFailed(reportFd);
    if (devNull != STDIN_FILENO) close(devNull);
  }
  if (dup2(stdoutFd, STDOUT_FILENO) < 0 || dup2(stderrFd, STDERR_FILENO) < 0) childExecFailed(reportFd);
  // Best effort: a rank that cannot be bound still runs.
  if (!settings.rankCpus.empty())
    [[maybe_unused]] int ignored = sched_setaffinity(0, sizeof(cpu_set_t), &settings.rankCpus[rankIndex]);

  std::string rank = std::to_string(rankIndex);
  std::string worldSize = std::to_string(settings.worldSize);
  setenv("SHOAL_RANK", rank.c_str(), 1);
  setenv("SHOAL_WORLD_SIZE", worldSize.c_str(), 1);
  setenv("SHOAL_LOCAL_RANK", rank.c_str(), 1);
  setenv("SHOAL_LOCAL_SIZE", worldSize.c_str(), 1);
  if (!settings.store.empty()) setenv("SHOAL_STORE", settings.store.c_str(), 1);
  if (!settings.token.empty()) setenv("SHOAL_TOKEN", settings.token.c_str(), 1);

  std::vector<char*> arguments;
  for (const std::string& argument : command) arguments.push_back(const_cast<char*>(argument.c_str()));
  arguments.push_back(nullptr);
  execvp(arguments[0], arguments.data());
  childExecFailed(reportFd);
}

struct StartFailure {
  int error = 0;             // errno; 0 = the rank started
  bool execFailed = false;   // the program itself could not be run (else: shoalrun ran out of pipes or processes)
};

// Starts one rank and waits until its program has been exec'd (or failed to be).
StartFailure startRank(const LaunchSettings& settings, const std::vector<std::string>& command, Rank& rank) {
  int pipes[3][2] = {{-1, -1}, {-1, -1}, {-1, -1}};  // stdout, stderr, exec report
  auto closeAll = [&pipes] {
    for (auto& pipe : pipes) {
      for (int& fd : pipe) {
        if (fd >= 0) close(fd);
        fd = -1;
      }
    }
  };
  // The report pipe is closed by a successful exec (O_CLOEXEC) and carries errno when exec fails.
  for (auto& pipe : pipes) {
    if (pipe2(pipe, O_CLOEXEC) != 0) {
      int error = errno;
      closeAll();
      return {error, false};
    }
  }
  auto& [stdoutPipe, stderrPipe, reportPipe] = pipes;

  pid_t launcher = getpid();
  pid_t pid = fork();
  if (pid < 0) {
    int error = errno;
    closeAll();
    return {error, false};
  }
  if (pid == 0) execRank(settings, rank.index, stdoutPipe[1], stderrPipe[1], reportPipe[1], command, launcher);

  setpgid(pid, pid);  // also here, so the group exists before we might signal it
  rank.pid = pid;
  rank.streams[0] = {stdoutPipe[0], STDOUT_FILENO, {}};
  rank.streams[1] = {stderrPipe[0], STDERR_FILENO, {}};
  stdoutPipe[0] = stderrPipe[0] = -1;  // owned by the rank now

  close(reportPipe[1]);
  reportPipe[1] = -1;
  int execError = 0;
  ssize_t n;
  do {
    n = read(reportPipe[0], &execError, sizeof(execError));
  } while (n < 0 && errno == EINTR);
  closeAll();
  if (n == static_cast<ssize_t>(sizeof(execError))) return {execError, true};
  return {};
}

// Each rank holds two pipes; a large -np can need more descriptors than the default soft limit.
void raiseDescriptorLimitFor(int worldSize) {
  rlimit limit{};
  if (getrlimit(RLIMIT_NOFILE, &limit) != 0) return;
  rlim_t needed = static_cast<rlim_t>(worldSize) * 2 + 64;
  if (limit.rlim_cur == RLIM_INFINITY || limit.rlim_cur >= needed) return;
  limit.rlim_cur = (limit.rlim_max == RLIM_INFINITY || limit.rlim_max > needed) ? needed : limit.rlim_max;
  setrlimit(RLIMIT_NOFILE, &limit);
}

class Launcher {
 public:
  Launcher(Options options, LaunchSettings settings) : options_(std::move(options)), settings_(std::move(settings)) {}

  int run() {
    ranks_.resize(static_cast<size_t>(settings_.worldSize));
    for (size_t i = 0; i < ranks_.size(); ++i) {
      Rank& rank = ranks_[i];
      rank.index = static_cast<int>(i);
      rank.prefix = "[" + std::to_string(i) + "] ";
      StartFailure failure = startRank(settings_, options_.command, rank);
      if (failure.error != 0) {
        if (failure.execFailed) {
          std::fprintf(stderr, "shoalrun: cannot run '%s': %s\n", options_.command[0].c_str(),
                       std::strerror(failure.error));
          exitCode_ = kCannotRunExit;
        } else {
          std::fprintf(stderr, "shoalrun: cannot start rank %zu: %s\n", i, std::strerror(failure.error));
          exitCode_ = 1;
        }
        stopping_ = true;                               // the ranks already started are stopped, not failed
        if (rank.pid > 0) reap(rank, /*block=*/true);  // it already _exit()ed
        startStopping(SIGTERM);
        break;
      }
    }
    if (options_.jobTimeoutSeconds) {
      jobDeadline_ = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                        std::chrono::duration<double>(*options_.jobTimeoutSeconds));
    }
    loop();
    for (Rank& rank : ranks_) {
      for (OutputStream& stream : rank.streams) stream.close(rank.prefix);
    }
    return exitCode_;
  }

 private:
  void loop() {
    std::vector<pollfd> pollFds;
    std::vector<std::pair<Rank*, OutputStream*>> pollStreams;  // parallel to pollFds
    char buffer[65536];
    for (;;) {
      reapExited();
      if (allReaped()) {
        if (!drainDeadline_) drainDeadline_ = Clock::now() + kDrainGrace;
        if (!anyOutputOpen()) return;
        if (Clock::now() >= *drainDeadline_) {
          signalRanks(SIGTERM);  // leftover children of finished ranks, still writing to our pipes
          return;
        }
      }
      checkDeadlines();

      pollFds.clear();
      pollStreams.clear();
      pollFds.push_back({signalPipe[0], POLLIN, 0});
      pollStreams.push_back({nullptr, nullptr});
      for (Rank& rank : ranks_) {
        for (OutputStream& stream : rank.streams) {
          if (stream.fd < 0) continue;
          pollFds.push_back({stream.fd, POLLIN, 0});
          pollStreams.push_back({&rank, &stream});
        }
      }
      int ready = poll(pollFds.data(), pollFds.size(), pollTimeoutMs());
      if (ready < 0) {
        if (errno == EINTR) continue;
        std::perror("shoalrun: poll");
        startStopping(SIGKILL);
        exitCode_ = exitCode_ ? exitCode_ : 1;
        return;
      }
      if (pollFds[0].revents & POLLIN) handleSignals();
      for (size_t i = 1; i < pollFds.size(); ++i) {
        if (!(pollFds[i].revents & (POLLIN | POLLHUP | POLLERR))) continue;
        OutputStream& stream = *pollStreams[i].second;
        const std::string& prefix = pollStreams[i].first->prefix;
        ssize_t n = read(stream.fd, buffer, sizeof(buffer));
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) {
          stream.close(prefix);
        } else {
          stream.forward(prefix, buffer, static_cast<size_t>(n));
        }
      }
    }
  }

  int pollTimeoutMs() const {
    auto soonest = Clock::now() + std::chrono::seconds(1);  // also a backstop should a SIGCHLD get lost
    for (const auto& deadline : {killDeadline_, jobDeadline_, drainDeadline_}) {
      if (deadline && *deadline < soonest) soonest = *deadline;
    }
    auto wait = std::chrono::duration_cast<std::chrono::milliseconds>(soonest - Clock::now()).count();
    return static_cast<int>(std::max<long long>(0, wait) + 1);
  }

  void handleSignals() {
    unsigned char received[64];
    ssize_t n;
    while ((n = read(signalPipe[0], received, sizeof(received))) > 0) {
      for (ssize_t i = 0; i < n; ++i) {
        int signalNumber = received[i];
        if (signalNumber == SIGCHLD) continue;  // the loop reaps
        if (interrupted_) {
          std::fprintf(stderr, "shoalrun: %s again; killing the ranks\n", signalName(signalNumber).c_str());
          signalRanks(SIGKILL);
          continue;
        }
        interrupted_ = true;
        std::fprintf(stderr, "shoalrun: got %s; forwarding it to the ranks\n", signalName(signalNumber).c_str());
        if (exitCode_ == 0) exitCode_ = 128 + signalNumber;
        stopping_ = true;  // what the ranks do now is our doing, not a failure to report
        signalRanks(signalNumber == SIGHUP ? SIGTERM : signalNumber);
      }
    }
  }

  void checkDeadlines() {
    auto now = Clock::now();
    if (jobDeadline_ && now >= *jobDeadline_ && !stopping_) {
      std::fprintf(stderr, "shoalrun: the job is still running after --timeout-s %g; stopping the ranks\n",
                   *options_.jobTimeoutSeconds);
      exitCode_ = kJobTimeoutExit;
      startStopping(SIGTERM);
    }
    if (killDeadline_ && now >= *killDeadline_) {
      signalRanks(SIGKILL);
      killDeadline_.reset();
    }
  }

  void startStopping(int signalNumber) {
    stopping_ = true;
    signalRanks(signalNumber);
    if (signalNumber != SIGKILL && !killDeadline_) killDeadline_ = Clock::now() + kKillGrace;
  }

  // Signals each rank's process group. A rank already reaped may have left children that still
  // hold its output pipes; its group is signalled too while those pipes are open.
  void signalRanks(int signalNumber) {
    for (Rank& rank : ranks_) {
      if (rank.pid <= 0 || (rank.reaped && !rank.outputOpen())) continue;
      if (kill(-rank.pid, signalNumber) != 0 && !rank.reaped) kill(rank.pid, signalNumber);
    }
  }

  void reapExited() {
    for (Rank& rank : ranks_) {
      if (rank.pid > 0 && !rank.reaped) reap(rank, /*block=*/false);
    }
  }

  void reap(Rank& rank, bool block) {
    int status = 0;
    pid_t result;
    do {
      result = waitpid(rank.pid, &status, block ? 0 : WNOHANG);
    } while (result < 0 && errno == EINTR);
    if (result == 0) return;
    rank.reaped = true;
    rank.waitStatus = status;
    if (result < 0) return;  // not our child any more; nothing to report
    bool failed = !(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    if (!failed || stopping_) return;
    if (WIFSIGNALED(status)) {
      int signalNumber = WTERMSIG(status);
      std::fprintf(stderr, "shoalrun: rank %d killed by signal %d (%s); stopping the other ranks\n", rank.index,
                   signalNumber, signalName(signalNumber).c_str());
      exitCode_ = 128 + signalNumber;
    } else {
      std::fprintf(stderr, "shoalrun: rank %d exited with status %d; stopping the other ranks\n", rank.index,
                   WEXITSTATUS(status));
      exitCode_ = WEXITSTATUS(status);
    }
    startStopping(SIGTERM);
  }

  bool allReaped() const {
    for (const Rank& rank : ranks_) {
      if (rank.pid > 0 && !rank.reaped) return false;
    }
    return true;
  }

  bool anyOutputOpen() const {
    for (const Rank& rank : ranks_) {
      if (rank.outputOpen()) return true;
    }
    return false;
  }

  Options options_;
  LaunchSettings settings_;
  std::vector<Rank> ranks_;
  int exitCode_ = 0;
  bool stopping_ = false;     // ranks are being stopped; later exits are not reported as failures
  bool interrupted_ = false;  // we forwarded SIGINT/SIGTERM/SIGHUP once already
  std::optional<Clock::time_point> killDeadline_;
  std::optional<Clock::time_point> jobDeadline_;
  std::optional<Clock::time_point> drainDeadline_;
};

}  // namespace

int main(int argc, char** argv) {
  Options options = parseArguments(argc, argv);
  if (options.help) {
    std::printf("%s%s", kUsage, kHelp);
    return 0;
  }
  if (options.version) {
    int library = 0;
    shoal_get_version(&library);
    std::printf("shoalrun %d.%d.%d (libshoal %d.%d.%d)\n", SHOAL_VERSION_MAJOR, SHOAL_VERSION_MINOR,
                SHOAL_VERSION_PATCH, library / 10000, library / 100 % 100, library % 100);
    return 0;
  }
  if (options.printConfig) {
    shoal_status_t status = shoal_config_print(stdout, options.markdown ? 1 : 0);
    if (status != SHOAL_OK) {
      std::fprintf(stderr, "shoalrun: --print-config failed: %s\n", shoal_status_string(status));
      return 1;
    }
    return 0;
  }
  if (options.listCompressors) {
    // Built-ins and the plugins on SHOAL_PLUGIN_PATH, with any refused plugin and why.
    std::printf("compressors:\n");
    shoal_status_t status = shoal_compressors_print(stdout);
    if (status != SHOAL_OK) {
      std::fprintf(stderr, "shoalrun: --list-compressors failed: %s: %s\n", shoal_status_string(status),
                   shoal_last_error(nullptr));
      return 1;
    }
    return 0;
  }

  LaunchSettings settings;
  settings.worldSize = options.worldSize;
  if (!isSetAndNonEmpty("SHOAL_STORE")) {
    int port = findFreeLoopbackPort();
    if (port <= 0) {
      std::fprintf(stderr, "shoalrun: cannot find a free port on 127.0.0.1 for the store: %s\n", std::strerror(errno));
      return 1;
    }
    settings.store = "tcp://127.0.0.1:" + std::to_string(port);
  }
  if (!isSetAndNonEmpty("SHOAL_TOKEN")) {
    auto token = makeRandomToken();
    if (!token) {
      std::fprintf(stderr, "shoalrun: cannot read /dev/urandom for the job token: %s\n", std::strerror(errno));
      return 1;
    }
    settings.token = *token;
  }
  // A rank in its own process group that reads the terminal would be stopped (SIGTTIN).
  settings.rankZeroReadsStdin = !isatty(STDIN_FILENO);
  if (options.bindToCores) settings.rankCpus = shareCpus(options.worldSize);

  raiseDescriptorLimitFor(options.worldSize);
  std::fflush(nullptr);  // nothing buffered may be written twice by the children
  installSignalHandlers();
  Launcher launcher(std::move(options), std::move(settings));
  return launcher.run();
}
