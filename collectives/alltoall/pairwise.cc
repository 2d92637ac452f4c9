// Pairwise-exchange alltoall(v): n-1 steps, in step k rank r sends to r+k and
// receives from r-k. Each step moves one block each way per rank, so links see
// no incast and the receive buffers are written once, directly. The default;
// Bruck (bruck.cc, SHOAL_ALGO=bruck) trades n-1 messages for ceil(log2 n) and
// local copies, for small blocks of one size.
#include <cstring>

#include "collectives/exchange.h"

namespace shoal {

void alltoallvPairwise(Context& context, const uint8_t* send, PeerBlocks sendBlocks, uint8_t* recv,
                       PeerBlocks recvBlocks) {
  const int n = context.size, r = context.rank;
  if (sendBlocks.bytes[r] > 0) std::memcpy(recv + recvBlocks.offset[r], send + sendBlocks.offset[r], sendBlocks.bytes[r]);
  if (n == 1) return;
  // One tag serves every step: a receive names its peer, and each peer sends
  // this rank one message per call.
  const uint64_t tag = context.reserveTags(1);
  std::vector<Transport::Request> requests;
  for (int k = 1; k < n; ++k) {
    const int to = (r + k) % n, from = (r - k + n) % n;
    requests.clear();
    requests.push_back(context.transport.irecv(from, tag, recv + recvBlocks.offset[from], recvBlocks.bytes[from]));
    requests.push_back(context.transport.isend(to, tag, send + sendBlocks.offset[to], sendBlocks.bytes[to]));
    context.waitAll(requests);
  }
}

}  // namespace shoal
