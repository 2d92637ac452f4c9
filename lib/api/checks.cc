#include "api/checks.h"

#include <cmath>

#include "collectives/common/reducer.h"
#include "core/error.h"

namespace shoal {

size_t checkedByteCount(const char* call, const char* what, size_t count, shoal_dtype_t dtype, size_t factor) {
  const size_t element = dtypeSize(dtype);
  if (element == 0)
    fail(SHOAL_ERR_INVALID_ARGUMENT, "{}: dtype {} is not a shoal_dtype_t; use SHOAL_F16 .. SHOAL_U64", call,
         static_cast<int>(dtype));
  if (factor == 0 || count == 0) return 0;
  if (count > kMaxBufferBytes / element / factor)
    fail(SHOAL_ERR_INVALID_ARGUMENT,
         "{}: {} = {} elements of {}{} overflows the largest buffer ({} bytes); pass a count of at most {}", call,
         what, count, shoal_dtype_name(dtype), factor > 1 ? fmt::format(" x {}", factor) : std::string(),
         kMaxBufferBytes, kMaxBufferBytes / element / factor);
  return count * element * factor;
}

size_t checkedTensorElements(const char* call, const char* what, const shoal_tensor_t& tensor) {
  if (tensor.ndim < 0 || tensor.ndim > SHOAL_MAX_DIMS)
    fail(SHOAL_ERR_INVALID_ARGUMENT, "{}: {}->ndim is {}; it must lie in 0..{}", call, what, tensor.ndim,
         SHOAL_MAX_DIMS);
  const size_t element = dtypeSize(tensor.dtype);
  if (element == 0)
    fail(SHOAL_ERR_INVALID_ARGUMENT, "{}: {}->dtype {} is not a shoal_dtype_t; use SHOAL_F16 .. SHOAL_U64", call, what,
         static_cast<int>(tensor.dtype));
  const size_t limit = kMaxBufferBytes / element;
  size_t elements = 1;
  bool zero = false;
  for (int d = 0; d < tensor.ndim; ++d) {
    const int64_t extent = tensor.shape[d];
    if (extent < 0)
      fail(SHOAL_ERR_INVALID_ARGUMENT, "{}: {}->shape[{}] is {}; extents must be >= 0", call, what, d, extent);
    if (extent == 0) zero = true;
  }
  if (zero) return 0;
  for (int d = 0; d < tensor.ndim; ++d) {
    const auto extent = static_cast<size_t>(tensor.shape[d]);
    if (elements > limit / extent)
      fail(SHOAL_ERR_INVALID_ARGUMENT,
           "{}: {}'s shape holds more elements than the largest buffer allows ({} of {}); shape[{}] = {} makes the "
           "product overflow",
           call, what, limit, shoal_dtype_name(tensor.dtype), d, tensor.shape[d]);
    elements *= extent;
  }
  return elements;
}

double checkedTimeout(const char* call, const char* what, double seconds, double communicatorS) {
  if (std::isnan(seconds))
    fail(SHOAL_ERR_INVALID_ARGUMENT,
         "{}: {} is NaN; pass seconds > 0, or <= 0 or INFINITY for the communicator's deadline (SHOAL_TIMEOUT_S = {})",
         call, what, communicatorS);
  if (seconds <= 0 || std::isinf(seconds)) return communicatorS;
  return seconds;
}

}  // namespace shoal
