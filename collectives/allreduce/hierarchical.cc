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
// (HostLayout::chunkBytes), each of which passes through the three legs in
// turn, so that while chunk c crosses hosts, chunk c+1 is reduce-scattered
// inside the host and chunk c-1 gathered. Each leg is a ring phase
// (collectives/common/ring_phase.h) over a view of the communicator's
// transport that renumbers a subset of its ranks (GroupTransport); one thread
// drives the three lanes at once, waiting for whichever request completes
// first (Transport::waitAny). The chunks' legs share the call's tags, handed
// out from one budget that every rank splits alike, and its deadline.
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
    crossTags = 2 * static_cast<uint64_t>(hosts - 1) * largest.maxSegments();
  }
  uint8_t* shard() const { return data + legs.shardOffset(); }

  uint8_t* data;
  HostLegs legs;
  Blocks pieces;             // this rank's shard, one piece per host
  uint64_t hostLegTags = 0;  // each host leg's
  uint64_t crossTags = 0;    // both cross-host rings'
  uint64_t firstTag = 0;     // sub-tags: leg 1, then leg 2, then leg 3
};

// One of the pipeline's three lanes (leg 1, leg 2, leg 3): chunks pass
// through each in order, one at a time.
struct Lane {
  size_t started = 0;                // chunks that entered the lane
  std::optional<Context> context;    // the running phase's, over its group
  std::unique_ptr<RingPhase> phase;  // null while idle
  bool gathering = false;            // leg 2: its allgather ring runs (after the reduce-scatter)

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

void runPipeline(Context& context, std::vector<std::unique_ptr<Chunk>>& chunks, const Reducer& reducer) {
  const size_t total = chunks.size();
  const size_t element = reducer.elementSize();
  Lane scatter, cross, gather;
  Lane* const lanes[3] = {&cross, &scatter, &gather};  // the cross-host leg first: it is the critical path
  while (gather.finished() < total) {
    // A chunk enters a lane once the lane before is done with it.
    if (!scatter.phase && scatter.started < total) {
      Chunk& chunk = *chunks[scatter.started];
      Context& leg = scatter.begin(context, chunk.legs.onHost(), chunk.firstTag);
      scatter.phase = std::make_unique<RingReduceScatterPhase>(leg, chunk.data, chunk.data, chunk.legs.shards(),
                                                               reducer);
    }
    if (!cross.phase && cross.started < scatter.finished()) {
      Chunk& chunk = *chunks[cross.started];
      Context& leg = cross.begin(context, chunk.legs.acrossHosts(), chunk.firstTag + chunk.hostLegTags);
      cross.gathering = false;
      cross.phase = std::make_unique<RingReduceScatterPhase>(leg, chunk.shard(), chunk.shard(), chunk.pieces,
                                                             reducer, kCrossScratchSlot);
    }
    if (!gather.phase && gather.started < cross.finished()) {
      Chunk& chunk = *chunks[gather.started];
      Context& leg = gather.begin(context, chunk.legs.onHost(), chunk.firstTag + chunk.hostLegTags + chunk.crossTags);
      gather.phase = std::make_unique<RingAllgatherPhase>(leg, chunk.data, chunk.legs.shards());
    }
    // Phases with nothing (more) to wait for end; leg 2's reduce-scatter
    // hands over to its allgather ring.
    bool ended = false;
    for (Lane* lane : lanes) {
      if (!lane->phase || !lane->phase->done()) continue;
      ended = true;
      if (lane == &cross && !cross.gathering) {
        Chunk& chunk = *chunks[cross.started - 1];
        Context& leg = *cross.context;
        // avg divides by every rank of the communicator, once, by the piece's owner.
        reducer.finish(chunk.shard() + chunk.pieces.offset[leg.rank], chunk.pieces.bytes[leg.rank] / element,
                       context.size);
        cross.gathering = true;
        cross.phase = std::make_unique<RingAllgatherPhase>(leg, chunk.shard(), chunk.pieces);
      } else {
        lane->phase.reset();
      }
    }
    if (ended) continue;
    // Wait until one lane's request completes, then move every lane that can.
    Lane* waiting[3];
    Transport::Request requests[3];
    size_t count = 0;
    for (Lane* lane : lanes)
      if (lane->phase) {
        waiting[count] = lane;
        requests[count++] = *lane->phase->awaited();
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
  return std::max({wanted, (count + kMaxChunks - 1) / kMaxChunks, size_t(1)});
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
    nextTag += 2 * chunks.back()->hostLegTags + chunks.back()->crossTags;
  }
  context.reserveTags(nextTag - context.nextSubTag);  // fails, with text, beyond the call's budget
  runPipeline(context, chunks, reducer);
}

}  // namespace shoal
