// What the CUDA runtime can offer this process. Compiled only in the GPU
// build (SHOAL_WITH_CUDA); host code calls it under #if SHOAL_WITH_CUDA.
#pragma once

#include <string>

namespace shoal::cuda {

// Number of usable CUDA devices; 0 with the runtime's reason in *why when
// there is none (no driver, no device, CUDA_VISIBLE_DEVICES empty, ...).
int deviceCount(std::string *why);

}  // namespace shoal::cuda
