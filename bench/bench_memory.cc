#include "bench_memory.h"

#if SHOAL_BENCH_CUDA
#include <cuda_runtime_api.h>

namespace bench {
namespace {
std::string text(cudaError_t status, const char *what) {
  return status == cudaSuccess ? std::string() : std::string(what) + ": " + cudaGetErrorString(status);
}
}  // namespace

std::string selectDevice(int localRank, int *device) {
  int count = 0;
  if (std::string e = text(cudaGetDeviceCount(&count), "cudaGetDeviceCount"); !e.empty()) return e;
  if (count == 0) return "no CUDA device";
  *device = localRank % count;
  return text(cudaSetDevice(*device), "cudaSetDevice");
}
std::string deviceAlloc(size_t bytes, void **ptr) { return text(cudaMalloc(ptr, bytes ? bytes : 1), "cudaMalloc"); }
void deviceFree(void *ptr) { cudaFree(ptr); }
std::string copyToDevice(void *dst, const void *src, size_t bytes) {
  return text(cudaMemcpy(dst, src, bytes, cudaMemcpyHostToDevice), "cudaMemcpy to the device");
}
std::string copyToHost(void *dst, const void *src, size_t bytes) {
  return text(cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToHost), "cudaMemcpy to the host");
}
std::string copyOnDevice(void *dst, const void *src, size_t bytes) {
  return text(cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToDevice), "cudaMemcpy on the device");
}
}  // namespace bench

#else

namespace bench {
namespace {
const char *const kNoCuda = "this shoal-bench was built without CUDA (configure with -DSHOAL_WITH_CUDA=ON)";
}
std::string selectDevice(int, int *) { return kNoCuda; }
std::string deviceAlloc(size_t, void **) { return kNoCuda; }
void deviceFree(void *) {}
std::string copyToDevice(void *, const void *, size_t) { return kNoCuda; }
std::string copyToHost(void *, const void *, size_t) { return kNoCuda; }
std::string copyOnDevice(void *, const void *, size_t) { return kNoCuda; }
}  // namespace bench

#endif
