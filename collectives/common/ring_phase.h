// The ring's two phases as objects that move one wait at a time, so that a
// caller can drive several at once on one thread: the pipelined hierarchical
// allreduce (collectives/allreduce/hierarchical.cc) reduce-scatters one chunk
// inside the host while the previous one crosses hosts. The blocking ring
// functions (ringReduceScatter, ringAllgather) run one phase to its end, so
// the ring's steps are written once, here and in the two ring.cc files.
//
// A phase reserves its tags when it is made, posts what it can, and then
// names the one request it needs next (awaited()). Once that request is
// complete (the caller waited on it), advance() does the work it unblocks
// (reduce a segment, forward it) and names the next. A phase is done when it
// awaits nothing. The context, buffers and blocks must outlive the phase.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "collectives/common/context.h"
#include "collectives/common/reducer.h"

namespace shoal {

class RingPhase {
 public:
  virtual ~RingPhase() = default;
  // The request this phase waits for next; null once it is done.
  Transport::Request* awaited() const { return awaited_; }
  bool done() const { return awaited_ == nullptr; }
  // Called once *awaited() is complete.
  virtual void advance() = 0;

 protected:
  Transport::Request* awaited_ = nullptr;
};

// Waits for a phase's requests one after another until it is done.
inline void runToEnd(Context& context, RingPhase& phase) {
  while (!phase.done()) {
    context.wait(*phase.awaited());
    phase.advance();
  }
}

// Ring reduce-scatter (collectives/reduce_scatter/ring.cc). Received segments
// land in two scratch blocks, the context's slots `firstSlot` and
// `firstSlot + 1`: phases that run at once must use different slots.
class RingReduceScatterPhase final : public RingPhase {
 public:
  RingReduceScatterPhase(Context& context, const uint8_t* input, uint8_t* data, const Blocks& blocks,
                         const Reducer& reducer, int firstSlot = 0);
  void advance() override;

 private:
  int blockReceivedIn(int step) const;
  void postReceives(int step);
  void settle();  // finds the next request to wait for

  Context& context_;
  const uint8_t* input_;
  uint8_t* data_;
  const Blocks& blocks_;
  const Reducer& reducer_;
  int steps_ = 0;
  size_t segments_ = 0;
  uint64_t firstTag_ = 0;
  uint8_t* scratch_[2] = {nullptr, nullptr};
  std::vector<Transport::Request> receives_[2];
  std::vector<Transport::Request> sends_;
  int step_ = 0;
  size_t segment_ = 0;    // the next segment of step_'s block to combine
  size_t sendsDone_ = 0;  // once every step is done: sends known complete
};

// Ring allgather (collectives/allgather/ring.cc): no scratch.
class RingAllgatherPhase final : public RingPhase {
 public:
  RingAllgatherPhase(Context& context, uint8_t* data, const Blocks& blocks);
  void advance() override;

 private:
  int blockReceivedIn(int step) const;
  void settle();

  Context& context_;
  uint8_t* data_;
  const Blocks& blocks_;
  int steps_ = 0;
  size_t segments_ = 0;
  uint64_t firstTag_ = 0;
  std::vector<std::vector<Transport::Request>> receives_;
  std::vector<Transport::Request> sends_;
  int step_ = 0;
  size_t segment_ = 0;
  size_t sendsDone_ = 0;
};

}  // namespace shoal
