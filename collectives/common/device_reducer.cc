// The throwing face of the device reducer (its kernels: reducer.cu).
#if SHOAL_WITH_CUDA
#include "collectives/common/device_reducer.h"

#include "collectives/common/reducer.h"
#include "core/error.h"

namespace shoal::cuda {
namespace {

void requireValid(shoal_dtype_t dtype, shoal_op_t op) {
  if (!isValidDtypeOp(dtype, op))
    fail(SHOAL_ERR_INVALID_ARGUMENT, "device reducer: op {} is not defined on dtype {}", shoal_op_name(op),
         shoal_dtype_name(dtype));
}

void check(const std::string& error) {
  if (!error.empty()) fail(SHOAL_ERR_SYSTEM, "CUDA: {}", error);
}

}  // namespace

void reduceOnDevice(void* dst, const void* src, size_t count, shoal_dtype_t dtype, shoal_op_t op, void* stream) {
  requireValid(dtype, op);
  if (count > 0) check(detail::launchCombine(dst, src, nullptr, count, dtype, op, stream));
}

void reduceIntoOnDevice(void* out, const void* a, const void* b, size_t count, shoal_dtype_t dtype, shoal_op_t op,
                        void* stream) {
  if (out == a) return reduceOnDevice(out, b, count, dtype, op, stream);
  requireValid(dtype, op);
  if (count > 0) check(detail::launchCombine(out, a, b, count, dtype, op, stream));
}

void finishOnDevice(void* buf, size_t count, shoal_dtype_t dtype, shoal_op_t op, int worldSize, void* stream) {
  requireValid(dtype, op);
  if (op == SHOAL_AVG && worldSize > 1 && count > 0) check(detail::launchDivide(buf, count, dtype, worldSize, stream));
}

}  // namespace shoal::cuda
#endif  // SHOAL_WITH_CUDA
