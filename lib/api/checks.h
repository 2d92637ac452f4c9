// Argument checks shared by the C entry points: one rule for element and
// byte counts, one for tensor shapes, one for timeouts. Each failure is
// SHOAL_ERR_INVALID_ARGUMENT with text naming the call, the argument, its
// value and the range it must lie in.
#pragma once

#include <cstddef>
#include <cstdint>

#include <string_view>

#include "collectives/common/reducer.h"
#include "comm/agree.h"
#include "core/error.h"
#include "shoal/shoal.h"

namespace shoal {

// The largest buffer a call accepts: PTRDIFF_MAX bytes (no object is larger).
constexpr size_t kMaxBufferBytes = static_cast<size_t>(PTRDIFF_MAX);

// count x sizeof(dtype) x factor, refused when it exceeds kMaxBufferBytes
// (also when the product wraps). `what` names the argument ("count").
size_t checkedByteCount(const char* call, const char* what, size_t count, shoal_dtype_t dtype, size_t factor = 1);

// The element count of a tensor: ndim in 0..SHOAL_MAX_DIMS, no negative
// extent, and a product whose bytes fit kMaxBufferBytes. The dtype must be
// valid (checked first).
size_t checkedTensorElements(const char* call, const char* what, const shoal_tensor_t& tensor);

// Whether two tensors have the same ndim (a valid one) and extents: then a
// shape check of one holds for the other (dtypes are compared on their own).
inline bool sameShape(const shoal_tensor_t& a, const shoal_tensor_t& b) {
  if (a.ndim != b.ndim || a.ndim < 0 || a.ndim > SHOAL_MAX_DIMS) return false;
  for (int d = 0; d < a.ndim; ++d)
    if (a.shape[d] != b.shape[d]) return false;
  return true;
}

// A wait's timeout in seconds: NaN is refused; <= 0 and +infinity mean the
// communicator's deadline (`communicatorS`, SHOAL_TIMEOUT_S): shoal never
// waits without one. Finite values above it are kept.
double checkedTimeout(const char* call, const char* what, double seconds, double communicatorS);

// The entry points' common checks (moved here from collectives_api.cc so the
// exchanging collectives share them). Each failure is INVALID_ARGUMENT. The
// ones every call makes are inline (a small call's path) and refuse through
// the out-of-line refuse* functions below, which write the text.
void checkDtype(const char* call, shoal_dtype_t dtype);
[[noreturn]] void refuseDtypeOp(const char* call, shoal_dtype_t dtype, shoal_op_t op);
// A pair with loops is a valid dtype and op (one table load); refuseDtypeOp
// names what is wrong, the dtype first.
inline void checkDtypeOp(const char* call, shoal_dtype_t dtype, shoal_op_t op) {
  if (!isValidDtypeOp(dtype, op)) refuseDtypeOp(call, dtype, op);
}
// A NULL buffer is refused when it should hold bytes > 0.
[[noreturn]] void refuseNullBuffer(const char* call, const char* name, size_t bytes);
inline void checkBuffer(const char* call, const char* name, const void* buffer, size_t bytes) {
  if (buffer == nullptr && bytes > 0) refuseNullBuffer(call, name, bytes);
}
// [a, a + na) and [b, b + nb) overlap without being the in-place layout:
// refused, since the result would depend on the copy order.
[[noreturn]] void refuseOverlap(const char* call);
inline void checkNoPartialOverlap(const char* call, const void* a, size_t na, const void* b, size_t nb,
                                  bool inPlace) {
  auto pa = reinterpret_cast<uintptr_t>(a), pb = reinterpret_cast<uintptr_t>(b);
  if (inPlace || a == nullptr || b == nullptr || na == 0 || nb == 0) return;
  if (pa < pb + nb && pb < pa + na) refuseOverlap(call);
}
// A rank argument (a root, a peer) must lie in 0..size-1; `what` names it
// ("root", "ops[2]: peer").
void checkRank(const char* call, std::string_view what, int rank, int size);

}  // namespace shoal
