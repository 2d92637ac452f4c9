// The topk CUDA path against its CPU path: the table driven for n simulated
// ranks (tests/harness/compressor_rounds.h), the same calls on host tensors
// and on CUDA tensors (fused tensors of mixed dtypes, a zero-size one, ties,
// NaNs, error feedback over several steps, sum and avg). Payloads, outputs
// and saved residuals must be the same bits (NaNs: both NaN, see sameValue).
// Also: a state loaded before the first call moves to the device, and a name
// that changes memory kind is refused.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "cuda_test_util.h"
#include "shoal/compressor.h"

namespace {

using shoal::test::CompressorRounds;
using shoal::test::DeviceBytes;
using shoal::test::upload;

class CudaTopk : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string why;
    if (shoal::test::noCudaDevice(&why)) GTEST_SKIP() << "no CUDA device: " << why;
  }
};

struct TensorSpec {
  size_t count;
  shoal_dtype_t dtype;
};

// Rank r's tensor t at step s: values with exact ties, a NaN now and then, as raw bytes.
std::vector<unsigned char> gradientBytes(const TensorSpec& spec, int r, int t, int s, bool ties) {
  std::mt19937_64 random(uint64_t(r) * 1000003u + uint64_t(t) * 7919u + uint64_t(s) * 31u + (ties ? 1 : 0));
  std::normal_distribution<double> normal(0.0, 1.0);
  const size_t size = shoal_dtype_size(spec.dtype);
  std::vector<unsigned char> bytes(spec.count * size);
  for (size_t i = 0; i < spec.count; ++i) {
    double x = ties ? double(int(random() % 7) - 3) : normal(random);
    if (random() % 997 == 0) x = std::numeric_limits<double>::quiet_NaN();
    if (spec.dtype == SHOAL_F32) {
      float f = static_cast<float>(x);
      std::memcpy(&bytes[i * 4], &f, 4);
    } else {
      std::memcpy(&bytes[i * 8], &x, 8);
    }
  }
  return bytes;
}

struct TopkRun {
  std::vector<std::vector<std::vector<unsigned char>>> outputs;  // [step][rank*T + t]
  std::vector<std::vector<uint64_t>> payloads;                   // [step] all ranks' words, gathered
  std::vector<std::vector<unsigned char>> states;                // [rank*T + t] after the last step
};

// `steps` allreduces of the tensors over n ranks simulated by CompressorRounds,
// on the device or the host.
TopkRun runTopk(const std::vector<TensorSpec>& specs, int n, int steps, const char* options, shoal_op_t op,
                bool onDevice, bool ties) {
  const shoal_compressor_t* table = nullptr;
  EXPECT_EQ(shoal_compressor_lookup("topk", &table), SHOAL_OK);
  const int tensors = static_cast<int>(specs.size());
  cudaStream_t stream = nullptr;
  EXPECT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
  std::vector<CompressorRounds::TensorSpec> named;
  for (int t = 0; t < tensors; ++t)
    named.push_back({specs[t].dtype, {int64_t(specs[t].count)}, "tensor" + std::to_string(t)});
  TopkRun run;
  {
    CompressorRounds rounds(table, n);
    EXPECT_EQ(rounds.create(shoal::test::optionPairs(options)), SHOAL_OK) << rounds.error(rounds.failedRank());
    if (onDevice) rounds.placeTensors(shoal::test::deviceMemory(stream));
    for (int s = 0; s < steps; ++s) {
      std::vector<uint64_t> gathered;  // every rank's words, in rank order
      auto fill = [&](int r, int t, void* data) {
        const std::vector<unsigned char> bytes = gradientBytes(specs[t], r, t, s, ties);
        std::memcpy(data, bytes.data(), bytes.size());
      };
      auto keepGathered = [&](shoal::test::Delivered& delivered) {
        EXPECT_EQ(delivered.collective, SHOAL_COLLECTIVE_ALLGATHERV);
        gathered.resize(delivered.bytes.size() / 8);
        std::memcpy(gathered.data(), delivered.bytes.data(), gathered.size() * 8);
      };
      EXPECT_EQ(rounds.allreduce(named, op, uint64_t(s), fill, keepGathered), SHOAL_OK)
          << rounds.error(rounds.failedRank());
      EXPECT_EQ(rounds.rounds(), 1) << "one gathering round, then done";
      run.payloads.push_back(gathered);
      std::vector<std::vector<unsigned char>> outputs;
      for (int r = 0; r < n; ++r)
        for (int t = 0; t < tensors; ++t) {
          const auto* out = static_cast<const unsigned char*>(rounds.output(r, t));
          outputs.emplace_back(out, out + specs[t].count * shoal_dtype_size(specs[t].dtype));
        }
      run.outputs.push_back(outputs);
    }
    for (int r = 0; r < n; ++r)
      for (int t = 0; t < tensors; ++t) {
        std::vector<unsigned char> bytes;
        if (table->save_tensor_state && rounds.state(r, t)) {
          size_t size = 0;
          EXPECT_EQ(table->save_tensor_state(rounds.instance(r), rounds.state(r, t), nullptr, &size), SHOAL_OK);
          bytes.resize(size);
          EXPECT_EQ(table->save_tensor_state(rounds.instance(r), rounds.state(r, t), bytes.data(), &size), SHOAL_OK);
        }
        run.states.push_back(bytes);
      }
  }  // the states and instances go with `rounds`, before the stream
  cudaStreamDestroy(stream);
  return run;
}

// Same bits, except that NaNs need only both be NaN: a GPU's arithmetic on a
// NaN gives the canonical NaN where an x86 CPU keeps the operand's payload.
bool sameValue(uint64_t a, uint64_t b, bool isFloat) {
  if (a == b) return true;
  if (isFloat) {
    float x, y;
    uint32_t la = uint32_t(a), lb = uint32_t(b);
    std::memcpy(&x, &la, 4);
    std::memcpy(&y, &lb, 4);
    return std::isnan(x) && std::isnan(y);
  }
  double x, y;
  std::memcpy(&x, &a, 8);
  std::memcpy(&y, &b, 8);
  return std::isnan(x) && std::isnan(y);
}

::testing::AssertionResult sameBytes(const std::vector<unsigned char>& a, const std::vector<unsigned char>& b,
                                     shoal_dtype_t dtype) {
  if (a.size() != b.size()) return ::testing::AssertionFailure() << "sizes " << a.size() << " and " << b.size();
  const size_t size = shoal_dtype_size(dtype);
  for (size_t i = 0; i < a.size() / size; ++i) {
    uint64_t x = 0, y = 0;
    std::memcpy(&x, &a[i * size], size);
    std::memcpy(&y, &b[i * size], size);
    if (!sameValue(x, y, dtype == SHOAL_F32))
      return ::testing::AssertionFailure() << "element " << i << ": bits " << std::hex << x << " and " << y;
  }
  return ::testing::AssertionSuccess();
}

void expectSameRuns(const std::vector<TensorSpec>& specs, const TopkRun& host, const TopkRun& device) {
  const size_t tensors = specs.size();
  ASSERT_EQ(host.payloads.size(), device.payloads.size());
  for (size_t s = 0; s < host.payloads.size(); ++s) {
    const std::vector<uint64_t>& a = host.payloads[s];
    const std::vector<uint64_t>& b = device.payloads[s];
    ASSERT_EQ(a.size(), b.size()) << "payload words of step " << s;
    for (size_t w = 0; w + 1 < a.size(); w += 2) {
      ASSERT_EQ(a[w], b[w]) << "index word " << w << " of step " << s;
      const bool isFloat = (a[w + 1] >> 32) == 0 && (b[w + 1] >> 32) == 0;
      ASSERT_TRUE(sameValue(a[w + 1], b[w + 1], isFloat)) << "value word " << w + 1 << " of step " << s;
    }
    for (size_t at = 0; at < host.outputs[s].size(); ++at)
      ASSERT_TRUE(sameBytes(host.outputs[s][at], device.outputs[s][at], specs[at % tensors].dtype))
          << "output of rank " << at / tensors << ", tensor " << at % tensors << ", step " << s;
  }
  ASSERT_EQ(host.states.size(), device.states.size());
  for (size_t at = 0; at < host.states.size(); ++at)
    ASSERT_TRUE(sameBytes(host.states[at], device.states[at], specs[at % tensors].dtype))
        << "saved residual of rank " << at / tensors << ", tensor " << at % tensors;
}

const std::vector<TensorSpec> kFused = {{1000, SHOAL_F32}, {0, SHOAL_F32}, {77, SHOAL_F64}, {5, SHOAL_F32},
                                        {100000, SHOAL_F32}, {4097, SHOAL_F64}};

TEST_F(CudaTopk, FusedTensorsWithErrorFeedbackMatchTheHost) {
  for (bool ties : {false, true}) {
    TopkRun host = runTopk(kFused, 3, 3, "k=17,ef=1", SHOAL_SUM, false, ties);
    TopkRun device = runTopk(kFused, 3, 3, "k=17,ef=1", SHOAL_SUM, true, ties);
    expectSameRuns(kFused, host, device);
  }
}

TEST_F(CudaTopk, AverageRatioAndNoFeedbackMatchTheHost) {
  expectSameRuns(kFused, runTopk(kFused, 4, 2, "ratio=0.05,ef=1", SHOAL_AVG, false, true),
                 runTopk(kFused, 4, 2, "ratio=0.05,ef=1", SHOAL_AVG, true, true));
  expectSameRuns(kFused, runTopk(kFused, 2, 2, "k=3,ef=0", SHOAL_SUM, false, false),
                 runTopk(kFused, 2, 2, "k=3,ef=0", SHOAL_SUM, true, false));
}

TEST_F(CudaTopk, EverythingSentIsThePlainSum) {
  const std::vector<TensorSpec> small = {{9, SHOAL_F32}, {4, SHOAL_F64}};
  expectSameRuns(small, runTopk(small, 3, 2, "k=1000", SHOAL_SUM, false, false),
                 runTopk(small, 3, 2, "k=1000", SHOAL_SUM, true, false));
}

// The table with one CUDA tensor on one rank: start + round 0 only (for the state tests below).
shoal_status_t startOnDevice(const shoal_compressor_t* table, void* instance, void** state, void* data, size_t count,
                             bool onDevice, std::string* error) {
  char text[512] = {};
  shoal_compress_tensor_t tensor{};
  tensor.input = shoal_tensor_1d(data, count, SHOAL_F32);
  tensor.output = tensor.input;
  if (onDevice) {
    tensor.input.memory = tensor.output.memory = SHOAL_MEMORY_CUDA;
  }
  tensor.name = "g";
  tensor.state = state;
  shoal_compress_op_t op{};
  op.struct_size = sizeof op;
  op.world_size = 1;
  op.op = SHOAL_SUM;
  op.num_tensors = 1;
  op.tensors = &tensor;
  op.error_text = text;
  op.error_text_size = sizeof text;
  void* opState = nullptr;
  shoal_status_t status = table->start(instance, &op, &opState);
  *error = text;
  if (status != SHOAL_OK) return status;
  shoal_round_t round{};
  round.struct_size = sizeof round;
  status = table->round(instance, opState, &op, &round);
  *error = text;
  table->finish(instance, opState);
  cudaDeviceSynchronize();
  return status;
}

TEST_F(CudaTopk, LoadedStateMovesToTheDeviceAndNamesStayPut) {
  const shoal_compressor_t* table = nullptr;
  ASSERT_EQ(shoal_compressor_lookup("topk", &table), SHOAL_OK);
  const char* keys[] = {"k"};
  const char* values[] = {"1"};
  shoal_compressor_params_t params{};
  params.struct_size = sizeof params;
  params.num_options = 1;
  params.keys = keys;
  params.values = values;
  void* instance = nullptr;
  ASSERT_EQ(table->create(&params, &instance), SHOAL_OK);

  // e = {0.5, 10, 0.25, 0}; g = {1, 1, 1, 1}: g + e = {1.5, 11, 1.25, 1}; k=1 sends index 1.
  std::vector<float> residual = {0.5f, 10.0f, 0.25f, 0.0f}, g(4, 1.0f);
  void* state = nullptr;
  ASSERT_EQ(table->load_tensor_state(instance, &state, residual.data(), residual.size() * 4), SHOAL_OK);
  DeviceBytes data(16);
  upload(data.get(), g.data(), 16);
  std::string error;
  ASSERT_EQ(startOnDevice(table, instance, &state, data.get(), 4, true, &error), SHOAL_OK) << error;
  std::vector<float> saved(4);
  size_t bytes = 16;
  ASSERT_EQ(table->save_tensor_state(instance, state, saved.data(), &bytes), SHOAL_OK);
  EXPECT_EQ(saved, (std::vector<float>{1.5f, 0.0f, 1.25f, 1.0f}));

  // The same name on host memory now: refused, with where it was and where it is.
  std::vector<float> hostData(4, 1.0f);
  EXPECT_EQ(startOnDevice(table, instance, &state, hostData.data(), 4, false, &error), SHOAL_ERR_INVALID_ARGUMENT);
  EXPECT_NE(error.find("CUDA device 0"), std::string::npos) << error;
  EXPECT_NE(error.find("host memory"), std::string::npos) << error;

  // Loading into the device state overwrites it in place.
  std::vector<float> zeros(4, 0.0f);
  ASSERT_EQ(table->load_tensor_state(instance, &state, zeros.data(), 16), SHOAL_OK);
  ASSERT_EQ(table->save_tensor_state(instance, state, saved.data(), &bytes), SHOAL_OK);
  EXPECT_EQ(saved, zeros);
  table->destroy_tensor_state(instance, state);
  table->destroy(instance);
}

}  // namespace
