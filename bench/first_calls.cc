// shoal-first-calls: what a fresh process pays in its first allreduces of one
// size (issue 17: "the first iterations after start-up are slow"). It times
// each of the first calls one by one, each after a barrier, and counts the
// page faults each rank took inside it, so a one-time cost shows as the calls
// it lands in rather than as a mean:
//
//   shoalrun -np 2 shoal-first-calls 1M 20        # bytes (K/M suffix), calls
//   shoalrun -np 2 shoal-first-calls 1M 20 inplace
//
// Prints, on rank 0, the init's time, page faults and resident size, then one
// line per call: the slowest rank's time and the most faults any rank took.
// The buffers are written before init, so their own first-touch faults are
// not counted (they are the application's, in any library).
#include <shoal/shoal.h>
#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

namespace {

using Clock = std::chrono::steady_clock;

long minorFaults() {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  return usage.ru_minflt + usage.ru_majflt;
}

double maxRssMiB() {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  return double(usage.ru_maxrss) / 1024.0;  // KiB on Linux
}

size_t parseBytes(const char* text) {
  char* end = nullptr;
  double value = std::strtod(text, &end);
  if (end == text || value <= 0) return 0;
  std::string unit(end);
  if (unit == "K" || unit == "k") value *= 1024;
  else if (unit == "M" || unit == "m") value *= 1024 * 1024;
  else if (unit == "G" || unit == "g") value *= 1024.0 * 1024 * 1024;
  else if (!unit.empty()) return 0;
  return static_cast<size_t>(value);
}

void check(shoal_status_t status, const char* what) {
  if (status == SHOAL_OK) return;
  std::fprintf(stderr, "shoal-first-calls: %s failed: %s: %s\n", what, shoal_status_string(status),
               shoal_last_error(nullptr));
  std::exit(1);
}

}  // namespace

int main(int argc, char** argv) {
  const size_t bytes = argc > 1 ? parseBytes(argv[1]) : 0;
  const int calls = argc > 2 ? std::atoi(argv[2]) : 20;
  const bool inPlace = argc > 3 && std::strcmp(argv[3], "inplace") == 0;
  if (bytes < 4 || calls < 1 || (argc > 3 && !inPlace)) {
    std::fprintf(stderr, "usage: shoalrun -np N shoal-first-calls BYTES[K|M|G] [CALLS=20] [inplace]\n");
    return 2;
  }
  const size_t count = bytes / sizeof(float);
  std::vector<float> send(count, 1.0f), recv(count, 0.0f);  // written now: their faults are not the calls'

  const long faultsBeforeInit = minorFaults();
  const auto initStart = Clock::now();
  shoal_comm_t comm = nullptr;
  shoal_config_t config = SHOAL_CONFIG_INIT;
  check(shoal_comm_init_config(&config, &comm), "shoal_comm_init_config");
  double initMs = std::chrono::duration<double, std::milli>(Clock::now() - initStart).count();
  double init[3] = {initMs, double(minorFaults() - faultsBeforeInit), maxRssMiB()};
  int rank = 0, size = 1;
  check(shoal_comm_rank(comm, &rank), "shoal_comm_rank");
  check(shoal_comm_size(comm, &size), "shoal_comm_size");
  check(shoal_allreduce(comm, init, init, 3, SHOAL_F64, SHOAL_MAX), "shoal_allreduce (init figures)");

  // Per call: time (us) and faults, each the maximum over ranks.
  std::vector<double> figures(2 * size_t(calls));
  float* out = inPlace ? send.data() : recv.data();
  for (int i = 0; i < calls; ++i) {
    check(shoal_barrier(comm), "shoal_barrier");
    const long faults = minorFaults();
    const auto start = Clock::now();
    check(shoal_allreduce(comm, send.data(), out, count, SHOAL_F32, SHOAL_SUM), "shoal_allreduce");
    figures[2 * size_t(i)] = std::chrono::duration<double, std::micro>(Clock::now() - start).count();
    figures[2 * size_t(i) + 1] = double(minorFaults() - faults);
  }
  check(shoal_allreduce(comm, figures.data(), figures.data(), figures.size(), SHOAL_F64, SHOAL_MAX),
        "shoal_allreduce (figures)");
  if (rank == 0) {
    std::printf("# shoal-first-calls: %d ranks, %zu bytes (f32 sum, %s), %d calls, each after a barrier\n", size,
                count * sizeof(float), inPlace ? "in place" : "out of place", calls);
    std::printf("# init: %.1f ms, %.0f page faults, max RSS %.1f MiB (maxima over ranks)\n", init[0], init[1],
                init[2]);
    std::printf("# %5s %14s %14s\n", "call", "time_us(max)", "faults(max)");
    for (int i = 0; i < calls; ++i)
      std::printf("  %5d %14.1f %14.0f\n", i + 1, figures[2 * size_t(i)], figures[2 * size_t(i) + 1]);
    std::vector<double> later;
    for (int i = calls / 2; i < calls; ++i) later.push_back(figures[2 * size_t(i)]);
    std::sort(later.begin(), later.end());
    std::printf("# median of calls %d..%d: %.1f us\n", calls / 2 + 1, calls, later[later.size() / 2]);
  }
  check(shoal_comm_finalize(comm), "shoal_comm_finalize");
  shoal_comm_destroy(comm);
  return 0;
}
