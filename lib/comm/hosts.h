// The communicator's rank-to-host map and the allreduce choice that uses it.
#pragma once

#include <cstddef>
#include <vector>

#include "comm/communicator.h"
#include "collectives/collectives.h"

namespace shoal {

// Every rank's host (SHOAL_HOST_ID, else host name, boot and network
// namespace), by one allgather at init; sets comm.hosts and comm.hierMinBytes.
void learnHosts(shoal_comm& comm);
// A sub-communicator's map, from its parent's, without communication:
// `members` are the parent ranks of the child, in child rank order.
void inheritHosts(shoal_comm& child, const shoal_comm& parent, const std::vector<int>& members);
// The algorithm an uncompressed allreduce of `bytes` runs: comm.allreduceChoice at this size,
// plus the hierarchical algorithm for `auto` when the layout has one and the message is at
// least SHOAL_HIER_MIN_BYTES; the ring where SHOAL_ALGO=hierarchical meets a layout without one.
const AllreduceAlgorithm& chooseAllreduce(const shoal_comm& comm, size_t bytes);

}  // namespace shoal
