// shoal-runtime-bench: the async runtime on a training step's gradients. Each
// step every rank submits the ResNet-50 gradient set (161 named f32 tensors,
// bench/resnet50_shapes.h) with shoal_iallreduce (avg) in its own shuffled
// order, then waits for all of them. Run under shoalrun:
//
//   shoalrun -np 4 build/bin/shoal-runtime-bench [--steps N] [--warmup N]
//       [--compressor NAME] [--copts k=v,...] [--shrink K]
//
// Fusion follows SHOAL_FUSION_THRESHOLD (default 128 MiB; 0 = off): run it
// once with each to compare (a tcp store serves one communicator at a time,
// so one run measures one setting). Rank 0 prints one Markdown row:
//   steps/s: 1 / the median over timed steps of the slowest rank's step time;
//   negotiation us/step: the median over timed steps of the time rank 0's
//     engine spent negotiating (the bitwise allreduce of every cycle, plus the
//     metadata allgatherv of full rounds) during the step;
//   cycles/step, collectives/step (fused groups count once) and full rounds
//     during the timed steps (0 in steady state: the response cache's bits
//     negotiate everything);
//   idle rounds/s and idle CPU: negotiation rounds per second and this
//     process's CPU (getrusage: the engine thread and UCX's, the main thread
//     sleeps) over 1 s with nothing submitted after the steps. The rounds are
//     the fewest any rank counted in its 1 s: see the end of runConfig.
// --shrink K divides every tensor's first dimension by K (default 1: real shapes).
#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "resnet50_shapes.h"
#include "shoal/shoal.h"

namespace {

using shoal::bench::kResNet50;
using shoal::bench::kTensors;

void check(shoal_status_t status, shoal_comm_t comm, const char* what) {
  if (status != SHOAL_OK) {
    std::fprintf(stderr, "shoal-runtime-bench: %s failed: %s: %s\n", what, shoal_status_string(status),
                 comm ? shoal_last_error(comm) : shoal_last_error(nullptr));
    std::exit(1);
  }
}

constexpr double kIdleS = 1.0;

double processCpuS() {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  return static_cast<double>(usage.ru_utime.tv_sec + usage.ru_stime.tv_sec) +
         static_cast<double>(usage.ru_utime.tv_usec + usage.ru_stime.tv_usec) / 1e6;
}

double median(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  size_t n = values.size();
  return n % 2 ? values[n / 2] : (values[n / 2 - 1] + values[n / 2]) / 2;
}

struct Options {
  int steps = 10, warmup = 3;
  int64_t shrink = 1;
  std::string compressor = "none", copts;
};

struct Row {
  double stepS = 0, negotiationUs = 0, cycles = 0, groups = 0, idleRoundsPerS = 0, idleCpuMsPerS = 0;
  uint64_t fullRounds = 0;
};

Row runConfig(const Options& options) {
  shoal_comm_t comm = nullptr;
  check(shoal_comm_init(&comm), nullptr, "shoal_comm_init");
  int rank = 0;
  check(shoal_comm_rank(comm, &rank), comm, "shoal_comm_rank");
  std::vector<std::vector<int64_t>> shapes(kTensors);
  std::vector<std::vector<float>> grads(kTensors), outs(kTensors);
  std::mt19937 random(static_cast<uint32_t>(rank * 1009 + 7));
  std::uniform_real_distribution<float> uniform(-1, 1);
  for (size_t t = 0; t < kTensors; ++t) {
    shapes[t].assign(kResNet50[t].shape, kResNet50[t].shape + kResNet50[t].ndim);
    shapes[t][0] = (shapes[t][0] + options.shrink - 1) / options.shrink;
    size_t count = 1;
    for (int64_t extent : shapes[t]) count *= static_cast<size_t>(extent);
    grads[t].resize(count);
    outs[t].resize(count);
    for (float& x : grads[t]) x = uniform(random);
  }
  check(shoal_async_start(comm), comm, "shoal_async_start");
  shoal_async_options_t async = SHOAL_ASYNC_OPTIONS_INIT;
  async.compressor = options.compressor.c_str();
  async.compressor_options = options.copts.c_str();
  async.compress_min_bytes = 0;
  std::vector<size_t> order(kTensors);
  std::iota(order.begin(), order.end(), 0);
  std::vector<double> times, negotiation, cycles, groups;
  uint64_t fullRounds = 0;
  std::vector<shoal_request_t> requests(kTensors);
  for (int step = 0; step < options.warmup + options.steps; ++step) {
    check(shoal_barrier(comm), comm, "shoal_barrier");
    std::shuffle(order.begin(), order.end(), random);
    shoal_async_stats_t before = SHOAL_ASYNC_STATS_INIT, after = SHOAL_ASYNC_STATS_INIT;
    check(shoal_async_stats(comm, &before), comm, "shoal_async_stats");
    auto start = std::chrono::steady_clock::now();
    for (size_t k = 0; k < kTensors; ++k) {
      size_t t = order[k];
      shoal_tensor_t in = shoal_tensor_1d(grads[t].data(), grads[t].size(), SHOAL_F32);
      in.ndim = static_cast<int>(shapes[t].size());
      for (int d = 0; d < in.ndim; ++d) in.shape[d] = shapes[t][d];
      shoal_tensor_t out = in;
      out.data = outs[t].data();
      check(shoal_iallreduce(comm, kResNet50[t].name, &in, &out, SHOAL_AVG, &async, &requests[k]), comm,
            kResNet50[t].name);
    }
    check(shoal_wait_all(requests.data(), static_cast<int>(kTensors), 0), nullptr, "shoal_wait_all");
    double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    check(shoal_async_stats(comm, &after), comm, "shoal_async_stats");
    for (shoal_request_t r : requests) shoal_request_free(r);
    check(shoal_allreduce(comm, &seconds, &seconds, 1, SHOAL_F64, SHOAL_MAX), comm, "timing allreduce");
    if (step < options.warmup) continue;
    times.push_back(seconds);
    negotiation.push_back(after.negotiation_us - before.negotiation_us);
    cycles.push_back(static_cast<double>(after.cycles - before.cycles));
    groups.push_back(static_cast<double>(after.groups - before.groups));
    fullRounds += after.full_rounds - before.full_rounds;
  }
  shoal_async_stats_t idleBefore = SHOAL_ASYNC_STATS_INIT, idleAfter = SHOAL_ASYNC_STATS_INIT;
  check(shoal_barrier(comm), comm, "shoal_barrier");
  check(shoal_async_stats(comm, &idleBefore), comm, "shoal_async_stats");
  const double cpuBefore = processCpuS();
  std::this_thread::sleep_for(std::chrono::milliseconds(static_cast<int>(kIdleS * 1000)));
  const double idleCpuMsPerS = (processCpuS() - cpuBefore) * 1e3 / kIdleS;
  check(shoal_async_stats(comm, &idleAfter), comm, "shoal_async_stats");
  // The windows end with this allreduce, through the runtime like every call now: the rank whose
  // window ends first starts its round at once, and a rank whose window ends later (its barrier
  // above returned later, or its sleep overran on a busy CPU) joins that round inside its window
  // and counts it, though no round ran without a reason. (This failed multiproc.netns_two_hosts'
  // check of 0 on a loaded machine, ninth session; so would any call here, e.g. a barrier.) The
  // fewest over the ranks is exact for that: the rank whose window ends first counts none of this
  // call's rounds (no rank has made it before that rank reads), and none of the barrier's (they
  // all ran before it returned on every rank), while a round that runs while every window is open
  // counts on every rank. tests/runtime/test_async_idle.cc pins both. It also makes every rank read
  // its count before any rank's shutdown round (destroy) can start.
  double idleRounds = static_cast<double>(idleAfter.cycles - idleBefore.cycles);
  check(shoal_allreduce(comm, &idleRounds, &idleRounds, 1, SHOAL_F64, SHOAL_MIN), comm, "idle rounds allreduce");
  const double idleRoundsPerS = idleRounds / kIdleS;
  check(shoal_comm_destroy(comm), nullptr, "shoal_comm_destroy");
  return {median(times), median(negotiation), median(cycles), median(groups), idleRoundsPerS, idleCpuMsPerS, fullRounds};
}

}  // namespace

int main(int argc, char** argv) {
  Options options;
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    auto value = [&]() -> const char* {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "shoal-runtime-bench: %s needs a value\n", arg.c_str());
        std::exit(2);
      }
      return argv[++i];
    };
    if (arg == "--steps") options.steps = std::atoi(value());
    else if (arg == "--warmup") options.warmup = std::atoi(value());
    else if (arg == "--shrink") options.shrink = std::atoll(value());
    else if (arg == "--compressor") options.compressor = value();
    else if (arg == "--copts") options.copts = value();
    else {
      std::fprintf(stderr,
                   "usage: shoalrun -np N shoal-runtime-bench [--steps N] [--warmup N] [--compressor NAME] "
                   "[--copts k=v,...] [--shrink K]\n");
      return 2;
    }
  }
  if (options.steps < 1 || options.warmup < 0 || options.shrink < 1) {
    std::fprintf(stderr, "shoal-runtime-bench: --steps >= 1, --warmup >= 0 and --shrink >= 1 please\n");
    return 2;
  }
  const char* rankText = std::getenv("SHOAL_RANK");
  const bool rankZero = rankText == nullptr || std::strcmp(rankText, "0") == 0;
  const char* sizeText = std::getenv("SHOAL_WORLD_SIZE");
  if (rankZero) {
    std::printf("# shoal-runtime-bench: %zu ResNet-50 tensors (first dims / %lld), %s ranks, avg, compressor %s%s%s, "
                "%d warm-up + %d timed steps, SHOAL_CYCLE_TIME_MS=%s\n",
                kTensors, static_cast<long long>(options.shrink), sizeText ? sizeText : "1", options.compressor.c_str(),
                options.copts.empty() ? "" : " ", options.copts.c_str(), options.warmup, options.steps,
                std::getenv("SHOAL_CYCLE_TIME_MS") ? std::getenv("SHOAL_CYCLE_TIME_MS") : "1 (default)");
    std::printf("| SHOAL_FUSION_THRESHOLD | steps/s | time/step (ms) | negotiation (us/step) | cycles/step | collectives/step | full rounds (timed) | idle rounds/s | idle CPU (ms/s, rank 0) |\n");
    std::printf("|---|---:|---:|---:|---:|---:|---:|---:|---:|\n");
    std::fflush(stdout);
  }
  const char* threshold = std::getenv("SHOAL_FUSION_THRESHOLD");
  std::string label = threshold == nullptr || threshold[0] == '\0' ? "134217728 (default)" : threshold;
  Row row = runConfig(options);
  if (rankZero) {
    std::printf("| %s | %.2f | %.1f | %.0f | %.0f | %.0f | %llu | %.0f | %.1f |\n", label.c_str(), 1 / row.stepS,
                row.stepS * 1e3, row.negotiationUs, row.cycles, row.groups,
                static_cast<unsigned long long>(row.fullRounds), row.idleRoundsPerS, row.idleCpuMsPerS);
    std::fflush(stdout);
  }
  return 0;
}
