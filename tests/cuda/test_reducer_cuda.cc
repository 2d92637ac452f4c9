// The device reducer against the CPU reducer, bit for bit, for every dtype x
// op the CPU takes and counts 0, 1, odd and large. Both run the per-element
// functions of element_ops.h, so any difference is a bug. Skips without a device.
#include <gtest/gtest.h>

#include <cuda_runtime_api.h>

#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "collectives/common/device_reducer.h"
#include "core/numeric/element_ops.h"
#include "collectives/common/reducer.h"
#include "core/error.h"
#include "gpu/cuda/device.h"

namespace {

#define SKIP_WITHOUT_DEVICE()                                                   \
  do {                                                                          \
    std::string why;                                                            \
    if (shoal::cuda::deviceCount(&why) == 0) GTEST_SKIP() << "no CUDA device: " << why; \
  } while (0)

void ok(cudaError_t status, const char* what) {
  ASSERT_EQ(status, cudaSuccess) << what << ": " << cudaGetErrorString(status);
}

struct DeviceBytes {
  void* data = nullptr;
  explicit DeviceBytes(size_t bytes) { cudaMalloc(&data, bytes > 0 ? bytes : 1); }
  ~DeviceBytes() { cudaFree(data); }
};

bool isNan(shoal_dtype_t dtype, const uint8_t* at) {
  uint64_t bits = 0;
  std::memcpy(&bits, at, shoal::dtypeSize(dtype));
  switch (dtype) {
    case SHOAL_F16: return (bits & 0x7c00u) == 0x7c00u && (bits & 0x3ffu);
    case SHOAL_BF16: return (bits & 0x7f80u) == 0x7f80u && (bits & 0x7fu);
    case SHOAL_F32: return (bits & 0x7f800000u) == 0x7f800000u && (bits & 0x7fffffu);
    case SHOAL_F64: return (bits >> 52 & 0x7ff) == 0x7ff && (bits & ((uint64_t(1) << 52) - 1));
    default: return false;
  }
}

// Random elements of dtype, with the values that test the edges: for floats
// zeros of both signs, infinities, subnormals (no NaN: its payload is not
// part of the contract); for integers the full bit range.
std::vector<uint8_t> randomElements(shoal_dtype_t dtype, size_t count, std::mt19937_64& random) {
  size_t element = shoal::dtypeSize(dtype);
  std::vector<uint8_t> bytes(count * element);
  for (size_t i = 0; i < count; ++i) {
    uint8_t* at = bytes.data() + i * element;
    uint64_t bits = random();
    switch (dtype) {
      case SHOAL_F32: {
        const float specials[] = {0.0f, -0.0f, INFINITY, -INFINITY, 1e-40f, -3e-39f, 3.4e38f};
        float value = i % 11 == 0 ? specials[bits % 7]
                                  : std::ldexp(float(int32_t(bits >> 40)) / 8388608.0f, int(bits % 40) - 20);
        std::memcpy(at, &value, 4);
        break;
      }
      case SHOAL_F64: {
        const double specials[] = {0.0, -0.0, INFINITY, -INFINITY, 1e-310, 1.7e308};
        double value = i % 11 == 0 ? specials[bits % 6]
                                   : std::ldexp(double(int64_t(bits >> 11)) / 9e15, int(bits % 80) - 40);
        std::memcpy(at, &value, 8);
        break;
      }
      case SHOAL_F16:
      case SHOAL_BF16: {
        uint16_t half = uint16_t(bits);
        std::memcpy(at, &half, 2);
        if (isNan(dtype, at)) {
          half &= 0x83ffu;  // keep the sign and low mantissa, make it finite
          std::memcpy(at, &half, 2);
        }
        break;
      }
      default: std::memcpy(at, &bits, element);
    }
  }
  return bytes;
}

// Equal bit for bit, except that any NaN equals any NaN (inf - inf makes a
// NaN whose sign and payload differ between x86 and the GPU). "" when equal.
std::string firstDifference(shoal_dtype_t dtype, const std::vector<uint8_t>& got,
                            const std::vector<uint8_t>& expected) {
  size_t element = shoal::dtypeSize(dtype);
  for (size_t i = 0; i * element < got.size(); ++i) {
    const uint8_t* g = got.data() + i * element;
    const uint8_t* e = expected.data() + i * element;
    if (std::memcmp(g, e, element) == 0 || (isNan(dtype, g) && isNan(dtype, e))) continue;
    uint64_t gb = 0, eb = 0;
    std::memcpy(&gb, g, element);
    std::memcpy(&eb, e, element);
    return "element " + std::to_string(i) + ": device bits " + std::to_string(gb) + ", CPU bits " + std::to_string(eb);
  }
  return "";
}

const shoal_dtype_t kDtypes[] = {SHOAL_F16, SHOAL_BF16, SHOAL_F32, SHOAL_F64, SHOAL_I8,
                                 SHOAL_U8,  SHOAL_I32,  SHOAL_U32, SHOAL_I64, SHOAL_U64};
const size_t kCounts[] = {0, 1, 7, 1001, (size_t(1) << 20) + 3};

TEST(DeviceReducer, MatchesCpuBitForBit) {
  SKIP_WITHOUT_DEVICE();
  std::mt19937_64 random(42);
  cudaStream_t stream = nullptr;
  ok(cudaStreamCreate(&stream), "cudaStreamCreate");
  for (shoal_dtype_t dtype : kDtypes)
    for (int o = 0; o < SHOAL_OP_COUNT; ++o) {
      auto op = static_cast<shoal_op_t>(o);
      if (!shoal::isValidDtypeOp(dtype, op)) continue;
      shoal::Reducer reducer(dtype, op);
      for (size_t count : kCounts) {
        std::string what =
            std::string(shoal_dtype_name(dtype)) + " " + shoal_op_name(op) + " count " + std::to_string(count);
        const size_t bytes = count * reducer.elementSize();
        std::vector<uint8_t> a = randomElements(dtype, count, random), b = randomElements(dtype, count, random);
        DeviceBytes da(bytes), db(bytes), dout(bytes);
        ok(cudaMemcpy(da.data, a.data(), bytes, cudaMemcpyHostToDevice), "copy a");
        ok(cudaMemcpy(db.data, b.data(), bytes, cudaMemcpyHostToDevice), "copy b");

        // Out of place: out = a op b.
        shoal::cuda::reduceIntoOnDevice(dout.data, da.data, db.data, count, dtype, op, stream);
        // In place: a op= b, then the end of avg over a world of 3.
        shoal::cuda::reduceOnDevice(da.data, db.data, count, dtype, op, stream);
        shoal::cuda::finishOnDevice(da.data, count, dtype, op, 3, stream);
        ok(cudaStreamSynchronize(stream), "cudaStreamSynchronize");

        std::vector<uint8_t> expected(bytes), gotInto(bytes), gotFinished(bytes);
        reducer.combineInto(expected.data(), a.data(), b.data(), count);
        ok(cudaMemcpy(gotInto.data(), dout.data, bytes, cudaMemcpyDeviceToHost), "copy out");
        EXPECT_EQ(firstDifference(dtype, gotInto, expected), "") << what << ": out of place";
        reducer.finish(expected.data(), count, 3);
        ok(cudaMemcpy(gotFinished.data(), da.data, bytes, cudaMemcpyDeviceToHost), "copy a back");
        EXPECT_EQ(firstDifference(dtype, gotFinished, expected), "") << what << ": in place (then avg's division)";
      }
    }
  cudaStreamDestroy(stream);
}

// The per-element conversions the kernels use, on the device, against the
// host for every 16-bit pattern (the host conversions are checked against
// the vectorised ones by the unit tests).
TEST(DeviceReducer, SixteenBitFloatsRoundTripEveryPattern) {
  SKIP_WITHOUT_DEVICE();
  const size_t count = 65536;
  std::vector<uint16_t> all(count), ones(count, 0);
  for (size_t i = 0; i < count; ++i) all[i] = uint16_t(i);
  for (shoal_dtype_t dtype : {SHOAL_F16, SHOAL_BF16}) {
    DeviceBytes d(count * 2), zero(count * 2);
    ok(cudaMemcpy(d.data, all.data(), count * 2, cudaMemcpyHostToDevice), "copy");
    ok(cudaMemset(zero.data, 0x80, count * 2), "memset");  // 0x8080: a tiny negative value; max against it
    shoal::cuda::reduceOnDevice(d.data, zero.data, count, dtype, SHOAL_MAX, nullptr);
    ok(cudaDeviceSynchronize(), "sync");
    std::vector<uint16_t> got(count), expected = all;
    std::vector<uint16_t> negative(count, 0x8080);
    shoal::Reducer(dtype, SHOAL_MAX).combine(expected.data(), negative.data(), count);
    ok(cudaMemcpy(got.data(), d.data, count * 2, cudaMemcpyDeviceToHost), "copy back");
    for (size_t i = 0; i < count; ++i) {
      if (isNan(dtype, reinterpret_cast<const uint8_t*>(&all[i]))) continue;  // NaN payloads: not part of the contract
      ASSERT_EQ(got[i], expected[i]) << shoal_dtype_name(dtype) << " pattern 0x" << std::hex << i;
    }
  }
}

TEST(DeviceReducer, RefusesUndefinedOps) {
  SKIP_WITHOUT_DEVICE();
  EXPECT_THROW(shoal::cuda::reduceOnDevice(nullptr, nullptr, 4, SHOAL_F32, SHOAL_BOR, nullptr), shoal::Error);
}

}  // namespace
