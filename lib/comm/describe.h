// The communicator summary SHOAL_LOG_LEVEL=info prints once per communicator
// on every rank (what NCCL_DEBUG=INFO users look for): version, rank, size
// and host, what the transport chose per peer, the algorithm thresholds, the
// compressor and the options in force. See docs/diagnostics.md.
#pragma once

struct shoal_comm;

namespace shoal {

void describeCommunicator(shoal_comm& comm, const char* storeUrl);

}  // namespace shoal
