// The CPU products of the PowerSGD step (powersgd_engine.cc), written for the
// shapes PowerSGD has: a matrix M [rows x cols] against a skinny factor of r
// columns (r is 1..8 in practice; any r works). They replace two OpenBLAS
// sgemm calls whose packing of M cost more than the products themselves: each
// kernel here reads a row of M once, while it is in L1, and the factor is
// kept transposed ([r x cols], its columns contiguous), so the loop over a row
// vectorizes without a reduction across lanes.
//
// The order of every sum is fixed by this code (not by the thread count, the
// alignment or the factor's chunking below), and the build does not contract
// a * b + c into FMA (-march=x86-64-v2 has none), so the same inputs give the
// same bits on every rank:
//   factorDots      P[k] = sum_j m[j] qt[k][j]: 8 partial sums (j mod 8, over
//                   whole blocks of 8, ascending), added pairwise, then the
//                   remaining j ascending, added last.
//   accumulateRows  qt[k][j] = qt[k][j] + p_0[k] m_0[j] + p_1[k] m_1[j] + ...,
//                   the rows in order: the same bits whether the rows come in
//                   blocks of 4 or one by one.
//   productRow      a[j] = ((0 + p[0] qt[0][j]) + p[1] qt[1][j]) + ..., k
//                   ascending: the bits of the plain loop the step had before.
// Columns of the factor are taken 8 (factorDots) or 4 at a time, then fewer
// for the rest, so the accumulators stay in registers (AVX2's 16 for 8
// columns) at any r; the bits do not depend on this chunking.
#pragma once

#include <cstddef>

namespace shoal::powersgd::kernels {

constexpr int kLanes = 8;      // partial sums per dot product
constexpr int kFactorStep = 4;  // factor columns per pass over a row
constexpr int kRowBlock = 4;    // rows per pass of accumulateRows

namespace detail {

inline float laneSum(const float* a) { return ((a[0] + a[1]) + (a[2] + a[3])) + ((a[4] + a[5]) + (a[6] + a[7])); }

template <int R>
inline void factorDotsFixed(const float* m, size_t cols, const float* qt, size_t qtStride, float* p) {
  float acc[R][kLanes] = {};
  size_t j = 0;
  for (; j + kLanes <= cols; j += kLanes)
    for (int k = 0; k < R; ++k)
      for (int l = 0; l < kLanes; ++l) acc[k][l] += m[j + l] * qt[k * qtStride + j + l];
  for (int k = 0; k < R; ++k) {
    float tail = 0.0f;
    for (size_t t = j; t < cols; ++t) tail += m[t] * qt[k * qtStride + t];
    p[k] = laneSum(acc[k]) + tail;
  }
}

template <int B>
inline void accumulateRowsFixed(const float* m, size_t cols, const float* p, int r, float* qt) {
  for (int k = 0; k < r; ++k) {
    float c[B];
    for (int b = 0; b < B; ++b) c[b] = p[b * r + k];
    float* out = qt + k * cols;
    for (size_t j = 0; j < cols; ++j) {
      float t = out[j];
      for (int b = 0; b < B; ++b) t += c[b] * m[b * cols + j];
      out[j] = t;
    }
  }
}

template <int R>
inline void productRowFixed(const float* p, const float* qt, size_t cols, bool first, float* a) {
  float c[R];
  for (int k = 0; k < R; ++k) c[k] = p[k];
  for (size_t j = 0; j < cols; ++j) {
    float s = first ? 0.0f : a[j];
    for (int k = 0; k < R; ++k) s += c[k] * qt[k * cols + j];
    a[j] = s;
  }
}

}  // namespace detail

// p[k] = M row m (cols floats) · column k of the factor, for k < r; qt is the
// factor transposed, [r x cols].
inline void factorDots(const float* m, size_t cols, const float* qt, int r, float* p) {
  int k = 0;
  for (; k + 2 * kFactorStep <= r; k += 2 * kFactorStep) detail::factorDotsFixed<8>(m, cols, qt + k * cols, cols, p + k);
  for (; k + kFactorStep <= r; k += kFactorStep) detail::factorDotsFixed<4>(m, cols, qt + k * cols, cols, p + k);
  switch (r - k) {
    case 3: detail::factorDotsFixed<3>(m, cols, qt + k * cols, cols, p + k); break;
    case 2: detail::factorDotsFixed<2>(m, cols, qt + k * cols, cols, p + k); break;
    case 1: detail::factorDotsFixed<1>(m, cols, qt + k * cols, cols, p + k); break;
    default: break;
  }
}

// qt [r x cols] += Mᵀ P over `rows` consecutive rows of M (m, row-major, cols
// floats each) and their rows of P (p, [rows x r]).
inline void accumulateRows(const float* m, size_t rows, size_t cols, const float* p, int r, float* qt) {
  size_t i = 0;
  for (; i + kRowBlock <= rows; i += kRowBlock) detail::accumulateRowsFixed<4>(m + i * cols, cols, p + i * r, r, qt);
  switch (rows - i) {
    case 3: detail::accumulateRowsFixed<3>(m + i * cols, cols, p + i * r, r, qt); break;
    case 2: detail::accumulateRowsFixed<2>(m + i * cols, cols, p + i * r, r, qt); break;
    case 1: detail::accumulateRowsFixed<1>(m + i * cols, cols, p + i * r, r, qt); break;
    default: break;
  }
}

// a [cols] = one row of P Qᵀ: p is the row of P (r floats), qt is Q transposed [r x cols].
inline void productRow(const float* p, const float* qt, int r, size_t cols, float* a) {
  int k = 0;
  for (; k + kFactorStep <= r; k += kFactorStep) detail::productRowFixed<4>(p + k, qt + k * cols, cols, k == 0, a);
  switch (r - k) {
    case 3: detail::productRowFixed<3>(p + k, qt + k * cols, cols, k == 0, a); break;
    case 2: detail::productRowFixed<2>(p + k, qt + k * cols, cols, k == 0, a); break;
    case 1: detail::productRowFixed<1>(p + k, qt + k * cols, cols, k == 0, a); break;
    default: break;
  }
}

// A factor [n x r] (row-major) transposed into its columns [r x n] ...
inline void toColumns(const float* f, size_t n, int r, float* ft) {
  for (size_t j = 0; j < n; ++j)
    for (int k = 0; k < r; ++k) ft[k * n + j] = f[j * r + k];
}

// ... and back.
inline void fromColumns(const float* ft, size_t n, int r, float* f) {
  for (size_t j = 0; j < n; ++j)
    for (int k = 0; k < r; ++k) f[j * r + k] = ft[k * n + j];
}

}  // namespace shoal::powersgd::kernels
