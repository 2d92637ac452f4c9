// The device side of Reducer: the same elementwise combine, as CUDA kernels
// (collectives/common/reducer.cu) built from the per-element functions of
// element_ops.h, so the GPU computes what the CPU reducer computes, bit for bit.
// Plain C++ declarations (no CUDA headers): streams are cudaStream_t passed as
// void*; nullptr is the default stream. Exists only in the GPU build
// (SHOAL_WITH_CUDA); every function enqueues on the stream and returns without
// waiting. A launch failure throws shoal::Error(SHOAL_ERR_SYSTEM) with the
// CUDA runtime's text; an undefined (dtype, op) throws INVALID_ARGUMENT.
#pragma once

#include <cstddef>
#include <string>

#include "shoal/shoal.h"

namespace shoal::cuda {

// dst[i] = dst[i] op src[i] for i < count (device pointers; they may not overlap).
void reduceOnDevice(void* dst, const void* src, size_t count, shoal_dtype_t dtype, shoal_op_t op, void* stream);
// out[i] = a[i] op b[i]; out may equal a, never b.
void reduceIntoOnDevice(void* out, const void* a, const void* b, size_t count, shoal_dtype_t dtype, shoal_op_t op,
                        void* stream);
// The end of SHOAL_AVG: buf[i] /= worldSize as Reducer::finish does (a no-op for other ops).
void finishOnDevice(void* buf, size_t count, shoal_dtype_t dtype, shoal_op_t op, int worldSize, void* stream);

namespace detail {
// The kernel launchers (reducer.cu), wrapped by the functions above
// (device_reducer.cc): "" on success, else what failed. Split because nvcc
// cannot compile fmt, which shoal::Error's helpers use.
// b == nullptr combines in place: out[i] = out[i] op a[i].
std::string launchCombine(void* out, const void* a, const void* b, size_t count, shoal_dtype_t dtype, shoal_op_t op,
                          void* stream);
std::string launchDivide(void* buf, size_t count, shoal_dtype_t dtype, int divisor, void* stream);
}  // namespace detail

}  // namespace shoal::cuda
