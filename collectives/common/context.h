// What every collective algorithm gets: the transport, its place in the
// communicator, a tag range of its own, a deadline and the pipelining segment.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include "collectives/common/ring.h"
#include "core/deadline.h"
#include "transport/transport.h"

namespace shoal {

struct HostLayout;  // collectives/common/host_layout.h

// Tags (transport.h): the call's signature, its sequence number (wrapping: a
// call finishes all its messages before the next starts) and a sub-tag that
// the algorithm hands out per step and segment.
class SharedSegment;  // transport/shm/segment.h

constexpr uint64_t kSubTagLimit = uint64_t(1) << kSubTagBits;

// Scratch memory that lives as long as the communicator, so large calls do not
// allocate (and page-fault) fresh buffers every time. Slots are independent:
// the ring reduce-scatter takes 0 and 1, the pipelined hierarchical allreduce
// 3 and 4 for its cross-host ring (collectives/allreduce/hierarchical.cc).
class Scratch {
 public:
  static constexpr int kSlots = 5;
  uint8_t* get(int slot, size_t bytes) {
    if (capacity_[slot] < bytes) {
      buffers_[slot].reset(new uint8_t[bytes]);  // uninitialised on purpose
      capacity_[slot] = bytes;
    }
    return buffers_[slot].get();
  }

 private:
  std::unique_ptr<uint8_t[]> buffers_[kSlots];
  size_t capacity_[kSlots] = {};
};

struct Context {
  Transport& transport;
  int rank;
  int size;
  uint64_t tagBase;     // signature | (sequence << kSubTagBits)
  CallDeadline deadline;  // read from the clock by the first wait that needs it
  size_t segmentBytes;  // pipelining unit of ring and chain algorithms
  Scratch& scratch;
  uint64_t nextSubTag = 0;
  const HostLayout* hosts = nullptr;  // set by the communicator; the hierarchical allreduce needs it
  SharedSegment* shm = nullptr;  // the communicator's shared-memory segment, where it has one
  // Set by the shared-memory algorithms: the call ran through the segment
  // only, so its end-of-call check for peers that gave up is the segment's
  // abort word (one load) instead of the transport's (comm/call.h).
  bool sharedSegmentOnly = false;

  // `signature` is the call's signature word (comm/agree.h); every message of
  // the call carries it.
  Context(Transport& t, uint64_t sequence, CallDeadline d, size_t segment, Scratch& s, uint32_t signature = 0)
      : Context(t, t.rank(), t.size(), sequence, std::move(d), segment, s, signature) {}
  // The same where the caller knows t's rank and size (a communicator's own
  // transport: the communicator's), without asking the transport.
  Context(Transport& t, int rankOfT, int sizeOfT, uint64_t sequence, CallDeadline d, size_t segment, Scratch& s,
          uint32_t signature)
      : transport(t), rank(rankOfT), size(sizeOfT),
        tagBase((uint64_t(signature) << kSignatureShift & kSignatureMask) |
                ((sequence % kCollectiveSequences) << kSubTagBits)),
        deadline(std::move(d)), segmentBytes(segment), scratch(s) {}

  // Reserves `count` consecutive tags for one phase of an algorithm.
  uint64_t reserveTags(uint64_t count) {
    if (nextSubTag + count > kSubTagLimit)
      fail(SHOAL_ERR_INTERNAL, "collective needs {} tags, more than the {} a call has", nextSubTag + count,
           kSubTagLimit);
    uint64_t first = tagBase + nextSubTag;
    nextSubTag += count;
    return first;
  }
  void wait(Transport::Request& request) { transport.waitAll(&request, 1, deadline); }
  void waitAll(std::vector<Transport::Request>& requests) {
    transport.waitAll(requests.data(), requests.size(), deadline);
  }
  int left() const { return ring::leftOf(rank, size); }
  int right() const { return ring::rightOf(rank, size); }
};

// A buffer split into one block per rank (byte offsets and lengths), each block
// cut into segments of at most `segment` bytes for pipelining.
struct Blocks {
  std::vector<size_t> offset;
  std::vector<size_t> bytes;
  size_t segment = 1;

  size_t segmentsIn(int block) const { return (bytes[block] + segment - 1) / segment; }
  size_t maxSegments() const {
    size_t most = 0;
    for (size_t b = 0; b < bytes.size(); ++b) most = std::max(most, segmentsIn(static_cast<int>(b)));
    return most;
  }
  size_t maxBytes() const { return bytes.empty() ? 0 : *std::max_element(bytes.begin(), bytes.end()); }
  // Byte range [begin, begin + length) of segment k of a block, relative to the buffer.
  size_t segmentBegin(int block, size_t k) const { return offset[block] + k * segment; }
  size_t segmentLength(int block, size_t k) const { return std::min(segment, bytes[block] - k * segment); }
};

// Splits `count` elements evenly into `parts` blocks (the first count % parts
// blocks get one extra element). The segment is a multiple of the element size,
// grown if needed so that steps x segments fits the call's tag budget.
Blocks splitEvenly(size_t count, size_t elementSize, int parts, size_t segmentBytes, uint64_t tagsPerSegment);
// Blocks at given element counts and displacements (allgatherv).
Blocks blocksFrom(const size_t* counts, const size_t* displacements, size_t elementSize, int parts,
                  size_t segmentBytes, uint64_t tagsPerSegment);

}  // namespace shoal
