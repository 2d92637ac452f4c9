// The host Reducer's loops (collectives/common/reducer.cc: blocked, so the
// compiler vectorises them) against the plain per-element functions of
// core/numeric/element_ops.h, one element at a time: bit for bit, for every
// dtype x op the reducer takes, every count from 0 to 70 and odd and even
// counts around the block sizes, at element offsets 0..3 (so the vector
// loads start unaligned), out of place, in place, and avg's division.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "collectives/common/reducer.h"
#include "core/numeric/element_ops.h"

namespace {

using shoal::ops::BFloat16;
using shoal::ops::Half;

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

// Random elements with the edge values: zeros of both signs, infinities,
// subnormals and NaNs for the floats, the full bit range for the integers.
std::vector<uint8_t> randomElements(shoal_dtype_t dtype, size_t count, std::mt19937_64& random) {
  const size_t element = shoal::dtypeSize(dtype);
  std::vector<uint8_t> bytes(count * element);
  for (size_t i = 0; i < count; ++i) {
    uint8_t* at = bytes.data() + i * element;
    const uint64_t bits = random();
    if (dtype == SHOAL_F32) {
      const float specials[] = {0.0f, -0.0f, INFINITY, -INFINITY, 1e-40f, -3e-39f, 3.4e38f, NAN};
      float value = i % 7 == 0 ? specials[bits % 8] : std::ldexp(float(int32_t(bits >> 40)) / 8388608.0f, int(bits % 40) - 20);
      std::memcpy(at, &value, 4);
    } else if (dtype == SHOAL_F64) {
      const double specials[] = {0.0, -0.0, INFINITY, -INFINITY, 1e-310, 1.7e308, NAN};
      double value = i % 7 == 0 ? specials[bits % 7] : std::ldexp(double(int64_t(bits >> 11)) / 9e15, int(bits % 80) - 40);
      std::memcpy(at, &value, 8);
    } else {
      std::memcpy(at, &bits, element);  // f16 and bf16: every pattern, NaNs and infinities included
    }
  }
  return bytes;
}

// Bit for bit, except that any NaN equals any NaN (which operand's payload
// a NaN + NaN keeps is the compiler's choice of operand order). "" when equal.
std::string firstDifference(shoal_dtype_t dtype, const uint8_t* got, const uint8_t* expected, size_t count) {
  const size_t element = shoal::dtypeSize(dtype);
  for (size_t i = 0; i < count; ++i) {
    const uint8_t* g = got + i * element;
    const uint8_t* e = expected + i * element;
    if (std::memcmp(g, e, element) == 0 || (isNan(dtype, g) && isNan(dtype, e))) continue;
    uint64_t gb = 0, eb = 0;
    std::memcpy(&gb, g, element);
    std::memcpy(&eb, e, element);
    return "element " + std::to_string(i) + ": reducer bits " + std::to_string(gb) + ", per-element bits " +
           std::to_string(eb);
  }
  return "";
}

// The reference: element_ops.h's functions, one element at a time.
template <typename T, typename Op>
void referenceInto(void* out, const void* a, const void* b, size_t count) {
  for (size_t i = 0; i < count; ++i)
    shoal::ops::combineElementInto(static_cast<T*>(out), static_cast<const T*>(a), static_cast<const T*>(b), i, Op{});
}

template <typename T>
void referenceFor(shoal_op_t op, void* out, const void* a, const void* b, size_t count) {
  namespace ops = shoal::ops;
  switch (op) {
    case SHOAL_SUM: case SHOAL_AVG: return referenceInto<T, ops::Sum>(out, a, b, count);
    case SHOAL_PROD: return referenceInto<T, ops::Prod>(out, a, b, count);
    case SHOAL_MIN: return referenceInto<T, ops::Min>(out, a, b, count);
    case SHOAL_MAX: return referenceInto<T, ops::Max>(out, a, b, count);
    default: break;
  }
  if constexpr (std::is_integral_v<T>) {
    switch (op) {
      case SHOAL_BAND: return referenceInto<T, ops::BitAnd>(out, a, b, count);
      case SHOAL_BOR: return referenceInto<T, ops::BitOr>(out, a, b, count);
      case SHOAL_BXOR: return referenceInto<T, ops::BitXor>(out, a, b, count);
      default: break;
    }
  }
  FAIL() << "no reference for op " << op;
}

void reference(shoal_dtype_t dtype, shoal_op_t op, void* out, const void* a, const void* b, size_t count) {
  switch (dtype) {
    case SHOAL_F16: return referenceFor<Half>(op, out, a, b, count);
    case SHOAL_BF16: return referenceFor<BFloat16>(op, out, a, b, count);
    case SHOAL_F32: return referenceFor<float>(op, out, a, b, count);
    case SHOAL_F64: return referenceFor<double>(op, out, a, b, count);
    case SHOAL_I8: return referenceFor<int8_t>(op, out, a, b, count);
    case SHOAL_U8: return referenceFor<uint8_t>(op, out, a, b, count);
    case SHOAL_I32: return referenceFor<int32_t>(op, out, a, b, count);
    case SHOAL_U32: return referenceFor<uint32_t>(op, out, a, b, count);
    case SHOAL_I64: return referenceFor<int64_t>(op, out, a, b, count);
    case SHOAL_U64: return referenceFor<uint64_t>(op, out, a, b, count);
    default: FAIL() << "no reference for dtype " << dtype;
  }
}

template <typename T>
void referenceDivide(void* buf, size_t count, int divisor) {
  for (size_t i = 0; i < count; ++i) shoal::ops::divideElement(static_cast<T*>(buf), i, divisor);
}

void referenceAvgEnd(shoal_dtype_t dtype, void* buf, size_t count, int divisor) {
  switch (dtype) {
    case SHOAL_F16: return referenceDivide<Half>(buf, count, divisor);
    case SHOAL_BF16: return referenceDivide<BFloat16>(buf, count, divisor);
    case SHOAL_F32: return referenceDivide<float>(buf, count, divisor);
    case SHOAL_F64: return referenceDivide<double>(buf, count, divisor);
    case SHOAL_I8: return referenceDivide<int8_t>(buf, count, divisor);
    case SHOAL_U8: return referenceDivide<uint8_t>(buf, count, divisor);
    case SHOAL_I32: return referenceDivide<int32_t>(buf, count, divisor);
    case SHOAL_U32: return referenceDivide<uint32_t>(buf, count, divisor);
    case SHOAL_I64: return referenceDivide<int64_t>(buf, count, divisor);
    case SHOAL_U64: return referenceDivide<uint64_t>(buf, count, divisor);
    default: FAIL() << "no reference for dtype " << dtype;
  }
}

std::vector<size_t> counts() {
  std::vector<size_t> result;
  for (size_t n = 0; n <= 70; ++n) result.push_back(n);
  for (size_t n : {127, 128, 129, 255, 256, 257, 511, 512, 513, 1023, 1024, 1025, 1537, 4099}) result.push_back(n);
  return result;
}

const shoal_dtype_t kDtypes[] = {SHOAL_F16, SHOAL_BF16, SHOAL_F32, SHOAL_F64, SHOAL_I8,
                                 SHOAL_U8,  SHOAL_I32,  SHOAL_U32, SHOAL_I64, SHOAL_U64};

TEST(HostReducer, MatchesPerElementFunctionsBitForBitAtEveryCountAndOffset) {
  std::mt19937_64 random(17);
  int pairs = 0;
  for (shoal_dtype_t dtype : kDtypes)
    for (int o = 0; o < SHOAL_OP_COUNT; ++o) {
      const auto op = static_cast<shoal_op_t>(o);
      if (!shoal::isValidDtypeOp(dtype, op)) continue;
      ++pairs;
      const shoal::Reducer reducer(dtype, op);
      const size_t element = reducer.elementSize();
      for (size_t count : counts())
        for (size_t offset = 0; offset < 4; ++offset) {
          const std::string what = std::string(shoal_dtype_name(dtype)) + " " + shoal_op_name(op) + " count " +
                                   std::to_string(count) + " offset " + std::to_string(offset);
          // Each operand `offset` elements into its own buffer.
          const size_t bytes = count * element, at = offset * element;
          std::vector<uint8_t> a = randomElements(dtype, count + offset, random);
          std::vector<uint8_t> b = randomElements(dtype, count + offset, random);
          std::vector<uint8_t> expected(bytes + at), got(bytes + at, 0xa5);
          reference(dtype, op, expected.data() + at, a.data() + at, b.data() + at, count);

          reducer.combineInto(got.data() + at, a.data() + at, b.data() + at, count);
          ASSERT_EQ(firstDifference(dtype, got.data() + at, expected.data() + at, count), "") << what << ": into";
          for (size_t i = 0; i < at; ++i) ASSERT_EQ(got[i], 0xa5) << what << ": wrote before the output";

          std::vector<uint8_t> inPlace = a;
          reducer.combine(inPlace.data() + at, b.data() + at, count);
          ASSERT_EQ(firstDifference(dtype, inPlace.data() + at, expected.data() + at, count), "") << what << ": in place";
          if (at > 0) ASSERT_EQ(std::memcmp(inPlace.data(), a.data(), at), 0) << what << ": wrote before the output";

          if (op == SHOAL_AVG) {
            reducer.finish(inPlace.data() + at, count, 3);
            referenceAvgEnd(dtype, expected.data() + at, count, 3);
            ASSERT_EQ(firstDifference(dtype, inPlace.data() + at, expected.data() + at, count), "") << what << ": avg";
          }
        }
    }
  EXPECT_EQ(pairs, 4 * 5 + 6 * 8);  // floats: sum avg prod min max; integers also the three bitwise ops
}

}  // namespace
