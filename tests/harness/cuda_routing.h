// What the tests of CUDA-call routing share (tests/unit/test_gpu_routing.cc,
// tests/unit/test_exchange_routing.cc; cudaTensor also tests/cuda): CUDA
// tensors, over device pointers or over fake ones that are never
// dereferenced, and the checks every refusal must pass: the status and a
// text that says what to fix, on every rank well before the deadline (the
// agreement round carried it, nobody waited), and a communicator that still
// works afterwards. Needs no GPU; compiles with and without CUDA.
#pragma once

#include <gtest/gtest.h>

#include <chrono>
#include <cstdint>
#include <initializer_list>
#include <string>

#include "harness/rank_sync.h"
#include "shoal/shoal.h"
#if SHOAL_WITH_CUDA
#include "gpu/cuda/device.h"
#endif

namespace shoal::test {

// The communicators' deadline in the routing tests: a refusal that took a
// third of it waited for it instead of reaching every rank.
constexpr double kRoutingTimeoutS = 30;

// True when this build and machine run CUDA calls: refusals then name the
// argument; else every CUDA call is refused as unsupported here.
inline bool cudaUsable() {
#if SHOAL_WITH_CUDA && SHOAL_WITH_NCCL
  std::string why;
  return shoal::cuda::deviceCount(&why) > 0;
#else
  return false;
#endif
}

inline shoal_tensor_t cudaTensor(void* data, size_t count, shoal_dtype_t dtype, int device = 0,
                                 void* stream = nullptr) {
  shoal_tensor_t tensor = shoal_tensor_1d(data, count, dtype);
  tensor.memory = SHOAL_MEMORY_CUDA;
  tensor.device = device;
  tensor.stream = stream;
  return tensor;
}

// Device pointers for calls that are refused before any device work.
inline void* fakeDevicePointer(int which = 0) {
  return reinterpret_cast<void*>(uintptr_t(0x7f0000000000) + (uintptr_t(which) << 20));
}

// The call returned `expected` with a text containing every one of `words`,
// in under a third of kRoutingTimeoutS since `start`.
inline void expectRefused(shoal_status_t got, shoal_status_t expected, shoal_comm_t comm,
                          std::chrono::steady_clock::time_point start, std::initializer_list<std::string> words,
                          const std::string& what) {
  EXPECT_EQ(got, expected) << what << ": " << shoal_status_string(got) << ": " << shoal_last_error(comm);
  const std::string text = shoal_last_error(comm);
  for (const std::string& word : words)
    EXPECT_NE(text.find(word), std::string::npos) << what << ": error does not mention '" << word << "': " << text;
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(), kRoutingTimeoutS / 3)
      << what << ": the refusal waited for the deadline instead of reaching every rank";
}

// After a refused call the communicator still works: a host allreduce of ones sums to the size.
inline void expectUsable(shoal_comm_t comm, int size) {
  int value = 1, sum = 0;
  if (callOk(shoal_allreduce(comm, &value, &sum, 1, SHOAL_I32, SHOAL_SUM), comm, "host allreduce after a refusal"))
    EXPECT_EQ(sum, size);
}

}  // namespace shoal::test
