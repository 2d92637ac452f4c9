// The topk compressor on CUDA tensors (GPU build only; SHOAL_CAP_CUDA is set
// only there): every tensor of a call on one device and stream, at most
// 2^32 - 1 elements each. The same steps as the host rounds (topk.cc), as
// kernels on that stream (topk_kernels.cu): selection by a stable descending
// radix sort of the magnitude keys (the order of topk_math.h), the payload and
// the residual in device memory. Round 0 never waits for the device; round 1
// waits once, at its end, to learn whether a gathered pair was malformed.
#if SHOAL_WITH_CUDA

#include <vector>

#include "compressors/common/payload.h"
#include "compressors/common/text.h"
#include "compressors/topk/topk_cuda.h"
#include "compressors/topk/topk_instance.h"
#include "gpu/cuda/stream_memory.h"
#include "shoal/compressor.h"

namespace shoal::compressors::topk_impl {
namespace {

shoal_status_t cudaFailure(shoal_compress_op_t* op, const OpState& state, const char* what, const char* error) {
  writeText(op->error_text, op->error_text_size, "topk: %s on CUDA device %d failed: %s", what, state.device, error);
  return SHOAL_ERR_INTERNAL;
}

}  // namespace

shoal_status_t encodeRoundOnDevice(OpState& state, shoal_compress_op_t* op, shoal_round_t* round,
                                   const std::vector<size_t>& kept, size_t totalKept) {
  cuda::DeviceScope scope(state.device);
  if (scope.error()) return cudaFailure(op, state, "selecting the device", scope.error());
  void* pairs = nullptr;
  if (const char* error = cuda::allocAsync(&pairs, 2 * totalKept * sizeof(uint64_t), state.stream)) {
    writeText(op->error_text, op->error_text_size, "topk: no device memory for the payload (%zu bytes on device %d): %s",
              2 * totalKept * sizeof(uint64_t), state.device, error);
    return SHOAL_ERR_NO_MEMORY;
  }
  state.devicePairs = static_cast<uint64_t*>(pairs);
  uint64_t* written = state.devicePairs;
  for (int t = 0; t < op->num_tensors; ++t) {
    const shoal_compress_tensor_t& tensor = op->tensors[t];
    TensorState* error = state.errors[t];
    if (const char* failure =
            topk::encodeOnDevice(tensor.input.dtype, tensor.input.data, error ? error->data : nullptr,
                                 state.offsets[t + 1] - state.offsets[t], kept[t], state.offsets[t], written,
                                 state.stream))
      return cudaFailure(op, state, "the selection", failure);
    if (error != nullptr)
      if (const char* failure = cuda::recordEvent(error->lastUse, state.stream))
        return cudaFailure(op, state, "recording the residual's last use", failure);
    written += 2 * kept[t];
  }
  requestOnePayload(round, SHOAL_COLLECTIVE_ALLGATHERV, SHOAL_U64, SHOAL_SUM, state.devicePairs, 2 * totalKept);
  return SHOAL_OK;
}

// Round 1 on the device: zero, add every rank's pairs in rank order, divide
// for avg; then wait for the stream once to read the malformed-pair count.
shoal_status_t decodeOnDevice(OpState& state, shoal_compress_op_t* op, const shoal_payload_t& payload,
                              unsigned* badPairs) {
  cuda::DeviceScope scope(state.device);
  if (scope.error()) return cudaFailure(op, state, "selecting the device", scope.error());
  const int tensors = op->num_tensors;
  std::vector<topk::DeviceOutput> outputs(tensors);
  for (int t = 0; t < tensors; ++t) {
    const shoal_tensor_t& output = op->tensors[t].output;
    outputs[t] = {output.data, output.dtype, state.offsets[t], state.offsets[t + 1]};
    const size_t bytes = (state.offsets[t + 1] - state.offsets[t]) * shoal_dtype_size(output.dtype);
    if (const char* failure = cuda::zeroAsync(output.data, bytes, state.stream))
      return cudaFailure(op, state, "zeroing an output", failure);
  }
  const size_t tableBytes = (tensors * sizeof(topk::DeviceOutput) + 15) / 16 * 16;
  if (const char* failure = cuda::allocAsync(&state.deviceDecode, tableBytes + sizeof(unsigned), state.stream))
    return cudaFailure(op, state, "allocating the outputs' table", failure);
  auto* table = static_cast<topk::DeviceOutput*>(state.deviceDecode);
  auto* deviceBad = reinterpret_cast<unsigned*>(static_cast<unsigned char*>(state.deviceDecode) + tableBytes);
  const char* failure = cuda::copyAsync(table, outputs.data(), tensors * sizeof(topk::DeviceOutput), state.stream);
  if (!failure) failure = cuda::zeroAsync(deviceBad, sizeof(unsigned), state.stream);
  if (!failure)
    failure = topk::addPairsOnDevice(table, tensors, state.offsets[tensors],
                                     static_cast<const uint64_t*>(payload.gathered), payload.gathered_counts,
                                     payload.gathered_displs, op->world_size, deviceBad, state.stream);
  for (int t = 0; t < tensors && !failure && op->op == SHOAL_AVG; ++t)
    failure = topk::divideOnDevice(outputs[t].dtype, outputs[t].data, state.offsets[t + 1] - state.offsets[t],
                                   op->world_size, state.stream);
  if (!failure) failure = cuda::copyAsync(badPairs, deviceBad, sizeof(unsigned), state.stream);
  if (!failure) failure = cuda::synchronize(state.stream);
  if (failure) return cudaFailure(op, state, "adding the gathered pairs", failure);
  return SHOAL_OK;
}

void releaseDeviceMemory(OpState& state) {
  cuda::DeviceScope scope(state.device);
  cuda::freeAsync(state.devicePairs, state.stream);  // stream-ordered: after the kernels that use them
  cuda::freeAsync(state.deviceDecode, state.stream);
}

}  // namespace shoal::compressors::topk_impl

#endif  // SHOAL_WITH_CUDA
