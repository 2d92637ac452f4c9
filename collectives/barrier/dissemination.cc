// Dissemination barrier: in round k each rank signals rank + 2^k and waits for
// rank - 2^k. After ceil(log2 n) rounds every rank has heard, transitively,
// from every other: none leaves before all have arrived.
#include "collectives/collectives.h"

namespace shoal {

void barrierDissemination(Context& context) {
  const int n = context.size;
  if (n == 1) return;
  int rounds = 0;
  while ((1 << rounds) < n) ++rounds;
  const uint64_t firstTag = context.reserveTags(rounds);
  uint8_t outgoing = 1;
  for (int k = 0; k < rounds; ++k) {
    uint8_t incoming = 0;
    int distance = 1 << k;
    std::vector<Transport::Request> requests;
    requests.push_back(context.transport.irecv((context.rank - distance % n + n) % n, firstTag + k, &incoming, 1));
    requests.push_back(context.transport.isend((context.rank + distance) % n, firstTag + k, &outgoing, 1));
    context.waitAll(requests);
  }
}

}  // namespace shoal
