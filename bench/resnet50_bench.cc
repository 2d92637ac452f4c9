// resnet50-bench: one training step's worth of ResNet-50 gradient allreduces
// (the 161 parameter tensors of torchvision's resnet50, 25,557,032 f32
// parameters) through shoal_allreduce_tensor, one named call per tensor, with
// a chosen compressor. Run it under shoalrun:
//
//   shoalrun -np 4 build/bin/resnet50-bench                       # all configurations
//   shoalrun -np 4 build/bin/resnet50-bench --compressor powersgd --copts rank=4
//
// Options: --compressor NAME, --copts "k=v,...", --steps N (timed steps,
// default 5), --warmup N (untimed steps first, default 2), --op sum|avg
// (default avg). Without --compressor it runs none, fp16 and powersgd at
// rank 1, 4 and 16, one after the other.
//
// Per configuration rank 0 prints one Markdown table row:
//   bytes sent per rank per step: the sum over the step's calls of
//     shoal_last_compress_stats().wire_bytes on rank 0. Uncompressed calls
//     report wire_bytes 0 (the plain path does not count them), so for those
//     the ring's 2(n-1)/n * bytes is used instead, and the row says so;
//   time per step: the median over the timed steps of the slowest rank's
//     step time (each step starts after a barrier);
//   compression ratio: input bytes / payload bytes (payload = what the
//     compressor handed to collectives; uncompressed calls count their input).
// Every rank's gradients are deterministic pseudo-random N(0, 1)-ish values;
// inputs stay intact (output is a separate buffer), so every step sees the
// same gradients.
#include <algorithm>
#include <chrono>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "resnet50_shapes.h"
#include "shoal/shoal.h"

namespace {

using shoal::bench::Param;
using shoal::bench::kResNet50;
using shoal::bench::kTensors;
using shoal::bench::kParameters;


int64_t elementsOf(const Param& p) {
  int64_t n = 1;
  for (int d = 0; d < p.ndim; ++d) n *= p.shape[d];
  return n;
}

void check(shoal_status_t status, shoal_comm_t comm, const char* what) {
  if (status != SHOAL_OK) {
    std::fprintf(stderr, "resnet50-bench: %s failed: %s: %s\n", what, shoal_status_string(status),
                 shoal_last_error(comm));
    std::exit(1);
  }
}

struct Config {
  std::string compressor, copts;
};

struct Result {
  double bytesPerStep = 0;      // sent by rank 0 per step
  bool computedBytes = false;   // some calls' bytes were computed as 2(n-1)/n * bytes
  double inputBytes = 0, payloadBytes = 0;
  double medianS = 0;
};

Result runConfig(shoal_comm_t comm, int size, const Config& config, const std::vector<std::vector<float>>& grads,
                 std::vector<std::vector<float>>& outs, int warmup, int steps, shoal_op_t op) {
  Result result;
  std::vector<double> times;
  for (int step = 0; step < warmup + steps; ++step) {
    check(shoal_barrier(comm), comm, "shoal_barrier");
    double sent = 0, input = 0, payload = 0;
    bool computed = false;
    auto start = std::chrono::steady_clock::now();
    for (size_t t = 0; t < kTensors; ++t) {
      const Param& p = kResNet50[t];
      shoal_tensor_t in = shoal_tensor_1d(const_cast<float*>(grads[t].data()), grads[t].size(), SHOAL_F32);
      in.ndim = p.ndim;
      for (int d = 0; d < p.ndim; ++d) in.shape[d] = p.shape[d];
      shoal_tensor_t out = in;
      out.data = outs[t].data();
      shoal_allreduce_options_t options = SHOAL_ALLREDUCE_OPTIONS_INIT;
      options.name = p.name;
      options.compressor = config.compressor.c_str();
      options.compressor_options = config.copts.c_str();
      options.compress_min_bytes = 0;
      check(shoal_allreduce_tensor(comm, &in, &out, op, &options), comm, p.name);
      shoal_compress_stats_t stats = SHOAL_COMPRESS_STATS_INIT;
      check(shoal_last_compress_stats(comm, &stats), comm, "shoal_last_compress_stats");
      const double bytes = static_cast<double>(grads[t].size() * sizeof(float));
      input += bytes;
      if (stats.wire_bytes == 0 && stats.payload_bytes == 0) {  // the plain (uncompressed) path
        sent += 2.0 * (size - 1) / size * bytes;
        payload += bytes;
        computed = computed || size > 1;
      } else {
        sent += static_cast<double>(stats.wire_bytes);
        payload += static_cast<double>(stats.payload_bytes);
      }
    }
    double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    check(shoal_allreduce(comm, &seconds, &seconds, 1, SHOAL_F64, SHOAL_MAX), comm, "timing allreduce");
    if (step >= warmup) times.push_back(seconds);
    result.bytesPerStep = sent;
    result.inputBytes = input;
    result.payloadBytes = payload;
    result.computedBytes = computed;
  }
  std::sort(times.begin(), times.end());
  size_t n = times.size();
  result.medianS = n % 2 ? times[n / 2] : (times[n / 2 - 1] + times[n / 2]) / 2;
  return result;
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<Config> configs;
  std::string compressor, copts;
  bool haveCompressor = false;
  int steps = 5, warmup = 2;
  shoal_op_t op = SHOAL_AVG;
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    auto value = [&]() -> const char* {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "resnet50-bench: %s needs a value\n", arg.c_str());
        std::exit(2);
      }
      return argv[++i];
    };
    if (arg == "--compressor") compressor = value(), haveCompressor = true;
    else if (arg == "--copts") copts = value();
    else if (arg == "--steps") steps = std::atoi(value());
    else if (arg == "--warmup") warmup = std::atoi(value());
    else if (arg == "--op") {
      if (shoal_op_from_name(value(), &op) != SHOAL_OK || (op != SHOAL_SUM && op != SHOAL_AVG)) {
        std::fprintf(stderr, "resnet50-bench: --op takes sum or avg\n");
        return 2;
      }
    } else {
      std::fprintf(stderr,
                   "usage: shoalrun -np N resnet50-bench [--compressor NAME] [--copts k=v,...] [--steps N] "
                   "[--warmup N] [--op sum|avg]\n");
      return 2;
    }
  }
  if (steps < 1 || warmup < 0) {
    std::fprintf(stderr, "resnet50-bench: --steps must be >= 1 and --warmup >= 0\n");
    return 2;
  }
  if (haveCompressor) configs.push_back({compressor, copts});
  else configs = {{"none", ""}, {"fp16", ""}, {"powersgd", "rank=1"}, {"powersgd", "rank=4"}, {"powersgd", "rank=16"}};

  int64_t total = 0;
  for (const Param& p : kResNet50) total += elementsOf(p);
  if (total != kParameters) {
    std::fprintf(stderr, "resnet50-bench: the shape table holds %" PRId64 " parameters, expected %" PRId64 "\n", total,
                 kParameters);
    return 1;
  }

  shoal_comm_t comm = nullptr;
  check(shoal_comm_init(&comm), nullptr, "shoal_comm_init");
  int rank = 0, size = 1;
  shoal_comm_rank(comm, &rank);
  shoal_comm_size(comm, &size);

  std::vector<std::vector<float>> grads(kTensors), outs(kTensors);
  uint64_t state = 0x9e3779b97f4a7c15ull * (rank + 1);
  for (size_t t = 0; t < kTensors; ++t) {
    grads[t].resize(static_cast<size_t>(elementsOf(kResNet50[t])));
    outs[t].resize(grads[t].size());
    for (float& x : grads[t]) {  // sum of 4 uniforms, centred: roughly N(0, 1/3)
      float sum = 0;
      for (int k = 0; k < 4; ++k) {
        state = state * 6364136223846793005ull + 1442695040888963407ull;
        sum += static_cast<float>(state >> 40) / static_cast<float>(1 << 24);
      }
      x = sum - 2.0f;
    }
  }

  if (rank == 0) {
    std::printf("# resnet50-bench: %zu tensors, %" PRId64 " parameters (%.1f MB f32), %d ranks, op %s, %d warm-up + %d timed steps\n",
                kTensors, total, total * 4 / 1e6, size, shoal_op_name(op), warmup, steps);
    std::printf("| compressor | options | bytes sent/rank/step (MB) | time/step (ms, median) | compression ratio |\n");
    std::printf("|---|---|---:|---:|---:|\n");
    std::fflush(stdout);
  }
  for (const Config& config : configs) {
    Result r = runConfig(comm, size, config, grads, outs, warmup, steps, op);
    if (rank == 0) {
      std::printf("| %s | %s | %.2f%s | %.1f | %.1f |\n", config.compressor.c_str(),
                  config.copts.empty() ? "-" : config.copts.c_str(), r.bytesPerStep / 1e6,
                  r.computedBytes ? " (computed 2(n-1)/n*bytes)" : "", r.medianS * 1e3,
                  r.inputBytes / r.payloadBytes);
      std::fflush(stdout);
    }
  }
  check(shoal_comm_destroy(comm), nullptr, "shoal_comm_destroy");
  return 0;
}
