// fp16 and bf16: cast to a 16-bit float, allreduce that, cast back.
//
// Accumulation: each ring/tree hop widens both 16-bit operands to f32, adds,
// and rounds the sum once to the 16-bit format (collectives/common/
// element_ops.h); avg divides once at the end. So every element's error is at
// most u * (n + 1) * sum_r |x_r| with u the format's unit roundoff (2^-11 for
// fp16, 2^-8 for bf16): one rounding per input, at most n - 1 per hop, one for
// avg. Declared bound: 2u * n * sum_r |x_r|. It holds for values inside the
// format's normal range (fp16: 6.1e-5 .. 65504; beyond 65504 fp16 overflows
// to inf; bf16 spans f32's range).
//
// Several tensors of one call (a fused group) share one payload.
//
// CUDA tensors (GPU build only; SHOAL_CAP_CUDA is set only there): every
// tensor of a call must be on one device and stream. The payload lives in
// device memory, allocated stream-ordered in start() and freed in finish();
// encode and decode are kernels on that stream (cast_kernels.cu, per element
// cast_math.h: the CPU path's bits except NaN payloads, see there). Nothing
// waits for the device: the driver runs the payload's collective on the same
// stream.
#include <cstring>
#include <vector>

#include "compressors/common/payload.h"
#include "compressors/common/text.h"
#include "core/numeric/element_ops.h"
#include "core/numeric/half_convert.h"
#include "core/tensor.h"
#include "shoal/compressor.h"

#if SHOAL_WITH_CUDA
#include "compressors/cast/cast_cuda.h"
#include "gpu/cuda/stream_memory.h"
#endif

namespace shoal::compressors {
namespace {

enum class Format { Fp16, Bf16 };

struct Instance {
  Format format;
};

struct OpState {
  std::vector<uint16_t> payload;  // host tensors
  size_t count = 0;                // elements of the payload
  // CUDA tensors: the payload in device memory on `device`, ordered on `stream`.
  bool onDevice = false;
  int device = 0;
  void* stream = nullptr;
  uint16_t* devicePayload = nullptr;
};

const char* formatName(Format format) { return format == Format::Fp16 ? "fp16" : "bf16"; }

// Host tensors, or CUDA tensors of one device and stream; else an error in op->error_text.
shoal_status_t checkMemory(Format format, const shoal_compress_op_t* op, OpState* state) {
  const shoal_tensor_t& first = op->tensors[0].input;
  state->onDevice = first.memory == SHOAL_MEMORY_CUDA;
  state->device = first.device;
  state->stream = first.stream;
  for (int t = 0; t < op->num_tensors; ++t)
    for (const shoal_tensor_t* tensor : {&op->tensors[t].input, &op->tensors[t].output}) {
      bool same = tensor->memory == first.memory &&
                  (first.memory != SHOAL_MEMORY_CUDA || (tensor->device == first.device && tensor->stream == first.stream));
      if (!same) {
        writeText(op->error_text, op->error_text_size,
                  "%s: tensor %d's %s is in %s memory (device %d), tensor 0's input in %s memory (device %d): the "
                  "tensors of one call must share the memory kind, and on CUDA the device and stream",
                  formatName(format), t, tensor == &op->tensors[t].input ? "input" : "output",
                  tensor->memory == SHOAL_MEMORY_CUDA ? "CUDA" : "host", tensor->device,
                  first.memory == SHOAL_MEMORY_CUDA ? "CUDA" : "host", first.device);
        return SHOAL_ERR_INVALID_ARGUMENT;
      }
    }
#if !SHOAL_WITH_CUDA
  if (state->onDevice) {
    writeText(op->error_text, op->error_text_size, "%s: CUDA tensors need a build with SHOAL_WITH_CUDA",
              formatName(format));
    return SHOAL_ERR_UNSUPPORTED;
  }
#endif
  return SHOAL_OK;
}

void encode(Format format, const float* in, uint16_t* out, size_t count) {
  if (format == Format::Fp16) ops::floatToHalf(in, out, count);
  else ops::floatToBfloat16(in, out, count);
}

void decode(Format format, const uint16_t* in, float* out, size_t count) {
  if (format == Format::Fp16) ops::halfToFloat(in, out, count);
  else ops::bfloat16ToFloat(in, out, count);
}

// f64 goes through f32 (one more rounding, inside the declared bound).
void encode(Format format, const double* in, uint16_t* out, size_t count) {
  if (format == Format::Fp16)
    for (size_t i = 0; i < count; ++i) out[i] = ops::toHalf(static_cast<float>(in[i])).bits;
  else
    for (size_t i = 0; i < count; ++i) out[i] = ops::toBFloat16(static_cast<float>(in[i])).bits;
}

void decode(Format format, const uint16_t* in, double* out, size_t count) {
  if (format == Format::Fp16)
    for (size_t i = 0; i < count; ++i) out[i] = ops::toFloat(ops::Half{in[i]});
  else
    for (size_t i = 0; i < count; ++i) out[i] = ops::toFloat(ops::BFloat16{in[i]});
}

template <Format kFormat>
shoal_status_t create(const shoal_compressor_params_t* params, void** instance) {
  if (params->num_options > 0) {
    std::snprintf(params->error_text, params->error_text_size, "%s takes no options (got '%s')",
                  kFormat == Format::Fp16 ? "fp16" : "bf16", params->keys[0]);
    return SHOAL_ERR_INVALID_ARGUMENT;
  }
  *instance = new Instance{kFormat};
  return SHOAL_OK;
}

void destroy(void* instance) { delete static_cast<Instance*>(instance); }

shoal_status_t start(void* instance, shoal_compress_op_t* op, void** opState) {
  Format format = static_cast<Instance*>(instance)->format;
  auto* state = new OpState;
  for (int t = 0; t < op->num_tensors; ++t) state->count += shoal::elementsCount(op->tensors[t].input);
  if (op->num_tensors > 0) {
    if (shoal_status_t status = checkMemory(format, op, state); status != SHOAL_OK) {
      delete state;
      return status;
    }
  }
  if (!state->onDevice) {
    state->payload.resize(state->count);
    *opState = state;
    return SHOAL_OK;
  }
#if SHOAL_WITH_CUDA
  cuda::DeviceScope scope(state->device);
  const char* error = scope.error();
  if (error == nullptr) {
    void* buffer = nullptr;
    error = cuda::allocAsync(&buffer, state->count * sizeof(uint16_t), state->stream);
    state->devicePayload = static_cast<uint16_t*>(buffer);
  }
  if (error != nullptr) {
    writeText(op->error_text, op->error_text_size, "%s: no device memory for the payload (%zu bytes on device %d): %s",
              formatName(format), state->count * sizeof(uint16_t), state->device, error);
    delete state;
    return SHOAL_ERR_NO_MEMORY;
  }
#endif
  *opState = state;
  return SHOAL_OK;
}

#if SHOAL_WITH_CUDA
// Round 0 or 1 on CUDA tensors: kernels on the tensors' stream, no waiting.
shoal_status_t roundOnDevice(Format format, OpState* state, shoal_compress_op_t* op, shoal_round_t* round) {
  cuda::DeviceScope scope(state->device);
  const char* error = scope.error();
  size_t offset = 0;
  for (int t = 0; t < op->num_tensors && error == nullptr; ++t) {
    const shoal_compress_tensor_t& tensor = op->tensors[t];
    size_t count = shoal::elementsCount(tensor.input);
    uint16_t* slice = state->devicePayload + offset;
    offset += count;
    if (round->index == 0)
      error = cast::encodeOnDevice(format == Format::Fp16, tensor.input.dtype, tensor.input.data, slice, count,
                                   state->stream);
    else
      error = cast::decodeOnDevice(format == Format::Fp16, tensor.output.dtype, slice, tensor.output.data, count,
                                   state->stream);
  }
  if (error != nullptr) {
    writeText(op->error_text, op->error_text_size, "%s: CUDA %s kernel failed on device %d: %s", formatName(format),
              round->index == 0 ? "encode" : "decode", state->device, error);
    return SHOAL_ERR_INTERNAL;
  }
  if (round->index > 0) return roundsDone(round);
  requestOnePayload(round, SHOAL_COLLECTIVE_ALLREDUCE, format == Format::Fp16 ? SHOAL_F16 : SHOAL_BF16, op->op,
                    state->devicePayload, state->count);
  return SHOAL_OK;
}
#endif

shoal_status_t round(void* instance, void* opState, shoal_compress_op_t* op, shoal_round_t* round) {
  Format format = static_cast<Instance*>(instance)->format;
  auto* state = static_cast<OpState*>(opState);
  // Round 1 decodes the payload of round 0, whose size this call fixed; every
  // 16-bit pattern decodes to some value, so there is nothing else to check.
  if (round->index > 1) {
    writeText(op->error_text, op->error_text_size, "%s: called for round %d, but it is done after round 1",
              formatName(format), round->index);
    return SHOAL_ERR_INTERNAL;
  }
#if SHOAL_WITH_CUDA
  if (state->onDevice) return roundOnDevice(format, state, op, round);
#endif
  size_t offset = 0;
  for (int t = 0; t < op->num_tensors; ++t) {
    const shoal_compress_tensor_t& tensor = op->tensors[t];
    size_t count = shoal::elementsCount(tensor.input);
    uint16_t* slice = state->payload.data() + offset;
    offset += count;
    bool isDouble = tensor.input.dtype == SHOAL_F64;
    if (round->index == 0) {
      if (isDouble) encode(format, static_cast<const double*>(tensor.input.data), slice, count);
      else encode(format, static_cast<const float*>(tensor.input.data), slice, count);
    } else {
      if (isDouble) decode(format, slice, static_cast<double*>(tensor.output.data), count);
      else decode(format, slice, static_cast<float*>(tensor.output.data), count);
    }
  }
  if (round->index > 0) return roundsDone(round);
  requestOnePayload(round, SHOAL_COLLECTIVE_ALLREDUCE, format == Format::Fp16 ? SHOAL_F16 : SHOAL_BF16, op->op,
                    state->payload.data(), state->payload.size());
  return SHOAL_OK;
}

void finish(void*, void* opState) {
  auto* state = static_cast<OpState*>(opState);
#if SHOAL_WITH_CUDA
  if (state->devicePayload != nullptr) {
    cuda::DeviceScope scope(state->device);
    cuda::freeAsync(state->devicePayload, state->stream);  // after the stream's decode kernels
  }
#endif
  delete state;
}

#if SHOAL_WITH_CUDA
constexpr uint64_t kCudaCap = SHOAL_CAP_CUDA;
#else
constexpr uint64_t kCudaCap = 0;
#endif

constexpr uint32_t kFloatTypes = (1u << SHOAL_F32) | (1u << SHOAL_F64);

const shoal_compressor_t kFp16 = {
    .abi_version = SHOAL_COMPRESSOR_ABI_VERSION,
    .struct_size = sizeof(shoal_compressor_t),
    .name = "fp16",
    .description = "cast to IEEE half for the allreduce (2x smaller than f32); sums in f32, rounded once per hop",
    .options_help = "",
    .caps = SHOAL_CAP_HOST | SHOAL_CAP_HOMOMORPHIC | kCudaCap,
    .error_kind = SHOAL_ERROR_RELATIVE,
    .error_bound = 2.0 / 2048,
    .dtypes = kFloatTypes,
    .create = create<Format::Fp16>,
    .destroy = destroy,
    .start = start,
    .round = round,
    .finish = finish,
    .destroy_tensor_state = nullptr,
    .save_tensor_state = nullptr,
    .load_tensor_state = nullptr,
};

const shoal_compressor_t kBf16 = {
    .abi_version = SHOAL_COMPRESSOR_ABI_VERSION,
    .struct_size = sizeof(shoal_compressor_t),
    .name = "bf16",
    .description =
        "cast to bfloat16 for the allreduce (2x smaller than f32, f32's range); sums in f32, rounded once per hop",
    .options_help = "",
    .caps = SHOAL_CAP_HOST | SHOAL_CAP_HOMOMORPHIC | kCudaCap,
    .error_kind = SHOAL_ERROR_RELATIVE,
    .error_bound = 2.0 / 256,
    .dtypes = kFloatTypes,
    .create = create<Format::Bf16>,
    .destroy = destroy,
    .start = start,
    .round = round,
    .finish = finish,
    .destroy_tensor_state = nullptr,
    .save_tensor_state = nullptr,
    .load_tensor_state = nullptr,
};

}  // namespace

const shoal_compressor_t* fp16() { return &kFp16; }
const shoal_compressor_t* bf16() { return &kBf16; }

}  // namespace shoal::compressors
