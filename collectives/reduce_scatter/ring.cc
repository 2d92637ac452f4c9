// Ring reduce-scatter, pipelined.
//
// Vocabulary (the index math is collectives/common/ring.h): the buffer has one
// *block* per rank; each block is cut into *segments*. In step s
// (0 <= s < n-1) rank r sends block (r-s-1) to its right neighbour and
// receives block (r-s-2) from its left, adding it into its own copy. After
// n-1 steps block r has passed through every rank: it holds the full
// reduction.
//
// Pipelining: the block received in step s is the block sent in step s+1, so
// each segment is forwarded as soon as it has been added, while later segments
// are still arriving. Receives land in two scratch blocks used alternately, so
// the next step's receives are posted before this step's are consumed.
//
// Out of place, this rank's contribution is read from `input` and every sum is
// written to `data` (no copy of the input first); in place, input == data.
#include "collectives/collectives.h"
#include "collectives/common/ring.h"

namespace shoal {

void ringReduceScatter(Context& context, const uint8_t* input, uint8_t* data, const Blocks& blocks,
                       const Reducer& reducer) {
  const int n = context.size, r = context.rank;
  if (n == 1) return;
  const int steps = n - 1;
  const size_t segments = blocks.maxSegments();
  const uint64_t firstTag = context.reserveTags(static_cast<uint64_t>(steps) * segments);
  auto tagOf = [&](int step, size_t k) { return firstTag + static_cast<uint64_t>(step) * segments + k; };
  auto blockSentIn = [&](int step) { return ring::reduceScatterStep(r, n, step).sendBlock; };
  auto blockReceivedIn = [&](int step) { return ring::reduceScatterStep(r, n, step).receiveBlock; };

  uint8_t* scratch[2] = {context.scratch.get(0, blocks.maxBytes()), context.scratch.get(1, blocks.maxBytes())};
  std::vector<Transport::Request> receives[2];
  std::vector<Transport::Request> sends;
  sends.reserve(static_cast<size_t>(steps) * segments);

  auto postReceives = [&](int step) {
    int block = blockReceivedIn(step);
    std::vector<Transport::Request>& pending = receives[step % 2];
    pending.clear();
    for (size_t k = 0; k < blocks.segmentsIn(block); ++k)
      pending.push_back(context.transport.irecv(context.left(), tagOf(step, k),
                                                scratch[step % 2] + k * blocks.segment,
                                                blocks.segmentLength(block, k)));
  };

  postReceives(0);
  int first = blockSentIn(0);
  for (size_t k = 0; k < blocks.segmentsIn(first); ++k)
    sends.push_back(context.transport.isend(context.right(), tagOf(0, k), input + blocks.segmentBegin(first, k),
                                            blocks.segmentLength(first, k)));

  for (int step = 0; step < steps; ++step) {
    if (step + 1 < steps) postReceives(step + 1);
    int block = blockReceivedIn(step);
    for (size_t k = 0; k < blocks.segmentsIn(block); ++k) {
      context.wait(receives[step % 2][k]);
      size_t length = blocks.segmentLength(block, k);
      uint8_t* mine = data + blocks.segmentBegin(block, k);
      reducer.combineInto(mine, input + blocks.segmentBegin(block, k), scratch[step % 2] + k * blocks.segment,
                          length / reducer.elementSize());
      if (step + 1 < steps) sends.push_back(context.transport.isend(context.right(), tagOf(step + 1, k), mine, length));
    }
  }
  context.waitAll(sends);
}

}  // namespace shoal
