// Bytes per element of a shoal_dtype_t: used by every layer and by the
// built-in compressors, so it lives in lib/core rather than with the reducers.
#pragma once

#include <cstddef>

#include "shoal/shoal.h"

namespace shoal {

// 0 for a value that is not a shoal_dtype_t.
constexpr size_t dtypeSize(shoal_dtype_t dtype) {
  switch (dtype) {
    case SHOAL_F16: case SHOAL_BF16: return 2;
    case SHOAL_F32: case SHOAL_I32: case SHOAL_U32: return 4;
    case SHOAL_F64: case SHOAL_I64: case SHOAL_U64: return 8;
    case SHOAL_I8: case SHOAL_U8: return 1;
    default: return 0;
  }
}

}  // namespace shoal
