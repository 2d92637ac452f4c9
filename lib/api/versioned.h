// Versioned structs at the C API (NCCL's config model): a caller's struct
// starts with struct_size, the size its header declared. A later version only
// appends fields, so a caller built against an older header passes a smaller
// size: where one of the struct's fields ends, or that end rounded up to the
// struct's alignment (its sizeof). The library reads (or writes) the caller's
// bytes up to that size; the fields beyond take the library's defaults. Any
// other size is refused with text naming the call, the sizes it accepts and
// the INIT macro to start from: 0, a size beyond this version's struct, and a
// size inside a field (which would copy part of a pointer). The one place that rule lives; every entry point that takes
// such a struct goes through readVersioned / writeVersioned.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstring>
#include <string>
#include <vector>

#include "core/error.h"
#include "shoal/lowrank.h"
#include "shoal/shoal.h"

namespace shoal {

// Where each field of a versioned struct ends, in declaration order
// (specialised below; a struct without a list does not compile here).
template <typename T>
struct VersionedFields;

#define SHOAL_FIELD_END(T, field) (offsetof(T, field) + sizeof(T::field))

template <>
struct VersionedFields<shoal_config_t> {
  static constexpr const char* kInit = "SHOAL_CONFIG_INIT";
  static constexpr size_t kEnds[] = {
      SHOAL_FIELD_END(shoal_config_t, struct_size), SHOAL_FIELD_END(shoal_config_t, rank),
      SHOAL_FIELD_END(shoal_config_t, world_size),  SHOAL_FIELD_END(shoal_config_t, store),
      SHOAL_FIELD_END(shoal_config_t, token),       SHOAL_FIELD_END(shoal_config_t, timeout_s),
      SHOAL_FIELD_END(shoal_config_t, algorithm)};
};

template <>
struct VersionedFields<shoal_allreduce_options_t> {
  static constexpr const char* kInit = "SHOAL_ALLREDUCE_OPTIONS_INIT";
  static constexpr size_t kEnds[] = {SHOAL_FIELD_END(shoal_allreduce_options_t, struct_size),
                                     SHOAL_FIELD_END(shoal_allreduce_options_t, name),
                                     SHOAL_FIELD_END(shoal_allreduce_options_t, compressor),
                                     SHOAL_FIELD_END(shoal_allreduce_options_t, compressor_options),
                                     SHOAL_FIELD_END(shoal_allreduce_options_t, compress_min_bytes)};
};

template <>
struct VersionedFields<shoal_async_options_t> {
  static constexpr const char* kInit = "SHOAL_ASYNC_OPTIONS_INIT";
  static constexpr size_t kEnds[] = {SHOAL_FIELD_END(shoal_async_options_t, struct_size),
                                     SHOAL_FIELD_END(shoal_async_options_t, compressor),
                                     SHOAL_FIELD_END(shoal_async_options_t, compressor_options),
                                     SHOAL_FIELD_END(shoal_async_options_t, compress_min_bytes)};
};

template <>
struct VersionedFields<shoal_compress_stats_t> {
  static constexpr const char* kInit = "SHOAL_COMPRESS_STATS_INIT";
  static constexpr size_t kEnds[] = {
      SHOAL_FIELD_END(shoal_compress_stats_t, struct_size),   SHOAL_FIELD_END(shoal_compress_stats_t, compressor),
      SHOAL_FIELD_END(shoal_compress_stats_t, input_bytes),   SHOAL_FIELD_END(shoal_compress_stats_t, payload_bytes),
      SHOAL_FIELD_END(shoal_compress_stats_t, wire_bytes),    SHOAL_FIELD_END(shoal_compress_stats_t, rounds)};
};

template <>
struct VersionedFields<shoal_async_stats_t> {
  static constexpr const char* kInit = "SHOAL_ASYNC_STATS_INIT";
  static constexpr size_t kEnds[] = {
      SHOAL_FIELD_END(shoal_async_stats_t, struct_size), SHOAL_FIELD_END(shoal_async_stats_t, cycles),
      SHOAL_FIELD_END(shoal_async_stats_t, full_rounds), SHOAL_FIELD_END(shoal_async_stats_t, cache_hits),
      SHOAL_FIELD_END(shoal_async_stats_t, tensors),     SHOAL_FIELD_END(shoal_async_stats_t, groups),
      SHOAL_FIELD_END(shoal_async_stats_t, negotiation_us)};
};

template <>
struct VersionedFields<shoal_lowrank_config_t> {
  static constexpr const char* kInit = "SHOAL_LOWRANK_CONFIG_INIT";
  static constexpr size_t kEnds[] = {
      SHOAL_FIELD_END(shoal_lowrank_config_t, struct_size), SHOAL_FIELD_END(shoal_lowrank_config_t, rank),
      SHOAL_FIELD_END(shoal_lowrank_config_t, error_feedback),
      SHOAL_FIELD_END(shoal_lowrank_config_t, min_compression_rate),
      SHOAL_FIELD_END(shoal_lowrank_config_t, start_iter),  SHOAL_FIELD_END(shoal_lowrank_config_t, seed),
      SHOAL_FIELD_END(shoal_lowrank_config_t, dtype),       SHOAL_FIELD_END(shoal_lowrank_config_t, memory),
      SHOAL_FIELD_END(shoal_lowrank_config_t, device),      SHOAL_FIELD_END(shoal_lowrank_config_t, stream)};
};

template <>
struct VersionedFields<shoal_lowrank_sizes_t> {
  static constexpr const char* kInit = "SHOAL_LOWRANK_SIZES_INIT";
  static constexpr size_t kEnds[] = {
      SHOAL_FIELD_END(shoal_lowrank_sizes_t, struct_size), SHOAL_FIELD_END(shoal_lowrank_sizes_t, p_elems),
      SHOAL_FIELD_END(shoal_lowrank_sizes_t, q_elems),     SHOAL_FIELD_END(shoal_lowrank_sizes_t, compressed),
      SHOAL_FIELD_END(shoal_lowrank_sizes_t, dense_elems), SHOAL_FIELD_END(shoal_lowrank_sizes_t, workspace_bytes),
      SHOAL_FIELD_END(shoal_lowrank_sizes_t, state_bytes)};
};

#undef SHOAL_FIELD_END

// A list that misses a field appended later ends short of the struct by more
// than its tail padding: caught here at compile time.
template <typename T>
constexpr bool listsEveryField() {
  const auto& ends = VersionedFields<T>::kEnds;
  const size_t last = ends[sizeof(ends) / sizeof(ends[0]) - 1];
  return last <= sizeof(T) && sizeof(T) - last < alignof(T);
}

// The sizes a caller built against this or an earlier header can pass: the
// end of each field (a version that ended there), that end rounded up to the
// struct's alignment (the same version's sizeof, tail padding included), and
// sizeof(T). In order, without repeats.
template <typename T>
std::vector<size_t> acceptedStructSizes() {
  std::vector<size_t> sizes;
  auto add = [&](size_t size) {
    if (size <= sizeof(T) && (sizes.empty() || sizes.back() < size)) sizes.push_back(size);
  };
  for (size_t end : VersionedFields<T>::kEnds) {
    add(end);
    add((end + alignof(T) - 1) / alignof(T) * alignof(T));
  }
  add(sizeof(T));
  return sizes;
}

// Refuses a struct_size that no version of T had. `call` and `what`
// ("options", "stats") name it. A field appended later must not start inside
// an earlier version's tail padding (the earlier sizeof would then read it
// from the caller's padding): header authors append at sizeof(T) or after.
template <typename T>
void checkStructSize(const char* call, const char* what, size_t size) {
  static_assert(listsEveryField<T>(), "VersionedFields<T>::kEnds misses a field of T");
  if (size == sizeof(T)) return;
  const std::vector<size_t> sizes = acceptedStructSizes<T>();
  if (std::find(sizes.begin(), sizes.end(), size) != sizes.end()) return;
  std::string list;
  for (size_t accepted : sizes) list += (list.empty() ? "" : ", ") + std::to_string(accepted);
  fail(SHOAL_ERR_INVALID_ARGUMENT,
       "{}: {}->struct_size is {}; it must be the struct's size in this or an earlier version of shoal.h ({}): "
       "start from {}",
       call, what, size, list, VersionedFields<T>::kInit);
}

// The caller's struct over `defaults`: the fields its version has, the
// defaults for the rest; struct_size becomes sizeof(T). `given` NULL: the
// defaults.
template <typename T>
T readVersioned(const char* call, const char* what, const T* given, const T& defaults) {
  T resolved = defaults;
  if (given == nullptr) return resolved;
  checkStructSize<T>(call, what, given->struct_size);
  std::memcpy(static_cast<void*>(&resolved), given, given->struct_size);
  resolved.struct_size = sizeof(T);
  return resolved;
}

// Writes `result` into the caller's struct, only the fields its version has
// (the caller set struct_size, usually through T's INIT macro). NULL is refused.
template <typename T>
void writeVersioned(const char* call, const char* what, T* out, const T& result) {
  if (out == nullptr) fail(SHOAL_ERR_INVALID_ARGUMENT, "{}: {} is NULL; pass a struct from {}", call, what,
                           VersionedFields<T>::kInit);
  const size_t size = out->struct_size;
  checkStructSize<T>(call, what, size);
  T copy = result;
  copy.struct_size = size;  // the caller's version, not this library's
  std::memcpy(static_cast<void*>(out), &copy, size);
}

}  // namespace shoal
