// Shared pieces of the peer benchmarks (gloo_allreduce.cc, mpi_allreduce.cc):
// command-line parsing, the verifiable input pattern, and nccl-tests-style
// output. Header-only so each benchmark is a single compile command.
//
// Output format (one line per size, rank 0 only), as in nccl-tests:
//   size count type redop time_us algbw_GBps busbw_GBps #wrong
// algbw = size / time, busbw = algbw * 2(n-1)/n, GB = 1e9.
//
// Timing convention (identical in both peers): after warm-up and a barrier,
// every rank times `iters` back-to-back allreduces with std::chrono::
// steady_clock; time_us is that loop's mean per-iteration time, and the
// reported value is the MAX over ranks (the slowest rank bounds the
// collective). Correctness is checked on a separate, untimed iteration with
// freshly written inputs, like nccl-tests' check iteration.
#pragma once

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cinttypes>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

namespace peers {

struct Options {
  // Sweep (nccl-tests flag names).
  size_t min_bytes = 4 << 10;
  size_t max_bytes = 4 << 10;
  double factor = 2.0;
  int iters = 20;
  int warmup = 5;
  bool check = true;
  bool inplace = false;  // gloo old-API algorithms are always in place
  bool percentiles = false;  // also print rank 0's per-iteration spread
  // Gloo only.
  int rank = -1;
  int size = -1;
  std::string store_dir;
  std::string host = "127.0.0.1";
  std::string algo = "ring";
  int timeout_s = 120;  // per Gloo operation; a dead peer fails the run
};

// Parses "4096", "4K", "16M", "1G" (binary units, as nccl-tests does).
inline bool parse_bytes(const char* s, size_t* out) {
  char* end = nullptr;
  errno = 0;
  double v = std::strtod(s, &end);
  if (errno != 0 || end == s || v < 0) return false;
  double mult = 1;
  switch (*end) {
    case '\0': break;
    case 'k': case 'K': mult = 1024.0; ++end; break;
    case 'm': case 'M': mult = 1024.0 * 1024; ++end; break;
    case 'g': case 'G': mult = 1024.0 * 1024 * 1024; ++end; break;
    default: return false;
  }
  if (*end == 'B' || *end == 'b') ++end;
  if (*end != '\0') return false;
  *out = static_cast<size_t>(v * mult);
  return true;
}

inline void usage(const char* prog, bool gloo) {
  std::fprintf(stderr,
      "usage: %s %s-b MINBYTES -e MAXBYTES -f FACTOR -n ITERS -w WARMUP\n"
      "          [-c 0|1 (check)] [--inplace] [-p (per-iteration percentiles)]%s\n",
      prog,
      gloo ? "--rank R --size N --store-dir DIR [--host 127.0.0.1]\n"
             "          [--algo ring|ring_chunked|halving_doubling|bcube|"
             "new_ring|new_bcube]\n          [--timeout-s S] "
           : "",
      gloo ? "" : "\n  (launch with mpirun)");
}

// Returns false (after printing why) on a bad command line.
inline bool parse_args(int argc, char** argv, Options* o, bool gloo) {
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto need = [&](const char* what) -> const char* {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "%s: %s needs a value\n", argv[0], what);
        return nullptr;
      }
      return argv[++i];
    };
    const char* v = nullptr;
    bool ok = true;
    if (a == "-b" || a == "--minbytes") {
      ok = (v = need("-b")) && parse_bytes(v, &o->min_bytes);
    } else if (a == "-e" || a == "--maxbytes") {
      ok = (v = need("-e")) && parse_bytes(v, &o->max_bytes);
    } else if (a == "-f" || a == "--stepfactor") {
      ok = (v = need("-f")) && (o->factor = std::atof(v)) > 1.0;
    } else if (a == "-n" || a == "--iters") {
      ok = (v = need("-n")) && (o->iters = std::atoi(v)) > 0;
    } else if (a == "-w" || a == "--warmup_iters") {
      ok = (v = need("-w")) && (o->warmup = std::atoi(v)) >= 0;
    } else if (a == "-c" || a == "--check") {
      ok = (v = need("-c")) != nullptr;
      if (ok) o->check = std::atoi(v) != 0;
    } else if (a == "--inplace") {
      o->inplace = true;
    } else if (a == "-p" || a == "--percentiles") {
      o->percentiles = true;
    } else if (gloo && a == "--rank") {
      ok = (v = need("--rank")) && (o->rank = std::atoi(v)) >= 0;
    } else if (gloo && a == "--size") {
      ok = (v = need("--size")) && (o->size = std::atoi(v)) > 0;
    } else if (gloo && a == "--store-dir") {
      ok = (v = need("--store-dir")) != nullptr;
      if (ok) o->store_dir = v;
    } else if (gloo && a == "--host") {
      ok = (v = need("--host")) != nullptr;
      if (ok) o->host = v;
    } else if (gloo && a == "--algo") {
      ok = (v = need("--algo")) != nullptr;
      if (ok) o->algo = v;
    } else if (gloo && a == "--timeout-s") {
      ok = (v = need("--timeout-s")) && (o->timeout_s = std::atoi(v)) > 0;
    } else if (a == "-h" || a == "--help") {
      usage(argv[0], gloo);
      std::exit(0);
    } else {
      std::fprintf(stderr, "%s: unknown argument '%s'\n", argv[0], a.c_str());
      ok = false;
    }
    if (!ok) {
      if (v) std::fprintf(stderr, "%s: bad value '%s' for %s\n", argv[0], v, a.c_str());
      usage(argv[0], gloo);
      return false;
    }
  }
  if (o->max_bytes < o->min_bytes) o->max_bytes = o->min_bytes;
  if (gloo && (o->rank < 0 || o->size <= 0 || o->rank >= o->size ||
               o->store_dir.empty())) {
    std::fprintf(stderr, "%s: --rank, --size and --store-dir are required\n", argv[0]);
    usage(argv[0], gloo);
    return false;
  }
  return true;
}

// Message sizes of the sweep, rounded down to whole floats (min one float).
inline std::vector<size_t> sweep_sizes(const Options& o) {
  std::vector<size_t> out;
  for (double b = static_cast<double>(o.min_bytes);
       b <= static_cast<double>(o.max_bytes) * (1 + 1e-9); b *= o.factor) {
    size_t bytes = static_cast<size_t>(b) / sizeof(float) * sizeof(float);
    if (bytes == 0) bytes = sizeof(float);
    if (out.empty() || out.back() != bytes) out.push_back(bytes);
  }
  return out;
}

// Verifiable inputs: small non-negative integers, so every partial sum is
// exactly representable and the result does not depend on reduction order.
// Values repeat with period kPeriod in the element index.
constexpr size_t kPeriod = 31;

inline float input_value(size_t i, int rank) {
  return static_cast<float>((i * 7 + static_cast<size_t>(rank) * 3) % kPeriod);
}

inline void fill_input(float* buf, size_t count, int rank) {
  float period[kPeriod];
  for (size_t j = 0; j < kPeriod; ++j) period[j] = input_value(j, rank);
  for (size_t i = 0, j = 0; i < count; ++i, j = (j + 1 == kPeriod ? 0 : j + 1))
    buf[i] = period[j];
}

// Elements that differ from the exact sum over `nranks` ranks.
inline int64_t count_wrong(const float* buf, size_t count, int nranks) {
  float expect[kPeriod] = {};
  for (size_t j = 0; j < kPeriod; ++j)
    for (int r = 0; r < nranks; ++r) expect[j] += input_value(j, r);
  int64_t wrong = 0;
  for (size_t i = 0, j = 0; i < count; ++i, j = (j + 1 == kPeriod ? 0 : j + 1))
    wrong += buf[i] != expect[j];
  return wrong;
}

inline double now_us() {
  using namespace std::chrono;
  return duration<double, std::micro>(steady_clock::now().time_since_epoch())
      .count();
}

inline void print_header(const char* what, int nranks, const Options& o,
                         const char* placement) {
  std::printf("# %s: allreduce float sum, nranks %d, %s, iters %d, warmup %d, "
              "check %d\n", what, nranks, placement, o.iters, o.warmup,
              o.check ? 1 : 0);
  std::printf("# time = max over ranks of the mean per-iteration time; "
              "GB = 1e9; busbw = algbw * 2(n-1)/n; #wrong = -1 if unchecked\n");
  std::printf("# %10s %12s %6s %6s %12s %12s %12s %8s\n", "size", "count",
              "type", "redop", "time_us", "algbw_GBps", "busbw_GBps", "#wrong");
  std::fflush(stdout);
}

inline void print_row(size_t bytes, int nranks, double time_us, int64_t wrong) {
  double algbw = time_us > 0 ? static_cast<double>(bytes) / (time_us * 1e3) : 0;
  double busbw = algbw * 2.0 * (nranks - 1) / nranks;
  std::printf("  %10zu %12zu %6s %6s %12.2f %12.4f %12.4f %8" PRId64 "\n",
              bytes, bytes / sizeof(float), "float", "sum", time_us, algbw,
              busbw, wrong);
  std::fflush(stdout);
}

// Times `iters` calls of fn(). Returns the loop's mean per-iteration time;
// with `per_iter` also records each iteration (used by -p to tell steady
// slowness from occasional stalls, e.g. TCP delayed-ACK waits).
template <typename Fn>
double time_loop(int iters, Fn&& fn, std::vector<double>* per_iter) {
  const double t0 = now_us();
  if (per_iter) {
    per_iter->clear();
    double prev = t0;
    for (int i = 0; i < iters; ++i) {
      fn();
      const double t = now_us();
      per_iter->push_back(t - prev);
      prev = t;
    }
    return (prev - t0) / iters;
  }
  for (int i = 0; i < iters; ++i) fn();
  return (now_us() - t0) / iters;
}

// "# p: size min p50 p90 p99 max" (microseconds, this rank only).
inline void print_percentiles(size_t bytes, std::vector<double> v) {
  if (v.empty()) return;
  std::sort(v.begin(), v.end());
  auto q = [&](double f) { return v[static_cast<size_t>(f * (v.size() - 1))]; };
  std::printf("# p: %10zu min %.1f p50 %.1f p90 %.1f p99 %.1f max %.1f us\n",
              bytes, v.front(), q(0.5), q(0.9), q(0.99), v.back());
}

}  // namespace peers
