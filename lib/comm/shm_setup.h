// Init-time pieces for the first calls to be fast: the shared-memory segment
// of a communicator whose ranks share one host, and a warm-up that wires the
// endpoints and faults in the scratch buffers the small and medium
// algorithms use (UCX connects lazily; fresh pages fault on first touch).
#pragma once

#include <cstddef>

struct shoal_comm;

namespace shoal {

// The segment's slot size, the largest call that auto sends through it:
// SHOAL_SHM_MAX_BYTES, or under "auto" a size chosen by the rank count.
size_t sharedSlotBytes(int ranks);

// Opens comm.shm (every rank calls it at init; the same outcome on every
// rank). SHOAL_ALGO=shm without a segment fails here, saying why.
void attachSharedSegment(shoal_comm& comm);
// A few internal collectives on every rank (collective: every rank calls it).
void warmUp(shoal_comm& comm);

}  // namespace shoal
