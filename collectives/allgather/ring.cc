// Ring allgather, pipelined.
//
// Rank r starts with its own block r in place (the index math is
// collectives/common/ring.h). In step s (0 <= s < n-1) it
// sends block (r-s) to its right neighbour and receives block (r-s-1) from its
// left, straight into its final place. Every receive is posted up front (each
// lands in a different place); a received segment is forwarded in the next
// step at once, so segments stream around the ring.
#include "collectives/collectives.h"
#include "collectives/common/ring.h"

namespace shoal {

void ringAllgather(Context& context, uint8_t* data, const Blocks& blocks) {
  const int n = context.size, r = context.rank;
  if (n == 1) return;
  const int steps = n - 1;
  const size_t segments = blocks.maxSegments();
  const uint64_t firstTag = context.reserveTags(static_cast<uint64_t>(steps) * segments);
  auto tagOf = [&](int step, size_t k) { return firstTag + static_cast<uint64_t>(step) * segments + k; };
  auto blockSentIn = [&](int step) { return ring::allgatherStep(r, n, step).sendBlock; };
  auto blockReceivedIn = [&](int step) { return ring::allgatherStep(r, n, step).receiveBlock; };

  std::vector<std::vector<Transport::Request>> receives(steps);
  for (int step = 0; step < steps; ++step) {
    int block = blockReceivedIn(step);
    for (size_t k = 0; k < blocks.segmentsIn(block); ++k)
      receives[step].push_back(context.transport.irecv(context.left(), tagOf(step, k),
                                                       data + blocks.segmentBegin(block, k),
                                                       blocks.segmentLength(block, k)));
  }
  std::vector<Transport::Request> sends;
  sends.reserve(static_cast<size_t>(steps) * segments);
  int own = blockSentIn(0);
  for (size_t k = 0; k < blocks.segmentsIn(own); ++k)
    sends.push_back(context.transport.isend(context.right(), tagOf(0, k), data + blocks.segmentBegin(own, k),
                                            blocks.segmentLength(own, k)));
  for (int step = 0; step < steps; ++step) {
    int block = blockReceivedIn(step);
    for (size_t k = 0; k < blocks.segmentsIn(block); ++k) {
      context.wait(receives[step][k]);
      if (step + 1 < steps)
        sends.push_back(context.transport.isend(context.right(), tagOf(step + 1, k),
                                                data + blocks.segmentBegin(block, k), blocks.segmentLength(block, k)));
    }
  }
  context.waitAll(sends);
}

}  // namespace shoal
