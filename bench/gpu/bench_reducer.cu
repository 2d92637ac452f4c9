// Device reducer throughput (collectives/common/reducer.cu): dst op= src for
// a few dtype x op pairs and sizes. Standalone; links shoal_internal. Exits 77
// (skip) without a CUDA device. One line per measurement:
//   kernel reduce_<dtype>_<op> bytes <B> time_us <t> GBps <g>
// where bytes is the size of one operand and GBps counts the 3 x bytes the
// kernel moves (read dst and src, write dst).
#include <cuda_runtime.h>

#include <cstdio>
#include <cstring>
#include <vector>

#include "collectives/common/device_reducer.h"
#include "collectives/common/reducer.h"

namespace {

bool ok(cudaError_t status, const char* what) {
  if (status == cudaSuccess) return true;
  std::fprintf(stderr, "bench_reducer: %s: %s\n", what, cudaGetErrorString(status));
  return false;
}

}  // namespace

int main() {
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    std::printf("bench_reducer: no CUDA device, skipped\n");
    return 77;
  }
  struct Case {
    shoal_dtype_t dtype;
    shoal_op_t op;
  };
  const Case cases[] = {{SHOAL_F32, SHOAL_SUM}, {SHOAL_F16, SHOAL_SUM}, {SHOAL_BF16, SHOAL_SUM},
                        {SHOAL_F32, SHOAL_MAX}, {SHOAL_I32, SHOAL_SUM}, {SHOAL_U64, SHOAL_BOR},
                        {SHOAL_U8, SHOAL_BXOR}, {SHOAL_F64, SHOAL_PROD}};
  const size_t sizes[] = {size_t(1) << 20, size_t(1) << 26, size_t(1) << 28};
  const size_t largest = sizes[sizeof sizes / sizeof sizes[0] - 1];
  void *dst = nullptr, *src = nullptr;
  if (!ok(cudaMalloc(&dst, largest), "cudaMalloc") || !ok(cudaMalloc(&src, largest), "cudaMalloc")) return 1;
  // Small integer patterns: no float overflows to inf or NaN along the way.
  if (!ok(cudaMemset(dst, 0x01, largest), "cudaMemset") || !ok(cudaMemset(src, 0x01, largest), "cudaMemset")) return 1;
  cudaEvent_t start, stop;
  cudaEventCreate(&start);
  cudaEventCreate(&stop);
  for (const Case& c : cases)
    for (size_t bytes : sizes) {
      const size_t count = bytes / shoal::dtypeSize(c.dtype);
      const int iterations = bytes >= (size_t(1) << 26) ? 20 : 200;
      try {
        shoal::cuda::reduceOnDevice(dst, src, count, c.dtype, c.op, nullptr);  // warm-up
        cudaEventRecord(start);
        for (int i = 0; i < iterations; ++i) shoal::cuda::reduceOnDevice(dst, src, count, c.dtype, c.op, nullptr);
        cudaEventRecord(stop);
      } catch (const std::exception& error) {
        std::fprintf(stderr, "bench_reducer: %s\n", error.what());
        return 1;
      }
      if (!ok(cudaEventSynchronize(stop), "kernel")) return 1;
      float ms = 0;
      cudaEventElapsedTime(&ms, start, stop);
      double us = 1000.0 * ms / iterations;
      std::printf("kernel reduce_%s_%s bytes %zu time_us %.2f GBps %.1f\n", shoal_dtype_name(c.dtype),
                  shoal_op_name(c.op), bytes, us, 3.0 * double(bytes) / (us * 1e3));
    }
  cudaFree(dst);
  cudaFree(src);
  return 0;
}
