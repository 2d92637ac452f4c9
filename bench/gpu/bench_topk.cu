// topk's round-0 encode on the device (compressors/topk/topk_kernels.cu):
// error feedback g + e, selection of k = 1% by CUB radix sort, pair packing.
// bytes = the tensor's size (4 per element), so GBps reads as "gradient bytes
// compressed per second", not memory traffic (the sort moves several times that).
#include <random>
#include <string>
#include <vector>

#include "bench_util.h"
#include "compressors/topk/topk_cuda.h"

int main() {
  bench::gpu::requireDevice();
  cudaStream_t stream;
  bench::gpu::check(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "stream");
  for (size_t count : {size_t(1) << 20, size_t(1) << 24, size_t(25557032)}) {  // 25.6M: ResNet-50's gradients
    const size_t k = (count + 99) / 100;
    std::vector<float> host(count);
    std::mt19937 random(1);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    for (float& x : host) x = normal(random);
    float *input = nullptr, *error = nullptr;
    uint64_t* pairs = nullptr;
    bench::gpu::check(cudaMalloc(&input, count * 4), "cudaMalloc");
    bench::gpu::check(cudaMalloc(&error, count * 4), "cudaMalloc");
    bench::gpu::check(cudaMalloc(&pairs, k * 16), "cudaMalloc");
    bench::gpu::check(cudaMemcpy(input, host.data(), count * 4, cudaMemcpyHostToDevice), "upload");
    bench::gpu::check(cudaMemset(error, 0, count * 4), "cudaMemset");
    for (bool ef : {false, true}) {
      double us = bench::gpu::medianMicroseconds(stream, [&] {
        bench::gpu::check(shoal::topk::encodeOnDevice(SHOAL_F32, input, ef ? error : nullptr, count, k, 0, pairs,
                                                      stream),
                          "topk encode");
      }, 10);
      std::string name = std::string("topk_encode_f32_") + (ef ? "ef_" : "") + "n" + std::to_string(count) + "_k" +
                         std::to_string(k);
      bench::gpu::report(name.c_str(), count * 4, us);
    }
    cudaFree(input);
    cudaFree(error);
    cudaFree(pairs);
  }
  cudaStreamDestroy(stream);
  return 0;
}
