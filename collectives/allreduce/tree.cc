// Tree allreduce: binomial reduce to rank 0, then binomial broadcast.
// 2 log2(n) message latencies instead of the ring's 2(n-1): the choice for
// small messages. Rank 0 reduces in a fixed order and broadcasts its bits, so
// every rank ends with the same result.
#include "collectives/collectives.h"

namespace shoal {

void allreduceTree(Context& context, void* recv, size_t count, const Reducer& reducer) {
  const int n = context.size, r = context.rank;
  const size_t bytes = count * reducer.elementSize();
  if (n > 1) {
    const uint64_t tag = context.reserveTags(1);
    uint8_t* scratch = context.scratch.get(0, bytes);
    // Reduce: in round `mask`, ranks with that bit set send their partial sum to
    // rank - mask and drop out; the others add what rank + mask sends them.
    for (int mask = 1; mask < n; mask <<= 1) {
      if (r & mask) {
        Transport::Request send = context.transport.isend(r - mask, tag, recv, bytes);
        context.wait(send);
        break;
      }
      if (r + mask < n) {
        Transport::Request receive = context.transport.irecv(r + mask, tag, scratch, bytes);
        context.wait(receive);
        reducer.combine(recv, scratch, count);
      }
    }
  }
  if (r == 0) reducer.finish(recv, count, n);
  broadcastTree(context, recv, bytes, 0);
}

}  // namespace shoal
