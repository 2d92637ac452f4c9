// The powersgd compressor's CUDA path (compressors/powersgd/powersgd.cu)
// against its CPU path. Skips without a device; the CPU tests
// (tests/unit/test_powersgd.cc, test_lowrank_plan.cc) cover the same math.
//  - the first Q drawn on the device equals the CPU's uniformAt bits exactly;
//  - the compressor table driven with CUDA tensors and with host tensors (2
//    ranks simulated in one thread, payloads summed on the host in the same
//    order) gives the same payloads (P, Q), outputs, error vectors and warm-
//    start Q up to rounding (GEMMs and dot products sum in another order),
//    in f32 and bf16, over 3 steps; with ef=0 zero gradients give zeros;
//  - a CUDA plan's split phases match a host plan's up to rounding, and its
//    state saves and loads through the host format.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "core/numeric/element_ops.h"
#include "compressors/powersgd/powersgd_cuda.h"
#include "compressors/powersgd/powersgd_math.h"
#include "gpu/cuda/device.h"
#include "shoal/compressor.h"
#include "shoal/lowrank.h"
#include "shoal/shoal.h"

namespace {

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

// One rank's side of the table: host or device tensors.
struct Side {
  void* instance = nullptr;
  std::vector<void*> states;
  std::vector<std::vector<uint8_t>> hostIn, hostOut;
  std::vector<void*> deviceIn, deviceOut;
  std::vector<shoal_compress_tensor_t> tensors;
  shoal_compress_op_t op{};
  void* opState = nullptr;
  shoal_round_t round{};
  char error[512] = {};
};

std::vector<float> payloadToHost(const shoal_payload_t& payload, bool device) {
  std::vector<float> values(payload.count);
  if (device)
    EXPECT_EQ(cudaMemcpy(values.data(), payload.buffer, payload.count * 4, cudaMemcpyDeviceToHost), cudaSuccess);
  else
    std::memcpy(values.data(), payload.buffer, payload.count * 4);
  return values;
}

void payloadFromHost(const shoal_payload_t& payload, const std::vector<float>& values, bool device) {
  if (device)
    EXPECT_EQ(cudaMemcpy(payload.buffer, values.data(), values.size() * 4, cudaMemcpyHostToDevice), cudaSuccess);
  else
    std::memcpy(payload.buffer, values.data(), values.size() * 4);
}

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
// gradients are zero and so must be every output.
void compareHostAndDevice(shoal_dtype_t dtype, const char* ef) {
  const size_t bytesPer = dtype == SHOAL_F32 ? 4 : 2;
  const double tolerance = dtype == SHOAL_F32 ? 2e-4 : 2e-2;
  const shoal_compressor_t* table = nullptr;
  ASSERT_EQ(shoal_compressor_lookup("powersgd", &table), SHOAL_OK) << shoal_last_error(nullptr);
  ASSERT_TRUE(table->caps & SHOAL_CAP_CUDA);
  const std::vector<Tensor> shapes = {{"a", 64, 48, 2}, {"bias", 50, 1, 1}, {"b", 64, 48, 2}, {"c", 32, 80, 2}};
  const int n = 2, count = static_cast<int>(shapes.size());
  const char* keys[] = {"rank", "seed", "ef"};
  const char* values[] = {"4", "9", ef};
  const bool zeroLastStep = ef[0] == '0';
  // sides[device][rank]
  std::vector<std::vector<Side>> sides(2, std::vector<Side>(n));
  for (int device = 0; device < 2; ++device)
    for (Side& side : sides[device]) {
      shoal_compressor_params_t params{sizeof(shoal_compressor_params_t), 3, keys, values, nullptr, side.error,
                                       sizeof side.error};
      ASSERT_EQ(table->create(&params, &side.instance), SHOAL_OK) << side.error;
      side.states.assign(count, nullptr);
      side.deviceIn.assign(count, nullptr);
      side.deviceOut.assign(count, nullptr);
      for (int t = 0; t < count; ++t)
        if (device) {
          const size_t bytes = shapes[t].rows * shapes[t].cols * bytesPer;
          ASSERT_EQ(cudaMalloc(&side.deviceIn[t], bytes), cudaSuccess);
          ASSERT_EQ(cudaMalloc(&side.deviceOut[t], bytes), cudaSuccess);
        }
    }
  for (int step = 0; step < 3; ++step) {
    for (int device = 0; device < 2; ++device)
      for (int w = 0; w < n; ++w) {
        Side& side = sides[device][w];
        side.hostIn.assign(count, {});
        side.hostOut.assign(count, {});
        side.tensors.assign(count, {});
        for (int t = 0; t < count; ++t) {
          const size_t elems = shapes[t].rows * shapes[t].cols;
          std::vector<float> g(elems, 0.0f);
          if (step < 2 || !zeroLastStep)
            for (size_t i = 0; i < elems; ++i) g[i] = uniform(100 * step + 10 * w + t, 3, i);
          side.hostIn[t].resize(elems * bytesPer);
          for (size_t i = 0; i < elems; ++i) {
            if (dtype == SHOAL_BF16)
              reinterpret_cast<shoal::ops::BFloat16*>(side.hostIn[t].data())[i] = shoal::ops::narrow<shoal::ops::BFloat16>(g[i]);
            else
              reinterpret_cast<float*>(side.hostIn[t].data())[i] = g[i];
          }
          side.hostOut[t].assign(elems * bytesPer, 0);
          shoal_compress_tensor_t& tensor = side.tensors[t];
          void* in = side.hostIn[t].data();
          void* out = side.hostOut[t].data();
          if (device) {
            ASSERT_EQ(cudaMemcpy(side.deviceIn[t], in, elems * bytesPer, cudaMemcpyHostToDevice), cudaSuccess);
            in = side.deviceIn[t];
            out = side.deviceOut[t];
          }
          tensor.input = shoal_tensor_1d(in, elems, dtype);
          if (shapes[t].ndim == 2)
            tensor.input.ndim = 2, tensor.input.shape[0] = int64_t(shapes[t].rows),
            tensor.input.shape[1] = int64_t(shapes[t].cols);
          tensor.input.memory = device ? SHOAL_MEMORY_CUDA : SHOAL_MEMORY_HOST;
          tensor.input.device = 0;
          tensor.output = tensor.input;
          tensor.output.data = out;
          tensor.name = shapes[t].name;
          tensor.state = &side.states[t];
        }
        side.op = shoal_compress_op_t{sizeof(shoal_compress_op_t), w, n, SHOAL_AVG, count, side.tensors.data(),
                                      uint64_t(step), side.error, sizeof side.error};
        ASSERT_EQ(table->start(side.instance, &side.op, &side.opState), SHOAL_OK) << side.error;
        side.round = shoal_round_t{};
        side.round.struct_size = sizeof(shoal_round_t);
      }
    for (int index = 0; index < 3; ++index) {
      for (int device = 0; device < 2; ++device)
        for (int w = 0; w < n; ++w) {
          Side& side = sides[device][w];
          side.round.index = index;
          ASSERT_EQ(table->round(side.instance, side.opState, &side.op, &side.round), SHOAL_OK) << side.error;
          ASSERT_EQ(side.round.done, index == 2 ? 1 : 0) << "round " << index;
        }
      if (index == 2) break;
      ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
      // Every rank's payload before the sum: the same on host and device up to rounding.
      std::vector<std::vector<std::vector<float>>> payloads(2, std::vector<std::vector<float>>(n));
      for (int device = 0; device < 2; ++device)
        for (int w = 0; w < n; ++w) payloads[device][w] = payloadToHost(sides[device][w].round.payloads[0], device);
      for (int w = 0; w < n; ++w)
        expectClose(payloads[1][w], payloads[0][w], tolerance,
                    "step " + std::to_string(step) + " rank " + std::to_string(w) + " payload " + std::to_string(index));
      for (int device = 0; device < 2; ++device) {
        std::vector<float> sum(payloads[device][0].size(), 0.0f);
        for (int w = 0; w < n; ++w)
          for (size_t i = 0; i < sum.size(); ++i) sum[i] += payloads[device][w][i];
        for (int w = 0; w < n; ++w) payloadFromHost(sides[device][w].round.payloads[0], sum, device);
      }
    }
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    for (int device = 0; device < 2; ++device)
      for (Side& side : sides[device]) table->finish(side.instance, side.opState);
    for (int w = 0; w < n; ++w)
      for (int t = 0; t < count; ++t) {
        const size_t elems = shapes[t].rows * shapes[t].cols;
        std::vector<uint8_t> deviceOut(elems * bytesPer);
        ASSERT_EQ(cudaMemcpy(deviceOut.data(), sides[1][w].deviceOut[t], deviceOut.size(), cudaMemcpyDeviceToHost),
                  cudaSuccess);
        std::vector<float> got(elems), want(elems);
        for (size_t i = 0; i < elems; ++i)
          got[i] = asFloat(dtype, deviceOut.data(), i), want[i] = asFloat(dtype, sides[0][w].hostOut[t].data(), i);
        const std::string what = "step " + std::to_string(step) + " rank " + std::to_string(w) + " " + shapes[t].name;
        expectClose(got, want, tolerance, what + " output");
        if (step == 2 && zeroLastStep)
          for (float x : got) ASSERT_EQ(x, 0.0f) << what << ": zero gradients";
        // The saved state (error vector, Q) through save_tensor_state (a download for the device).
        std::vector<std::vector<float>> saved(2);
        uint64_t trailers[2][5] = {};
        for (int device = 0; device < 2; ++device) {
          size_t bytes = 0;
          ASSERT_EQ(table->save_tensor_state(sides[device][w].instance, sides[device][w].states[t], nullptr, &bytes),
                    SHOAL_OK);
          std::vector<uint8_t> blob(bytes);
          ASSERT_EQ(table->save_tensor_state(sides[device][w].instance, sides[device][w].states[t], blob.data(),
                                             &bytes),
                    SHOAL_OK);
          for (size_t i = 0; i < elems; ++i) saved[device].push_back(asFloat(dtype, blob.data(), i));
          const size_t qFloats = (bytes - elems * bytesPer - 40) / 4;
          for (size_t i = 0; i < qFloats; ++i) {
            float q;
            std::memcpy(&q, blob.data() + elems * bytesPer + 4 * i, 4);
            saved[device].push_back(q);
          }
          std::memcpy(trailers[device], blob.data() + bytes - 40, 40);
          if (device) {
            size_t hostBytes = 0;
            table->save_tensor_state(sides[0][w].instance, sides[0][w].states[t], nullptr, &hostBytes);
            EXPECT_EQ(bytes, hostBytes) << what;
          }
        }
        expectClose(saved[1], saved[0], tolerance, what + " state");
        // count, cols, r, flags (Q valid, RNG draws so far), dtype: exactly the host's
        for (int word = 0; word < 5; ++word) EXPECT_EQ(trailers[1][word], trailers[0][word]) << what << " trailer " << word;
      }
  }
  for (int device = 0; device < 2; ++device)
    for (Side& side : sides[device]) {
      for (void* state : side.states) table->destroy_tensor_state(side.instance, state);
      table->destroy(side.instance);
      for (void* p : side.deviceIn) cudaFree(p);
      for (void* p : side.deviceOut) cudaFree(p);
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
