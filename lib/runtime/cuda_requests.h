// Async requests on CUDA tensors (docs/gpu.md, "Async requests on CUDA
// tensors"): negotiated like host requests (the memory kind is part of the
// agreed metadata), never fused, and run one by one on the engine thread
// through the same CUDA paths as the blocking tensor calls: one host round in
// which every rank says whether it can run the call, then NCCL on the
// tensor's stream, waited for before the request completes.
#pragma once

#include "runtime/request.h"

struct shoal_comm;

namespace shoal::runtime {

class Timeline;

inline bool onCuda(const Request& request) { return request.meta.memory == SHOAL_MEMORY_CUDA; }

// Runs one CUDA request (allreduce, allgather, broadcast, reduce-scatter or
// alltoall(v): what arrives is then device memory the request holds) and throws on
// failure, with every rank's refusal reaching every rank; the caller
// completes the request.
void runCudaRequest(shoal_comm& comm, Request& request, Timeline* timeline);

}  // namespace shoal::runtime
