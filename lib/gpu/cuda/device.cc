#include "gpu/cuda/device.h"

#include <cuda_runtime_api.h>

namespace shoal::cuda {

int deviceCount(std::string *why) {
  int count = 0;
  cudaError_t status = cudaGetDeviceCount(&count);
  if (status != cudaSuccess) {
    if (why) *why = cudaGetErrorString(status);
    cudaGetLastError();  // clear the sticky "no device" error for later calls
    return 0;
  }
  if (count == 0 && why) *why = "the CUDA runtime reports no devices";
  return count;
}

}  // namespace shoal::cuda
