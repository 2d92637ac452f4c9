// Running one collective call on a communicator: the sequence number, the
// deadline and the abort-on-failure rule every collective shares.
#pragma once

#include "comm/communicator.h"
#include "collectives/collectives.h"

namespace shoal {

// Runs one collective with its call's sequence number and signature
// (comm.call, comm/agree.h). The number is taken at entry, even when the
// arguments are then refused, so that a rank that skips a call can
// never pair its next call with its peers' current one: they see a timeout
// or mismatch instead of a silently wrong result. Any failure aborts the
// communicator (peers are told) and is rethrown.
template <typename Body>
void runCollective(shoal_comm& comm, uint64_t sequence, Body&& body) {
  Context context(*comm.transport, sequence, deadlineAfter(comm.timeoutS), comm.segmentBytes, comm.scratch,
                  currentCallWord(comm));
  try {
    body(context);
    comm.transport->checkNotAborted();
  } catch (const Error& error) {
    if (!comm.transport->failed()) comm.transport->abort(error.what(), error.status());
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

}  // namespace shoal
