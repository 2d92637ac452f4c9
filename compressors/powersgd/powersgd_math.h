// PowerSGD small kernels, shared by the CPU path (powersgd_engine.cc) and the
// CUDA kernels (powersgd.cu): everything here is SHOAL_HD (__host__ __device__
// under nvcc). The GPU runs the same per-column decisions (keepColumn) and the
// same RNG (uniformAt: bit-identical Q on CPU and GPU), with its dot products
// reduced in another order.
//
// Matrices are row-major; a factor F [rows x r] has column c at F[i * r + c].
//
//  - Counter-based RNG: splitmix64 of (seed, name hash, generation, element) ->
//    uniform in [-1, 1). Every rank computes the same bits from the same key,
//    so the initial Q is bit-identical everywhere with no communication.
//  - Gram-Schmidt, one column at a time (orthogonalizeColumn): two passes of
//    projections against the earlier columns ("twice is enough"), dot products
//    accumulated in double, then normalization with an explicit zero-column
//    guard: a column whose norm after projection is below kTinyNorm, or below
//    kRelativeCutoff times its norm before projection (it lay in the span of
//    the earlier columns: what is left is rounding noise), becomes all zeros.
//    Never a division by zero, never NaN from a zero column.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>

#include "core/numeric/element_ops.h"  // SHOAL_HD

namespace shoal::powersgd {

// Norms below this are treated as zero (well above the f32 subnormal range).
constexpr double kTinyNorm = 1e-30;
// A column that keeps less than this fraction of its norm after removing its
// projections on earlier columns is rank-deficient noise: zeroed.
constexpr double kRelativeCutoff = 1e-5;

SHOAL_HD inline uint64_t splitmix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// Uniform in [-1, 1), a multiple of 2^-23 (exact in f32), keyed by
// (seed, name hash, generation, element index).
SHOAL_HD inline float uniformAt(uint64_t seed, uint64_t nameHash, uint64_t generation, uint64_t index) {
  uint64_t h = splitmix64(seed ^ splitmix64(nameHash ^ splitmix64(generation * 0x100000001b3ull ^ splitmix64(index))));
  // 24 random bits -> [0, 2^24) -> [-1, 1) in steps of 2^-23.
  return static_cast<float>(static_cast<int32_t>(h >> 40) - (1 << 23)) * (1.0f / 8388608.0f);
}

// FNV-1a of a NUL-terminated name.
SHOAL_HD inline uint64_t nameHash(const char* name) {
  uint64_t h = 1469598103934665603ull;
  if (name == nullptr) return h;
  for (const char* p = name; *p; ++p) h = (h ^ static_cast<unsigned char>(*p)) * 1099511628211ull;
  return h;
}

// Dot product of columns a and b of F [rows x r], accumulated in double.
SHOAL_HD inline double columnDot(const float* F, size_t rows, int r, int a, int b) {
  double sum = 0;
  for (size_t i = 0; i < rows; ++i) sum += static_cast<double>(F[i * r + a]) * static_cast<double>(F[i * r + b]);
  return sum;
}

// Column c -= coefficient * column j.
SHOAL_HD inline void columnSubtract(float* F, size_t rows, int r, int c, int j, double coefficient) {
  const float k = static_cast<float>(coefficient);
  for (size_t i = 0; i < rows; ++i) F[i * r + c] -= k * F[i * r + j];
}

// The zero-column guard: keep a column of norm `norm` after projections, whose
// norm was `before` (false for NaN too).
SHOAL_HD inline bool keepColumn(double norm, double before) {
  return norm >= kTinyNorm && norm >= kRelativeCutoff * before;
}

// Scales column c to unit norm, or zeroes it under the guard above. before =
// the column's norm before projections. Returns 1 if the column is kept.
SHOAL_HD inline int normalizeOrZero(float* F, size_t rows, int r, int c, double before) {
  double norm = std::sqrt(columnDot(F, rows, r, c, c));
  if (!keepColumn(norm, before)) {
    for (size_t i = 0; i < rows; ++i) F[i * r + c] = 0.0f;
    return 0;
  }
  const float inverse = static_cast<float>(1.0 / norm);
  for (size_t i = 0; i < rows; ++i) F[i * r + c] *= inverse;
  return 1;
}

// Orthonormalizes column c of F against columns 0..c-1 (already orthonormal or
// zero). Returns 1 if the column is kept, 0 if it was zeroed.
SHOAL_HD inline int orthogonalizeColumn(float* F, size_t rows, int r, int c) {
  const double before = std::sqrt(columnDot(F, rows, r, c, c));
  if (!keepColumn(before, 0.0)) {
    for (size_t i = 0; i < rows; ++i) F[i * r + c] = 0.0f;
    return 0;
  }
  for (int pass = 0; pass < 2; ++pass)
    for (int j = 0; j < c; ++j) {
      double coefficient = columnDot(F, rows, r, j, c);  // column j is unit or zero
      if (coefficient != 0) columnSubtract(F, rows, r, c, j, coefficient);
    }
  return normalizeOrZero(F, rows, r, c, before);
}

// Modified Gram-Schmidt on all r columns; returns how many were kept.
SHOAL_HD inline int orthogonalize(float* F, size_t rows, int r) {
  int kept = 0;
  for (int c = 0; c < r; ++c) kept += orthogonalizeColumn(F, rows, r, c);
  return kept;
}

// PyTorch's rule (powerSGD_hook._should_compress): a [rows x cols] matrix at
// rank r is compressed iff (rows + cols) * r * min_compression_rate < rows * cols.
SHOAL_HD inline bool shouldCompress(uint64_t rows, uint64_t cols, uint64_t r, double minCompressionRate) {
  return static_cast<double>(rows + cols) * static_cast<double>(r) * minCompressionRate <
         static_cast<double>(rows) * static_cast<double>(cols);
}

}  // namespace shoal::powersgd
