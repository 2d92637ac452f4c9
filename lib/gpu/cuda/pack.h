// Fusion-buffer packing on the device: N device tensors copied back to back
// into one contiguous device buffer (and back), in one kernel launch each,
// on a caller's stream. Plain C++ declarations (no CUDA headers); compiled
// only in the GPU build (SHOAL_WITH_CUDA), called under #if SHOAL_WITH_CUDA.
//
// Layout: tensor i occupies packed[offset(i), offset(i) + bytes[i]) with
// offset(i) = bytes[0] + ... + bytes[i - 1]: no padding, so tensors of one
// dtype pack into one array of that dtype. Zero-size tensors take no room
// (their pointer is never read). Pointers may have any alignment; the copy
// uses 16-byte words where source and destination allow it.
#pragma once

#include <cstddef>

namespace shoal::cuda {

// The packed buffer's size: the sum of bytes[0..count).
size_t packedBytes(const size_t* bytes, size_t count);

// Enqueues the copy of tensors[i] (bytes[i] bytes, device memory) into packed
// on stream (a cudaStream_t; nullptr is the legacy default stream). Returns
// nullptr, or the CUDA error's text when enqueuing failed. The tensors must not
// overlap the packed buffer. Up to kInlineEntries tensors travel in the
// kernel's parameters; more take a small device table (allocated and freed
// stream-ordered; its upload from pageable memory may wait for the stream).
const char* packTensors(const void* const* tensors, const size_t* bytes, size_t count, void* packed, void* stream);

// The inverse: packed's slices back into tensors[i].
const char* unpackTensors(const void* packed, void* const* tensors, const size_t* bytes, size_t count, void* stream);

constexpr size_t kInlineEntries = 128;

}  // namespace shoal::cuda
