// Calls for bindings that cannot use the header's macros and inline functions
// (ctypes, cffi): the library's own version, a tensor initialiser, and the
// sizes of the public structs so a binding can check its mirrors at import.
#include <cstring>

#include "api/export.h"
#include "api/guard.h"
#include "comm/communicator.h"
#include "shoal/compressor.h"
#include "shoal/lowrank.h"

static_assert(SHOAL_VERSION_MAJOR == SHOAL_PROJECT_VERSION_MAJOR && SHOAL_VERSION_MINOR == SHOAL_PROJECT_VERSION_MINOR &&
                  SHOAL_VERSION_PATCH == SHOAL_PROJECT_VERSION_PATCH,
              "include/shoal/shoal.h's SHOAL_VERSION_* differ from CMakeLists.txt's project(VERSION)");


SHOAL_EXPORT shoal_status_t shoal_get_version(int* version) {
  return shoal::guarded(nullptr, [&] {
    if (version == nullptr) shoal::fail(SHOAL_ERR_INVALID_ARGUMENT, "shoal_get_version: version (the out-parameter) is NULL");
    *version = SHOAL_VERSION_CODE;
  });
}

SHOAL_EXPORT shoal_status_t shoal_tensor_init(shoal_tensor_t* tensor, void* data, size_t count, shoal_dtype_t dtype) {
  return shoal::guarded(nullptr, [&] {
    if (tensor == nullptr) shoal::fail(SHOAL_ERR_INVALID_ARGUMENT, "shoal_tensor_init: tensor (the out-parameter) is NULL");
    *tensor = shoal_tensor_1d(data, count, dtype);
  });
}

SHOAL_EXPORT size_t shoal_struct_size(const char* name) {
  struct Entry { const char* name; size_t size; };
  static const Entry kStructs[] = {
      {"shoal_tensor_t", sizeof(shoal_tensor_t)},
      {"shoal_config_t", sizeof(shoal_config_t)},
      {"shoal_allreduce_options_t", sizeof(shoal_allreduce_options_t)},
      {"shoal_compress_stats_t", sizeof(shoal_compress_stats_t)},
      {"shoal_async_options_t", sizeof(shoal_async_options_t)},
      {"shoal_async_stats_t", sizeof(shoal_async_stats_t)},
      {"shoal_lowrank_matrix_t", sizeof(shoal_lowrank_matrix_t)},
      {"shoal_lowrank_config_t", sizeof(shoal_lowrank_config_t)},
      {"shoal_lowrank_sizes_t", sizeof(shoal_lowrank_sizes_t)},
  };
  if (name == nullptr) return 0;
  for (const Entry& entry : kStructs)
    if (std::strcmp(entry.name, name) == 0) return entry.size;
  return 0;
}

SHOAL_EXPORT int shoal_built_with(const char* feature) {
  if (feature == nullptr) return 0;
#if SHOAL_WITH_CUDA
  if (std::strcmp(feature, "cuda") == 0) return 1;
#endif
#if SHOAL_WITH_NCCL
  if (std::strcmp(feature, "nccl") == 0) return 1;
#endif
  return 0;
}
