#include "runtime/cuda_requests.h"

#include <fmt/format.h>

#include "comm/call.h"
#include "gpu/route.h"
#include "plugin/driver.h"
#include "runtime/timeline.h"

namespace shoal::runtime {

void runCudaRequest(shoal_comm& comm, Request& r, Timeline* timeline) {
  const Clock::time_point begin = Clock::now();
  // The sequence number first, as a blocking call's Call takes it: a rank
  // that refuses still takes part in the call's agreement round.
  const uint64_t sequence = takeSequence(comm);
  const size_t count = r.meta.elements();
  const char* phase = "";
  switch (r.meta.kind) {
    case OpKind::Allreduce: {
      // The driver's own path: plain NCCL allreduce, or the compressor when
      // it has SHOAL_CAP_CUDA (refused on every rank otherwise).
      shoal_allreduce_options_t options = SHOAL_ALLREDUCE_OPTIONS_INIT;
      options.name = r.name.c_str();
      options.compressor = r.meta.compressor.c_str();
      options.compressor_options = r.meta.options.c_str();  // resolved at submission: "" is none
      options.compress_min_bytes = r.meta.minBytes;
      allreduceTensor(comm, sequence, r.input, r.output, r.meta.op, &options);
      phase = "CUDA_ALLREDUCE";
      break;
    }
    case OpKind::Allgather: {
      MemoryRoute route = routeOf("shoal_iallgather", {&r.input, &r.output});
      checkCudaReady(comm, "shoal_iallgather", route);
      cudaAllgather(comm, sequence, route, r.input.data, r.output.data, count, r.meta.dtype);
      phase = "CUDA_ALLGATHER";
      break;
    }
    case OpKind::Broadcast: {
      MemoryRoute route = routeOf("shoal_ibroadcast", {&r.output});
      checkCudaReady(comm, "shoal_ibroadcast", route);
      cudaBroadcast(comm, sequence, route, r.output.data, r.output.data, count, r.meta.dtype, r.meta.root);
      phase = "CUDA_BROADCAST";
      break;
    }
    default:  // submission refuses every other kind on CUDA tensors
      fail(SHOAL_ERR_INTERNAL, "async runtime: a {} request on CUDA tensors reached the engine",
           opKindName(r.meta.kind));
  }
  if (timeline != nullptr)
    timeline->span(r.name, phase, begin, Clock::now(), fmt::format("\"bytes\": {}", r.meta.bytes()));
}

}  // namespace shoal::runtime
