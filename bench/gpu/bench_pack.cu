// Fusion-buffer pack and unpack (lib/gpu/cuda/pack.cu) against one
// device-to-device cudaMemcpyAsync of the same total: ResNet-50-like tensor
// sizes (161 tensors, 25.6M f32; table uploaded to the device), 64 mid-size
// tensors (inline table), and 2000 tiny ones. bytes = 2 x total (read + write).
#include <string>
#include <vector>

#include "bench_util.h"
#include "gpu/cuda/pack.h"

namespace {

void run(const char* name, const std::vector<size_t>& sizes, cudaStream_t stream) {
  const size_t total = shoal::cuda::packedBytes(sizes.data(), sizes.size());
  unsigned char *tensors = nullptr, *packed = nullptr;
  bench::gpu::check(cudaMalloc(&tensors, total + 256 * sizes.size()), "cudaMalloc");
  bench::gpu::check(cudaMalloc(&packed, total), "cudaMalloc");
  std::vector<const void*> sources;
  std::vector<void*> destinations;
  size_t at = 0;
  for (size_t size : sizes) {  // each tensor 256-byte aligned, like framework allocations
    sources.push_back(tensors + at);
    destinations.push_back(tensors + at);
    at += (size + 255) / 256 * 256;
  }
  double us = bench::gpu::medianMicroseconds(stream, [&] {
    bench::gpu::check(shoal::cuda::packTensors(sources.data(), sizes.data(), sizes.size(), packed, stream), "pack");
  });
  bench::gpu::report((std::string("pack_") + name).c_str(), 2 * total, us);
  us = bench::gpu::medianMicroseconds(stream, [&] {
    bench::gpu::check(shoal::cuda::unpackTensors(packed, destinations.data(), sizes.data(), sizes.size(), stream),
                      "unpack");
  });
  bench::gpu::report((std::string("unpack_") + name).c_str(), 2 * total, us);
  us = bench::gpu::medianMicroseconds(stream, [&] {
    bench::gpu::check(cudaMemcpyAsync(packed, tensors, total, cudaMemcpyDeviceToDevice, stream), "memcpy");
  });
  bench::gpu::report((std::string("memcpy_d2d_baseline_") + name).c_str(), 2 * total, us);
  cudaFree(tensors);
  cudaFree(packed);
}

}  // namespace

int main() {
  bench::gpu::requireDevice();
  cudaStream_t stream;
  bench::gpu::check(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "stream");
  // ResNet-50's layer shapes, roughly: conv weights of growing size, batch-norm pairs, the fc layer.
  std::vector<size_t> resnet;
  const size_t convs[] = {9408, 4096, 36864, 16384, 16384, 32768, 147456, 65536, 131072, 524288, 589824, 262144,
                          524288, 2097152, 2359296, 1048576};
  for (int i = 0; i < 80; ++i) {
    resnet.push_back(4 * convs[i % 16]);
    resnet.push_back(4 * 256);
  }
  resnet.push_back(4 * 2048000);
  run("resnet50_like_161", resnet, stream);
  run("mid_64x1MiB", std::vector<size_t>(64, size_t(1) << 20), stream);
  run("tiny_2000x4KiB", std::vector<size_t>(2000, 4096), stream);
  cudaStreamDestroy(stream);
  return 0;
}
