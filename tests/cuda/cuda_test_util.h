// Small helpers for the GPU tests: device presence, device buffers, copies,
// and CUDA device memory for CompressorRounds (tests/harness/compressor_rounds.h).
#pragma once

#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cstddef>
#include <string>
#include <vector>

#include "gpu/cuda/device.h"
#include "harness/compressor_rounds.h"

namespace shoal::test {

// True (with the reason) when there is no CUDA device: the test then skips.
inline bool noCudaDevice(std::string* why) { return shoal::cuda::deviceCount(why) == 0; }

// Device memory for one test, freed at scope end; an allocation failure fails the test.
class DeviceBytes {
 public:
  explicit DeviceBytes(size_t bytes) : bytes_(bytes) {
    if (bytes > 0) EXPECT_EQ(cudaMalloc(&data_, bytes), cudaSuccess) << "cudaMalloc of " << bytes << " bytes";
  }
  ~DeviceBytes() {
    if (data_) cudaFree(data_);
  }
  DeviceBytes(const DeviceBytes&) = delete;
  DeviceBytes& operator=(const DeviceBytes&) = delete;
  template <typename T = void>
  T* get() const { return static_cast<T*>(data_); }
  size_t bytes() const { return bytes_; }

 private:
  void* data_ = nullptr;
  size_t bytes_;
};

inline void upload(void* device, const void* host, size_t bytes) {
  if (bytes > 0) ASSERT_EQ(cudaMemcpy(device, host, bytes, cudaMemcpyDefault), cudaSuccess);
}

template <typename T>
std::vector<T> download(const void* device, size_t count) {
  std::vector<T> host(count);
  if (count > 0) EXPECT_EQ(cudaMemcpy(host.data(), device, count * sizeof(T), cudaMemcpyDefault), cudaSuccess);
  return host;
}

inline void deviceSync() { ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess) << cudaGetErrorString(cudaGetLastError()); }

// CompressorRounds' tensors in device memory on `stream`. A copy waits for the
// whole device before and after (cudaMemcpyDefault: either side may be the host),
// so a compressor's work on its own stream never races the collectives' copies.
inline TensorMemory deviceMemory(cudaStream_t stream = nullptr) {
  TensorMemory memory;
  memory.kind = SHOAL_MEMORY_CUDA;
  memory.device = 0;
  memory.stream = stream;
  memory.allocate = [](size_t bytes) {
    void* data = nullptr;
    EXPECT_EQ(cudaMalloc(&data, bytes), cudaSuccess) << "cudaMalloc of " << bytes << " bytes";
    return data;
  };
  memory.release = [](void* data) { cudaFree(data); };
  memory.copy = [](void* to, const void* from, size_t bytes) {
    EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess) << cudaGetErrorString(cudaGetLastError());
    EXPECT_EQ(cudaMemcpy(to, from, bytes, cudaMemcpyDefault), cudaSuccess);
    EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  };
  return memory;
}

}  // namespace shoal::test
