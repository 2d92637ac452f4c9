// Issue 13.2: a stateful compressor chosen by environment works for unnamed
// shoal_allreduce calls on persistent buffers: the driver keys their state by
// output buffer, dtype and shape (CompressorCache::unnamedKey), so topk's
// error feedback accumulates across steps and powersgd keeps its warm start.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <vector>

#include "harness/harness.h"

namespace {

struct CompressorEnv {
  CompressorEnv(const char* name, const char* options) {
    setenv("SHOAL_COMPRESSOR", name, 1);
    setenv("SHOAL_COMPRESSOR_OPTS", options, 1);
    setenv("SHOAL_COMPRESS_MIN_BYTES", "0", 1);
  }
  ~CompressorEnv() {
    unsetenv("SHOAL_COMPRESSOR");
    unsetenv("SHOAL_COMPRESSOR_OPTS");
    unsetenv("SHOAL_COMPRESS_MIN_BYTES");
  }
};

// topk with k = 1 of 4 and error feedback: the residual of what was not sent
// grows until it wins, so over the steps every coordinate is sent. Without
// state carried between calls only the largest coordinate ever would be.
TEST(UnnamedState, TopkErrorFeedbackAccumulatesAcrossSteps) {
  CompressorEnv env("topk", "k=1,ef=1");
  shoal::test::runRanks(2, [](int, shoal_comm_t comm) {
    const std::vector<float> gradient = {4, 3, 2, 1};
    std::vector<float> input(4), output(4), total(4, 0.0f), other(4);
    constexpr int kSteps = 12;
    for (int step = 0; step < kSteps; ++step) {
      input = gradient;
      ASSERT_EQ(shoal_allreduce(comm, input.data(), output.data(), 4, SHOAL_F32, SHOAL_SUM), SHOAL_OK)
          << shoal_last_error(comm);
      // Another persistent buffer of the same shape in the same step keeps its own state.
      std::vector<float> zeros(4, 0.0f);
      ASSERT_EQ(shoal_allreduce(comm, zeros.data(), other.data(), 4, SHOAL_F32, SHOAL_SUM), SHOAL_OK)
          << shoal_last_error(comm);
      for (int i = 0; i < 4; ++i) total[i] += output[i];
    }
    for (int i = 0; i < 4; ++i) {
      EXPECT_GT(total[i], 0.0f) << "coordinate " << i << " was never sent: no error feedback across steps";
      // Sent + residual = everything: the sum (2 ranks) never exceeds what was fed in.
      EXPECT_LE(total[i], 2 * kSteps * gradient[i] + 1e-3f) << "coordinate " << i;
    }
    for (float value : other) EXPECT_EQ(value, 0.0f) << "the zero buffer picked up another buffer's residual";
  });
}

TEST(UnnamedState, PowersgdRunsOnUnnamedMatrices) {
  CompressorEnv env("powersgd", "rank=1");
  shoal::test::runRanks(2, [](int rank, shoal_comm_t comm) {
    std::vector<float> input(8 * 6), output(input.size());
    shoal_tensor_t in{}, out{};
    shoal_tensor_init(&in, input.data(), input.size(), SHOAL_F32);
    shoal_tensor_init(&out, output.data(), output.size(), SHOAL_F32);
    in.ndim = out.ndim = 2;
    in.shape[0] = out.shape[0] = 8;
    in.shape[1] = out.shape[1] = 6;
    for (int step = 0; step < 4; ++step) {
      // A rank-1 matrix (outer product): PowerSGD with rank 1 recovers it, warm start or not.
      for (int i = 0; i < 8; ++i)
        for (int j = 0; j < 6; ++j) input[i * 6 + j] = static_cast<float>((i + 1) * (j + 1) * (rank + 1));
      ASSERT_EQ(shoal_allreduce_tensor(comm, &in, &out, SHOAL_SUM, nullptr), SHOAL_OK) << shoal_last_error(comm);
      for (int i = 0; i < 8; ++i)
        for (int j = 0; j < 6; ++j)
          EXPECT_NEAR(output[i * 6 + j], 3.0f * (i + 1) * (j + 1), 1e-2f * (i + 1) * (j + 1)) << "step " << step;
    }
  });
}

}  // namespace
