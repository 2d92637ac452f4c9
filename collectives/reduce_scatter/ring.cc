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
//
// The steps are a RingReduceScatterPhase (collectives/common/ring_phase.h):
// the blocking call runs one to its end; the pipelined hierarchical allreduce
// drives several at once.
#include "collectives/collectives.h"
#include "collectives/common/ring.h"
#include "collectives/common/ring_phase.h"

namespace shoal {

RingReduceScatterPhase::RingReduceScatterPhase(Context& context, const uint8_t* input, uint8_t* data,
                                               const Blocks& blocks, const Reducer& reducer, int firstSlot)
    : context_(context), input_(input), data_(data), blocks_(blocks), reducer_(reducer) {
  const int n = context.size;
  if (n == 1) return;  // nothing to wait for: done
  steps_ = n - 1;
  segments_ = blocks.maxSegments();
  firstTag_ = context.reserveTags(static_cast<uint64_t>(steps_) * segments_);
  scratch_[0] = context.scratch.get(firstSlot, blocks.maxBytes());
  scratch_[1] = context.scratch.get(firstSlot + 1, blocks.maxBytes());
  sends_.reserve(static_cast<size_t>(steps_) * segments_);  // never moves: awaited_ may point into it

  postReceives(0);
  const int first = ring::reduceScatterStep(context.rank, n, 0).sendBlock;
  for (size_t k = 0; k < blocks.segmentsIn(first); ++k)
    sends_.push_back(context.transport.isend(context.right(), firstTag_ + k, input + blocks.segmentBegin(first, k),
                                             blocks.segmentLength(first, k)));
  if (steps_ > 1) postReceives(1);
  settle();
}

int RingReduceScatterPhase::blockReceivedIn(int step) const {
  return ring::reduceScatterStep(context_.rank, context_.size, step).receiveBlock;
}

void RingReduceScatterPhase::postReceives(int step) {
  const int block = blockReceivedIn(step);
  std::vector<Transport::Request>& pending = receives_[step % 2];
  pending.clear();
  for (size_t k = 0; k < blocks_.segmentsIn(block); ++k)
    pending.push_back(context_.transport.irecv(context_.left(), firstTag_ + static_cast<uint64_t>(step) * segments_ + k,
                                               scratch_[step % 2] + k * blocks_.segment,
                                               blocks_.segmentLength(block, k)));
}

void RingReduceScatterPhase::settle() {
  // A step begins by posting the next step's receives, as its segments arrive.
  while (step_ < steps_ && segment_ == blocks_.segmentsIn(blockReceivedIn(step_))) {
    ++step_;
    segment_ = 0;
    if (step_ + 1 < steps_) postReceives(step_ + 1);
  }
  if (step_ < steps_) {
    awaited_ = &receives_[step_ % 2][segment_];
    return;
  }
  while (sendsDone_ < sends_.size() && sends_[sendsDone_].done) ++sendsDone_;
  awaited_ = sendsDone_ < sends_.size() ? &sends_[sendsDone_] : nullptr;
}

void RingReduceScatterPhase::advance() {
  if (step_ < steps_) {
    // Segment `segment_` of this step's block arrived: add it in, and forward
    // the sum in the next step.
    const int block = blockReceivedIn(step_);
    const size_t length = blocks_.segmentLength(block, segment_);
    uint8_t* mine = data_ + blocks_.segmentBegin(block, segment_);
    reducer_.combineInto(mine, input_ + blocks_.segmentBegin(block, segment_),
                         scratch_[step_ % 2] + segment_ * blocks_.segment, length / reducer_.elementSize());
    if (step_ + 1 < steps_)
      sends_.push_back(context_.transport.isend(
          context_.right(), firstTag_ + static_cast<uint64_t>(step_ + 1) * segments_ + segment_, mine, length));
    ++segment_;
  } else {
    ++sendsDone_;
  }
  settle();
}

void ringReduceScatter(Context& context, const uint8_t* input, uint8_t* data, const Blocks& blocks,
                       const Reducer& reducer) {
  RingReduceScatterPhase phase(context, input, data, blocks, reducer);
  runToEnd(context, phase);
}

}  // namespace shoal
