// Reducer: the elementwise combine step of every reducing collective, for one
// (dtype, op) pair, chosen once per call from a dispatch table.
#pragma once

#include <cstddef>

#include "core/numeric/dtype.h"
#include "shoal/shoal.h"

namespace shoal {

// True when op is defined on dtype (bitwise ops need an integer type).
bool isValidDtypeOp(shoal_dtype_t dtype, shoal_op_t op);

class Reducer {
 public:
  Reducer(shoal_dtype_t dtype, shoal_op_t op);
  // dst[i] = dst[i] op src[i] for i < count.
  void combine(void* dst, const void* src, size_t count) const { combine_(dst, src, count); }
  // out[i] = a[i] op b[i]; out may be a (then this is combine), never b.
  void combineInto(void* out, const void* a, const void* b, size_t count) const {
    if (out == a) return combine_(out, b, count);
    combineInto_(out, a, b, count);
  }
  // Avg only: buf[i] /= worldSize. A no-op for other ops.
  void finish(void* buf, size_t count, int worldSize) const {
    if (divide_ != nullptr && worldSize > 1) divide_(buf, count, worldSize);
  }
  size_t elementSize() const { return elementSize_; }
  shoal_dtype_t dtype() const { return dtype_; }
  shoal_op_t op() const { return op_; }

 private:
  using CombineFn = void (*)(void*, const void*, size_t);
  using CombineIntoFn = void (*)(void*, const void*, const void*, size_t);
  using DivideFn = void (*)(void*, size_t, int);
  shoal_dtype_t dtype_;
  shoal_op_t op_;
  size_t elementSize_;
  CombineFn combine_;
  CombineIntoFn combineInto_;
  DivideFn divide_;
};

}  // namespace shoal
