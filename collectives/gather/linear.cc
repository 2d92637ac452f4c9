// Linear gather and scatter: root posts one receive (send) per peer at once
// and waits for all; the others make one send (receive). n-1 messages at the
// root, one latency: shoal's rank counts are small enough that a binomial
// tree's log2(n) forwarding copies would cost more than they save.
#include "collectives/exchange.h"

namespace shoal {

void gatherLinear(Context& context, const void* send, size_t bytes, uint8_t* recv, PeerBlocks recvBlocks, int root) {
  if (context.size == 1) return;
  const uint64_t tag = context.reserveTags(1);
  std::vector<Transport::Request> requests;
  if (context.rank == root) {
    for (int p = 0; p < context.size; ++p)
      if (p != root) requests.push_back(context.transport.irecv(p, tag, recv + recvBlocks.offset[p], recvBlocks.bytes[p]));
  } else {
    requests.push_back(context.transport.isend(root, tag, send, bytes));
  }
  context.waitAll(requests);
}

void scatterLinear(Context& context, const uint8_t* send, PeerBlocks sendBlocks, void* recv, size_t bytes, int root) {
  if (context.size == 1) return;
  const uint64_t tag = context.reserveTags(1);
  std::vector<Transport::Request> requests;
  if (context.rank == root) {
    for (int p = 0; p < context.size; ++p)
      if (p != root) requests.push_back(context.transport.isend(p, tag, send + sendBlocks.offset[p], sendBlocks.bytes[p]));
  } else {
    requests.push_back(context.transport.irecv(root, tag, recv, bytes));
  }
  context.waitAll(requests);
}

}  // namespace shoal
