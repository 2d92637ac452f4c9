// Ring allgather, pipelined.
//
// Rank r starts with its own block r in place (the index math is
// collectives/common/ring.h). In step s (0 <= s < n-1) it
// sends block (r-s) to its right neighbour and receives block (r-s-1) from its
// left, straight into its final place. Every receive is posted up front (each
// lands in a different place); a received segment is forwarded in the next
// step at once, so segments stream around the ring.
//
// The steps are a RingAllgatherPhase (collectives/common/ring_phase.h): the
// blocking call runs one to its end; the pipelined hierarchical allreduce
// drives several at once.
#include "collectives/collectives.h"
#include "collectives/common/ring.h"
#include "collectives/common/ring_phase.h"

namespace shoal {

RingAllgatherPhase::RingAllgatherPhase(Context& context, uint8_t* data, const Blocks& blocks)
    : context_(context), data_(data), blocks_(blocks) {
  const int n = context.size;
  if (n == 1) return;  // nothing to wait for: done
  steps_ = n - 1;
  segments_ = blocks.maxSegments();
  firstTag_ = context.reserveTags(static_cast<uint64_t>(steps_) * segments_);
  receives_.resize(steps_);
  for (int step = 0; step < steps_; ++step) {
    const int block = blockReceivedIn(step);
    for (size_t k = 0; k < blocks.segmentsIn(block); ++k)
      receives_[step].push_back(context.transport.irecv(context.left(),
                                                        firstTag_ + static_cast<uint64_t>(step) * segments_ + k,
                                                        data + blocks.segmentBegin(block, k),
                                                        blocks.segmentLength(block, k)));
  }
  sends_.reserve(static_cast<size_t>(steps_) * segments_);  // never moves: awaited_ may point into it
  const int own = ring::allgatherStep(context.rank, n, 0).sendBlock;
  for (size_t k = 0; k < blocks.segmentsIn(own); ++k)
    sends_.push_back(context.transport.isend(context.right(), firstTag_ + k, data + blocks.segmentBegin(own, k),
                                             blocks.segmentLength(own, k)));
  settle();
}

int RingAllgatherPhase::blockReceivedIn(int step) const {
  return ring::allgatherStep(context_.rank, context_.size, step).receiveBlock;
}

void RingAllgatherPhase::settle() {
  while (step_ < steps_ && segment_ == receives_[step_].size()) {
    ++step_;
    segment_ = 0;
  }
  if (step_ < steps_) {
    awaited_ = &receives_[step_][segment_];
    return;
  }
  while (sendsDone_ < sends_.size() && sends_[sendsDone_].done) ++sendsDone_;
  awaited_ = sendsDone_ < sends_.size() ? &sends_[sendsDone_] : nullptr;
}

void RingAllgatherPhase::advance() {
  if (step_ < steps_) {
    // Segment `segment_` of this step's block is in place: pass it on.
    if (step_ + 1 < steps_) {
      const int block = blockReceivedIn(step_);
      sends_.push_back(context_.transport.isend(
          context_.right(), firstTag_ + static_cast<uint64_t>(step_ + 1) * segments_ + segment_,
          data_ + blocks_.segmentBegin(block, segment_), blocks_.segmentLength(block, segment_)));
    }
    ++segment_;
  } else {
    ++sendsDone_;
  }
  settle();
}

void ringAllgather(Context& context, uint8_t* data, const Blocks& blocks) {
  RingAllgatherPhase phase(context, data, blocks);
  runToEnd(context, phase);
}

}  // namespace shoal
