// The GPU build's smoke test: reports the devices, skips without one.
#include <gtest/gtest.h>

#include <string>

#include "gpu/cuda/device.h"

TEST(CudaDevice, CountOrSkip) {
  std::string why;
  int count = shoal::cuda::deviceCount(&why);
  if (count == 0) GTEST_SKIP() << "no CUDA device: " << why;
  EXPECT_GT(count, 0);
}
