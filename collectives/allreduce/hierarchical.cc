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
// Each leg is an ordinary ring over a view of the communicator's transport
// that renumbers a subset of its ranks (GroupTransport): the legs share the
// call's tags, handed out from one budget, and its deadline. HostLegs
// (hierarchical.h) holds legs 1 and 3 for the compressed allreduce too.
#include "collectives/allreduce/hierarchical.h"

#include <algorithm>
#include <vector>

#include "collectives/common/ring.h"

namespace shoal {
namespace {

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

// One shard per rank of a host, of the given element counts, packed.
Blocks hostShards(const std::vector<size_t>& counts, size_t element, size_t segmentBytes) {
  const int parts = static_cast<int>(counts.size());
  return blocksFrom(counts.data(), nullptr, element, parts, segmentBytes, 4 * static_cast<uint64_t>(parts));
}

}  // namespace

std::vector<size_t> HostLegs::shardCountsOf(size_t rows, size_t rowElements, int localSize) {
  // With rows of one element this is splitEvenly's split (ring::blockOf).
  std::vector<size_t> counts(localSize);
  for (int b = 0; b < localSize; ++b) counts[b] = ring::blockOf(rows, localSize, b).count * rowElements;
  return counts;
}

// Tags: the host legs (reduce-scatter, allgather) take at most half the
// call's budget (4 l tags per segment), the cross-host leg the other half.
HostLegs::HostLegs(Transport& transport, const HostLayout& layout, size_t count, size_t element, size_t segmentBytes,
                   size_t rowElements)
    : HostLegs(transport, layout,
               shardCountsOf(rowElements > 1 ? count / rowElements : count, std::max<size_t>(rowElements, 1),
                             static_cast<int>(layout.local.size())),
               element, segmentBytes) {}

HostLegs::HostLegs(Transport& transport, const HostLayout& layout, const std::vector<size_t>& shardCounts,
                   size_t element, size_t segmentBytes)
    : layout_(layout),
      host_(transport, layout.local, layout.localRank),
      across_(transport, layout.peers, indexOf(layout.peers, transport.rank())),
      shards_(hostShards(shardCounts, element, segmentBytes)),
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

void allreduceHierarchical(Context& context, void* recv, size_t count, const Reducer& reducer) {
  const HostLayout* layout = context.hosts;
  if (layout == nullptr || !layout->hierarchical() || layout->hostOf.size() != static_cast<size_t>(context.size))
    return allreduceRing(context, recv, count, reducer);  // the communicator chose it; this keeps it correct anyway
  auto* data = static_cast<uint8_t*>(recv);
  const size_t element = reducer.elementSize();
  const int hosts = layout->hosts;
  HostLegs legs(context.transport, *layout, count, element, context.segmentBytes);
  legs.reduceScatter(context, data, reducer);

  uint8_t* shard = data + legs.shardOffset();
  // Shards differ by an element, so the cross-host rings of different local
  // ranks could use different numbers of tags, and the allgather after them
  // would start at different tags. Every rank reserves what the largest
  // shard's ring takes, cut with the same segment.
  Blocks largest = splitEvenly(legs.largestShardCount(), element, hosts, context.segmentBytes,
                               4 * static_cast<uint64_t>(hosts));
  Blocks pieces = splitEvenly(legs.shardCount(), element, hosts, context.segmentBytes, 4 * static_cast<uint64_t>(hosts));
  pieces.segment = largest.segment;
  const uint64_t crossTags = 2 * static_cast<uint64_t>(hosts - 1) * largest.maxSegments();
  const uint64_t firstCrossTag = context.nextSubTag;
  onGroup(context, legs.acrossHosts(), [&](Context& leg) {
    ringReduceScatter(leg, shard, shard, pieces, reducer);
    // avg divides by every rank of the communicator, once, by the piece's owner.
    reducer.finish(shard + pieces.offset[leg.rank], pieces.bytes[leg.rank] / element, context.size);
    ringAllgather(leg, shard, pieces);
  });
  context.nextSubTag = firstCrossTag;
  context.reserveTags(crossTags);

  legs.allgather(context, data);
}

}  // namespace shoal
