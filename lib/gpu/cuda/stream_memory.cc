#include "gpu/cuda/stream_memory.h"

#include <cuda_runtime_api.h>

namespace shoal::cuda {
namespace {

const char* check(cudaError_t status) {
  if (status == cudaSuccess) return nullptr;
  cudaGetLastError();  // clear a non-sticky error so later calls start clean
  return cudaGetErrorString(status);
}

cudaStream_t asStream(void* stream) { return static_cast<cudaStream_t>(stream); }

}  // namespace

DeviceScope::DeviceScope(int device) {
  error_ = check(cudaGetDevice(&previous_));
  if (error_ == nullptr && previous_ != device) error_ = check(cudaSetDevice(device));
  if (error_ != nullptr || previous_ == device) previous_ = -1;  // nothing to restore
}

DeviceScope::~DeviceScope() {
  if (previous_ >= 0) cudaSetDevice(previous_);
}

const char* allocAsync(void** pointer, size_t bytes, void* stream) {
  *pointer = nullptr;
  if (bytes == 0) return nullptr;
  return check(cudaMallocAsync(pointer, bytes, asStream(stream)));
}

const char* freeAsync(void* pointer, void* stream) {
  if (pointer == nullptr) return nullptr;
  return check(cudaFreeAsync(pointer, asStream(stream)));
}

const char* copyAsync(void* destination, const void* source, size_t bytes, void* stream) {
  if (bytes == 0) return nullptr;
  return check(cudaMemcpyAsync(destination, source, bytes, cudaMemcpyDefault, asStream(stream)));
}

const char* zeroAsync(void* pointer, size_t bytes, void* stream) {
  if (bytes == 0) return nullptr;
  return check(cudaMemsetAsync(pointer, 0, bytes, asStream(stream)));
}

const char* synchronize(void* stream) { return check(cudaStreamSynchronize(asStream(stream))); }

const char* allocDevice(void** pointer, size_t bytes) {
  *pointer = nullptr;
  if (bytes == 0) return nullptr;
  return check(cudaMalloc(pointer, bytes));
}

void freeDevice(void* pointer) {
  if (pointer != nullptr) cudaFree(pointer);
}

const char* copyBlocking(void* destination, const void* source, size_t bytes) {
  if (bytes == 0) return nullptr;
  if (const char* error = check(cudaMemcpy(destination, source, bytes, cudaMemcpyDefault))) return error;
  // cudaMemcpy from pageable memory may return before its DMA lands; kernels on a
  // non-blocking stream would not wait for it, so wait here.
  return check(cudaStreamSynchronize(cudaStreamLegacy));
}

const char* createEvent(void** event) {
  cudaEvent_t created = nullptr;
  const char* error = check(cudaEventCreateWithFlags(&created, cudaEventDisableTiming));
  *event = created;
  return error;
}

const char* recordEvent(void* event, void* stream) {
  return check(cudaEventRecord(static_cast<cudaEvent_t>(event), asStream(stream)));
}

const char* waitEvent(void* event) { return check(cudaEventSynchronize(static_cast<cudaEvent_t>(event))); }

void destroyEvent(void* event) {
  if (event != nullptr) cudaEventDestroy(static_cast<cudaEvent_t>(event));
}

const char* lastLaunchError() { return check(cudaGetLastError()); }

}  // namespace shoal::cuda
