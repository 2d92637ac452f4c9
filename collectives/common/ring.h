// The ring's index math, written once for the host ring
// (collectives/reduce_scatter/ring.cc, collectives/allgather/ring.cc) and the
// device ring (lib/gpu/nccl/nccl_comm.cc). Pure functions: tests/unit/test_ring_math.cc
// checks them without a transport.
//
// Vocabulary: the buffer is cut into one *block* per rank, block b owned by
// rank b. Ranks stand in a ring; rank r sends to its right neighbour r+1 and
// receives from its left neighbour r-1 (mod n). Both phases take n-1 steps.
//
//  - Reduce-scatter, step s (0 <= s < n-1): rank r sends block (r-s-1) and
//    receives block (r-s-2), combining it into its own copy of that block.
//    The block received in step s is the one sent in step s+1, so a block
//    collects one more rank's contribution per hop; after n-1 steps block r
//    of rank r holds the full reduction, every rank's contribution in it
//    exactly once. (Rank r combines every block but r-1, which it only sends.)
//  - Allgather, step s: rank r sends block (r-s) and receives block (r-s-1)
//    into place. It starts by sending its own block r; after n-1 steps every
//    rank holds every block.
//
// The split is the same everywhere (the host ring's splitEvenly in
// collectives/common/context.cc uses ringBlock): that is what lets the host and
// device rings agree bit for bit.
#pragma once

#include <cstddef>

namespace shoal::ring {

// value mod size in 0..size-1, also for negative values.
inline int wrap(int value, int size) { return ((value % size) + size) % size; }

inline int leftOf(int rank, int size) { return wrap(rank - 1, size); }
inline int rightOf(int rank, int size) { return wrap(rank + 1, size); }

// The blocks rank `rank` sends right and receives from the left in `step`.
struct Step {
  int sendBlock;
  int receiveBlock;
};

inline Step reduceScatterStep(int rank, int size, int step) {
  return {wrap(rank - step - 1, size), wrap(rank - step - 2, size)};
}

inline Step allgatherStep(int rank, int size, int step) {
  return {wrap(rank - step, size), wrap(rank - step - 1, size)};
}

// Block b of `count` elements split into `size` blocks: the first count % size
// blocks hold one extra element, so blocks differ by at most one element.
struct Block {
  size_t offset;  // elements
  size_t count;
};

inline Block blockOf(size_t count, int size, int block) {
  size_t base = count / static_cast<size_t>(size), extra = count % static_cast<size_t>(size);
  size_t b = static_cast<size_t>(block);
  return {b * base + (b < extra ? b : extra), base + (b < extra ? 1 : 0)};
}

}  // namespace shoal::ring
