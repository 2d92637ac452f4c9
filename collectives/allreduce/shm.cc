// Allreduce, broadcast and barrier through the communicator's shared-memory
// segment (lib/transport/shm/segment.h), for ranks that all share one host.
// A call of more bytes than a slot holds runs in pieces, one round each.
//
// Every rank reduces every rank's slot itself, always in rank order
// (((x0 op x1) op x2) ...), so all ranks get the same bits, also for floats
// and ops that are not associative in floating point.
//
// These algorithms mark the context's sharedSegmentOnly: the call's end-of-call
// check for peers that gave up is then the segment's abort word, which every
// rank that gives up on a call writes, instead of the transport's (a UCX
// progress call, a third of a small call's cost on one host).
#include <algorithm>
#include <cstring>

#include "collectives/collectives.h"
#include "transport/shm/segment.h"

namespace shoal {
namespace {

SharedSegment& segmentOf(Context& context) {
  if (context.shm == nullptr)
    fail(SHOAL_ERR_INVALID_ARGUMENT,
         "the shared-memory algorithm needs every rank on one host and a shared segment (SHOAL_SHM_MAX_BYTES > 0); "
         "this communicator has none: use SHOAL_ALGO=auto");
  return *context.shm;
}

}  // namespace

void allreduceShmOutOfPlace(Context& context, const void* send, void* recv, size_t count, const Reducer& reducer) {
  SharedSegment& shm = segmentOf(context);
  const size_t element = reducer.elementSize();
  const auto* in = static_cast<const uint8_t*>(send);
  auto* out = static_cast<uint8_t*>(recv);
  // One round: elements [first, first + n).
  auto round = [&](size_t first, size_t n) {
    uint8_t* piece = out + first * element;
    // The input goes straight into this rank's slot: out of place there is
    // no copy into recv first (every rank reduces from the slots).
    shm.exchange({context.tagBase, count, first, "allreduce"}, in + first * element, n * element,
                 context.transport, context.deadline);
    if (context.size == 1) {
      if (piece != in + first * element) std::memcpy(piece, in + first * element, n * element);
      return;
    }
    reducer.combineInto(piece, shm.peerData(0), shm.peerData(1), n);
    for (int r = 2; r < context.size; ++r) reducer.combine(piece, shm.peerData(r), n);
  };
  if (count * element <= shm.slotBytes()) {  // the call fits the slot: one round, no division
    if (count > 0) round(0, count);
  } else {
    const size_t perRound = std::max<size_t>(1, shm.slotBytes() / element);
    for (size_t first = 0; first < count; first += perRound) round(first, std::min(perRound, count - first));
  }
  reducer.finish(recv, count, context.size);
  context.sharedSegmentOnly = count > 0;
}

void allreduceShm(Context& context, void* recv, size_t count, const Reducer& reducer) {
  allreduceShmOutOfPlace(context, recv, recv, count, reducer);
}

void broadcastShm(Context& context, void* buf, size_t bytes, int root) {
  SharedSegment& shm = segmentOf(context);
  auto* data = static_cast<uint8_t*>(buf);
  const bool isRoot = context.rank == root;
  for (size_t first = 0; first < bytes; first += shm.slotBytes()) {
    const size_t n = std::min(shm.slotBytes(), bytes - first);
    shm.exchange({context.tagBase, bytes, first, "broadcast"}, isRoot ? data + first : nullptr, n,
                 context.transport, context.deadline);
    if (!isRoot) std::memcpy(data + first, shm.peerData(root), n);
  }
  context.sharedSegmentOnly = bytes > 0;
}

void barrierShm(Context& context) {
  segmentOf(context).exchange({context.tagBase, 0, 0, "barrier"}, nullptr, 0, context.transport, context.deadline);
  context.sharedSegmentOnly = true;
}

}  // namespace shoal
