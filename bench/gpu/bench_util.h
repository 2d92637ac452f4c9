// Shared by the GPU benchmarks: the device check (exit 77 without one), CUDA
// error checks, event timing, and the one output line check.sh parses.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <vector>

namespace bench::gpu {

inline void requireDevice() {
  int count = 0;
  cudaError_t status = cudaGetDeviceCount(&count);
  if (status != cudaSuccess || count == 0) {
    std::printf("no CUDA device: %s\n", status != cudaSuccess ? cudaGetErrorString(status) : "none found");
    std::exit(77);
  }
}

inline void check(cudaError_t status, const char* what) {
  if (status == cudaSuccess) return;
  std::fprintf(stderr, "%s: %s\n", what, cudaGetErrorString(status));
  std::exit(1);
}

// A call that returns nullptr or error text (shoal's GPU entry points).
inline void check(const char* error, const char* what) {
  if (error == nullptr) return;
  std::fprintf(stderr, "%s: %s\n", what, error);
  std::exit(1);
}

// Median time of one call of `launch` (enqueued on `stream`) in microseconds,
// over `repeats` timed calls after two warm-up calls.
template <typename Launch>
double medianMicroseconds(cudaStream_t stream, Launch&& launch, int repeats = 20) {
  cudaEvent_t start, stop;
  check(cudaEventCreate(&start), "cudaEventCreate");
  check(cudaEventCreate(&stop), "cudaEventCreate");
  for (int i = 0; i < 2; ++i) launch();
  check(cudaStreamSynchronize(stream), "warm-up");
  std::vector<float> times;
  for (int i = 0; i < repeats; ++i) {
    check(cudaEventRecord(start, stream), "cudaEventRecord");
    launch();
    check(cudaEventRecord(stop, stream), "cudaEventRecord");
    check(cudaEventSynchronize(stop), "timed call");
    float ms = 0;
    check(cudaEventElapsedTime(&ms, start, stop), "cudaEventElapsedTime");
    times.push_back(ms);
  }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  std::sort(times.begin(), times.end());
  return times[times.size() / 2] * 1000.0;
}

// bytes: what the kernel reads plus what it writes.
inline void report(const char* name, size_t bytes, double microseconds) {
  std::printf("kernel %s bytes %zu time_us %.2f GBps %.1f\n", name, bytes, microseconds,
              microseconds > 0 ? double(bytes) / microseconds / 1e3 : 0.0);
  std::fflush(stdout);
}

}  // namespace bench::gpu
