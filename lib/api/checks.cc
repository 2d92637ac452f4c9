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
  // count x element x factor > kMaxBufferBytes, also when it wraps: the same
  // refusal as count > kMaxBufferBytes / element / factor, without dividing.
  size_t elements = 0, bytes = 0;
  if (__builtin_mul_overflow(count, factor, &elements) || __builtin_mul_overflow(elements, element, &bytes) ||
      bytes > kMaxBufferBytes)
    fail(SHOAL_ERR_INVALID_ARGUMENT,
         "{}: {} = {} elements of {}{} overflows the largest buffer ({} bytes); pass a count of at most {}", call,
         what, count, shoal_dtype_name(dtype), factor > 1 ? fmt::format(" x {}", factor) : std::string(),
         kMaxBufferBytes, kMaxBufferBytes / element / factor);
  return bytes;
}

size_t checkedTensorElements(const char* call, const char* what, const shoal_tensor_t& tensor) {
  if (tensor.ndim < 0 || tensor.ndim > SHOAL_MAX_DIMS)
    fail(SHOAL_ERR_INVALID_ARGUMENT, "{}: {}->ndim is {}; it must lie in 0..{}", call, what, tensor.ndim,
         SHOAL_MAX_DIMS);
  const size_t element = dtypeSize(tensor.dtype);
  if (element == 0)
    fail(SHOAL_ERR_INVALID_ARGUMENT, "{}: {}->dtype {} is not a shoal_dtype_t; use SHOAL_F16 .. SHOAL_U64", call, what,
         static_cast<int>(tensor.dtype));
  // One pass: a negative extent anywhere is refused first, a zero extent
  // anywhere makes 0 elements (however large the others), and otherwise the
  // first extent that takes the product past the limit is named.
  size_t elements = 1;
  bool zero = false;
  int overflowAt = -1;
  for (int d = 0; d < tensor.ndim; ++d) {
    const int64_t extent = tensor.shape[d];
    if (extent < 0)
      fail(SHOAL_ERR_INVALID_ARGUMENT, "{}: {}->shape[{}] is {}; extents must be >= 0", call, what, d, extent);
    if (extent == 0) zero = true;
    if (zero || overflowAt >= 0) continue;
    // product > kMaxBufferBytes / element, without dividing
    size_t product = 0, bytes = 0;
    if (__builtin_mul_overflow(elements, static_cast<size_t>(extent), &product) ||
        __builtin_mul_overflow(product, element, &bytes) || bytes > kMaxBufferBytes)
      overflowAt = d;
    else
      elements = product;
  }
  if (zero) return 0;
  if (overflowAt >= 0)
    fail(SHOAL_ERR_INVALID_ARGUMENT,
         "{}: {}'s shape holds more elements than the largest buffer allows ({} of {}); shape[{}] = {} makes the "
         "product overflow",
         call, what, kMaxBufferBytes / element, shoal_dtype_name(tensor.dtype), overflowAt, tensor.shape[overflowAt]);
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

void checkDtype(const char* call, shoal_dtype_t dtype) {
  if (dtypeSize(dtype) == 0)
    fail(SHOAL_ERR_INVALID_ARGUMENT, "{}: dtype {} is not a shoal_dtype_t; use SHOAL_F16 .. SHOAL_U64", call,
         static_cast<int>(dtype));
}

void refuseDtypeOp(const char* call, shoal_dtype_t dtype, shoal_op_t op) {
  checkDtype(call, dtype);
  if (op < 0 || op >= SHOAL_OP_COUNT)
    fail(SHOAL_ERR_INVALID_ARGUMENT, "{}: op {} is not a shoal_op_t; use SHOAL_SUM .. SHOAL_BXOR", call,
         static_cast<int>(op));
  fail(SHOAL_ERR_INVALID_ARGUMENT, "{}: op {} is not defined on dtype {}; bitwise ops need an integer dtype", call,
       shoal_op_name(op), shoal_dtype_name(dtype));
}

void refuseNullBuffer(const char* call, const char* name, size_t bytes) {
  fail(SHOAL_ERR_INVALID_ARGUMENT, "{}: {} is NULL but {} bytes were requested; pass a buffer or count 0", call, name,
       bytes);
}

void refuseOverlap(const char* call) {
  fail(SHOAL_ERR_INVALID_ARGUMENT,
       "{}: sendbuf and recvbuf overlap without being the in-place layout; use separate buffers or the in-place form",
       call);
}

void checkRank(const char* call, std::string_view what, int rank, int size) {
  if (rank < 0 || rank >= size)
    fail(SHOAL_ERR_INVALID_ARGUMENT, "{}: {} {} is not a rank; use 0..{}", call, what, rank, size - 1);
}

}  // namespace shoal
