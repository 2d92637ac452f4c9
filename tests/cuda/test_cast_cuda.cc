// The fp16/bf16 CUDA path: the kernels against cast_math.h on the CPU bit for
// bit (NaN, inf, f32 denormals, half subnormals, every rounding tie, overflow
// to inf, millions of random patterns; f32 and f64 inputs; aligned and
// misaligned pointers), against the CPU compressor's array converter (the same
// bits except NaN payloads), and the compressor table driven with CUDA
// tensors against the same calls on host tensors (tests/harness/compressor_rounds.h).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "core/numeric/element_ops.h"
#include "core/numeric/half_convert.h"
#include "compressors/cast/cast_cuda.h"
#include "compressors/cast/cast_math.h"
#include "cuda_test_util.h"
#include "shoal/compressor.h"

namespace {

using shoal::test::CompressorRounds;
using shoal::test::DeviceBytes;
using shoal::test::download;
using shoal::test::upload;

class CudaCast : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string why;
    if (shoal::test::noCudaDevice(&why)) GTEST_SKIP() << "no CUDA device: " << why;
  }
};

std::vector<float> specialFloats() {
  std::vector<uint32_t> bits = {
      0x00000000, 0x80000000, 0x7f800000, 0xff800000, 0x7fc00000, 0xffc00000, 0x7f800001, 0x7fbfffff, 0xffffffff,
      0x00000001, 0x807fffff, 0x00400000,                          // f32 denormals
      0x33000000, 0x33000001, 0x33c00000, 0x387fc000, 0x387fe000,  // around half's subnormal range and its ties
      0x38800000, 0x3f801000, 0x3f803000, 0x3f801001,              // half ties at 1.0
      0x477fe000, 0x477fefff, 0x477ff000, 0xc77ff000, 0x7f7fffff,  // 65504, just below / at the overflow tie, f32 max
      0x3f808000, 0x3f818000,                                      // bf16 ties
  };
  std::vector<float> values;
  for (uint32_t b : bits) values.push_back(shoal::ops::bitsFloat(b));
  // Every exponent with the rounding-relevant low bits, and random patterns.
  const uint32_t lows[] = {0x0000, 0x0001, 0x0fff, 0x1000, 0x1001, 0x1fff, 0x7fff, 0x8000, 0x8001, 0xffff};
  for (uint32_t upper = 0; upper < (1u << 16); ++upper)
    for (uint32_t low : lows) values.push_back(shoal::ops::bitsFloat((upper << 16) | (low & 0xffff) | ((upper & 7) << 13)));
  std::mt19937_64 random(11);
  for (int i = 0; i < 2000000; ++i) values.push_back(shoal::ops::bitsFloat(static_cast<uint32_t>(random())));
  return values;
}

bool halfNan(uint16_t h) { return (h & 0x7fff) > 0x7c00; }

// Encodes on the device at a pointer `shift` elements into the buffers.
template <typename T>
std::vector<uint16_t> deviceEncode(bool toHalf, const std::vector<T>& values, size_t shift) {
  DeviceBytes input((values.size() + shift) * sizeof(T)), payload((values.size() + shift) * sizeof(uint16_t));
  upload(input.get<T>() + shift, values.data(), values.size() * sizeof(T));
  const shoal_dtype_t dtype = sizeof(T) == 4 ? SHOAL_F32 : SHOAL_F64;
  EXPECT_EQ(shoal::cast::encodeOnDevice(toHalf, dtype, input.get<T>() + shift, payload.get<uint16_t>() + shift,
                                        values.size(), nullptr),
            nullptr);
  shoal::test::deviceSync();
  return download<uint16_t>(payload.get<uint16_t>() + shift, values.size());
}

TEST_F(CudaCast, EncodeMatchesCastMathBitForBit) {
  const std::vector<float> values = specialFloats();
  std::vector<double> doubles(values.begin(), values.end());
  doubles.push_back(1.0 + 0x1p-11 + 0x1p-40);  // a double that rounds differently straight to half
  doubles.push_back(65519.9999999);
  for (bool toHalf : {true, false})
    for (size_t shift : {0, 1, 3}) {
      std::vector<uint16_t> got = deviceEncode(toHalf, values, shift);
      for (size_t i = 0; i < values.size(); ++i) {
        uint16_t expected = toHalf ? shoal::cast::toHalfBits(values[i]) : shoal::cast::toBfloat16Bits(values[i]);
        ASSERT_EQ(got[i], expected) << (toHalf ? "fp16" : "bf16") << " shift " << shift << std::hex << " f32 0x"
                                    << shoal::ops::floatBits(values[i]);
      }
      std::vector<uint16_t> got64 = deviceEncode(toHalf, doubles, shift);
      for (size_t i = 0; i < doubles.size(); ++i)
        ASSERT_EQ(got64[i], toHalf ? shoal::cast::toHalfBits(doubles[i]) : shoal::cast::toBfloat16Bits(doubles[i]))
            << "f64 " << doubles[i];
    }
}

TEST_F(CudaCast, EncodeMatchesTheCpuArrayConverterExceptNanPayloads) {
  const std::vector<float> values = specialFloats();
  std::vector<uint16_t> half(values.size()), bf16(values.size());
  shoal::ops::floatToHalf(values.data(), half.data(), values.size());
  shoal::ops::floatToBfloat16(values.data(), bf16.data(), values.size());
  std::vector<uint16_t> gotHalf = deviceEncode(true, values, 0), gotBf16 = deviceEncode(false, values, 0);
  for (size_t i = 0; i < values.size(); ++i) {
    if (std::isnan(values[i])) {
      ASSERT_TRUE(halfNan(gotHalf[i]) && (gotHalf[i] >> 15) == (half[i] >> 15));
    } else {
      ASSERT_EQ(gotHalf[i], half[i]) << std::hex << "f32 0x" << shoal::ops::floatBits(values[i]);
    }
    ASSERT_EQ(gotBf16[i], bf16[i]) << std::hex << "f32 0x" << shoal::ops::floatBits(values[i]);
  }
}

TEST_F(CudaCast, DecodeIsExactForEveryPattern) {
  std::vector<uint16_t> all(65536);
  for (uint32_t h = 0; h < 65536; ++h) all[h] = static_cast<uint16_t>(h);
  DeviceBytes payload(all.size() * 2 + 2), out32(all.size() * 4 + 4), out64(all.size() * 8);
  for (bool fromHalf : {true, false})
    for (size_t shift : {0, 1}) {
      upload(payload.get<uint16_t>() + shift, all.data(), all.size() * 2);
      ASSERT_EQ(shoal::cast::decodeOnDevice(fromHalf, SHOAL_F32, payload.get<uint16_t>() + shift,
                                            out32.get<float>() + shift, all.size(), nullptr),
                nullptr);
      ASSERT_EQ(shoal::cast::decodeOnDevice(fromHalf, SHOAL_F64, payload.get<uint16_t>() + shift, out64.get<double>(),
                                            all.size(), nullptr),
                nullptr);
      shoal::test::deviceSync();
      std::vector<float> got32 = download<float>(out32.get<float>() + shift, all.size());
      std::vector<double> got64 = download<double>(out64.get<double>(), all.size());
      for (uint32_t h = 0; h < 65536; ++h) {
        const float expected = fromHalf ? shoal::cast::halfValue(all[h]) : shoal::cast::bfloat16Value(all[h]);
        ASSERT_EQ(shoal::ops::floatBits(got32[h]), shoal::ops::floatBits(expected)) << std::hex << h;
        const double expected64 = expected;
        ASSERT_EQ(std::memcmp(&got64[h], &expected64, 8), 0) << std::hex << h;
      }
    }
}

// ---- the compressor table with CUDA tensors ------------------------------------------

// One allreduce of `inputs` (one f32 tensor per rank, n = inputs.size())
// through the table, ranks simulated by CompressorRounds (the payload summed
// with shoal's Reducer, as the driver's allreduce: widen, add, round once per
// hop in rank order). On the device when `onDevice`, where the payload must
// live too. Returns every rank's output.
std::vector<std::vector<float>> allreduceThroughTable(const char* name, const std::vector<std::vector<float>>& inputs,
                                                      shoal_op_t op, bool onDevice) {
  const shoal_compressor_t* table = nullptr;
  EXPECT_EQ(shoal_compressor_lookup(name, &table), SHOAL_OK);
  EXPECT_NE(table->caps & SHOAL_CAP_CUDA, 0u) << name << " should declare SHOAL_CAP_CUDA in the CUDA build";
  const int n = static_cast<int>(inputs.size());
  const size_t count = inputs[0].size();
  const bool half = std::string(name) == "fp16";
  cudaStream_t stream = nullptr;
  EXPECT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
  std::vector<std::vector<float>> outputs(n);
  {
    CompressorRounds rounds(table, n);
    EXPECT_EQ(rounds.create({}), SHOAL_OK) << rounds.error(rounds.failedRank());
    if (onDevice) rounds.placeTensors(shoal::test::deviceMemory(stream));
    rounds.observe([&](int, const shoal_round_t& round) {
      if (round.done) return;
      EXPECT_EQ(round.num_payloads, 1);
      const shoal_payload_t& payload = round.payloads[0];
      EXPECT_EQ(payload.count, count);
      EXPECT_EQ(payload.dtype, half ? SHOAL_F16 : SHOAL_BF16);
      cudaPointerAttributes attributes{};
      EXPECT_EQ(cudaPointerGetAttributes(&attributes, payload.buffer), cudaSuccess);
      EXPECT_EQ(attributes.type == cudaMemoryTypeDevice, onDevice) << "the payload lives where the tensors do";
    });
    auto fill = [&](int r, int, void* data) { std::memcpy(data, inputs[r].data(), count * 4); };
    const shoal_status_t status = rounds.allreduce({{SHOAL_F32, {int64_t(count)}, ""}}, op, 0, fill);
    EXPECT_EQ(status, SHOAL_OK) << rounds.error(rounds.failedRank());
    EXPECT_EQ(rounds.rounds(), 1) << "one payload round, then done";
    for (int r = 0; r < n; ++r) outputs[r] = rounds.outputAs<float>(r, 0);
  }
  cudaStreamDestroy(stream);
  return outputs;
}

TEST_F(CudaCast, CompressorOnCudaTensorsMatchesHostTensors) {
  std::mt19937 random(5);
  std::normal_distribution<float> normal(0.0f, 3.0f);
  for (const char* name : {"fp16", "bf16"})
    for (size_t count : {1, 5, 1000, 100003}) {
      std::vector<std::vector<float>> inputs(3, std::vector<float>(count));
      for (auto& input : inputs)
        for (float& x : input) x = normal(random);
      inputs[0][0] = std::numeric_limits<float>::quiet_NaN();
      if (count > 2) inputs[1][2] = 70000.0f;  // fp16 overflow
      auto host = allreduceThroughTable(name, inputs, SHOAL_SUM, false);
      auto device = allreduceThroughTable(name, inputs, SHOAL_SUM, true);
      for (int r = 0; r < 3; ++r)
        ASSERT_EQ(std::memcmp(host[r].data(), device[r].data(), count * 4), 0) << name << " count " << count;
    }
}

}  // namespace
