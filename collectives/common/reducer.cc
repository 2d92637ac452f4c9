#include "collectives/common/reducer.h"

#include <algorithm>

#include "core/numeric/element_ops.h"
#include "core/numeric/half_convert.h"
#include "core/error.h"

namespace shoal {
namespace {

using ops::BFloat16;
using ops::Half;

// Blocked spans with restrict-qualified parameters (element_ops.h): the
// compiler vectorises and unrolls them without a runtime overlap check (a
// restrict on local pointers, as these loops had, GCC does not use).
template <typename T, typename Op>
void combineLoop(void* dst, const void* src, size_t count) {
  ops::combineSpan(static_cast<T*>(dst), static_cast<const T*>(src), count, Op{});
}

template <typename T, typename Op>
void combineIntoLoop(void* out, const void* a, const void* b, size_t count) {
  ops::combineSpanInto(static_cast<T*>(out), static_cast<const T*>(a), static_cast<const T*>(b), count, Op{});
}

// 16-bit floats: convert a chunk to f32 (vectorised), combine in f32, round
// back once. The same arithmetic as combineElement, many times faster.
constexpr size_t kChunk = 512;

template <typename T>
void widenChunk(const uint16_t* in, float* out, size_t count) {
  if constexpr (std::is_same_v<T, Half>) ops::halfToFloat(in, out, count);
  else ops::bfloat16ToFloat(in, out, count);
}
template <typename T>
void narrowChunk(const float* in, uint16_t* out, size_t count) {
  if constexpr (std::is_same_v<T, Half>) ops::floatToHalf(in, out, count);
  else ops::floatToBfloat16(in, out, count);
}

template <typename T, typename Op>
void combineIntoLoop16(void* out, const void* a, const void* b, size_t count) {
  float x[kChunk], y[kChunk];
  auto* o = static_cast<uint16_t*>(out);
  auto* pa = static_cast<const uint16_t*>(a);
  auto* pb = static_cast<const uint16_t*>(b);
  for (size_t begin = 0; begin < count; begin += kChunk) {
    size_t n = std::min(kChunk, count - begin);
    widenChunk<T>(pa + begin, x, n);
    widenChunk<T>(pb + begin, y, n);
    for (size_t i = 0; i < n; ++i) x[i] = Op{}(x[i], y[i]);
    narrowChunk<T>(x, o + begin, n);
  }
}

template <typename T, typename Op>
void combineLoop16(void* dst, const void* src, size_t count) {
  combineIntoLoop16<T, Op>(dst, dst, src, count);
}

template <typename T>
void divideLoop(void* buf, size_t count, int divisor) {
  T* b = static_cast<T*>(buf);
  for (size_t i = 0; i < count; ++i) ops::divideElement(b, i, divisor);
}

struct Entry {
  void (*combine)(void*, const void*, size_t);
  void (*divide)(void*, size_t, int);
  void (*combineInto)(void*, const void*, const void*, size_t);
};

template <typename T, typename Op>
constexpr Entry loopsFor(void (*divide)(void*, size_t, int)) {
  if constexpr (std::is_same_v<T, Half> || std::is_same_v<T, BFloat16>)
    return {combineLoop16<T, Op>, divide, combineIntoLoop16<T, Op>};
  else
    return {combineLoop<T, Op>, divide, combineIntoLoop<T, Op>};
}

template <typename T>
constexpr Entry entryFor(shoal_op_t op) {
  constexpr bool integral = std::is_integral_v<T>;
  switch (op) {
    case SHOAL_SUM:
    case SHOAL_AVG: return loopsFor<T, ops::Sum>(divideLoop<T>);
    case SHOAL_PROD: return loopsFor<T, ops::Prod>(nullptr);
    case SHOAL_MIN: return loopsFor<T, ops::Min>(nullptr);
    case SHOAL_MAX: return loopsFor<T, ops::Max>(nullptr);
    case SHOAL_BAND: if constexpr (integral) return loopsFor<T, ops::BitAnd>(nullptr); break;
    case SHOAL_BOR: if constexpr (integral) return loopsFor<T, ops::BitOr>(nullptr); break;
    case SHOAL_BXOR: if constexpr (integral) return loopsFor<T, ops::BitXor>(nullptr); break;
    default: break;
  }
  return {nullptr, nullptr, nullptr};
}

constexpr Entry lookup(shoal_dtype_t dtype, shoal_op_t op) {
  switch (dtype) {
    case SHOAL_F16: return entryFor<Half>(op);
    case SHOAL_BF16: return entryFor<BFloat16>(op);
    case SHOAL_F32: return entryFor<float>(op);
    case SHOAL_F64: return entryFor<double>(op);
    case SHOAL_I8: return entryFor<int8_t>(op);
    case SHOAL_U8: return entryFor<uint8_t>(op);
    case SHOAL_I32: return entryFor<int32_t>(op);
    case SHOAL_U32: return entryFor<uint32_t>(op);
    case SHOAL_I64: return entryFor<int64_t>(op);
    case SHOAL_U64: return entryFor<uint64_t>(op);
    default: return {nullptr, nullptr, nullptr};
  }
}

// Every (dtype, op) pair's loops, looked up once per process: a small
// allreduce checks its pair and builds its Reducer with two loads.
struct Table {
  Entry entries[SHOAL_DTYPE_COUNT][SHOAL_OP_COUNT] = {};
  constexpr Table() {
    for (int d = 0; d < SHOAL_DTYPE_COUNT; ++d)
      for (int o = 0; o < SHOAL_OP_COUNT; ++o)
        entries[d][o] = lookup(static_cast<shoal_dtype_t>(d), static_cast<shoal_op_t>(o));
  }
};
// Built by the compiler: a lookup is a load, with no guard for a first use
// (isValidDtypeOp and every Reducer ask per call).
constexpr Table kTable;

// Values outside the enums (a C caller's) have no entry.
const Entry* entryOf(shoal_dtype_t dtype, shoal_op_t op) {
  static constexpr Entry kNone = {nullptr, nullptr, nullptr};
  const auto d = static_cast<unsigned>(dtype), o = static_cast<unsigned>(op);
  if (d >= SHOAL_DTYPE_COUNT || o >= SHOAL_OP_COUNT) return &kNone;
  return &kTable.entries[d][o];
}

}  // namespace

bool isValidDtypeOp(shoal_dtype_t dtype, shoal_op_t op) { return entryOf(dtype, op)->combine != nullptr; }

namespace {
[[noreturn, gnu::noinline, gnu::cold]] void refusePair(shoal_dtype_t dtype, shoal_op_t op) {
  fail(SHOAL_ERR_INVALID_ARGUMENT, "op {} is not defined on dtype {}", shoal_op_name(op), shoal_dtype_name(dtype));
}
}  // namespace

Reducer::Reducer(shoal_dtype_t dtype, shoal_op_t op) : dtype_(dtype), op_(op), elementSize_(dtypeSize(dtype)) {
  const Entry* entry = entryOf(dtype, op);
  if (entry->combine == nullptr) refusePair(dtype, op);
  combine_ = entry->combine;
  combineInto_ = entry->combineInto;
  divide_ = op == SHOAL_AVG ? entry->divide : nullptr;
}

}  // namespace shoal
