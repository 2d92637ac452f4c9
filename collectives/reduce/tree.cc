// Binomial-tree reduce: ranks renumbered relative to root; in round `mask`, a
// rank with that bit set sends its partial result to relative - mask and
// drops out, the others combine what relative + mask sends them. log2(n)
// message latencies; every byte crosses log2(n) links (no pipelining: the
// choice for small and medium messages, docs/collectives.md).
#include <cstring>

#include "collectives/exchange.h"

namespace shoal {

void reduceTree(Context& context, const void* send, void* recv, size_t count, const Reducer& reducer, int root) {
  const int n = context.size;
  const size_t bytes = count * reducer.elementSize();
  const int relative = (context.rank - root + n) % n;
  auto actual = [&](int rel) { return (rel + root) % n; };
  // The partial result: in recv on root, in scratch elsewhere. A leaf sends
  // its input unchanged and needs none.
  const bool leaf = (relative & 1) || relative + 1 >= n;
  const uint8_t* partial = static_cast<const uint8_t*>(send);
  uint8_t* accumulator = nullptr;
  if (!leaf || context.rank == root) {
    accumulator = context.rank == root ? static_cast<uint8_t*>(recv) : context.scratch.get(1, bytes);
    if (accumulator != send && bytes > 0) std::memcpy(accumulator, send, bytes);
    partial = accumulator;
  }
  if (n > 1) {
    const uint64_t tag = context.reserveTags(1);
    uint8_t* incoming = context.scratch.get(0, bytes);
    for (int mask = 1; mask < n; mask <<= 1) {
      if (relative & mask) {
        Transport::Request message = context.transport.isend(actual(relative - mask), tag, partial, bytes);
        context.wait(message);
        break;
      }
      if (relative + mask < n) {
        Transport::Request message = context.transport.irecv(actual(relative + mask), tag, incoming, bytes);
        context.wait(message);
        reducer.combine(accumulator, incoming, count);
      }
    }
  }
  if (context.rank == root) reducer.finish(recv, count, n);
}

}  // namespace shoal
