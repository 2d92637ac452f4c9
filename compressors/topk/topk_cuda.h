// The topk compressor's CUDA kernels (topk_kernels.cu), declared for the host
// code without CUDA headers. Compiled only in the GPU build (SHOAL_WITH_CUDA).
// Every call enqueues work on `stream` (a cudaStream_t) of the current device
// and returns nullptr, or the CUDA error's text; nothing waits for the device.
// Per element the kernels run topk_math.h, the logic the CPU path and its
// tests use.
#pragma once

#include <cstddef>
#include <cstdint>

#include "shoal/shoal.h"

namespace shoal::topk {

// Tensors of the GPU path hold at most this many elements (indices are 32-bit there).
constexpr size_t kMaxDeviceCount = 0xffffffffu;

// One tensor of round 0, all pointers in device memory: with `error`
// (ef=1), error = input + error and selection runs on it, else on input.
// Selects the k first in the order of topk_math.h (a stable descending
// radix sort of the magnitude keys, so equal keys keep ascending index),
// writes k pairs (offset + index, value bits) at `pairs` ascending by index,
// and zeroes the sent elements of `error`. dtype f32 or f64; k <= count <= kMaxDeviceCount.
const char* encodeOnDevice(shoal_dtype_t dtype, const void* input, void* error, size_t count, size_t k,
                           uint64_t offset, uint64_t* pairs, void* stream);

// Where tensor t's results go in round 1: global indices [first, end).
struct DeviceOutput {
  void* data;
  shoal_dtype_t dtype;
  uint64_t first;
  uint64_t end;
};

// Round 1: adds every rank's pairs, rank after rank in order r = 0 .. ranks-1,
// into the outputs (a device table of `tensors` entries, ascending by first,
// outputs already zeroed). Rank r's words are gathered[displs[r] ..
// displs[r] + counts[r]) (counts and displs in host memory, counts even).
// Pairs whose index is not below `total` are skipped and counted in
// *badPairs (device memory).
const char* addPairsOnDevice(const DeviceOutput* outputs, int tensors, uint64_t total, const uint64_t* gathered,
                             const size_t* counts, const size_t* displs, int ranks, unsigned* badPairs, void* stream);

// data[i] /= divisor in dtype (f32 or f64), as the CPU path's SHOAL_AVG.
const char* divideOnDevice(shoal_dtype_t dtype, void* data, size_t count, int divisor, void* stream);

}  // namespace shoal::topk
