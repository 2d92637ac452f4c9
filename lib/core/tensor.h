// Element count of a public tensor: the product of its extents (a scalar, ndim 0, has one).
// In lib/core so that built-in compressors need nothing from lib/plugin; the
// API's argument checks have already refused shapes whose product overflows.
#pragma once

#include <cstddef>

#include "shoal/shoal.h"

namespace shoal {

inline size_t elementsCount(const shoal_tensor_t& tensor) {
  size_t count = 1;
  for (int d = 0; d < tensor.ndim; ++d) count *= static_cast<size_t>(tensor.shape[d]);
  return count;
}

}  // namespace shoal
