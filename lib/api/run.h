// Running one collective call on a communicator: the pieces shared by the C
// entry points (collectives_api.cc) and the compressed-collective driver.
#pragma once

#include "api/comm.h"
#include "collectives/collectives.h"

namespace shoal {

// Runs one collective with its call's sequence number and signature
// (comm.call, api/agree.h). The number is taken at entry, even when the
// arguments are then refused, so that a rank that skips a call can
// never pair its next call with its peers' current one: they see a timeout
// or mismatch instead of a silently wrong result. Any failure aborts the
// communicator (peers are told) and is rethrown.
template <typename Body>
void runCollective(shoal_comm& comm, uint64_t sequence, Body&& body) {
  Context context(*comm.transport, sequence, deadlineAfter(comm.timeoutS), comm.segmentBytes, comm.scratch,
                  currentCallWord(comm));
  context.shm = comm.shm.get();
  try {
    body(context);
    comm.transport->checkNotAborted();
  } catch (const Error& error) {
    if (!comm.transport->failed()) comm.transport->abort(error.what(), error.status());
    if (comm.shm) comm.shm->abort(error.what(), error.status());  // peers waiting in shared memory
    throw;
  }
}

// A call with nothing to move still exchanges empty messages along a tree, so
// a rank whose peers passed a non-zero count fails with them instead of
// returning success alone.
inline void emptyCall(shoal_comm& comm, uint64_t sequence) {
  runCollective(comm, sequence, [](Context& context) {
    uint8_t unused = 0;
    allreduceTree(context, &unused, 0, Reducer(SHOAL_U8, SHOAL_SUM));
  });
}

// The uncompressed allreduce of count elements (send may equal recv).
void plainAllreduce(shoal_comm& comm, uint64_t sequence, const void* send, void* recv, size_t count,
                    shoal_dtype_t dtype, shoal_op_t op);
// The same with the algorithm already chosen (selectAllreduce).
void plainAllreduce(shoal_comm& comm, uint64_t sequence, const AllreduceAlgorithm& algorithm, const void* send,
                    void* recv, size_t count, shoal_dtype_t dtype, shoal_op_t op);
// Every rank's count (one host allgather): fills counts and packed
// displacements (elements), returns the total.
size_t gatherCounts(shoal_comm& comm, size_t count, std::vector<size_t>& counts, std::vector<size_t>& displs);
// Allgatherv of this rank's `count` elements into `gathered` (resized), with
// every rank's count and displacement (in elements).
void allgathervBytes(shoal_comm& comm, const void* send, size_t count, shoal_dtype_t dtype,
                     std::vector<uint8_t>& gathered, std::vector<size_t>& counts, std::vector<size_t>& displs);

}  // namespace shoal
