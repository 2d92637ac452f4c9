// Bruck's alltoall (Bruck, Ho, Kipnis, Upfal, Weathersby 1997), for blocks
// of one size: ceil(log2 n) rounds instead of pairwise's n-1 steps, at the
// cost of sending each block up to log2 n times and copying it locally
// between rounds. For small blocks, where a message costs its latency rather
// than its bytes, fewer messages can win; for large ones pairwise moves each
// byte once and stays the default (SHOAL_ALGO=bruck asks for this one;
// docs/collectives.md has the measurement commands).
//
// Rank r, n ranks, blocks of B bytes, work buffer W of n blocks:
//   1. rotate: W[j] = the block r sends to rank (r + j) mod n;
//   2. round k = 0, 1, ... while 2^k < n: send every W[j] whose index j has
//      bit k set to rank (r + 2^k) mod n, packed in index order, and receive
//      the same indices' blocks from rank (r - 2^k) mod n into W. A block
//      from rank s to rank s + j moves in exactly the rounds of j's set bits,
//      2^k each time, so after the last round it lies at rank s + j, index j;
//   3. rotate back: the block from rank (r - j) mod n is W[j].
// Any n works, not only powers of two: the rounds' peers 2^k < n are all
// different, so each peer sends this rank one message per call and one tag
// serves every round (as in pairwise).
//
// W is recv itself (send and recv do not overlap: the C API stages the in-place
// form in scratch slot 2); scratch slot 0 holds a round's packed send side
// and then the final rotation's copy, slot 1 the packed receive side.
#include <cstring>
#include <vector>

#include "collectives/exchange.h"
#include "core/error.h"

namespace shoal {

void alltoallBruck(Context& context, const uint8_t* send, PeerBlocks sendBlocks, uint8_t* recv,
                   PeerBlocks recvBlocks) {
  const int n = context.size, r = context.rank;
  const size_t block = sendBlocks.bytes[0];
  for (int p = 0; p < n; ++p)
    if (sendBlocks.bytes[p] != block || recvBlocks.bytes[p] != block)
      fail(SHOAL_ERR_INTERNAL, "alltoall bruck: blocks of different sizes (peer {}: {} and {} bytes, peer 0: {}); "
           "Bruck's algorithm takes one size, pairwise takes any", p, sendBlocks.bytes[p], recvBlocks.bytes[p], block);
  // W[j] lives at recv's block j (recv's own layout, reused as the work buffer).
  auto work = [&](int j) { return recv + recvBlocks.offset[j]; };
  for (int j = 0; j < n; ++j)
    if (block > 0) std::memcpy(work(j), send + sendBlocks.offset[(r + j) % n], block);
  if (n == 1) return;

  const uint64_t tag = context.reserveTags(1);
  std::vector<int> moving;
  std::vector<Transport::Request> requests;
  for (int distance = 1; distance < n; distance *= 2) {
    moving.clear();
    for (int j = 1; j < n; ++j)
      if (j & distance) moving.push_back(j);
    const size_t bytes = moving.size() * block;
    uint8_t* outgoing = context.scratch.get(0, bytes);
    uint8_t* incoming = context.scratch.get(1, bytes);
    for (size_t m = 0; m < moving.size(); ++m)
      if (block > 0) std::memcpy(outgoing + m * block, work(moving[m]), block);
    requests.clear();
    requests.push_back(context.transport.irecv((r - distance + n) % n, tag, incoming, bytes));
    requests.push_back(context.transport.isend((r + distance) % n, tag, outgoing, bytes));
    context.waitAll(requests);
    for (size_t m = 0; m < moving.size(); ++m)
      if (block > 0) std::memcpy(work(moving[m]), incoming + m * block, block);
  }

  // Rotate back: recv block p = W[(r - p) mod n], through a copy of W.
  if (block == 0) return;
  uint8_t* copy = context.scratch.get(0, n * block);
  for (int j = 0; j < n; ++j) std::memcpy(copy + j * block, work(j), block);
  for (int p = 0; p < n; ++p) std::memcpy(recv + recvBlocks.offset[p], copy + ((r - p + n) % n) * block, block);
}

}  // namespace shoal
