// Per-element logic of the topk compressor, shared by the host code (topk.cc)
// and a later CUDA kernel: everything here is __host__ __device__ under nvcc
// (SHOAL_HD, from collectives/common/element_ops.h) and plain inline C++
// otherwise. No allocation, no standard containers.
//
// Order of selection: a strict total order on (value, index) pairs,
//   larger magnitude first, then lower index.
// Magnitude is compared through an integer key: the value's bits without the
// sign bit. For IEEE floats that integer order is the order of |x| (+0 and -0
// share key 0, +inf has the largest non-NaN key). Every NaN, whatever its sign
// or payload, gets one key just above +inf: NaN counts as the largest
// magnitude (a NaN in a gradient is sent, not hidden in the residual), and
// NaNs among themselves go by index like any tie.
//
// Wire format of one selected element: two 64-bit words,
//   word 0: the element's index, global across the call's tensors (tensor t's
//           element i is offset(t) + i, offsets being the running sum of the
//           tensors' element counts in call order);
//   word 1: the value's bits: an f32's 32 bits in the low half (high half 0),
//           or an f64's 64 bits.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>

#include "core/numeric/element_ops.h"  // SHOAL_HD

namespace shoal::topk {

// The magnitude key of a value; see above.
SHOAL_HD inline uint32_t magnitudeKey(float value) {
  uint32_t bits;
  std::memcpy(&bits, &value, sizeof bits);
  bits &= 0x7fffffffu;
  return bits > 0x7f800000u ? 0x7f800001u : bits;
}

SHOAL_HD inline uint64_t magnitudeKey(double value) {
  uint64_t bits;
  std::memcpy(&bits, &value, sizeof bits);
  bits &= 0x7fffffffffffffffull;
  return bits > 0x7ff0000000000000ull ? 0x7ff0000000000001ull : bits;
}

// True when (keyA, indexA) is selected before (keyB, indexB): a strict total
// order on distinct indices, so selection never depends on the sort algorithm.
template <typename Key, typename Index>
SHOAL_HD inline bool selectedBefore(Key keyA, Index indexA, Key keyB, Index indexB) {
  return keyA > keyB || (keyA == keyB && indexA < indexB);
}

// For f32 and indices below 2^32: one 64-bit word whose unsigned order is the
// selection order (a larger word is selected first): the magnitude key in the
// high half, the complement of the index in the low half. Lets a selection
// compare plain integers (std::nth_element, or a radix select on a GPU).
SHOAL_HD inline uint64_t selectionWord(float value, uint32_t index) {
  return (static_cast<uint64_t>(magnitudeKey(value)) << 32) | static_cast<uint64_t>(~index);
}
SHOAL_HD inline uint32_t selectionIndex(uint64_t word) { return ~static_cast<uint32_t>(word); }

// The word that carries a value (word 1 of a pair).
SHOAL_HD inline uint64_t valueWord(float value) {
  uint32_t bits;
  std::memcpy(&bits, &value, sizeof bits);
  return bits;
}

SHOAL_HD inline uint64_t valueWord(double value) {
  uint64_t bits;
  std::memcpy(&bits, &value, sizeof bits);
  return bits;
}

// The value a word carries, as T (float or double).
template <typename T>
SHOAL_HD inline T wordValue(uint64_t word);

template <>
SHOAL_HD inline float wordValue<float>(uint64_t word) {
  uint32_t bits = static_cast<uint32_t>(word);
  float value;
  std::memcpy(&value, &bits, sizeof value);
  return value;
}

template <>
SHOAL_HD inline double wordValue<double>(uint64_t word) {
  double value;
  std::memcpy(&value, &word, sizeof value);
  return value;
}

// Writes one pair at pair[0], pair[1].
template <typename T>
SHOAL_HD inline void packPair(uint64_t* pair, uint64_t globalIndex, T value) {
  pair[0] = globalIndex;
  pair[1] = valueWord(value);
}

// The tensor that global index `index` belongs to, for a decoder that finds
// it per pair (the CUDA one): the last t with table[t].first <= index, which
// passes over zero-size tensors (their first equals the next one's). table[t].first
// ascends with t (the running offsets); index must lie below the total.
template <typename Table>
SHOAL_HD inline int tensorOfIndex(const Table& table, int tensors, uint64_t index) {
  int low = 0, high = tensors - 1;
  while (low < high) {
    int middle = low + (high - low + 1) / 2;
    if (table[middle].first <= index) low = middle;
    else high = middle - 1;
  }
  return low;
}

}  // namespace shoal::topk
