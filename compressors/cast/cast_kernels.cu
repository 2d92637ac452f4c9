// fp16/bf16 encode and decode on the device: element-wise, grid-stride,
// four elements per thread (16-byte loads of f32) where alignment allows.
// Per element: cast_math.h, the code the CPU tests check.
#include <cuda_runtime.h>

#include "compressors/cast/cast_cuda.h"
#include "compressors/cast/cast_math.h"
#include "gpu/cuda/stream_memory.h"

namespace shoal::cast {
namespace {

constexpr int kThreads = 256;
constexpr size_t kMaxBlocks = 4096;

template <bool kHalf, typename T>
__device__ uint16_t narrowTo16(T value) {
  if constexpr (kHalf) return toHalfBits(value);
  else return toBfloat16Bits(value);
}

template <bool kHalf>
__device__ float widenFrom16(uint16_t bits) {
  if constexpr (kHalf) return halfValue(bits);
  else return bfloat16Value(bits);
}

template <bool kHalf, typename T>
__global__ void encodeScalar(const T* input, uint16_t* payload, size_t count) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < count; i += size_t(gridDim.x) * blockDim.x)
    payload[i] = narrowTo16<kHalf>(input[i]);
}

// f32 -> 16 bits, four at a time: a float4 load and a 64-bit store (input 16-byte, payload 8-byte aligned).
template <bool kHalf>
__global__ void encodeVector(const float4* input, uint2* payload, size_t quads) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < quads; i += size_t(gridDim.x) * blockDim.x) {
    const float4 v = input[i];
    payload[i] = make_uint2(narrowTo16<kHalf>(v.x) | (uint32_t(narrowTo16<kHalf>(v.y)) << 16),
                            narrowTo16<kHalf>(v.z) | (uint32_t(narrowTo16<kHalf>(v.w)) << 16));
  }
}

template <bool kHalf, typename T>
__global__ void decodeScalar(const uint16_t* payload, T* output, size_t count) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < count; i += size_t(gridDim.x) * blockDim.x)
    output[i] = static_cast<T>(widenFrom16<kHalf>(payload[i]));
}

template <bool kHalf>
__global__ void decodeVector(const uint2* payload, float4* output, size_t quads) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < quads; i += size_t(gridDim.x) * blockDim.x) {
    const uint2 w = payload[i];
    output[i] = make_float4(widenFrom16<kHalf>(uint16_t(w.x)), widenFrom16<kHalf>(uint16_t(w.x >> 16)),
                            widenFrom16<kHalf>(uint16_t(w.y)), widenFrom16<kHalf>(uint16_t(w.y >> 16)));
  }
}

unsigned blocksFor(size_t items) {
  size_t blocks = (items + kThreads - 1) / kThreads;
  if (blocks == 0) blocks = 1;
  return static_cast<unsigned>(blocks < kMaxBlocks ? blocks : kMaxBlocks);
}

bool aligned(const void* pointer, size_t bytes) { return reinterpret_cast<uintptr_t>(pointer) % bytes == 0; }

template <bool kHalf>
void launchEncode(shoal_dtype_t dtype, const void* input, uint16_t* payload, size_t count, cudaStream_t stream) {
  if (dtype == SHOAL_F64) {
    encodeScalar<kHalf><<<blocksFor(count), kThreads, 0, stream>>>(static_cast<const double*>(input), payload, count);
    return;
  }
  const auto* values = static_cast<const float*>(input);
  size_t quads = aligned(values, 16) && aligned(payload, 8) ? count / 4 : 0;
  if (quads > 0)
    encodeVector<kHalf><<<blocksFor(quads), kThreads, 0, stream>>>(reinterpret_cast<const float4*>(values),
                                                                    reinterpret_cast<uint2*>(payload), quads);
  if (size_t rest = count - 4 * quads)
    encodeScalar<kHalf><<<blocksFor(rest), kThreads, 0, stream>>>(values + 4 * quads, payload + 4 * quads, rest);
}

template <bool kHalf>
void launchDecode(shoal_dtype_t dtype, const uint16_t* payload, void* output, size_t count, cudaStream_t stream) {
  if (dtype == SHOAL_F64) {
    decodeScalar<kHalf><<<blocksFor(count), kThreads, 0, stream>>>(payload, static_cast<double*>(output), count);
    return;
  }
  auto* values = static_cast<float*>(output);
  size_t quads = aligned(values, 16) && aligned(payload, 8) ? count / 4 : 0;
  if (quads > 0)
    decodeVector<kHalf><<<blocksFor(quads), kThreads, 0, stream>>>(reinterpret_cast<const uint2*>(payload),
                                                                    reinterpret_cast<float4*>(values), quads);
  if (size_t rest = count - 4 * quads)
    decodeScalar<kHalf><<<blocksFor(rest), kThreads, 0, stream>>>(payload + 4 * quads, values + 4 * quads, rest);
}

}  // namespace

const char* encodeOnDevice(bool toHalf, shoal_dtype_t dtype, const void* input, uint16_t* payload, size_t count,
                           void* stream) {
  if (count == 0) return nullptr;
  auto cudaStream = static_cast<cudaStream_t>(stream);
  if (toHalf) launchEncode<true>(dtype, input, payload, count, cudaStream);
  else launchEncode<false>(dtype, input, payload, count, cudaStream);
  return cuda::lastLaunchError();
}

const char* decodeOnDevice(bool fromHalf, shoal_dtype_t dtype, const uint16_t* payload, void* output, size_t count,
                           void* stream) {
  if (count == 0) return nullptr;
  auto cudaStream = static_cast<cudaStream_t>(stream);
  if (fromHalf) launchDecode<true>(dtype, payload, output, count, cudaStream);
  else launchDecode<false>(dtype, payload, output, count, cudaStream);
  return cuda::lastLaunchError();
}

}  // namespace shoal::cast
