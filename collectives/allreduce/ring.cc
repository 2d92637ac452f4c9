// Ring allreduce = ring reduce-scatter + ring allgather (bandwidth-optimal:
// each rank sends 2(n-1)/n of the buffer). For avg, the owner of each block
// divides it once between the two phases, so every rank ends with the same bits.
#include <cstring>

#include "collectives/collectives.h"

namespace shoal {

void allreduceRingOutOfPlace(Context& context, const void* send, void* recv, size_t count, const Reducer& reducer) {
  auto* data = static_cast<uint8_t*>(recv);
  // One tag per segment in each of the two phases.
  Blocks blocks = splitEvenly(count, reducer.elementSize(), context.size, context.segmentBytes,
                              2 * static_cast<uint64_t>(context.size));
  if (context.size == 1 && send != recv) std::memcpy(recv, send, count * reducer.elementSize());
  ringReduceScatter(context, static_cast<const uint8_t*>(send), data, blocks, reducer);
  int own = context.rank;
  reducer.finish(data + blocks.offset[own], blocks.bytes[own] / reducer.elementSize(), context.size);
  ringAllgather(context, data, blocks);
}

void allreduceRing(Context& context, void* recv, size_t count, const Reducer& reducer) {
  allreduceRingOutOfPlace(context, recv, recv, count, reducer);
}

}  // namespace shoal
