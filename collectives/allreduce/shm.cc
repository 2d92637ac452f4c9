// Allreduce, broadcast and barrier through the communicator's shared-memory
// segment (lib/transport/shm/segment.h), for ranks that all share one host.
// A call of more bytes than a slot holds runs in pieces, one round each (two
// in the reduce-scatter form below).
//
// Every element is reduced in rank order (((x0 op x1) op x2) ...), so all
// ranks get the same bits, also for floats and ops that are not associative
// in floating point. Small pieces: every rank reduces all slots itself (one
// round). Larger pieces at N >= 3: a reduce-scatter in the segment, each rank
// reducing only its share (1/N, in the same rank order) into its slot of the
// next round, then copying every rank's reduced share: N times less
// arithmetic for a second round per piece.
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

// Pieces of at least this many bytes take the reduce-scatter form at N >= 3.
// Below it the second round costs more than the arithmetic it saves.
constexpr size_t kScatterMinBytes = 16 << 10;

// Rank `rank`'s share of a piece of n elements: whole cache lines (`unit`
// elements each) split as evenly as they go, the last share ending at n.
struct Share {
  size_t first;
  size_t count;
};
Share shareOf(int rank, int size, size_t n, size_t unit) {
  const size_t units = (n + unit - 1) / unit;
  const size_t each = units / size, extra = units % size, r = static_cast<size_t>(rank);
  const size_t firstUnit = r * each + std::min(r, extra);
  const size_t begin = std::min(n, firstUnit * unit), end = std::min(n, (firstUnit + each + (r < extra)) * unit);
  return {begin, end - begin};
}

// One round: every rank reduces every slot, elements [first, first + n) of a call of `count`.
inline void reduceAllSlots(Context& context, SharedSegment& shm, const uint8_t* in, uint8_t* out, size_t count,
                           size_t first, size_t n, const Reducer& reducer) {
  const size_t element = reducer.elementSize();
  uint8_t* piece = out + first * element;
  // The input goes straight into this rank's slot: out of place there is
  // no copy into recv first (every rank reduces from the slots).
  shm.exchange({context.tagBase, count, first, "allreduce"}, in + first * element, n * element, context.transport,
               context.deadline);
  if (context.size == 1) {
    if (piece != in + first * element) std::memcpy(piece, in + first * element, n * element);
    return;
  }
  reducer.combineInto(piece, shm.peerData(0), shm.peerData(1), n);
  for (int r = 2; r < context.size; ++r) reducer.combine(piece, shm.peerData(r), n);
}

// The reduce-scatter form of a piece (elements [first, first + n) of a call
// of `count`): two rounds. Not inlined: a small call's path stays as short as it was.
[[gnu::noinline]] void reduceScatterPiece(Context& context, SharedSegment& shm, const uint8_t* in, uint8_t* out,
                                          size_t count, size_t first, size_t n, const Reducer& reducer) {
  const size_t element = reducer.elementSize();
  const size_t lineElements = std::max<size_t>(1, 64 / element);
  shm.exchange({context.tagBase, count, first, "allreduce"}, in + first * element, n * element, context.transport,
               context.deadline);
  // This rank's share, combined in rank order, straight into its slot of the next round.
  const Share mine = shareOf(context.rank, context.size, n, lineElements);
  if (mine.count > 0) {
    const size_t at = mine.first * element;
    uint8_t* reduced = shm.nextData() + at;  // at its place in the piece
    reducer.combineInto(reduced, shm.peerData(0) + at, shm.peerData(1) + at, mine.count);
    for (int r = 2; r < context.size; ++r) reducer.combine(reduced, shm.peerData(r) + at, mine.count);
  }
  shm.exchangeWritten({context.tagBase, count, first, "allreduce (reduced shares)"}, n * element,
                      mine.count * element, context.transport, context.deadline);
  uint8_t* piece = out + first * element;
  for (int r = 0; r < context.size; ++r) {
    const Share theirs = shareOf(r, context.size, n, lineElements);
    const size_t at = theirs.first * element;
    std::memcpy(piece + at, shm.peerData(r) + at, theirs.count * element);
  }
}

}  // namespace

bool allreduceShmScatters(size_t pieceBytes, int size) { return size >= 3 && pieceBytes >= kScatterMinBytes; }

namespace {

// A call of more than one piece, or of one piece that takes the reduce-scatter
// form: piece by piece, each in the form its size takes (a short last piece
// one round). Not inlined: a small call's path stays as short as it was.
[[gnu::noinline]] void allreducePieces(Context& context, SharedSegment& shm, const uint8_t* in, uint8_t* out,
                                       size_t count, const Reducer& reducer) {
  const size_t element = reducer.elementSize();
  const size_t perRound = std::max<size_t>(1, shm.slotBytes() / element);
  for (size_t first = 0; first < count; first += perRound) {
    const size_t n = std::min(perRound, count - first);
    if (allreduceShmScatters(n * element, context.size))
      reduceScatterPiece(context, shm, in, out, count, first, n, reducer);
    else
      reduceAllSlots(context, shm, in, out, count, first, n, reducer);
  }
}

}  // namespace

void allreduceShmOutOfPlace(Context& context, const void* send, void* recv, size_t count, const Reducer& reducer) {
  SharedSegment& shm = segmentOf(context);
  const size_t element = reducer.elementSize();
  const auto* in = static_cast<const uint8_t*>(send);
  auto* out = static_cast<uint8_t*>(recv);
  const size_t bytes = count * element;
  if (bytes <= shm.slotBytes() && !allreduceShmScatters(bytes, context.size)) {  // one round, no division
    if (count > 0) reduceAllSlots(context, shm, in, out, count, 0, count, reducer);
  } else {
    allreducePieces(context, shm, in, out, count, reducer);
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
