// The topk compressor's tensor states: each named tensor's residual (error
// vector), created by its first call, kept by the driver between calls, freed
// with the communicator.
//
// Saved layout (shoal_compressor_state_save / _load): the error vector e of
// the tensor, count elements in the tensor's dtype (f32 or f64), native byte
// order, nothing else: count * 4 or count * 8 bytes. A state loaded before the
// tensor's first call takes its dtype and count from that call, which refuses
// it unless its size is count * sizeof(dtype); loading into an existing state
// requires the existing size. A name must keep its dtype and count from call
// to call (a mismatch is refused: the residual would be meaningless).
//
// CUDA tensors: a name's residual stays where its first call put it (host or
// one device; a later call elsewhere is refused); save and load copy it to and
// from host memory after the stream's last use of it. A state loaded before
// its tensor's first call moves to the device then.
#include <cstdlib>
#include <cstring>
#include <string>

#include "compressors/common/text.h"
#include "compressors/topk/topk_instance.h"
#include "shoal/compressor.h"

#if SHOAL_WITH_CUDA
#include "gpu/cuda/stream_memory.h"
#endif

namespace shoal::compressors::topk_impl {
namespace {

TensorState* newState(size_t bytes) {
  auto* state = new TensorState;
  state->bytes = bytes;
  if (bytes > 0) {
    state->data = std::calloc(1, bytes);  // all-zero bits: +0.0 in f32 and f64
    if (state->data == nullptr) {
      delete state;
      return nullptr;
    }
  }
  return state;
}

void freeState(TensorState* state) {
  if (state == nullptr) return;
#if SHOAL_WITH_CUDA
  if (state->onDevice) {
    cuda::DeviceScope scope(state->device);
    cuda::waitEvent(state->lastUse);  // the stream's kernels may still use it
    cuda::freeDevice(state->data);
    cuda::destroyEvent(state->lastUse);
    delete state;
    return;
  }
#endif
  std::free(state->data);
  delete state;
}

#if SHOAL_WITH_CUDA
// Moves a host state's bytes to `device` (zeros when fresh); nullptr, or the CUDA error's text.
const char* moveToDevice(TensorState* state, int device) {
  cuda::DeviceScope scope(device);
  if (scope.error()) return scope.error();
  void* data = nullptr;
  const char* error = cuda::allocDevice(&data, state->bytes);
  if (error == nullptr && state->bytes > 0) error = cuda::copyBlocking(data, state->data, state->bytes);
  void* event = nullptr;
  if (error == nullptr) error = cuda::createEvent(&event);
  if (error != nullptr) {
    cuda::freeDevice(data);
    return error;
  }
  std::free(state->data);
  state->data = data;
  state->onDevice = true;
  state->device = device;
  state->lastUse = event;
  return nullptr;
}
#endif

}  // namespace

// Where a tensor's data lives, for messages.
std::string placeText(bool onDevice, int device) {
  return onDevice ? "CUDA device " + std::to_string(device) : std::string("host memory");
}

// The tensor's error vector, created or checked; nullptr with error text on a mismatch.
TensorState* stateFor(shoal_compress_op_t* op, int t, size_t count, const OpState& opState) {
  const shoal_compress_tensor_t& tensor = op->tensors[t];
  const shoal_dtype_t dtype = tensor.input.dtype;
  const size_t bytes = count * shoal_dtype_size(dtype);
  auto* state = static_cast<TensorState*>(*tensor.state);
  // Puts a fresh or loaded (host) state where the op's tensors are.
  auto place = [&]([[maybe_unused]] TensorState* placed) -> bool {  // used by the CUDA build
    if (!opState.onDevice) return true;
#if SHOAL_WITH_CUDA
    if (const char* error = moveToDevice(placed, opState.device)) {
      writeText(op->error_text, op->error_text_size, "topk: no room for the residual of '%s' (%zu bytes) on %s: %s",
                tensor.name, bytes, placeText(true, opState.device).c_str(), error);
      return false;
    }
#endif
    return true;
  };
  if (state == nullptr) {
    state = newState(bytes);
    if (state == nullptr) {
      writeText(op->error_text, op->error_text_size, "topk: out of host memory for the residual of '%s' (%zu bytes)",
                tensor.name, bytes);
      return nullptr;
    }
    if (!place(state)) {
      freeState(state);
      return nullptr;
    }
    state->typed = true;
    state->dtype = dtype;
    state->count = count;
    *tensor.state = state;
    return state;
  }
  if (!state->typed) {
    if (state->bytes != bytes) {
      writeText(op->error_text, op->error_text_size,
                "topk: the state loaded for tensor '%s' holds %zu bytes, but the tensor has %zu elements of %s "
                "(%zu bytes): load the error vector saved for this tensor",
                tensor.name, state->bytes, count, shoal_dtype_name(dtype), bytes);
      return nullptr;
    }
    if (!state->onDevice && !place(state)) return nullptr;
    state->typed = true;
    state->dtype = dtype;
    state->count = count;
    return state;
  }
  if (state->onDevice != opState.onDevice || (state->onDevice && state->device != opState.device)) {
    writeText(op->error_text, op->error_text_size,
              "topk: tensor '%s' kept its residual in %s in earlier calls and is now in %s: a name must stay where "
              "it is (save its state, and load it under a new name)",
              tensor.name, placeText(state->onDevice, state->device).c_str(),
              placeText(opState.onDevice, opState.device).c_str());
    return nullptr;
  }
  if (state->dtype != dtype || state->count != count) {
    writeText(op->error_text, op->error_text_size,
              "topk: tensor '%s' had %zu elements of %s in earlier calls and now has %zu elements of %s: a name "
              "must keep its dtype and size (its residual belongs to that shape)",
              tensor.name, state->count, shoal_dtype_name(state->dtype), count, shoal_dtype_name(dtype));
    return nullptr;
  }
  return state;
}

void destroyTensorState(void*, void* state) { freeState(static_cast<TensorState*>(state)); }

shoal_status_t saveTensorState(void*, const void* statePointer, void* buffer, size_t* bytes) {
  const auto* state = static_cast<const TensorState*>(statePointer);
  if (state == nullptr || bytes == nullptr) return state == nullptr ? SHOAL_ERR_NOT_FOUND : SHOAL_ERR_INVALID_ARGUMENT;
  if (buffer == nullptr) {
    *bytes = state->bytes;
    return SHOAL_OK;
  }
  if (*bytes < state->bytes) {
    *bytes = state->bytes;
    return SHOAL_ERR_INVALID_ARGUMENT;  // buffer too small: *bytes says how much is needed
  }
  if (state->onDevice) {
#if SHOAL_WITH_CUDA
    cuda::DeviceScope scope(state->device);
    const char* error = scope.error();
    if (!error) error = cuda::waitEvent(state->lastUse);
    if (!error) error = cuda::copyBlocking(buffer, state->data, state->bytes);
    if (error) return SHOAL_ERR_INTERNAL;
#endif
  } else if (state->bytes > 0) {
    std::memcpy(buffer, state->data, state->bytes);
  }
  *bytes = state->bytes;
  return SHOAL_OK;
}

shoal_status_t loadTensorState(void* instancePointer, void** statePointer, const void* buffer, size_t bytes) {
  const auto& instance = *static_cast<const Instance*>(instancePointer);
  if (statePointer == nullptr || (buffer == nullptr && bytes > 0)) return SHOAL_ERR_INVALID_ARGUMENT;
  if (!instance.ef) {
    logText(instance.log, 1, "topk: ef=0 keeps no state; nothing to load");
    return SHOAL_ERR_UNSUPPORTED;
  }
  if (bytes % sizeof(float) != 0) {
    logText(instance.log, 1, "topk: a state of %zu bytes is no error vector of f32 or f64 elements", bytes);
    return SHOAL_ERR_INVALID_ARGUMENT;
  }
  auto* state = static_cast<TensorState*>(*statePointer);
  if (state == nullptr) {
    state = newState(bytes);
    if (state == nullptr) return SHOAL_ERR_NO_MEMORY;
    if (bytes > 0) std::memcpy(state->data, buffer, bytes);
    *statePointer = state;  // untyped until the tensor's next call checks the size
    return SHOAL_OK;
  }
  if (bytes != state->bytes) {
    if (state->typed)
      logText(instance.log, 1, "topk: the tensor's error vector has %zu elements of %s (%zu bytes); got %zu bytes",
                 state->count, shoal_dtype_name(state->dtype), state->bytes, bytes);
    else
      logText(instance.log, 1, "topk: the tensor's loaded state has %zu bytes; got %zu bytes", state->bytes, bytes);
    return SHOAL_ERR_INVALID_ARGUMENT;
  }
  if (state->onDevice) {
#if SHOAL_WITH_CUDA
    cuda::DeviceScope scope(state->device);
    const char* error = scope.error();
    if (!error) error = cuda::waitEvent(state->lastUse);
    if (!error) error = cuda::copyBlocking(state->data, buffer, bytes);
    if (error) {
      logText(instance.log, 0, "topk: loading the state into CUDA device %d failed: %s", state->device, error);
      return SHOAL_ERR_INTERNAL;
    }
#endif
    return SHOAL_OK;
  }
  if (bytes > 0) std::memcpy(state->data, buffer, bytes);
  return SHOAL_OK;
}

}  // namespace shoal::compressors::topk_impl
