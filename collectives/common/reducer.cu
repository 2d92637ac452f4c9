// CUDA kernels of the device reducer (device_reducer.h): one grid-stride loop
// per (dtype, op), each element computed by the very functions the CPU
// reducer uses (element_ops.h), so results match the CPU bit for bit.
#include <cuda_runtime.h>

#include <algorithm>
#include <string>
#include <type_traits>

#include "collectives/common/device_reducer.h"
#include "core/numeric/element_ops.h"

namespace shoal::cuda::detail {
namespace {

using ops::BFloat16;
using ops::Half;

constexpr int kThreads = 256;

template <typename T, typename Op>
__global__ void combineKernel(T* __restrict__ dst, const T* __restrict__ src, size_t count) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < count; i += size_t(gridDim.x) * blockDim.x)
    ops::combineElement(dst, src, i, Op{});
}

template <typename T, typename Op>
__global__ void combineIntoKernel(T* out, const T* a, const T* __restrict__ b, size_t count) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < count; i += size_t(gridDim.x) * blockDim.x)
    ops::combineElementInto(out, a, b, i, Op{});
}

template <typename T>
__global__ void divideKernel(T* buf, size_t count, int divisor) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < count; i += size_t(gridDim.x) * blockDim.x)
    ops::divideElement(buf, i, divisor);
}

// Enough blocks to fill the device; the grid-stride loop covers the rest.
unsigned blocksFor(size_t count) {
  size_t wanted = (count + kThreads - 1) / kThreads;
  return static_cast<unsigned>(std::clamp<size_t>(wanted, 1, 65535));
}

std::string lastLaunchError(const char* what) {
  cudaError_t status = cudaGetLastError();
  return status == cudaSuccess ? std::string() : std::string(what) + ": " + cudaGetErrorString(status);
}

struct Launch {
  void* out;
  const void* a;
  const void* b;  // nullptr: in place, out op= a
  size_t count;
  cudaStream_t stream;
};

template <typename T, typename Op>
void launch(const Launch& l) {
  if (l.b == nullptr)
    combineKernel<T, Op><<<blocksFor(l.count), kThreads, 0, l.stream>>>(static_cast<T*>(l.out),
                                                                       static_cast<const T*>(l.a), l.count);
  else
    combineIntoKernel<T, Op><<<blocksFor(l.count), kThreads, 0, l.stream>>>(
        static_cast<T*>(l.out), static_cast<const T*>(l.a), static_cast<const T*>(l.b), l.count);
}

// False when op is not defined on T (bitwise ops on floats).
template <typename T>
bool launchFor(shoal_op_t op, const Launch& l) {
  switch (op) {
    case SHOAL_SUM:
    case SHOAL_AVG: launch<T, ops::Sum>(l); return true;
    case SHOAL_PROD: launch<T, ops::Prod>(l); return true;
    case SHOAL_MIN: launch<T, ops::Min>(l); return true;
    case SHOAL_MAX: launch<T, ops::Max>(l); return true;
    default: break;
  }
  if constexpr (std::is_integral_v<T>) {
    switch (op) {
      case SHOAL_BAND: launch<T, ops::BitAnd>(l); return true;
      case SHOAL_BOR: launch<T, ops::BitOr>(l); return true;
      case SHOAL_BXOR: launch<T, ops::BitXor>(l); return true;
      default: break;
    }
  }
  return false;
}

// body(T{}) with the element type of dtype; false for an unknown dtype.
template <typename Body>
bool withType(shoal_dtype_t dtype, Body&& body) {
  switch (dtype) {
    case SHOAL_F16: return body(Half{});
    case SHOAL_BF16: return body(BFloat16{});
    case SHOAL_F32: return body(float{});
    case SHOAL_F64: return body(double{});
    case SHOAL_I8: return body(int8_t{});
    case SHOAL_U8: return body(uint8_t{});
    case SHOAL_I32: return body(int32_t{});
    case SHOAL_U32: return body(uint32_t{});
    case SHOAL_I64: return body(int64_t{});
    case SHOAL_U64: return body(uint64_t{});
    default: return false;
  }
}

}  // namespace

std::string launchCombine(void* out, const void* a, const void* b, size_t count, shoal_dtype_t dtype, shoal_op_t op,
                          void* stream) {
  Launch l{out, a, b, count, static_cast<cudaStream_t>(stream)};
  if (!withType(dtype, [&](auto type) { return launchFor<decltype(type)>(op, l); }))
    return std::string("op ") + shoal_op_name(op) + " is not defined on dtype " + shoal_dtype_name(dtype);
  return lastLaunchError("launching the device reducer");
}

std::string launchDivide(void* buf, size_t count, shoal_dtype_t dtype, int divisor, void* stream) {
  bool known = withType(dtype, [&](auto type) {
    using T = decltype(type);
    divideKernel<T><<<blocksFor(count), kThreads, 0, static_cast<cudaStream_t>(stream)>>>(static_cast<T*>(buf), count,
                                                                                          divisor);
    return true;
  });
  if (!known) return std::string("dtype ") + shoal_dtype_name(dtype) + " is not a shoal dtype";
  return lastLaunchError("launching the device average");
}

}  // namespace shoal::cuda::detail
