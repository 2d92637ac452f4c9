// rank_worker: one rank of a multi-process test (test_failure.cc starts N of
// them with fork/exec). Not a gtest program: it inits from the environment
// (SHOAL_RANK, SHOAL_WORLD_SIZE, SHOAL_STORE, SHOAL_TOKEN, SHOAL_TIMEOUT_S) and
// runs one mode:
//
//   rank_worker success
//       allreduce, allgather, broadcast (every root), reduce_scatter (and
//       its tensor form, in place) and barrier with exact results.
//   rank_worker die-mid-allreduce R [exit|kill]
//       loops allreduces of 1M floats; rank R dies after a few iterations
//       (_exit(9), or SIGKILL with "kill"); the others must get an error.
//   rank_worker stall-mid-allreduce R
//       like die-, but rank R stops calling (sleeps) instead of dying.
//   rank_worker cycles N
//       creates, checks (one allreduce) and destroys a communicator N times.
//   rank_worker two-comms
//       two communicators alive at once, used in turn, destroyed in creation order.
//   rank_worker fault COLLECTIVE R kill|stop
//       loops COLLECTIVE (allreduce, allgather, broadcast, reduce_scatter) on
//       1M floats; rank R SIGKILLs or SIGSTOPs itself before iteration 3, first
//       printing "fault at T" (T: CLOCK_REALTIME seconds); the others print
//       "detected at T: <error>" (tests/multiproc/fault_matrix.sh).
//   rank_worker exhaust-fds
//       rank 0 opens files until it runs out of descriptors (EMFILE), then
//       allreduces while rank 1 joins 1.5 s late: rank 0's liveness checks of
//       rank 1 then cannot open /proc/<pid>/stat, which must not read as death.
//   rank_worker hold
//       creates a communicator, prints "worker R: holding pid P" and sleeps (the
//       test kills it, or its launcher's death does).
//
// Exit codes (kExit*): 0 all good, 2 usage or init failure, 3 a shoal call
// returned an error (printed with shoal_last_error), 4 hung: still running
// after 3 x SHOAL_TIMEOUT_S (alarm), 5 a wrong result, 9 the rank that died on
// purpose (exit mode). Every line printed starts with "worker <rank>:".
//
// tests/CMakeLists.txt globs tests/multiproc/*.cc into gtest executables, so
// ctest runs this program with --gtest_list_tests to discover tests: it then
// prints nothing (no tests) and exits 0.
#include <fcntl.h>
#include <signal.h>
#include <time.h>
#include <unistd.h>

#include <cerrno>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "shoal/shoal.h"

namespace {

constexpr int kExitOk = 0;
constexpr int kExitUsage = 2;
constexpr int kExitShoalError = 3;
constexpr int kExitHung = 4;
constexpr int kExitWrongResult = 5;
constexpr int kExitDiedOnPurpose = 9;

int gRank = -1;
shoal_comm_t gComm = nullptr;

void onAlarm(int) {
  char text[96];
  int length = std::snprintf(text, sizeof text, "worker %d: hung: still running after 3 x SHOAL_TIMEOUT_S\n", gRank);
  if (write(STDERR_FILENO, text, static_cast<size_t>(length)) < 0) {}
  _exit(kExitHung);
}

// Reports a failed shoal call and exits with kExitShoalError (after destroying
// the communicator, which must not hang either: the alarm still runs).
void check(shoal_status_t status, const char* what) {
  if (status == SHOAL_OK) return;
  std::fprintf(stderr, "worker %d: %s failed: %s: %s\n", gRank, what, shoal_status_string(status),
               shoal_last_error(gComm));
  std::fflush(stderr);
  shoal_comm_destroy(gComm);
  std::fprintf(stderr, "worker %d: communicator destroyed\n", gRank);
  std::exit(kExitShoalError);
}

[[noreturn]] void wrong(const char* what, size_t index, const std::string& got, const std::string& expected) {
  std::fprintf(stderr, "worker %d: wrong result of %s at index %zu: got %s, expected %s\n", gRank, what, index,
               got.c_str(), expected.c_str());
  std::exit(kExitWrongResult);
}

int runSuccess(int rank, int size) {
  // allreduce: int64 sum and f32 max, exact.
  const size_t count = 1000003;
  std::vector<int64_t> values(count);
  for (size_t i = 0; i < count; ++i) values[i] = static_cast<int64_t>((rank + 1) * (i % 1000)) - 7;
  check(shoal_allreduce(gComm, values.data(), values.data(), count, SHOAL_I64, SHOAL_SUM), "allreduce i64 sum");
  for (size_t i = 0; i < count; ++i) {
    int64_t expected = static_cast<int64_t>(size) * (size + 1) / 2 * static_cast<int64_t>(i % 1000) - 7 * size;
    if (values[i] != expected) wrong("allreduce i64 sum", i, std::to_string(values[i]), std::to_string(expected));
  }
  std::vector<float> floats(4099), maxima(4099);
  for (size_t i = 0; i < floats.size(); ++i) floats[i] = static_cast<float>((i * 7 + static_cast<size_t>(rank) * 13) % 101);
  check(shoal_allreduce(gComm, floats.data(), maxima.data(), floats.size(), SHOAL_F32, SHOAL_MAX), "allreduce f32 max");
  for (size_t i = 0; i < floats.size(); ++i) {
    float expected = 0;
    for (int r = 0; r < size; ++r) expected = std::max(expected, static_cast<float>((i * 7 + static_cast<size_t>(r) * 13) % 101));
    if (maxima[i] != expected) wrong("allreduce f32 max", i, std::to_string(maxima[i]), std::to_string(expected));
  }
  // allgather: int32 blocks of 1000.
  const size_t block = 1000;
  std::vector<int32_t> mine(block), all(block * static_cast<size_t>(size), -1);
  for (size_t i = 0; i < block; ++i) mine[i] = rank * 100000 + static_cast<int32_t>(i);
  check(shoal_allgather(gComm, mine.data(), all.data(), block, SHOAL_I32), "allgather");
  for (size_t i = 0; i < all.size(); ++i) {
    int32_t expected = static_cast<int32_t>(i / block) * 100000 + static_cast<int32_t>(i % block);
    if (all[i] != expected) wrong("allgather", i, std::to_string(all[i]), std::to_string(expected));
  }
  // broadcast from every root: 1 MB of bytes.
  std::vector<uint8_t> bytes(1 << 20);
  for (int root = 0; root < size; ++root) {
    if (rank == root)
      for (size_t i = 0; i < bytes.size(); ++i) bytes[i] = static_cast<uint8_t>(i * 31 + static_cast<size_t>(root));
    else
      std::fill(bytes.begin(), bytes.end(), 0);
    check(shoal_broadcast(gComm, bytes.data(), bytes.data(), bytes.size(), SHOAL_U8, root), "broadcast");
    for (size_t i = 0; i < bytes.size(); ++i) {
      auto expected = static_cast<uint8_t>(i * 31 + static_cast<size_t>(root));
      if (bytes[i] != expected) wrong("broadcast", i, std::to_string(bytes[i]), std::to_string(expected));
    }
  }
  // reduce_scatter: u32 sum.
  std::vector<uint32_t> send(block * static_cast<size_t>(size)), recv(block);
  for (size_t i = 0; i < send.size(); ++i) send[i] = static_cast<uint32_t>(i) + static_cast<uint32_t>(rank);
  check(shoal_reduce_scatter(gComm, send.data(), recv.data(), block, SHOAL_U32, SHOAL_SUM), "reduce_scatter");
  for (size_t i = 0; i < block; ++i) {
    uint32_t j = static_cast<uint32_t>(static_cast<size_t>(rank) * block + i);
    uint32_t expected = j * static_cast<uint32_t>(size) + static_cast<uint32_t>(size * (size - 1) / 2);
    if (recv[i] != expected) wrong("reduce_scatter", i, std::to_string(recv[i]), std::to_string(expected));
  }
  // The tensor form on host tensors, in place (rank r's block of send is its output): u32 max.
  const shoal_tensor_t whole = shoal_tensor_1d(send.data(), send.size(), SHOAL_U32);
  const shoal_tensor_t own = shoal_tensor_1d(send.data() + static_cast<size_t>(rank) * block, block, SHOAL_U32);
  check(shoal_reduce_scatter_tensor(gComm, &whole, &own, SHOAL_MAX), "reduce_scatter_tensor");
  for (size_t i = 0; i < block; ++i) {
    uint32_t expected = static_cast<uint32_t>(static_cast<size_t>(rank) * block + i) + static_cast<uint32_t>(size - 1);
    uint32_t got = send[static_cast<size_t>(rank) * block + i];
    if (got != expected) wrong("reduce_scatter_tensor", i, std::to_string(got), std::to_string(expected));
  }
  check(shoal_barrier(gComm), "barrier");
  std::printf("worker %d: success\n", rank);
  return kExitOk;
}

int runFailure(int rank, int size, int victim, bool dies, bool bySignal) {
  const size_t count = 1 << 20;
  std::vector<float> data(count);
  constexpr int kIterations = 200;
  constexpr int kFailAt = 3;
  for (int iteration = 0; iteration < kIterations; ++iteration) {
    if (rank == victim && iteration == kFailAt) {
      std::printf("worker %d: %s on purpose before iteration %d\n", rank, dies ? "dying" : "stalling", iteration);
      std::fflush(stdout);
      if (!dies) {
        for (;;) pause();  // the test kills it; the alarm is a safety net
      }
      if (bySignal) raise(SIGKILL);
      _exit(kExitDiedOnPurpose);
    }
    for (size_t i = 0; i < count; ++i) data[i] = static_cast<float>((i + static_cast<size_t>(rank) + iteration) % 8);
    char what[64];
    std::snprintf(what, sizeof what, "allreduce iteration %d", iteration);
    check(shoal_allreduce(gComm, data.data(), data.data(), count, SHOAL_F32, SHOAL_SUM), what);
    for (size_t i = 0; i < count; i += 4093) {
      float expected = 0;
      for (int r = 0; r < size; ++r) expected += static_cast<float>((i + static_cast<size_t>(r) + iteration) % 8);
      if (data[i] != expected) wrong(what, i, std::to_string(data[i]), std::to_string(expected));
    }
  }
  std::printf("worker %d: all %d iterations succeeded although rank %d %s\n", rank, kIterations, victim,
              dies ? "died" : "stalled");
  return kExitOk;
}

// One small allreduce on comm with an exact result: sum over ranks of (rank + 1) * (i + salt).
int checkedAllreduce(shoal_comm_t comm, int rank, int size, int salt, const char* what) {
  std::vector<int64_t> values(1000);
  for (size_t i = 0; i < values.size(); ++i) values[i] = (rank + 1) * static_cast<int64_t>(i + salt);
  check(shoal_allreduce(comm, values.data(), values.data(), values.size(), SHOAL_I64, SHOAL_SUM), what);
  for (size_t i = 0; i < values.size(); ++i) {
    int64_t expected = static_cast<int64_t>(size) * (size + 1) / 2 * static_cast<int64_t>(i + salt);
    if (values[i] != expected) wrong(what, i, std::to_string(values[i]), std::to_string(expected));
  }
  return kExitOk;
}

shoal_comm_t initOrExit(const char* what) {
  shoal_comm_t comm = nullptr;
  shoal_status_t status = shoal_comm_init(&comm);
  if (status != SHOAL_OK) {
    std::fprintf(stderr, "worker %d: %s: shoal_comm_init failed: %s: %s\n", gRank, what, shoal_status_string(status),
                 shoal_last_error(nullptr));
    std::exit(kExitShoalError);
  }
  return comm;
}

int runCycles(int cycles) {
  for (int cycle = 0; cycle < cycles; ++cycle) {
    char what[64];
    std::snprintf(what, sizeof what, "cycle %d", cycle);
    gComm = initOrExit(what);
    int size = 0;
    check(shoal_comm_rank(gComm, &gRank), "shoal_comm_rank");
    check(shoal_comm_size(gComm, &size), "shoal_comm_size");
    checkedAllreduce(gComm, gRank, size, cycle, what);
    check(shoal_comm_destroy(gComm), "shoal_comm_destroy");
    gComm = nullptr;
  }
  std::printf("worker %d: %d cycles succeeded\n", gRank, cycles);
  return kExitOk;
}

int runTwoComms() {
  shoal_comm_t first = initOrExit("first communicator");
  shoal_comm_t second = initOrExit("second communicator");
  int size = 0;
  gComm = first;
  check(shoal_comm_rank(first, &gRank), "shoal_comm_rank");
  check(shoal_comm_size(first, &size), "shoal_comm_size");
  for (int step = 0; step < 20; ++step) {
    gComm = step % 2 ? second : first;
    checkedAllreduce(gComm, gRank, size, step, step % 2 ? "allreduce on the second" : "allreduce on the first");
  }
  gComm = first;
  check(shoal_comm_destroy(first), "shoal_comm_destroy(first)");
  gComm = second;
  checkedAllreduce(second, gRank, size, 99, "allreduce on the second after the first was destroyed");
  check(shoal_comm_destroy(second), "shoal_comm_destroy(second)");
  gComm = nullptr;
  std::printf("worker %d: two communicators succeeded\n", gRank);
  return kExitOk;
}

int usage(const char* why);

double wallClock() {
  timespec now{};
  clock_gettime(CLOCK_REALTIME, &now);
  return static_cast<double>(now.tv_sec) + static_cast<double>(now.tv_nsec) * 1e-9;
}

int runFault(int rank, int size, const std::string& collective, int victim, bool kill) {
  const size_t count = 1 << 20;
  std::vector<float> in(count * static_cast<size_t>(size), 1.0f), out(count * static_cast<size_t>(size));
  for (int iteration = 0; iteration < 1000; ++iteration) {
    if (rank == victim && iteration == 3) {
      std::printf("worker %d: fault at %.6f\n", rank, wallClock());
      std::fflush(stdout);
      raise(kill ? SIGKILL : SIGSTOP);
      for (;;) pause();
    }
    shoal_status_t status = SHOAL_OK;
    if (collective == "allreduce")
      status = shoal_allreduce(gComm, in.data(), out.data(), count, SHOAL_F32, SHOAL_SUM);
    else if (collective == "allgather")
      status = shoal_allgather(gComm, in.data(), out.data(), count, SHOAL_F32);
    else if (collective == "broadcast")
      status = shoal_broadcast(gComm, in.data(), out.data(), count, SHOAL_F32, 0);
    else if (collective == "reduce_scatter")
      status = shoal_reduce_scatter(gComm, in.data(), out.data(), count, SHOAL_F32, SHOAL_SUM);
    else
      return usage("unknown collective");
    if (status != SHOAL_OK) {
      std::printf("worker %d: detected at %.6f: %s: %s\n", rank, wallClock(), shoal_status_string(status),
                  shoal_last_error(gComm));
      std::fflush(stdout);
      shoal_comm_destroy(gComm);
      std::exit(kExitShoalError);
    }
  }
  std::printf("worker %d: never detected the fault\n", rank);
  return kExitOk;
}

int runExhaustFds(int rank, int size) {
  std::vector<int> hoard;
  if (rank == 0) {
    for (int fd; (fd = open("/dev/null", O_RDONLY | O_CLOEXEC)) >= 0;) hoard.push_back(fd);
    std::printf("worker 0: holding %zu descriptors, the last open failed: %s\n", hoard.size(), std::strerror(errno));
  } else {
    usleep(1500 * 1000);
  }
  for (int step = 0; step < 3; ++step) checkedAllreduce(gComm, rank, size, step, "allreduce while out of descriptors");
  for (int fd : hoard) close(fd);
  check(shoal_barrier(gComm), "barrier");
  std::printf("worker %d: exhaust-fds succeeded\n", rank);
  return kExitOk;
}

int usage(const char* why) {
  std::fprintf(stderr,
               "rank_worker: %s\nusage: rank_worker success | die-mid-allreduce RANK [exit|kill] | "
               "stall-mid-allreduce RANK | cycles N | two-comms | hold\n",
               why);
  return kExitUsage;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc >= 2 && std::strncmp(argv[1], "--gtest", 7) == 0) return 0;  // ctest test discovery: no tests here
  if (argc < 2) return usage("no mode given");
  std::string mode = argv[1];
  int victim = -1;
  bool bySignal = false;
  if (mode == "die-mid-allreduce" || mode == "stall-mid-allreduce") {
    if (argc < 3) return usage("the mode needs the rank that fails");
    victim = std::atoi(argv[2]);
    if (argc >= 4) bySignal = std::strcmp(argv[3], "kill") == 0;
  } else if (mode == "fault") {
    if (argc < 5) return usage("fault needs COLLECTIVE RANK kill|stop");
  } else if (mode == "cycles") {
    if (argc < 3) return usage("the mode needs a number of cycles");
  } else if (mode != "success" && mode != "two-comms" && mode != "hold" &&
             mode != "exhaust-fds") {
    return usage("unknown mode");
  }

  const char* timeoutText = std::getenv("SHOAL_TIMEOUT_S");
  double timeout = timeoutText ? std::atof(timeoutText) : 300;
  signal(SIGALRM, onAlarm);
  alarm(static_cast<unsigned>(3 * (timeout > 0 ? timeout : 300)) + 1);

  std::setvbuf(stdout, nullptr, _IOLBF, 0);
  if (mode == "cycles") return runCycles(std::atoi(argv[2]));
  if (mode == "two-comms") return runTwoComms();
  shoal_status_t status = shoal_comm_init(&gComm);
  if (status != SHOAL_OK) {
    std::fprintf(stderr, "worker ?: shoal_comm_init failed: %s: %s\n", shoal_status_string(status),
                 shoal_last_error(nullptr));
    return kExitUsage;
  }
  int size = 0;
  check(shoal_comm_rank(gComm, &gRank), "shoal_comm_rank");
  check(shoal_comm_size(gComm, &size), "shoal_comm_size");
  if (mode == "hold") {
    std::printf("worker %d: holding pid %d\n", gRank, static_cast<int>(getpid()));
    for (;;) pause();
  }

  if (mode == "exhaust-fds") {
    int code = runExhaustFds(gRank, size);
    check(shoal_comm_destroy(gComm), "shoal_comm_destroy");
    return code;
  }
  if (mode == "fault") return runFault(gRank, size, argv[2], std::atoi(argv[3]), std::strcmp(argv[4], "kill") == 0);
  int code = mode == "success" ? runSuccess(gRank, size)
                               : runFailure(gRank, size, victim, mode == "die-mid-allreduce", bySignal);
  check(shoal_comm_destroy(gComm), "shoal_comm_destroy");
  return code;
}
