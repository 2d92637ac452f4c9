// The fp16/bf16 compressor's CUDA kernels (cast_kernels.cu), declared for the
// host code without CUDA headers. Compiled only in the GPU build
// (SHOAL_WITH_CUDA). Each call enqueues one kernel on `stream` (a
// cudaStream_t) of the current device and returns nullptr, or the CUDA error's
// text. Per element they compute exactly cast_math.h.
#pragma once

#include <cstddef>
#include <cstdint>

#include "shoal/shoal.h"

namespace shoal::cast {

// payload[i] = the 16-bit float (half when toHalf, else bfloat16) of input[i]; dtype f32 or f64.
const char* encodeOnDevice(bool toHalf, shoal_dtype_t dtype, const void* input, uint16_t* payload, size_t count,
                           void* stream);
// output[i] = payload[i] widened to dtype (f32 or f64): exact.
const char* decodeOnDevice(bool fromHalf, shoal_dtype_t dtype, const uint16_t* payload, void* output, size_t count,
                           void* stream);

}  // namespace shoal::cast
