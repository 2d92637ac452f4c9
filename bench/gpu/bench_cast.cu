// fp16 / bf16 encode (f32 -> 16 bits) and decode (16 bits -> f32) on the
// device: the compressor's kernels (compressors/cast/cast_kernels.cu).
// bytes = 4 + 2 per element (read + write).
#include <string>

#include "bench_util.h"
#include "compressors/cast/cast_cuda.h"

int main() {
  bench::gpu::requireDevice();
  cudaStream_t stream;
  bench::gpu::check(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "stream");
  for (size_t count : {size_t(1) << 20, size_t(1) << 26}) {
    float* values = nullptr;
    uint16_t* payload = nullptr;
    bench::gpu::check(cudaMalloc(&values, count * 4), "cudaMalloc");
    bench::gpu::check(cudaMalloc(&payload, count * 2), "cudaMalloc");
    bench::gpu::check(cudaMemset(values, 0x3f, count * 4), "cudaMemset");  // ~0.75 everywhere
    for (bool half : {true, false}) {
      const std::string format = half ? "fp16" : "bf16";
      double us = bench::gpu::medianMicroseconds(stream, [&] {
        bench::gpu::check(shoal::cast::encodeOnDevice(half, SHOAL_F32, values, payload, count, stream), "encode");
      });
      bench::gpu::report((format + "_encode_f32_n" + std::to_string(count)).c_str(), count * 6, us);
      us = bench::gpu::medianMicroseconds(stream, [&] {
        bench::gpu::check(shoal::cast::decodeOnDevice(half, SHOAL_F32, payload, values, count, stream), "decode");
      });
      bench::gpu::report((format + "_decode_f32_n" + std::to_string(count)).c_str(), count * 6, us);
    }
    cudaFree(values);
    cudaFree(payload);
  }
  cudaStreamDestroy(stream);
  return 0;
}
