// The sketch compressor's CUDA kernels (compressors/sketch/sketch.cu) at 1%
// density: round-0 index build, support compaction, union enumeration,
// compact encode, count-sketch scatter (1.3 cells per member), peel, decode.
// One rank, no communication. Prints, per kernel,
//   kernel <name> bytes <B> time_us <t> GBps <g>
// with B = the dense f32 tensor (4 n bytes), so GBps compares directly with
// what a dense allreduce must move, and with sketch-kernels-bench (the CPU).
// time_us: median wall time of 9 calls, each between stream synchronisations
// (the peel and the enumerations synchronise by design). Exit 77 without a device.
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "compressors/sketch/sketch_cuda.h"
#include "compressors/sketch/sketch_math.h"
#include "compressors/sketch/sketch_peel.h"

namespace {

using namespace shoal::sketch;

void check(int error, const char* what) {
  if (error == 0) return;
  std::fprintf(stderr, "bench_sketch: %s: %s\n", what, gpu::errorText(error));
  std::exit(1);
}

template <class Body>
double medianMicroseconds(cudaStream_t stream, Body body) {
  std::vector<double> times;
  body();  // warm up
  for (int i = 0; i < 9; ++i) {
    check(cudaStreamSynchronize(stream), "synchronise");
    auto start = std::chrono::steady_clock::now();
    body();
    check(cudaStreamSynchronize(stream), "synchronise");
    times.push_back(std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - start).count());
  }
  std::sort(times.begin(), times.end());
  return times[times.size() / 2];
}

void report(const std::string& name, size_t bytes, double us) {
  std::printf("kernel %s bytes %zu time_us %.1f GBps %.2f\n", name.c_str(), bytes, us, double(bytes) / us / 1e3);
}

template <class T>
T* deviceArray(size_t n) {
  void* p = nullptr;
  check(cudaMalloc(&p, std::max<size_t>(n, 1) * sizeof(T)), "cudaMalloc");
  check(cudaMemset(p, 0, std::max<size_t>(n, 1) * sizeof(T)), "cudaMemset");
  return static_cast<T*>(p);
}

void run(size_t count, double density, cudaStream_t stream) {
  void* s = stream;
  // Values: signed multiples of 2^-12 in (-1, 1) at random positions (one limb).
  std::vector<float> host(count, 0.0f);
  uint64_t state = 12345;
  for (size_t i = 0; i < count; ++i) {
    state = mix64(state + i);
    if (double(state >> 11) * 0x1p-53 < density) host[i] = float(int64_t(state % 8191) - 4095) * 0x1p-12f;
  }
  float* x = deviceArray<float>(count);
  check(cudaMemcpy(x, host.data(), count * 4, cudaMemcpyHostToDevice), "upload");
  const std::string suffix = "_n" + std::to_string(count) + "_d" + std::to_string(density).substr(0, 4);
  const size_t bytes = count * 4;
  const size_t words = (count + 63) / 64;
  uint64_t* index = deviceArray<uint64_t>(words);
  uint64_t* stats = deviceArray<uint64_t>(3);
  double us = medianMicroseconds(stream, [&] {
    check(gpu::zero(index, words * 8, s), "zero");
    check(gpu::encodeIndex(x, count, BloomGeometry{}, index, stats, s), "encodeIndex");
  });
  report("sketch_index_bitmap" + suffix, bytes, us);
  BloomGeometry bloom = bloomGeometry(count, density, 7);
  uint64_t* filter = deviceArray<uint64_t>(bloom.words);
  us = medianMicroseconds(stream, [&] {
    check(gpu::zero(filter, bloom.words * 8, s), "zero");
    check(gpu::encodeIndex(x, count, bloom, filter, stats, s), "encodeIndex bloom");
  });
  report("sketch_index_bloom" + suffix, bytes, us);
  size_t u = 0;
  unsigned indexFlags = 0;  // sketch_checks.h: a refusal would show here (the bench's own index has none)
  us = medianMicroseconds(stream, [&] {
    check(gpu::countMembers(index, count, BloomGeometry{}, &u, &indexFlags, s), "count");
  });
  if (indexFlags != 0) std::fprintf(stderr, "countMembers flagged the index: %u\n", indexFlags);
  report("sketch_count_union" + suffix, bytes, us);
  uint64_t* members = deviceArray<uint64_t>(u);
  us = medianMicroseconds(stream, [&] { check(gpu::listMembers(index, count, BloomGeometry{}, members, s), "list"); });
  report("sketch_list_union" + suffix, bytes, us);
  size_t supportCount = 0;
  uint64_t* support = deviceArray<uint64_t>(u);
  us = medianMicroseconds(stream, [&] { check(gpu::compactSupport(x, count, support, &supportCount, s), "support"); });
  report("sketch_compact_support" + suffix, bytes, us);
  const int Q = -12, L = 63, K = 1;
  uint64_t* values = deviceArray<uint64_t>(u);
  unsigned* flags = deviceArray<unsigned>(1);  // the encoders' refusal word (device)
  us = medianMicroseconds(stream, [&] {
    check(gpu::zero(values, u * 8, s), "zero");
    check(gpu::encodeCompact(x, members, u, Q, L, K, values, flags, s), "compact");
  });
  report("sketch_encode_compact" + suffix, bytes, us);
  const SketchGeometry g = sketchGeometry(uint64_t(std::ceil(1.3 * double(u) / 3.0)), 99);
  const size_t cells = 3 * g.part;
  uint64_t* summed = deviceArray<uint64_t>(cells);
  uint64_t* work = deviceArray<uint64_t>(cells);
  us = medianMicroseconds(stream, [&] {
    check(gpu::zero(summed, cells * 8, s), "zero");
    check(gpu::scatterSketch(x, support, supportCount, g, Q, L, K, summed, flags, s), "scatter");
  });
  report("sketch_scatter" + suffix, bytes, us);
  uint64_t* limbs = deviceArray<uint64_t>(u);
  uint64_t* leftover = deviceArray<uint64_t>(u);
  size_t m = 0;
  bool certified = false;
  int rounds = 0;
  us = medianMicroseconds(stream, [&] {
    check(gpu::copy(work, summed, cells * 8, s), "copy");  // the peel consumes its cells
    check(gpu::peel(members, u, g, K, work, limbs, leftover, &m, &certified, &rounds, s), "peel");
  });
  report("sketch_peel" + suffix, bytes, us);
  std::printf("# peel: %zu members, %zu cells, %d rounds, %zu leftovers, certified %d\n", u, cells, rounds, m,
              int(certified));
  float* out = deviceArray<float>(count);
  us = medianMicroseconds(stream, [&] {
    check(gpu::zero(out, count * 4, s), "zero");
    check(gpu::decodeMembers(values, u, members, u, nullptr, K, L, Q, 1, false, out, s), "decode");
  });
  report("sketch_decode_compact" + suffix, bytes, us);
  us = medianMicroseconds(stream, [&] { check(gpu::copy(out, x, bytes, s), "memcpy"); });
  report("memcpy_d2d_baseline" + suffix, bytes, us);
  std::vector<float> back(count);
  check(cudaMemcpy(back.data(), out, bytes, cudaMemcpyDeviceToHost), "download");
  for (void* p : {(void*)x, (void*)index, (void*)stats, (void*)filter, (void*)members, (void*)support, (void*)values,
                  (void*)summed, (void*)work, (void*)limbs, (void*)leftover, (void*)out, (void*)flags})
    cudaFree(p);
}

}  // namespace

int main() {
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    std::fprintf(stderr, "bench_sketch: no CUDA device\n");
    return 77;
  }
  cudaStream_t stream;
  check(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "stream");
  for (size_t count : {size_t(1) << 22, size_t(1) << 26}) run(count, 0.01, stream);
  cudaStreamDestroy(stream);
  return 0;
}
