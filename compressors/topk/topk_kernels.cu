// topk on the device: error feedback, selection by CUB's radix sort, pair
// packing and the rank-ordered sum. See topk_cuda.h, topk.cc and topk_device.cc.
//
// Selection: keys = magnitudeKey (topk_math.h) with the indices as values,
// sorted descending by cub::DeviceRadixSort, which is stable: equal keys keep
// ascending index, exactly the CPU order "larger key first, then lower
// index". The first k indices are then sorted ascending (a second radix sort
// of k keys), so the payload has the CPU path's bytes.
#include <cub/device/device_radix_sort.cuh>
#include <cuda_runtime.h>

#include "compressors/topk/topk_cuda.h"
#include "compressors/topk/topk_math.h"
#include "gpu/cuda/stream_memory.h"

namespace shoal::topk {
namespace {

constexpr int kThreads = 256;
constexpr size_t kMaxBlocks = 4096;

unsigned blocksFor(size_t items) {
  size_t blocks = (items + kThreads - 1) / kThreads;
  if (blocks == 0) blocks = 1;
  return static_cast<unsigned>(blocks < kMaxBlocks ? blocks : kMaxBlocks);
}

#define SHOAL_GRID_STRIDE(i, n) \
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < (n); i += size_t(gridDim.x) * blockDim.x)

template <typename T>
__global__ void addError(const T* input, T* error, size_t count) {
  SHOAL_GRID_STRIDE(i, count) error[i] = input[i] + error[i];
}

template <typename T, typename Key>
__global__ void makeKeys(const T* values, Key* keys, uint32_t* indices, size_t count) {
  SHOAL_GRID_STRIDE(i, count) {
    keys[i] = magnitudeKey(values[i]);
    indices[i] = static_cast<uint32_t>(i);
  }
}

// Pair j from selected index indices[j] (or j itself when indices is null: everything is sent).
template <typename T>
__global__ void gatherPairs(const T* selectFrom, T* error, const uint32_t* indices, size_t k, uint64_t offset,
                            uint64_t* pairs) {
  SHOAL_GRID_STRIDE(j, k) {
    const size_t i = indices ? indices[j] : j;
    packPair(pairs + 2 * j, offset + i, selectFrom[i]);
    if (error) error[i] = T(0);
  }
}

__device__ void addPair(const DeviceOutput* outputs, int tensors, uint64_t index, uint64_t valueBits) {
  const DeviceOutput& out = outputs[tensorOfIndex(outputs, tensors, index)];
  if (out.dtype == SHOAL_F32) static_cast<float*>(out.data)[index - out.first] += wordValue<float>(valueBits);
  else static_cast<double*>(out.data)[index - out.first] += wordValue<double>(valueBits);
}

// One rank's pairs: their indices are distinct, so no two threads add into one element.
__global__ void addRankPairs(const DeviceOutput* outputs, int tensors, uint64_t total, const uint64_t* words,
                             size_t pairs, unsigned* badPairs) {
  SHOAL_GRID_STRIDE(p, pairs) {
    const uint64_t index = words[2 * p];
    if (index >= total) {
      atomicAdd(badPairs, 1u);
      continue;
    }
    addPair(outputs, tensors, index, words[2 * p + 1]);
  }
}

template <typename T>
__global__ void divideBy(T* data, size_t count, T divisor) {
  SHOAL_GRID_STRIDE(i, count) data[i] /= divisor;
}

// Sub-buffers of one device allocation, each 256-byte aligned.
struct Layout {
  size_t bytes = 0;
  size_t add(size_t size) {
    size_t at = bytes;
    bytes += (size + 255) / 256 * 256;
    return at;
  }
};

int bitsFor(uint64_t maximum) {
  int bits = 1;
  while (bits < 64 && (maximum >> bits) != 0) ++bits;
  return bits;
}

template <typename T, typename Key>
const char* encodeTyped(const T* input, T* error, size_t count, size_t k, uint64_t offset, uint64_t* pairs,
                        cudaStream_t stream) {
  const T* selectFrom = input;
  if (error != nullptr) {
    addError<<<blocksFor(count), kThreads, 0, stream>>>(input, error, count);
    selectFrom = error;
  }
  if (k >= count) {  // everything is sent, in index order
    gatherPairs<<<blocksFor(count), kThreads, 0, stream>>>(selectFrom, error, static_cast<const uint32_t*>(nullptr),
                                                           count, offset, pairs);
    return cuda::lastLaunchError();
  }
  const auto items = static_cast<uint32_t>(count);
  const auto kept = static_cast<uint32_t>(k);
  // The key's top bit is never set (no sign in a magnitude key).
  const int keyBits = sizeof(Key) * 8 - 1;
  const int indexBits = bitsFor(count - 1);
  size_t sortBytes = 0, orderBytes = 0;
  cudaError_t status = cub::DeviceRadixSort::SortPairsDescending(
      nullptr, sortBytes, static_cast<const Key*>(nullptr), static_cast<Key*>(nullptr),
      static_cast<const uint32_t*>(nullptr), static_cast<uint32_t*>(nullptr), items, 0, keyBits, stream);
  if (status == cudaSuccess)
    status = cub::DeviceRadixSort::SortKeys(nullptr, orderBytes, static_cast<const uint32_t*>(nullptr),
                                            static_cast<uint32_t*>(nullptr), kept, 0, indexBits, stream);
  if (status != cudaSuccess) return cudaGetErrorString(status);
  Layout layout;
  const size_t keysIn = layout.add(count * sizeof(Key)), keysOut = layout.add(count * sizeof(Key));
  const size_t indicesIn = layout.add(count * sizeof(uint32_t)), indicesOut = layout.add(count * sizeof(uint32_t));
  const size_t selected = layout.add(k * sizeof(uint32_t));
  const size_t temp = layout.add(sortBytes > orderBytes ? sortBytes : orderBytes);
  void* block = nullptr;
  if (const char* failure = cuda::allocAsync(&block, layout.bytes, stream)) return failure;
  auto* base = static_cast<unsigned char*>(block);
  auto* keys = reinterpret_cast<Key*>(base + keysIn);
  auto* sortedKeys = reinterpret_cast<Key*>(base + keysOut);
  auto* indices = reinterpret_cast<uint32_t*>(base + indicesIn);
  auto* sortedIndices = reinterpret_cast<uint32_t*>(base + indicesOut);
  auto* selectedIndices = reinterpret_cast<uint32_t*>(base + selected);

  makeKeys<<<blocksFor(count), kThreads, 0, stream>>>(selectFrom, keys, indices, count);
  const char* failure = cuda::lastLaunchError();
  if (failure == nullptr) {
    size_t bytes = sortBytes;
    status = cub::DeviceRadixSort::SortPairsDescending(base + temp, bytes, keys, sortedKeys, indices, sortedIndices,
                                                       items, 0, keyBits, stream);
    if (status == cudaSuccess) {
      bytes = orderBytes;
      status = cub::DeviceRadixSort::SortKeys(base + temp, bytes, sortedIndices, selectedIndices, kept, 0, indexBits,
                                              stream);
    }
    if (status != cudaSuccess) failure = cudaGetErrorString(status);
  }
  if (failure == nullptr) {
    gatherPairs<<<blocksFor(k), kThreads, 0, stream>>>(selectFrom, error, selectedIndices, k, offset, pairs);
    failure = cuda::lastLaunchError();
  }
  const char* freeFailure = cuda::freeAsync(block, stream);
  return failure ? failure : freeFailure;
}

}  // namespace

const char* encodeOnDevice(shoal_dtype_t dtype, const void* input, void* error, size_t count, size_t k,
                           uint64_t offset, uint64_t* pairs, void* stream) {
  if (count == 0) return nullptr;
  if (count > kMaxDeviceCount) return "tensor too large for the GPU path (at most 2^32 - 1 elements)";
  auto cudaStream = static_cast<cudaStream_t>(stream);
  if (dtype == SHOAL_F32)
    return encodeTyped<float, uint32_t>(static_cast<const float*>(input), static_cast<float*>(error), count, k, offset,
                                        pairs, cudaStream);
  return encodeTyped<double, uint64_t>(static_cast<const double*>(input), static_cast<double*>(error), count, k,
                                       offset, pairs, cudaStream);
}

const char* addPairsOnDevice(const DeviceOutput* outputs, int tensors, uint64_t total, const uint64_t* gathered,
                             const size_t* counts, const size_t* displs, int ranks, unsigned* badPairs, void* stream) {
  auto cudaStream = static_cast<cudaStream_t>(stream);
  for (int r = 0; r < ranks; ++r) {
    const size_t pairs = counts[r] / 2;
    if (pairs == 0) continue;
    addRankPairs<<<blocksFor(pairs), kThreads, 0, cudaStream>>>(outputs, tensors, total, gathered + displs[r], pairs,
                                                                badPairs);
    if (const char* failure = cuda::lastLaunchError()) return failure;
  }
  return nullptr;
}

const char* divideOnDevice(shoal_dtype_t dtype, void* data, size_t count, int divisor, void* stream) {
  if (count == 0) return nullptr;
  auto cudaStream = static_cast<cudaStream_t>(stream);
  if (dtype == SHOAL_F32)
    divideBy<<<blocksFor(count), kThreads, 0, cudaStream>>>(static_cast<float*>(data), count, float(divisor));
  else
    divideBy<<<blocksFor(count), kThreads, 0, cudaStream>>>(static_cast<double*>(data), count, double(divisor));
  return cuda::lastLaunchError();
}

}  // namespace shoal::topk
