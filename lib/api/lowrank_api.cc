// C entry points of include/shoal/lowrank.h: the fused allreduce (Pufferfish's
// one flattened allreduce of all factor gradients) and the SVD factorize helper.
#include <lapacke.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "api/enter.h"
#include "api/export.h"
#include "api/guard.h"
#include "comm/communicator.h"
#include "comm/call.h"
#include "comm/host_ops.h"
#include "runtime/blocking.h"
#include "collectives/common/reducer.h"
#include "shoal/lowrank.h"


using namespace shoal;

namespace {

constexpr size_t kMaxSize = std::numeric_limits<size_t>::max();

// Element count of one tensor, with its checks.
size_t tensorElements(const char* call, int index, const shoal_tensor_t& tensor) {
  if (tensor.ndim < 0 || tensor.ndim > SHOAL_MAX_DIMS)
    fail(SHOAL_ERR_INVALID_ARGUMENT, "{}: tensors[{}].ndim is {}; it must be in 0..{}", call, index, tensor.ndim,
         SHOAL_MAX_DIMS);
  size_t elements = 1;
  bool empty = false;
  for (int d = 0; d < tensor.ndim; ++d) {
    if (tensor.shape[d] < 0)
      fail(SHOAL_ERR_INVALID_ARGUMENT, "{}: tensors[{}].shape[{}] is {}; extents must be >= 0", call, index, d,
           tensor.shape[d]);
    if (tensor.shape[d] == 0) empty = true;
  }
  if (empty) return 0;
  for (int d = 0; d < tensor.ndim; ++d) {
    size_t extent = static_cast<size_t>(tensor.shape[d]);
    if (kMaxSize / extent < elements)
      fail(SHOAL_ERR_INVALID_ARGUMENT, "{}: tensors[{}]'s element count overflows the addressable size", call, index);
    elements *= extent;
  }
  return elements;
}

}  // namespace

SHOAL_EXPORT shoal_status_t shoal_fused_allreduce(shoal_comm_t comm, const shoal_tensor_t* tensors, int num_tensors,
                                                  shoal_op_t op) {
  return enter(comm, "shoal_fused_allreduce", [&](Call& fused) {
      const char* call = fused.name();
      shoal_comm& c = fused.comm();
      if (tensors == nullptr) fail(SHOAL_ERR_INVALID_ARGUMENT, "{}: tensors is NULL; pass an array of tensors", call);
      if (num_tensors <= 0)
        fail(SHOAL_ERR_INVALID_ARGUMENT, "{}: num_tensors is {}; pass at least one tensor", call, num_tensors);
      if (op != SHOAL_SUM && op != SHOAL_AVG)
        fail(SHOAL_ERR_INVALID_ARGUMENT, "{}: op {} is not supported; use SHOAL_SUM or SHOAL_AVG", call,
             shoal_op_name(op));
      const shoal_dtype_t dtype = tensors[0].dtype;
      const size_t element = dtypeSize(dtype);
      if (element == 0)
        fail(SHOAL_ERR_INVALID_ARGUMENT, "{}: tensors[0].dtype {} is not a shoal_dtype_t; use SHOAL_F16 .. SHOAL_U64",
             call, static_cast<int>(dtype));
      if (!isValidDtypeOp(dtype, op))
        fail(SHOAL_ERR_INVALID_ARGUMENT, "{}: op {} is not defined on dtype {}", call, shoal_op_name(op),
             shoal_dtype_name(dtype));
      std::vector<size_t> counts(static_cast<size_t>(num_tensors));
      size_t total = 0;
      for (int i = 0; i < num_tensors; ++i) {
        const shoal_tensor_t& tensor = tensors[i];
        if (tensor.dtype != dtype)
          fail(SHOAL_ERR_INVALID_ARGUMENT,
               "{}: tensors[{}].dtype is {} but tensors[0].dtype is {}; all tensors of one fused call must share a "
               "dtype (make one call per dtype)",
               call, i, shoal_dtype_name(tensor.dtype), shoal_dtype_name(dtype));
        if (tensor.memory != SHOAL_MEMORY_HOST)
          fail(SHOAL_ERR_UNSUPPORTED,
               "{}: tensors[{}] is not in host memory; the fused call takes host tensors (for CUDA tensors, pack "
               "them into one device buffer and call shoal_allreduce_tensor)",
               call, i);
        counts[i] = tensorElements(call, i, tensor);
        if (counts[i] > 0 && tensor.data == nullptr)
          fail(SHOAL_ERR_INVALID_ARGUMENT, "{}: tensors[{}].data is NULL but it holds {} elements", call, i,
               counts[i]);
        if (kMaxSize / element - total < counts[i])
          fail(SHOAL_ERR_INVALID_ARGUMENT, "{}: the tensors' total size overflows the addressable size; split the call",
               call);
        total += counts[i];
      }
      // Scratch slot 2 is free during an allreduce (slots 0 and 1 are the ring's receive buffers).
      uint8_t* flat = total > 0 ? c.scratch.get(2, total * element) : nullptr;
      size_t offset = 0;
      for (int i = 0; i < num_tensors; ++i) {
        if (counts[i] > 0) std::memcpy(flat + offset, tensors[i].data, counts[i] * element);
        offset += counts[i] * element;
      }
      fused.declare(signatureOf(CallKind::Allreduce, dtype, op, total));
      plainAllreduce(c, fused.sequence(), flat, flat, total, dtype, op);
      offset = 0;
      for (int i = 0; i < num_tensors; ++i) {
        if (counts[i] > 0) std::memcpy(tensors[i].data, flat + offset, counts[i] * element);
        offset += counts[i] * element;
      }
  });
}

SHOAL_EXPORT shoal_status_t shoal_lowrank_factorize(const float* w, int64_t rows, int64_t cols, int64_t rank,
                                                    float* u_out, float* v_out, float* singular_values_out) {
  return guarded(nullptr, [&] {
    const char* call = "shoal_lowrank_factorize";
    constexpr int64_t kLapackMax = std::numeric_limits<lapack_int>::max();
    if (rows < 1 || cols < 1)
      fail(SHOAL_ERR_INVALID_ARGUMENT, "{}: the matrix is [{} x {}]; rows and cols must be >= 1", call, rows, cols);
    if (rows > kLapackMax || cols > kLapackMax || rows > static_cast<int64_t>(kMaxSize / sizeof(float)) / cols)
      fail(SHOAL_ERR_INVALID_ARGUMENT, "{}: the matrix [{} x {}] is too large for LAPACK's 32-bit indices", call,
           rows, cols);
    const int64_t k = std::min(rows, cols);
    if (rank < 1 || rank > k)
      fail(SHOAL_ERR_INVALID_ARGUMENT, "{}: rank is {}; it must be in 1..min(rows, cols) = {}", call, rank, k);
    if (w == nullptr || u_out == nullptr || v_out == nullptr)
      fail(SHOAL_ERR_INVALID_ARGUMENT, "{}: w, u_out and v_out must not be NULL ({} is)", call,
           w == nullptr ? "w" : u_out == nullptr ? "u_out" : "v_out");
    const size_t count = static_cast<size_t>(rows) * static_cast<size_t>(cols);
    for (size_t i = 0; i < count; ++i)
      if (!std::isfinite(w[i]))
        fail(SHOAL_ERR_INVALID_ARGUMENT, "{}: w[{}] is {}; the matrix must be finite", call, i, w[i]);
    std::vector<float> a(w, w + count);  // sgesdd destroys its input
    std::vector<float> s(static_cast<size_t>(k));
    std::vector<float> u(static_cast<size_t>(rows * k));   // [rows x k], row-major
    std::vector<float> vt(static_cast<size_t>(k * cols));  // [k x cols], row-major
    lapack_int info = LAPACKE_sgesdd(LAPACK_ROW_MAJOR, 'S', static_cast<lapack_int>(rows),
                                     static_cast<lapack_int>(cols), a.data(), static_cast<lapack_int>(cols), s.data(),
                                     u.data(), static_cast<lapack_int>(k), vt.data(), static_cast<lapack_int>(cols));
    if (info > 0)
      fail(SHOAL_ERR_INVALID_ARGUMENT, "{}: the SVD of the [{} x {}] matrix did not converge (sgesdd info {})", call,
           rows, cols, info);
    if (info < 0)
      fail(SHOAL_ERR_INTERNAL, "{}: sgesdd refused argument {} for a [{} x {}] matrix", call, -info, rows, cols);
    std::vector<float> root(static_cast<size_t>(rank));
    for (int64_t j = 0; j < rank; ++j) root[j] = std::sqrt(std::max(s[j], 0.0f));
    for (int64_t i = 0; i < rows; ++i)
      for (int64_t j = 0; j < rank; ++j) u_out[i * rank + j] = u[i * k + j] * root[j];
    for (int64_t i = 0; i < cols; ++i)
      for (int64_t j = 0; j < rank; ++j) v_out[i * rank + j] = vt[j * cols + i] * root[j];
    if (singular_values_out != nullptr) std::memcpy(singular_values_out, s.data(), static_cast<size_t>(k) * sizeof(float));
  });
}

SHOAL_EXPORT int64_t shoal_lowrank_rank(int64_t rows, int64_t cols, int64_t rank_factor) {
  if (rows < 1 || cols < 1 || rank_factor < 1) return 0;
  return std::max<int64_t>(1, std::min(rows, cols) / rank_factor);
}
