// The async runtime's alltoall (shoal_ialltoall; Horovod's alltoall in its
// background thread): run by the engine like any other ready request, in the
// negotiated order, on the engine thread.
#pragma once

#include <vector>

#include "comm/agree.h"
#include "runtime/request.h"

struct shoal_comm;

namespace shoal::runtime {

class Timeline;

// Runs one alltoall request and fills its recvcounts and received data;
// throws on failure (the engine completes the request either way). The even
// form (OpKind::Alltoall) needs no count exchange: every rank submitted the
// same shape. The per-peer form (OpKind::Alltoallv) first exchanges every
// pair's counts in a small alltoall, so the received sizes are known (and
// agree by construction) before the data moves.
void runAlltoall(shoal_comm& comm, Request& request, Timeline* timeline);

// Its pieces, shared with the CUDA form (runtime/cuda_requests.h): the call's
// signature (for a CallScope), and the elements this rank receives from each
// rank (the per-peer form's count exchange takes a sequence number).
CallSignature alltoallSignature(const Request& request, int size);
std::vector<size_t> alltoallRecvCounts(shoal_comm& comm, const Request& request);

}  // namespace shoal::runtime
