// The host collectives by name, as the layers above call them (the C entry
// points, the compressed-collective driver, the async runtime, the low-rank
// plan): each picks its algorithm from its table and runs it as one call.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "collectives/collectives.h"
#include "comm/communicator.h"

namespace shoal {

// The uncompressed allreduce of count elements (send may equal recv). Returns
// the name of the algorithm that ran, for the debug log and the trace:
// "aggregate" where SHOAL_ALGO=aggregate took the call, else the algorithm's.
const char* plainAllreduce(shoal_comm& comm, uint64_t sequence, const void* send, void* recv, size_t count,
                           shoal_dtype_t dtype, shoal_op_t op);
// The same with the algorithm already chosen (chooseAllreduce).
const char* plainAllreduce(shoal_comm& comm, uint64_t sequence, const AllreduceAlgorithm& algorithm, const void* send,
                           void* recv, size_t count, shoal_dtype_t dtype, shoal_op_t op);
// Every rank's count (one host allgather): fills counts and packed
// displacements (elements), returns the total.
size_t gatherCounts(shoal_comm& comm, size_t count, std::vector<size_t>& counts, std::vector<size_t>& displs);
// Allgatherv of this rank's `count` elements into `gathered` (resized), with
// every rank's count and displacement (in elements).
void allgathervBytes(shoal_comm& comm, const void* send, size_t count, shoal_dtype_t dtype,
                     std::vector<uint8_t>& gathered, std::vector<size_t>& counts, std::vector<size_t>& displs);

// A compressor's payload collectives over a view of some of the
// communicator's ranks (`group`, a GroupTransport: the hierarchical
// compressed allreduce's cross-host leg, collectives/allreduce/hierarchical.h).
// The allreduce runs the flat algorithm SHOAL_ALGO names (ring, tree,
// doubling), else the one auto picks for the group's size; both take their
// sequence numbers from comm.sequence, as the whole communicator's do.
void groupAllreduce(shoal_comm& comm, Transport& group, void* buffer, size_t count, shoal_dtype_t dtype,
                    shoal_op_t op);
void groupAllgatherv(shoal_comm& comm, Transport& group, const void* send, size_t count, shoal_dtype_t dtype,
                     std::vector<uint8_t>& gathered, std::vector<size_t>& counts, std::vector<size_t>& displs);

// SHOAL_ALGO=aggregate: the allreduce through the communicator's aggregators
// (shoal-aggd, lib/aggregate; connected on first use).
void aggregateAllreduce(shoal_comm& comm, uint64_t sequence, const void* send, void* recv, size_t count,
                        shoal_dtype_t dtype, shoal_op_t op);

}  // namespace shoal
