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
#include <cstring>
#include <vector>

#include "compressors/common/payload.h"
#include "collectives/common/element_ops.h"
#include "collectives/common/half_convert.h"
#include "plugin/driver.h"
#include "shoal/compressor.h"

namespace shoal::compressors {
namespace {

enum class Format { Fp16, Bf16 };

struct Instance {
  Format format;
};

struct OpState {
  std::vector<uint16_t> payload;
};

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

shoal_status_t start(void*, shoal_compress_op_t* op, void** opState) {
  auto* state = new OpState;
  size_t total = 0;
  for (int t = 0; t < op->num_tensors; ++t) total += plugin::elementsCount(op->tensors[t].input);
  state->payload.resize(total);
  *opState = state;
  return SHOAL_OK;
}

shoal_status_t round(void* instance, void* opState, shoal_compress_op_t* op, shoal_round_t* round) {
  Format format = static_cast<Instance*>(instance)->format;
  auto* state = static_cast<OpState*>(opState);
  size_t offset = 0;
  for (int t = 0; t < op->num_tensors; ++t) {
    const shoal_compress_tensor_t& tensor = op->tensors[t];
    size_t count = plugin::elementsCount(tensor.input);
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
  if (round->index > 0) {
    round->done = 1;
    return SHOAL_OK;
  }
  requestOnePayload(round, SHOAL_COLLECTIVE_ALLREDUCE, format == Format::Fp16 ? SHOAL_F16 : SHOAL_BF16, op->op,
                    state->payload.data(), state->payload.size());
  return SHOAL_OK;
}

void finish(void*, void* opState) { delete static_cast<OpState*>(opState); }

constexpr uint32_t kFloatTypes = (1u << SHOAL_F32) | (1u << SHOAL_F64);

const shoal_compressor_t kFp16 = {
    SHOAL_COMPRESSOR_ABI_VERSION, sizeof(shoal_compressor_t), "fp16",
    "cast to IEEE half for the allreduce (2x smaller than f32); sums in f32, rounded once per hop", "",
    SHOAL_CAP_HOST | SHOAL_CAP_HOMOMORPHIC, SHOAL_ERROR_RELATIVE, 2.0 / 2048, kFloatTypes,
    create<Format::Fp16>, destroy, start, round, finish, nullptr, nullptr, nullptr,
};

const shoal_compressor_t kBf16 = {
    SHOAL_COMPRESSOR_ABI_VERSION, sizeof(shoal_compressor_t), "bf16",
    "cast to bfloat16 for the allreduce (2x smaller than f32, f32's range); sums in f32, rounded once per hop", "",
    SHOAL_CAP_HOST | SHOAL_CAP_HOMOMORPHIC, SHOAL_ERROR_RELATIVE, 2.0 / 256, kFloatTypes,
    create<Format::Bf16>, destroy, start, round, finish, nullptr, nullptr, nullptr,
};

}  // namespace

const shoal_compressor_t* fp16() { return &kFp16; }
const shoal_compressor_t* bf16() { return &kBf16; }

}  // namespace shoal::compressors
