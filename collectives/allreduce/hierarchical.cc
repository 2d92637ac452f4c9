// Hierarchical allreduce (Horovod's hierarchical allreduce, NCCL's tree
// across nodes) for ranks spread over h hosts with l ranks on each:
//   1. reduce-scatter inside each host: local rank i ends with block i of its
//      host's sum;
//   2. allreduce across hosts of block i among the ranks with local index i
//      (one per host), as a ring;
//   3. allgather inside the host.
// A host link then carries 2(h-1)/h of the buffer instead of the flat ring's
// 2(n-1)/n, and each host's l ranks share that traffic in parallel.
//
// Pipelined: the buffer is cut into chunks of about SHOAL_HIER_CHUNK_BYTES
// (HostLayout::chunkBytes), each of which passes through the legs in
// turn, so that while chunk c crosses hosts, chunk c+1 is reduce-scattered
// inside the host and chunk c-1 gathered. Each leg is a ring phase
// (collectives/common/ring_phase.h) over a view of the communicator's
// transport that renumbers a subset of its ranks (GroupTransport); one thread
// drives the lanes (leg 1, leg 2's two rings, leg 3) at once, waiting for
// whichever request completes first (Transport::waitAny). The chunks' legs
// share the call's tags, handed out from one budget that every rank splits
// alike, and its deadline.
// HostLegs (hierarchical.h) holds legs 1 and 3 for the compressed allreduce
// too, which runs them one after another.
#include "collectives/allreduce/hierarchical.h"

#include <algorithm>
#include <memory>
#include <optional>
#include <vector>

#include "collectives/common/ring.h"
#include "collectives/common/ring_phase.h"

namespace shoal {
namespace {

// At most this many chunks: each chunk's legs get 1/chunks of the call's tags,
// so more would force coarser segments than the pipelining gains.
constexpr size_t kMaxChunks = 256;
// The cross-host ring's scratch slots (the host reduce-scatter takes 0 and 1).
constexpr int kCrossScratchSlot = 3;

// Runs `leg` on a context over `group` that takes its tags from `outer`.
template <typename Leg>
void onGroup(Context& outer, Transport& group, Leg&& leg) {
  Context inner(group, 0, outer.deadline, outer.segmentBytes, outer.scratch);
  inner.tagBase = outer.tagBase;
  inner.nextSubTag = outer.nextSubTag;
  leg(inner);
  outer.nextSubTag = inner.nextSubTag;
}

int indexOf(const std::vector<int>& ranks, int rank) {
  return static_cast<int>(std::find(ranks.begin(), ranks.end(), rank) - ranks.begin());
}

// One shard per rank of a host, of the given element counts, packed. The
// call's tags are shared by `tagShares` such sets of legs (pipeline chunks).
Blocks hostShards(const std::vector<size_t>& counts, size_t element, size_t segmentBytes, int tagShares) {
  const int parts = static_cast<int>(counts.size());
  return blocksFrom(counts.data(), nullptr, element, parts, segmentBytes,
                    4 * static_cast<uint64_t>(parts) * static_cast<uint64_t>(std::max(tagShares, 1)));
}

// A chunk of the pipelined dense allreduce: a slice of the buffer with its own
// host legs and its own cut of this rank's shard for the cross-host ring.
struct Chunk {
  Chunk(Context& context, const HostLayout& layout, uint8_t* begin, size_t count, size_t element, int chunks)
      : data(begin), legs(context.transport, layout, count, element, context.segmentBytes, 1, chunks) {
    const int hosts = layout.hosts;
    const uint64_t tagsPerSegment = 4 * static_cast<uint64_t>(hosts) * static_cast<uint64_t>(chunks);
    // Shards differ by an element, so the cross-host rings of different local
    // ranks could use different numbers of tags, and the allgather after them
    // would start at different tags. Every rank reserves what the largest
    // shard's ring takes, cut with the same segment.
    Blocks largest = splitEvenly(legs.largestShardCount(), element, hosts, context.segmentBytes, tagsPerSegment);
    pieces = splitEvenly(legs.shardCount(), element, hosts, context.segmentBytes, tagsPerSegment);
    pieces.segment = largest.segment;
    hostLegTags = static_cast<uint64_t>(layout.local.size() - 1) * legs.shards().maxSegments();
    crossRingTags = static_cast<uint64_t>(hosts - 1) * largest.maxSegments();
  }
  uint8_t* shard() const { return data + legs.shardOffset(); }

  uint8_t* data;
  HostLegs legs;
  Blocks pieces;               // this rank's shard, one piece per host
  uint64_t hostLegTags = 0;    // each host leg's
  uint64_t crossRingTags = 0;  // each of leg 2's rings'
  uint64_t firstTag = 0;       // sub-tags: leg 1, leg 2's two rings, leg 3
};

// The pipeline's lanes, in the order a chunk passes through them: leg 1, leg
// 2's reduce-scatter and allgather rings (separate lanes, so that one chunk's
// allgather crosses hosts while the next chunk's reduce-scatter does), leg 3.
enum LaneIndex { kHostScatter, kCrossScatter, kCrossGather, kHostGather, kLanes };

// A lane runs one chunk's phase at a time, chunks in order.
struct Lane {
  size_t started = 0;                // chunks that entered the lane
  std::optional<Context> context;    // the running phase's, over its group
  std::unique_ptr<RingPhase> phase;  // null while idle

  size_t finished() const { return phase ? started - 1 : started; }
  Context& begin(Context& outer, Transport& group, uint64_t firstSubTag) {
    phase.reset();
    context.emplace(group, 0, outer.deadline, outer.segmentBytes, outer.scratch);
    context->tagBase = outer.tagBase;
    context->nextSubTag = firstSubTag;
    ++started;
    return *context;
  }
};

// Starts chunk `chunk`'s phase of lane `index`.
void startPhase(LaneIndex index, Lane& lane, Context& outer, Chunk& chunk, const Reducer& reducer) {
  switch (index) {
    case kHostScatter: {
      Context& leg = lane.begin(outer, chunk.legs.onHost(), chunk.firstTag);
      lane.phase = std::make_unique<RingReduceScatterPhase>(leg, chunk.data, chunk.data, chunk.legs.shards(), reducer);
      return;
    }
    case kCrossScatter: {
      Context& leg = lane.begin(outer, chunk.legs.acrossHosts(), chunk.firstTag + chunk.hostLegTags);
      lane.phase = std::make_unique<RingReduceScatterPhase>(leg, chunk.shard(), chunk.shard(), chunk.pieces, reducer,
                                                            kCrossScratchSlot);
      return;
    }
    case kCrossGather: {
      Context& leg =
          lane.begin(outer, chunk.legs.acrossHosts(), chunk.firstTag + chunk.hostLegTags + chunk.crossRingTags);
      lane.phase = std::make_unique<RingAllgatherPhase>(leg, chunk.shard(), chunk.pieces);
      return;
    }
    case kHostGather: {
      const uint64_t firstTag = chunk.firstTag + chunk.hostLegTags + 2 * chunk.crossRingTags;
      Context& leg = lane.begin(outer, chunk.legs.onHost(), firstTag);
      lane.phase = std::make_unique<RingAllgatherPhase>(leg, chunk.data, chunk.legs.shards());
      return;
    }
    case kLanes:
      return;
  }
}

void runPipeline(Context& context, std::vector<std::unique_ptr<Chunk>>& chunks, const Reducer& reducer) {
  const size_t total = chunks.size();
  const size_t element = reducer.elementSize();
  Lane lanes[kLanes];
  // Served cross-host first: those are the critical path.
  const LaneIndex order[kLanes] = {kCrossScatter, kCrossGather, kHostScatter, kHostGather};
  while (lanes[kHostGather].finished() < total) {
    // A chunk enters a lane once the lane before is done with it.
    for (int i = 0; i < kLanes; ++i) {
      Lane& lane = lanes[i];
      const size_t ready = i == 0 ? total : lanes[i - 1].finished();
      if (!lane.phase && lane.started < ready)
        startPhase(static_cast<LaneIndex>(i), lane, context, *chunks[lane.started], reducer);
    }
    // Phases with nothing (more) to wait for end. At the end of leg 2's
    // reduce-scatter this rank's piece holds the sum over every host: avg
    // divides it by every rank of the communicator, once, by its owner.
    bool ended = false;
    for (LaneIndex index : order) {
      Lane& lane = lanes[index];
      if (!lane.phase || !lane.phase->done()) continue;
      ended = true;
      if (index == kCrossScatter) {
        Chunk& chunk = *chunks[lane.started - 1];
        const int owner = lane.context->rank;
        reducer.finish(chunk.shard() + chunk.pieces.offset[owner], chunk.pieces.bytes[owner] / element, context.size);
      }
      lane.phase.reset();
    }
    if (ended) continue;
    // Wait until one lane's request completes, then move every lane that can.
    Lane* waiting[kLanes];
    Transport::Request requests[kLanes];
    size_t count = 0;
    for (LaneIndex index : order)
      if (lanes[index].phase) {
        waiting[count] = &lanes[index];
        requests[count++] = *lanes[index].phase->awaited();
      }
    context.transport.waitAny(requests, count, context.deadline);
    for (size_t i = 0; i < count; ++i) {
      *waiting[i]->phase->awaited() = requests[i];
      if (requests[i].done) waiting[i]->phase->advance();
    }
  }
}

}  // namespace

std::vector<size_t> HostLegs::shardCountsOf(size_t rows, size_t rowElements, int localSize) {
  // With rows of one element this is splitEvenly's split (ring::blockOf).
  std::vector<size_t> counts(localSize);
  for (int b = 0; b < localSize; ++b) counts[b] = ring::blockOf(rows, localSize, b).count * rowElements;
  return counts;
}

// Tags: the host legs (reduce-scatter, allgather) take at most half the
// call's budget (4 l tags per segment), the cross-host leg the other half;
// each of `tagShares` pipeline chunks a share of that.
HostLegs::HostLegs(Transport& transport, const HostLayout& layout, size_t count, size_t element, size_t segmentBytes,
                   size_t rowElements, int tagShares)
    : HostLegs(transport, layout,
               shardCountsOf(rowElements > 1 ? count / rowElements : count, std::max<size_t>(rowElements, 1),
                             static_cast<int>(layout.local.size())),
               element, segmentBytes, tagShares) {}

HostLegs::HostLegs(Transport& transport, const HostLayout& layout, const std::vector<size_t>& shardCounts,
                   size_t element, size_t segmentBytes, int tagShares)
    : layout_(layout),
      host_(transport, layout.local, layout.localRank),
      across_(transport, layout.peers, indexOf(layout.peers, transport.rank())),
      shards_(hostShards(shardCounts, element, segmentBytes, tagShares)),
      element_(element),
      segmentBytes_(segmentBytes),
      mine_(layout.localRank) {}

void HostLegs::reduceScatter(Context& context, uint8_t* data, const Reducer& reducer) {
  onGroup(context, host_, [&](Context& leg) { ringReduceScatter(leg, data, data, shards_, reducer); });
}

void HostLegs::allgather(Context& context, uint8_t* data) {
  onGroup(context, host_, [&](Context& leg) { ringAllgather(leg, data, shards_); });
}

uint64_t HostLegs::maxOnHost(Context& context, uint64_t value) {
  const int localSize = static_cast<int>(layout_.local.size());
  std::vector<uint64_t> values(localSize, 0);
  values[mine_] = value;
  Blocks one = blocksFrom(std::vector<size_t>(localSize, 1).data(), nullptr, sizeof(uint64_t), localSize,
                          segmentBytes_, localSize);
  onGroup(context, host_, [&](Context& leg) { ringAllgather(leg, reinterpret_cast<uint8_t*>(values.data()), one); });
  return *std::max_element(values.begin(), values.end());
}

size_t hierarchicalChunkElements(size_t count, size_t element, const HostLayout& layout) {
  // Every chunk has at least an element for each piece of the cross-host rings.
  const size_t least = layout.local.size() * static_cast<size_t>(layout.hosts);
  const size_t wanted = layout.chunkBytes == 0 ? count : std::max(layout.chunkBytes / element, least);
  // Every chunk's rings take at least a tag per step (one segment a block):
  // with many hosts that bounds the chunks within half the call's budget.
  const size_t stepTags = 2 * (layout.local.size() - 1 + static_cast<size_t>(layout.hosts) - 1);
  const size_t most =
      std::max<size_t>(1, std::min<size_t>(kMaxChunks, kSubTagLimit / 2 / std::max<size_t>(stepTags, 1)));
  return std::max({wanted, (count + most - 1) / most, size_t(1)});
}

void allreduceHierarchical(Context& context, void* recv, size_t count, const Reducer& reducer) {
  const HostLayout* layout = context.hosts;
  if (layout == nullptr || !layout->hierarchical() || layout->hostOf.size() != static_cast<size_t>(context.size))
    return allreduceRing(context, recv, count, reducer);  // the communicator chose it; this keeps it correct anyway
  auto* data = static_cast<uint8_t*>(recv);
  const size_t element = reducer.elementSize();
  // Chunks of chunkElements, the last one shorter; the same cut on every rank
  // (count, element, layout and SHOAL_HIER_CHUNK_BYTES agree), and so the same
  // tags for every leg of every chunk, whatever order the lanes run in.
  const size_t chunkElements = hierarchicalChunkElements(count, element, *layout);
  const size_t chunkCount = (count + chunkElements - 1) / chunkElements;
  std::vector<std::unique_ptr<Chunk>> chunks;
  chunks.reserve(chunkCount);
  uint64_t nextTag = context.nextSubTag;
  for (size_t begin = 0; begin < count; begin += chunkElements) {
    chunks.push_back(std::make_unique<Chunk>(context, *layout, data + begin * element,
                                             std::min(chunkElements, count - begin), element,
                                             static_cast<int>(chunkCount)));
    chunks.back()->firstTag = nextTag;
    nextTag += 2 * chunks.back()->hostLegTags + 2 * chunks.back()->crossRingTags;
  }
  context.reserveTags(nextTag - context.nextSubTag);  // fails, with text, beyond the call's budget
  runPipeline(context, chunks, reducer);
}

}  // namespace shoal
