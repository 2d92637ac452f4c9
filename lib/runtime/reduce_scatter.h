// The async runtime's reduce-scatter (shoal_ireduce_scatter; Horovod's
// reducescatter in its background thread): run by the engine like any other
// ready request, in the negotiated order, on the engine thread, through the
// host ring reduce-scatter the blocking shoal_reduce_scatter runs. Not fused.
//
// Rank r's share is a run of dim-0 rows of the input, as shoal.torch (and
// Horovod) split it: rows / size each, one more on the first rows % size
// ranks. The even form of shoal_reduce_scatter (rows a multiple of the world
// size) is the case with no remainder.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "runtime/request.h"

struct shoal_comm;

namespace shoal::runtime {

class Timeline;

struct RowShare {
  size_t first = 0;  // its first row
  size_t rows = 0;
};

// Rank `rank`'s rows of `rows` split over `size` ranks.
RowShare shareOf(size_t rows, int size, int rank);

// Elements per dim-0 row of a shape (1 for a 1-D shape; the shape has at
// least one dimension).
size_t rowElements(const std::vector<int64_t>& shape);

// Every rank's share in elements (index = rank), for the ring's blocks.
std::vector<size_t> shareCounts(const Metadata& meta, int size);

// Runs one reduce-scatter request: reduces its input over every rank and
// writes this rank's share into its output; throws on failure (the engine
// completes the request either way).
void runReduceScatter(shoal_comm& comm, Request& request, Timeline* timeline);

}  // namespace shoal::runtime
