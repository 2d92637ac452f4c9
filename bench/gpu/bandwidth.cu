// The device's theoretical memory bandwidth: memory clock x bus width x 2
// (double data rate), from cudaDeviceGetAttribute. check.sh prints the
// benchmarks' GB/s next to it. Exit 77 without a device.
#include <cstdio>

#include "bench_util.h"

int main() {
  bench::gpu::requireDevice();
  int device = 0, clockKhz = 0, busBits = 0;
  bench::gpu::check(cudaGetDevice(&device), "cudaGetDevice");
  cudaDeviceProp properties{};
  bench::gpu::check(cudaGetDeviceProperties(&properties, device), "cudaGetDeviceProperties");
  bench::gpu::check(cudaDeviceGetAttribute(&clockKhz, cudaDevAttrMemoryClockRate, device), "memory clock");
  bench::gpu::check(cudaDeviceGetAttribute(&busBits, cudaDevAttrGlobalMemoryBusWidth, device), "bus width");
  const double gbps = 2.0 * clockKhz * 1e3 * (busBits / 8.0) / 1e9;
  std::printf("device %d %s sm_%d%d memory_clock_khz %d bus_width_bits %d theoretical_GBps %.1f memory_GiB %.1f\n",
              device, properties.name, properties.major, properties.minor, clockKhz, busBits, gbps,
              properties.totalGlobalMem / 1073741824.0);
  return 0;
}
