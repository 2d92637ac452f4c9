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
// call's tags, handed out from one budget, and its deadline.
#include <algorithm>
#include <cstring>

#include "collectives/collectives.h"
#include "collectives/common/host_layout.h"

namespace shoal {
namespace {

// The ranks `members` of `parent` seen as ranks 0..members.size()-1.
class GroupTransport final : public Transport {
 public:
  GroupTransport(Transport& parent, const std::vector<int>& members, int rank)
      : parent_(parent), members_(members), rank_(rank) {}
  int rank() const override { return rank_; }
  int size() const override { return static_cast<int>(members_.size()); }
  const char* name() const override { return parent_.name(); }
  Request isend(int peer, uint64_t tag, const void* data, size_t bytes) override {
    return parent_.isend(members_[peer], tag, data, bytes);
  }
  Request irecv(int peer, uint64_t tag, void* data, size_t bytes) override {
    return parent_.irecv(members_[peer], tag, data, bytes);
  }
  void waitAll(Request* requests, size_t count, Deadline deadline) override {
    parent_.waitAll(requests, count, deadline);
  }
  void checkNotAborted() override { parent_.checkNotAborted(); }
  void abort(const std::string& reason, shoal_status_t status) override { parent_.abort(reason, status); }
  bool failed() const override { return parent_.failed(); }
  uint64_t bytesSent() const override { return parent_.bytesSent(); }
  std::string failure() const override { return parent_.failure(); }
  std::string describePeer(int peer) const override { return parent_.describePeer(members_[peer]); }

 private:
  Transport& parent_;
  const std::vector<int>& members_;
  int rank_;
};

// Runs `leg` on a context over `group` that takes its tags from `outer`.
template <typename Leg>
void onGroup(Context& outer, GroupTransport& group, Leg&& leg) {
  Context inner(group, 0, outer.deadline, outer.segmentBytes, outer.scratch);
  inner.tagBase = outer.tagBase;
  inner.nextSubTag = outer.nextSubTag;
  leg(inner);
  outer.nextSubTag = inner.nextSubTag;
}

}  // namespace

void allreduceHierarchical(Context& context, void* recv, size_t count, const Reducer& reducer) {
  const HostLayout* layout = context.hosts;
  if (layout == nullptr || !layout->hierarchical() || layout->hostOf.size() != static_cast<size_t>(context.size))
    return allreduceRing(context, recv, count, reducer);  // the communicator chose it; this keeps it correct anyway
  auto* data = static_cast<uint8_t*>(recv);
  const size_t element = reducer.elementSize();
  const int localSize = static_cast<int>(layout->local.size());
  const int hosts = layout->hosts;
  GroupTransport host(context.transport, layout->local, layout->localRank);
  GroupTransport across(context.transport, layout->peers, static_cast<int>(
      std::find(layout->peers.begin(), layout->peers.end(), context.rank) - layout->peers.begin()));

  // Tags: the host legs (reduce-scatter, allgather) take at most half the
  // call's budget, the cross-host ring the other half.
  Blocks shards = splitEvenly(count, element, localSize, context.segmentBytes, 4 * static_cast<uint64_t>(localSize));
  const int mine = layout->localRank;
  onGroup(context, host, [&](Context& leg) { ringReduceScatter(leg, data, data, shards, reducer); });

  uint8_t* shard = data + shards.offset[mine];
  const size_t shardCount = shards.bytes[mine] / element;
  // Shards differ by an element, so the cross-host rings of different local
  // ranks could use different numbers of tags, and the allgather after them
  // would start at different tags. Every rank reserves what the largest
  // shard's ring takes, cut with the same segment.
  Blocks largest = splitEvenly(shards.bytes[0] / element, element, hosts, context.segmentBytes,
                               4 * static_cast<uint64_t>(hosts));
  Blocks pieces = splitEvenly(shardCount, element, hosts, context.segmentBytes, 4 * static_cast<uint64_t>(hosts));
  pieces.segment = largest.segment;
  const uint64_t crossTags = 2 * static_cast<uint64_t>(hosts - 1) * largest.maxSegments();
  const uint64_t firstCrossTag = context.nextSubTag;
  onGroup(context, across, [&](Context& leg) {
    ringReduceScatter(leg, shard, shard, pieces, reducer);
    // avg divides by every rank of the communicator, once, by the piece's owner.
    reducer.finish(shard + pieces.offset[leg.rank], pieces.bytes[leg.rank] / element, context.size);
    ringAllgather(leg, shard, pieces);
  });
  context.nextSubTag = firstCrossTag;
  context.reserveTags(crossTags);

  onGroup(context, host, [&](Context& leg) { ringAllgather(leg, data, shards); });
}

}  // namespace shoal
