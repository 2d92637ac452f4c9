// Binomial-tree broadcast: log2(n) rounds; in each, every rank that has the
// data sends it to one that has not. Ranks are renumbered relative to root.
#include "collectives/collectives.h"

namespace shoal {

void broadcastTree(Context& context, void* buf, size_t bytes, int root) {
  const int n = context.size;
  if (n == 1) return;
  const uint64_t tag = context.reserveTags(1);
  const int relative = (context.rank - root + n) % n;
  auto actual = [&](int rel) { return (rel + root) % n; };
  int mask = 1;
  while (mask < n) {
    if (relative & mask) {
      Transport::Request receive = context.transport.irecv(actual(relative - mask), tag, buf, bytes);
      context.wait(receive);
      break;
    }
    mask <<= 1;
  }
  std::vector<Transport::Request> sends;
  for (mask >>= 1; mask > 0; mask >>= 1)
    if (relative + mask < n) sends.push_back(context.transport.isend(actual(relative + mask), tag, buf, bytes));
  context.waitAll(sends);
}

}  // namespace shoal
