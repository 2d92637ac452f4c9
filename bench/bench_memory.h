// Device buffers for shoal-bench --memory cuda: plain C++ over the CUDA
// runtime, so shoal-bench itself needs no CUDA headers. In a build without
// CUDA every call returns the reason instead of working.
#pragma once

#include <cstddef>
#include <string>

namespace bench {

// Each function returns "" on success, else the error text.
// Selects device (local rank) % (device count) for this process; *device gets it.
std::string selectDevice(int localRank, int *device);
std::string deviceAlloc(size_t bytes, void **ptr);
void deviceFree(void *ptr);
std::string copyToDevice(void *dst, const void *src, size_t bytes);
std::string copyToHost(void *dst, const void *src, size_t bytes);
// Device to device (both on the current device), complete when it returns.
std::string copyOnDevice(void *dst, const void *src, size_t bytes);

}  // namespace bench
