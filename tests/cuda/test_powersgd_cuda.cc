// The powersgd compressor's CUDA path (compressors/powersgd/powersgd.cu)
// against its CPU path. Skips without a device; the CPU tests
// (tests/unit/test_powersgd.cc, test_lowrank_plan.cc) cover the same math.
//  - the first Q drawn on the device equals the CPU's uniformAt bits exactly;
//  - the compressor table driven with CUDA tensors and with host tensors (2
//    ranks simulated in one thread by tests/harness/compressor_rounds.h,
//    payloads summed on the host in the same order) gives the same payloads
//    (P, Q), outputs, error vectors and warm-start Q up to rounding (GEMMs
//    and dot products sum in another order),
//    in f32 and bf16, over 3 steps; with ef=0 zero gradients give zeros;
//  - a CUDA plan's split phases match a host plan's up to rounding, and its
//    state saves and loads through the host format.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "core/numeric/element_ops.h"
#include "compressors/powersgd/powersgd_cuda.h"
#include "compressors/powersgd/powersgd_math.h"
#include "cuda_test_util.h"
#include "gpu/cuda/device.h"
#include "shoal/compressor.h"
#include "shoal/lowrank.h"
#include "shoal/shoal.h"

namespace {

using shoal::test::CompressorRounds;

bool noDevice(std::string* why) { return shoal::cuda::deviceCount(why) == 0; }

float uniform(uint64_t a, uint64_t b, uint64_t i) {
  return shoal::powersgd::uniformAt(a, b, 77, i);  // any fixed stream of test values
}

TEST(PowerSgdCuda, DrawnQMatchesTheCpuBitForBit) {
  std::string why;
  if (noDevice(&why)) GTEST_SKIP() << "no CUDA device: " << why;
  const size_t cols = 1000;
  const int r = 4;
  float* device = nullptr;
  ASSERT_EQ(cudaMalloc(reinterpret_cast<void**>(&device), cols * r * sizeof(float)), cudaSuccess);
  const uint64_t key = shoal::powersgd::nameHash("layer1.conv.weight");
  ASSERT_EQ(shoal::powersgd::cuda::drawQ(device, cols, r, 123, key, 5, 0, nullptr), "");
  std::vector<float> got(cols * r);
  ASSERT_EQ(cudaMemcpy(got.data(), device, got.size() * sizeof(float), cudaMemcpyDeviceToHost), cudaSuccess);
  cudaFree(device);
  for (size_t i = 0; i < cols; ++i)
    for (int c = 0; c < r; ++c) {
      const float want = shoal::powersgd::uniformAt(123, key, 5 + c, i);
      ASSERT_EQ(std::memcmp(&got[i * r + c], &want, sizeof want), 0) << "row " << i << " column " << c;
    }
}

struct Tensor {
  const char* name;
  size_t rows, cols;
  int ndim;
};

void expectClose(const std::vector<float>& got, const std::vector<float>& want, double relative, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  double scale = 0;
  for (float x : want) scale = std::max(scale, double(std::fabs(x)));
  for (size_t i = 0; i < got.size(); ++i) {
    ASSERT_TRUE(std::isfinite(got[i])) << what << " element " << i;
    ASSERT_NEAR(got[i], want[i], relative * scale + 1e-30) << what << " element " << i;
  }
}

float asFloat(shoal_dtype_t dtype, const uint8_t* data, size_t i) {
  using namespace shoal::ops;
  if (dtype == SHOAL_BF16) return widen(reinterpret_cast<const BFloat16*>(data)[i]);
  return reinterpret_cast<const float*>(data)[i];
}

// ef = "1": three steps of random gradients; ef = "0": the last step's
// gradients are zero and so must be every output. Host and device each run
// 2 ranks in lockstep (tests/harness/compressor_rounds.h: payloads summed
// with shoal's Reducer in rank order), step by step side by side.
void compareHostAndDevice(shoal_dtype_t dtype, const char* ef) {
  const size_t bytesPer = dtype == SHOAL_F32 ? 4 : 2;
  const double tolerance = dtype == SHOAL_F32 ? 2e-4 : 2e-2;
  const shoal_compressor_t* table = nullptr;
  ASSERT_EQ(shoal_compressor_lookup("powersgd", &table), SHOAL_OK) << shoal_last_error(nullptr);
  ASSERT_TRUE(table->caps & SHOAL_CAP_CUDA);
  const std::vector<Tensor> shapes = {{"a", 64, 48, 2}, {"bias", 50, 1, 1}, {"b", 64, 48, 2}, {"c", 32, 80, 2}};
  const int n = 2, count = static_cast<int>(shapes.size());
  const bool zeroLastStep = ef[0] == '0';
  std::vector<CompressorRounds::TensorSpec> specs;
  for (const Tensor& shape : shapes)
    specs.push_back({dtype, shape.ndim == 2 ? std::vector<int64_t>{int64_t(shape.rows), int64_t(shape.cols)}
                                            : std::vector<int64_t>{int64_t(shape.rows * shape.cols)},
                     shape.name});
  // sides[device]; payloads[device][index][rank]: each rank's payload of round `index` before the sum.
  std::vector<std::unique_ptr<CompressorRounds>> sides;
  std::vector<std::vector<std::vector<std::vector<float>>>> payloads(2);
  for (int device = 0; device < 2; ++device) {
    sides.push_back(std::make_unique<CompressorRounds>(table, n));
    CompressorRounds& side = *sides.back();
    ASSERT_EQ(side.create({{"rank", "4"}, {"seed", "9"}, {"ef", ef}}), SHOAL_OK) << side.error(side.failedRank());
    if (device) side.placeTensors(shoal::test::deviceMemory());
    side.observe([&payloads, rounds = &side, device](int rank, const shoal_round_t& round) {
      if (round.done) return;
      const std::vector<uint8_t> bytes = rounds->payloadBytes(round.payloads[0]);
      std::vector<float> values(bytes.size() / 4);
      std::memcpy(values.data(), bytes.data(), values.size() * 4);
      payloads[device].resize(std::max<size_t>(payloads[device].size(), size_t(round.index) + 1),
                              std::vector<std::vector<float>>(2));
      payloads[device][round.index][rank] = values;
    });
  }
  for (int step = 0; step < 3; ++step) {
    auto fill = [&](int w, int t, void* data) {
      const size_t elems = shapes[t].rows * shapes[t].cols;
      for (size_t i = 0; i < elems; ++i) {
        const float g = step < 2 || !zeroLastStep ? uniform(100 * step + 10 * w + t, 3, i) : 0.0f;
        if (dtype == SHOAL_BF16)
          static_cast<shoal::ops::BFloat16*>(data)[i] = shoal::ops::narrow<shoal::ops::BFloat16>(g);
        else
          static_cast<float*>(data)[i] = g;
      }
    };
    for (int device = 0; device < 2; ++device) {
      payloads[device].clear();
      CompressorRounds& side = *sides[device];
      ASSERT_EQ(side.allreduce(specs, SHOAL_AVG, uint64_t(step), fill), SHOAL_OK) << side.error(side.failedRank());
      ASSERT_EQ(side.rounds(), 2) << "P and Q, then done";
    }
    // Every rank's payload before the sum: the same on host and device up to rounding.
    ASSERT_EQ(payloads[0].size(), 2u);
    ASSERT_EQ(payloads[1].size(), 2u);
    for (int index = 0; index < 2; ++index)
      for (int w = 0; w < n; ++w)
        expectClose(payloads[1][index][w], payloads[0][index][w], tolerance,
                    "step " + std::to_string(step) + " rank " + std::to_string(w) + " payload " +
                        std::to_string(index));
    for (int w = 0; w < n; ++w)
      for (int t = 0; t < count; ++t) {
        const size_t elems = shapes[t].rows * shapes[t].cols;
        std::vector<float> got(elems), want(elems);
        for (size_t i = 0; i < elems; ++i)
          got[i] = asFloat(dtype, static_cast<const uint8_t*>(sides[1]->output(w, t)), i),
          want[i] = asFloat(dtype, static_cast<const uint8_t*>(sides[0]->output(w, t)), i);
        const std::string what = "step " + std::to_string(step) + " rank " + std::to_string(w) + " " + shapes[t].name;
        expectClose(got, want, tolerance, what + " output");
        if (step == 2 && zeroLastStep)
          for (float x : got) ASSERT_EQ(x, 0.0f) << what << ": zero gradients";
        // The saved state (error vector, Q) through save_tensor_state (a download for the device).
        std::vector<std::vector<float>> saved(2);
        uint64_t trailers[2][5] = {};
        size_t savedBytes[2] = {};
        for (int device = 0; device < 2; ++device) {
          CompressorRounds& side = *sides[device];
          size_t bytes = 0;
          ASSERT_EQ(table->save_tensor_state(side.instance(w), side.state(w, t), nullptr, &bytes), SHOAL_OK);
          std::vector<uint8_t> blob(bytes);
          ASSERT_EQ(table->save_tensor_state(side.instance(w), side.state(w, t), blob.data(), &bytes), SHOAL_OK);
          for (size_t i = 0; i < elems; ++i) saved[device].push_back(asFloat(dtype, blob.data(), i));
          const size_t qFloats = (bytes - elems * bytesPer - 40) / 4;
          for (size_t i = 0; i < qFloats; ++i) {
            float q;
            std::memcpy(&q, blob.data() + elems * bytesPer + 4 * i, 4);
            saved[device].push_back(q);
          }
          std::memcpy(trailers[device], blob.data() + bytes - 40, 40);
          savedBytes[device] = bytes;
        }
        EXPECT_EQ(savedBytes[1], savedBytes[0]) << what;
        expectClose(saved[1], saved[0], tolerance, what + " state");
        // count, cols, r, flags (Q valid, RNG draws so far), dtype: exactly the host's
        for (int word = 0; word < 5; ++word)
          EXPECT_EQ(trailers[1][word], trailers[0][word]) << what << " trailer " << word;
      }
  }
}

// The plan's split phases on device buffers against a host plan (one rank:
// the allreduces are identities), three steps with error feedback.
void comparePlans(shoal_dtype_t dtype) {
  const size_t bytesPer = dtype == SHOAL_F32 ? 4 : 2;
  const double tolerance = dtype == SHOAL_F32 ? 2e-4 : 2e-2;
  const std::vector<shoal_lowrank_matrix_t> matrices = {
      {64, 48, 0, 0, "a"}, {50, 1, 0, SHOAL_LOWRANK_DENSE, "bias"}, {64, 48, 0, 0, "b"}, {32, 80, 0, 0, "c"}};
  const int count = static_cast<int>(matrices.size());
  shoal_lowrank_plan_t plans[2] = {nullptr, nullptr};  // host, device
  for (int device = 0; device < 2; ++device) {
    shoal_lowrank_config_t config = SHOAL_LOWRANK_CONFIG_INIT;
    config.dtype = dtype;
    config.seed = 3;
    config.memory = device ? SHOAL_MEMORY_CUDA : SHOAL_MEMORY_HOST;
    ASSERT_EQ(shoal_lowrank_plan_create(matrices.data(), count, &config, &plans[device]), SHOAL_OK)
        << shoal_last_error(nullptr);
  }
  shoal_lowrank_sizes_t sizes = SHOAL_LOWRANK_SIZES_INIT;
  ASSERT_EQ(shoal_lowrank_plan_sizes(plans[1], &sizes), SHOAL_OK);
  std::vector<float> hostP(sizes.p_elems), hostQ(sizes.q_elems);
  float *deviceP = nullptr, *deviceQ = nullptr;
  ASSERT_EQ(cudaMalloc(reinterpret_cast<void**>(&deviceP), sizes.p_elems * 4), cudaSuccess);
  ASSERT_EQ(cudaMalloc(reinterpret_cast<void**>(&deviceQ), sizes.q_elems * 4), cudaSuccess);
  std::vector<void*> deviceGrads(count);
  for (int t = 0; t < count; ++t)
    ASSERT_EQ(cudaMalloc(&deviceGrads[t], size_t(matrices[t].rows * matrices[t].cols) * bytesPer), cudaSuccess);
  for (int step = 0; step < 3; ++step) {
    std::vector<std::vector<uint8_t>> grads(count);
    std::vector<void*> hostGrads(count);
    for (int t = 0; t < count; ++t) {
      const size_t elems = size_t(matrices[t].rows * matrices[t].cols);
      grads[t].resize(elems * bytesPer);
      for (size_t i = 0; i < elems; ++i) {
        const float g = uniform(10 * step + t, 4, i);
        if (dtype == SHOAL_BF16)
          reinterpret_cast<shoal::ops::BFloat16*>(grads[t].data())[i] = shoal::ops::narrow<shoal::ops::BFloat16>(g);
        else
          reinterpret_cast<float*>(grads[t].data())[i] = g;
      }
      hostGrads[t] = grads[t].data();
      ASSERT_EQ(cudaMemcpy(deviceGrads[t], grads[t].data(), grads[t].size(), cudaMemcpyHostToDevice), cudaSuccess);
    }
    size_t pCount[2], qCount[2];
    ASSERT_EQ(shoal_lowrank_phase_p(plans[0], hostGrads.data(), hostP.data(), &pCount[0]), SHOAL_OK);
    ASSERT_EQ(shoal_lowrank_phase_p(plans[1], deviceGrads.data(), deviceP, &pCount[1]), SHOAL_OK)
        << shoal_last_error(nullptr);
    ASSERT_EQ(pCount[0], pCount[1]);
    ASSERT_EQ(shoal_lowrank_phase_q(plans[0], hostP.data(), hostQ.data(), &qCount[0]), SHOAL_OK);
    ASSERT_EQ(shoal_lowrank_phase_q(plans[1], deviceP, deviceQ, &qCount[1]), SHOAL_OK) << shoal_last_error(nullptr);
    ASSERT_EQ(qCount[0], qCount[1]);
    ASSERT_EQ(shoal_lowrank_finish(plans[0], hostP.data(), hostQ.data(), hostGrads.data(), 1, SHOAL_AVG), SHOAL_OK);
    ASSERT_EQ(shoal_lowrank_finish(plans[1], deviceP, deviceQ, deviceGrads.data(), 1, SHOAL_AVG), SHOAL_OK)
        << shoal_last_error(nullptr);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    for (int t = 0; t < count; ++t) {
      std::vector<uint8_t> fromDevice(grads[t].size());
      ASSERT_EQ(cudaMemcpy(fromDevice.data(), deviceGrads[t], fromDevice.size(), cudaMemcpyDeviceToHost), cudaSuccess);
      std::vector<float> got, want;
      for (size_t i = 0; i < fromDevice.size() / bytesPer; ++i)
        got.push_back(asFloat(dtype, fromDevice.data(), i)), want.push_back(asFloat(dtype, grads[t].data(), i));
      expectClose(got, want, tolerance, "plan step " + std::to_string(step) + " matrix " + std::to_string(t));
    }
  }
  // The saved states: same size and trailers; error vectors and Q close.
  std::vector<std::vector<uint8_t>> saved(2);
  for (int device = 0; device < 2; ++device) {
    size_t bytes = 0;
    ASSERT_EQ(shoal_lowrank_state_save(plans[device], nullptr, &bytes), SHOAL_OK);
    saved[device].resize(bytes);
    ASSERT_EQ(shoal_lowrank_state_save(plans[device], saved[device].data(), &bytes), SHOAL_OK)
        << shoal_last_error(nullptr);
  }
  ASSERT_EQ(saved[0].size(), saved[1].size());
  EXPECT_EQ(std::memcmp(saved[0].data(), saved[1].data(), 24), 0) << "header";
  // Loading the host state into the device plan works and reads back the same bytes.
  ASSERT_EQ(shoal_lowrank_state_load(plans[1], saved[0].data(), saved[0].size()), SHOAL_OK)
      << shoal_last_error(nullptr);
  std::vector<uint8_t> reread(saved[0].size());
  size_t bytes = reread.size();
  ASSERT_EQ(shoal_lowrank_state_save(plans[1], reread.data(), &bytes), SHOAL_OK);
  EXPECT_EQ(reread, saved[0]);
  for (void* g : deviceGrads) cudaFree(g);
  cudaFree(deviceP);
  cudaFree(deviceQ);
  for (shoal_lowrank_plan_t plan : plans) shoal_lowrank_plan_destroy(plan);
}

class PowerSgdCudaDtype : public ::testing::TestWithParam<shoal_dtype_t> {};

TEST_P(PowerSgdCudaDtype, PlanOnDeviceMatchesHostPlan) {
  std::string why;
  if (noDevice(&why)) GTEST_SKIP() << "no CUDA device: " << why;
  comparePlans(GetParam());
}

TEST_P(PowerSgdCudaDtype, TableOnDeviceMatchesHost) {
  std::string why;
  if (noDevice(&why)) GTEST_SKIP() << "no CUDA device: " << why;
  compareHostAndDevice(GetParam(), "1");
}

TEST_P(PowerSgdCudaDtype, ZeroGradientsGiveZerosOnDevice) {
  std::string why;
  if (noDevice(&why)) GTEST_SKIP() << "no CUDA device: " << why;
  compareHostAndDevice(GetParam(), "0");
}

INSTANTIATE_TEST_SUITE_P(Dtypes, PowerSgdCudaDtype, ::testing::Values(SHOAL_F32, SHOAL_BF16),
                         [](const auto& info) { return std::string(shoal_dtype_name(info.param)); });

}  // namespace
