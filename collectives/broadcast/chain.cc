// Pipelined chain broadcast for large messages: root -> root+1 -> ... -> root-1,
// segment by segment, each rank forwarding a segment as soon as it arrives.
// Time ~ bytes/bandwidth + (n-1) x one segment, independent of n for large data.
#include "collectives/collectives.h"

namespace shoal {

void broadcastChain(Context& context, void* buf, size_t bytes, int root) {
  const int n = context.size;
  if (n == 1) return;
  auto* data = static_cast<uint8_t*>(buf);
  const size_t segment = std::max<size_t>(context.segmentBytes, (bytes + kSubTagLimit / 2 - 1) / (kSubTagLimit / 2));
  const size_t segments = (bytes + segment - 1) / segment;
  const uint64_t firstTag = context.reserveTags(std::max<size_t>(segments, 1));
  const int relative = (context.rank - root + n) % n;
  const int previous = (context.rank + n - 1) % n, next = (context.rank + 1) % n;
  const bool forwards = relative + 1 < n;

  std::vector<Transport::Request> receives, sends;
  if (relative != 0)
    for (size_t k = 0; k < segments; ++k)
      receives.push_back(context.transport.irecv(previous, firstTag + k, data + k * segment,
                                                 std::min(segment, bytes - k * segment)));
  for (size_t k = 0; k < segments; ++k) {
    if (relative != 0) context.wait(receives[k]);
    if (forwards)
      sends.push_back(context.transport.isend(next, firstTag + k, data + k * segment,
                                              std::min(segment, bytes - k * segment)));
  }
  context.waitAll(sends);
}

}  // namespace shoal
