// Ring allreduce = ring reduce-scatter + ring allgather (bandwidth-optimal:
// each rank sends 2(n-1)/n of the buffer). For avg, the owner of each block
// divides it once between the two phases, so every rank ends with the same bits.
#include "collectives/collectives.h"

namespace shoal {

void allreduceRing(Context& context, void* recv, size_t count, const Reducer& reducer) {
  auto* data = static_cast<uint8_t*>(recv);
  // One tag per segment in each of the two phases.
  Blocks blocks = splitEvenly(count, reducer.elementSize(), context.size, context.segmentBytes,
                              2 * static_cast<uint64_t>(context.size));
  ringReduceScatter(context, data, blocks, reducer);
  int own = context.rank;
  reducer.finish(data + blocks.offset[own], blocks.bytes[own] / reducer.elementSize(), context.size);
  ringAllgather(context, data, blocks);
}

}  // namespace shoal
