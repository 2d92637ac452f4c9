// The "done when" of the async runtime: 4 ranks submit the ResNet-50
// gradient set (161 named tensors) in a different shuffled order
// on every rank and step, for 100 steps, through the fp16 compressor (fused:
// one compressor operation per step), and get exact results (integer-valued
// gradients, exact in fp16; avg divides by 4, exact in binary).
// To keep the test label fast on two shared cores, every tensor's first
// dimension is divided by kShrink (rounded up): same 161 names, ranks and
// trailing dims, 1/8 of the 25.6M parameters. bench/runtime_bench.cc runs the
// full-size set.
#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "../../bench/resnet50_shapes.h"
#include "harness/harness.h"
#include "harness/rank_sync.h"
#include "runtime/async_helpers.h"
#include "shoal/shoal.h"

namespace shoal::test {
namespace {

constexpr int kRanks = 4;
constexpr int kSteps = 100;
constexpr int64_t kShrink = 8;

// Rank r's gradient element i of tensor t at step s: a small integer that
// repeats with period 17 in i, so filling and checking work from tables.
float gradient(size_t t, size_t i, int rank, int step) {
  return static_cast<float>(static_cast<int>((t * 7 + i * 13 + static_cast<size_t>(rank) * 5 + static_cast<size_t>(step) * 3) % 17) - 8);
}

constexpr size_t kPeriod = 17;

std::vector<int64_t> shapeOf(const bench::Param& p) {
  std::vector<int64_t> shape(p.shape, p.shape + p.ndim);
  shape[0] = (shape[0] + kShrink - 1) / kShrink;
  return shape;
}

TEST(AsyncResNet50, HundredShuffledStepsWithFp16AreExact) {
  using bench::kResNet50;
  using bench::kTensors;
  runRanks(kRanks, [&](int rank, shoal_comm_t comm) {
    std::vector<std::vector<float>> grads(kTensors), outs(kTensors);
    for (size_t t = 0; t < kTensors; ++t) {
      size_t count = 1;
      for (int64_t extent : shapeOf(kResNet50[t])) count *= static_cast<size_t>(extent);
      grads[t].resize(count);
      outs[t].resize(count);
    }
    std::vector<size_t> order(kTensors);
    std::iota(order.begin(), order.end(), 0);
    std::mt19937 random(static_cast<uint32_t>(rank * 7919 + 1));
    shoal_async_options_t options = SHOAL_ASYNC_OPTIONS_INIT;
    options.compressor = "fp16";
    options.compress_min_bytes = 0;
    for (int step = 0; step < kSteps; ++step) {
      for (size_t t = 0; t < kTensors; ++t) {
        float pattern[kPeriod];
        for (size_t i = 0; i < kPeriod; ++i) pattern[i] = gradient(t, i, rank, step);
        for (size_t i = 0; i < grads[t].size(); ++i) grads[t][i] = pattern[i % kPeriod];
      }
      std::shuffle(order.begin(), order.end(), random);
      std::vector<shoal_request_t> requests;
      for (size_t t : order) {
        const bench::Param& p = kResNet50[t];
        shoal_tensor_t in = tensorOf(grads[t].data(), SHOAL_F32, shapeOf(p));
        shoal_tensor_t out = in;
        out.data = outs[t].data();
        shoal_request_t request = nullptr;
        ASSERT_TRUE(callOk(shoal_iallreduce(comm, p.name, &in, &out, SHOAL_AVG, &options, &request), comm, p.name));
        requests.push_back(request);
      }
      ASSERT_EQ(waitAndFree(requests, 120, "step " + std::to_string(step)), 0);
      for (size_t t = 0; t < kTensors; ++t) {
        float expected[kPeriod];
        for (size_t i = 0; i < kPeriod; ++i) {
          float sum = 0;
          for (int r = 0; r < kRanks; ++r) sum += gradient(t, i, r, step);
          expected[i] = sum / kRanks;
        }
        for (size_t i = 0; i < outs[t].size(); ++i)
          if (outs[t][i] != expected[i % kPeriod])
            FAIL() << "rank " << rank << " step " << step << " " << kResNet50[t].name << "[" << i << "] = " << outs[t][i]
                   << ", expected " << expected[i % kPeriod];
      }
    }
    shoal_async_stats_t stats = asyncStats(comm);
    EXPECT_EQ(stats.tensors, kTensors * kSteps);
    // The 161 tensors fit one 128 MiB fusion buffer: about one compressor operation per step
    // (a step whose submissions straddle a cycle takes two or three).
    EXPECT_LE(stats.groups, 3u * kSteps) << "rank " << rank;
  });
}

}  // namespace
}  // namespace shoal::test
