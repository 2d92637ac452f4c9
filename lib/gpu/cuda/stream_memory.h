// Stream-ordered device memory and copies for the GPU compressors: thin
// wrappers over the CUDA runtime that keep CUDA headers out of host code.
// Every function returns nullptr on success, else the CUDA error's text (a
// static string). Compiled only in the GPU build (SHOAL_WITH_CUDA).
#pragma once

#include <cstddef>

namespace shoal::cuda {

// Makes `device` the calling thread's current device for a scope (the
// compressor's kernels run on the tensor's device, whatever the caller had).
class DeviceScope {
 public:
  explicit DeviceScope(int device);
  ~DeviceScope();
  DeviceScope(const DeviceScope&) = delete;
  DeviceScope& operator=(const DeviceScope&) = delete;
  const char* error() const { return error_; }

 private:
  int previous_ = -1;
  const char* error_ = nullptr;
};

// cudaMallocAsync / cudaFreeAsync on stream (nullptr for 0 bytes / a nullptr pointer).
const char* allocAsync(void** pointer, size_t bytes, void* stream);
const char* freeAsync(void* pointer, void* stream);
// cudaMemcpyAsync with cudaMemcpyDefault (unified addressing tells the direction).
const char* copyAsync(void* destination, const void* source, size_t bytes, void* stream);
const char* zeroAsync(void* pointer, size_t bytes, void* stream);
const char* synchronize(void* stream);
// Plain (not stream-ordered) device memory for state that outlives a stream's work.
const char* allocDevice(void** pointer, size_t bytes);
void freeDevice(void* pointer);
// A copy that is complete on return, also for kernels on other streams (cudaMemcpy and a
// wait for the legacy stream): for saving and loading state.
const char* copyBlocking(void* destination, const void* source, size_t bytes);
// Events mark how far a stream has come, for state that a later host call
// (saving it, freeing it) must not touch before the stream's kernels are done.
const char* createEvent(void** event);
const char* recordEvent(void* event, void* stream);
const char* waitEvent(void* event);  // blocks the host until the recorded work is done
void destroyEvent(void* event);
// The error of the last kernel launch (cudaGetLastError), nullptr if none.
const char* lastLaunchError();

}  // namespace shoal::cuda
