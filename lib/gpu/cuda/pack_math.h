// The index arithmetic of the batched pack/unpack copy (pack.cu), shared
// with its CPU test (tests/unit/test_pack_math.cc): __host__ __device__ under
// nvcc (SHOAL_HD), plain inline C++ otherwise.
//
// Entries are the tensors in packed order; entry e occupies the packed bytes
// [end(e - 1), end(e)) with end(-1) = 0 (zero-size entries have
// end(e - 1) == end(e)). The packed bytes are cut into chunks; each chunk
// copies the pieces of the entries it overlaps.
#pragma once

#include <cstddef>

#include "core/numeric/element_ops.h"  // SHOAL_HD

namespace shoal::cuda {

// The first entry whose end lies beyond `offset` (count when none): where a
// chunk starting at `offset` begins. table[i].end must be non-decreasing.
template <typename Table>
SHOAL_HD inline size_t firstEntryEndingAfter(const Table& table, size_t count, size_t offset) {
  size_t low = 0, high = count;
  while (low < high) {
    size_t middle = low + (high - low) / 2;
    if (table[middle].end <= offset) low = middle + 1;
    else high = middle;
  }
  return low;
}

// The part of the entry [entryStart, entryEnd) inside the chunk [chunkStart, chunkEnd).
struct Piece {
  size_t offsetInEntry;
  size_t bytes;  // 0 when they do not overlap
};

SHOAL_HD inline Piece pieceOf(size_t entryStart, size_t entryEnd, size_t chunkStart, size_t chunkEnd) {
  const size_t start = entryStart > chunkStart ? entryStart : chunkStart;
  const size_t end = entryEnd < chunkEnd ? entryEnd : chunkEnd;
  if (end <= start) return Piece{0, 0};
  return Piece{start - entryStart, end - start};
}

}  // namespace shoal::cuda
