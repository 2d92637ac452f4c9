// The ring schedule of shoal's own device allreduce (nccl_comm.cc): which
// block a rank sends and receives at each step. Pure functions, unit-tested
// on the CPU (tests/unit/test_gpu_routing.cc), the same rule as the host ring
// (collectives/reduce_scatter/ring.cc, collectives/allgather/ring.cc).
//
// The buffer has one block per rank. Reduce-scatter, step s (0 <= s < n-1):
// rank r sends block (r-s-1) right and receives block (r-s-2) from the left,
// combining it into its own copy; afterwards block r of rank r is reduced.
// Allgather, step s: rank r sends block (r-s) right and receives block (r-s-1)
// from the left into place; afterwards every rank holds every block.
#pragma once

#include <cstddef>

namespace shoal::nccl {

struct RingStep {
  int sendBlock;
  int receiveBlock;
};

inline int ringMod(int value, int size) { return ((value % size) + size) % size; }

inline RingStep reduceScatterStep(int rank, int size, int step) {
  return {ringMod(rank - step - 1, size), ringMod(rank - step - 2, size)};
}

inline RingStep allgatherStep(int rank, int size, int step) {
  return {ringMod(rank - step, size), ringMod(rank - step - 1, size)};
}

// Block b of `count` elements split into `size` blocks: the first count % size
// blocks hold one extra element (as splitEvenly does for the host ring).
struct BlockRange {
  size_t offset;  // elements
  size_t count;
};

inline BlockRange ringBlock(size_t count, int size, int block) {
  size_t base = count / size, extra = count % size, b = static_cast<size_t>(block);
  return {b * base + (b < extra ? b : extra), base + (b < extra ? 1 : 0)};
}

}  // namespace shoal::nccl
