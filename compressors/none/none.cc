// none: no compression, through the plugin ABI. Selecting "none" (the
// default) skips the driver altogether; this table exists so that "none" is
// listed, passes the conformance suite like any compressor, and shows the
// smallest possible compressor.
#include <cstdio>
#include <cstring>

#include "compressors/common/payload.h"
#include "core/tensor.h"
#include "shoal/compressor.h"

namespace shoal::compressors {
namespace {

shoal_status_t create(const shoal_compressor_params_t* params, void** instance) {
  if (params->num_options > 0) {
    std::snprintf(params->error_text, params->error_text_size, "none takes no options (got '%s')", params->keys[0]);
    return SHOAL_ERR_INVALID_ARGUMENT;
  }
  *instance = nullptr;
  return SHOAL_OK;
}

void destroy(void*) {}

shoal_status_t start(void*, shoal_compress_op_t*, void** opState) {
  *opState = nullptr;
  return SHOAL_OK;
}

// Round 0: one allreduce per tensor, in place in its output. Round 1: done.
shoal_status_t round(void*, void*, shoal_compress_op_t* op, shoal_round_t* round) {
  if (round->index > 0) return roundsDone(round);
  if (op->num_tensors > SHOAL_MAX_ROUND_PAYLOADS) {
    std::snprintf(op->error_text, op->error_text_size, "none handles at most %d tensors per call",
                  SHOAL_MAX_ROUND_PAYLOADS);
    return SHOAL_ERR_UNSUPPORTED;
  }
  round->num_payloads = op->num_tensors;
  for (int t = 0; t < op->num_tensors; ++t) {
    const shoal_compress_tensor_t& tensor = op->tensors[t];
    size_t count = shoal::elementsCount(tensor.input);
    if (tensor.output.data != tensor.input.data)
      std::memcpy(tensor.output.data, tensor.input.data, count * shoal_dtype_size(tensor.input.dtype));
    setAllreducePayload(round->payloads[t], tensor.input.dtype, op->op, tensor.output.data, count);
  }
  return SHOAL_OK;
}

void finish(void*, void*) {}

const shoal_compressor_t kNone = {
    .abi_version = SHOAL_COMPRESSOR_ABI_VERSION,
    .struct_size = sizeof(shoal_compressor_t),
    .name = "none",
    .description = "no compression: the plain allreduce",
    .options_help = "",
    .caps = SHOAL_CAP_HOST | SHOAL_CAP_LOSSLESS | SHOAL_CAP_HOMOMORPHIC,
    .error_kind = SHOAL_ERROR_EXACT,
    .error_bound = 0.0,
    .dtypes = (1u << SHOAL_DTYPE_COUNT) - 1,
    .create = create,
    .destroy = destroy,
    .start = start,
    .round = round,
    .finish = finish,
    .destroy_tensor_state = nullptr,
    .save_tensor_state = nullptr,
    .load_tensor_state = nullptr,
};

}  // namespace

const shoal_compressor_t* none() { return &kNone; }

}  // namespace shoal::compressors
