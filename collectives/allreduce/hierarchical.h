// The legs of the hierarchical allreduce (hierarchical.cc). The dense
// algorithm pipelines them over chunks of the buffer; the compressed
// allreduce (lib/plugin/driver.cc) runs its own middle leg: it reduces
// densely inside each host, runs its compressor's rounds across hosts on each
// rank's shard, and gathers densely inside the host again, so only the
// inter-host bytes are compressed.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "collectives/collectives.h"
#include "collectives/common/group_transport.h"
#include "collectives/common/host_layout.h"

namespace shoal {

class HostLegs {
 public:
  // A buffer of `count` elements of `element` bytes, cut into one shard per
  // rank of a host (the first count % l shards one element longer). With
  // `rowElements` > 1 the buffer is rows of that many elements (count a
  // multiple of it) and shards are whole rows, the first (count / rowElements)
  // % l one row longer: a row block of a matrix is a matrix again. `layout`
  // must be hierarchical() and outlive the legs. `tagShares` sets of legs
  // (the pipeline's chunks) share the call's tags: segments grow to fit.
  HostLegs(Transport& transport, const HostLayout& layout, size_t count, size_t element, size_t segmentBytes,
           size_t rowElements = 1, int tagShares = 1);
  // Shards of given element counts, one per rank of the host in local-rank
  // order, packed one after another (a fused group's: shard i holds block i of
  // every tensor of the group, see lib/plugin/driver.cc).
  HostLegs(Transport& transport, const HostLayout& layout, const std::vector<size_t>& shardCounts, size_t element,
           size_t segmentBytes, int tagShares = 1);

  // The element count of each rank's shard of one tensor of `rows` rows of
  // `rowElements` elements (1 for a 1-D split), split as evenly as rows allow.
  static std::vector<size_t> shardCountsOf(size_t rows, size_t rowElements, int localSize);

  // Leg 1, a ring reduce-scatter inside the host: afterwards this rank's
  // shard of `data` holds its host's reduction. `context` is over the whole
  // communicator; the leg takes its tags from it.
  void reduceScatter(Context& context, uint8_t* data, const Reducer& reducer);
  // Leg 3, a ring allgather inside the host: every shard to every rank of it.
  void allgather(Context& context, uint8_t* data);
  // The largest of the `value`s of this host's ranks (a small allgather inside the host).
  uint64_t maxOnHost(Context& context, uint64_t value);

  // Legs 1 and 3's ranks (this host's, numbered by local index) and shards,
  // for a caller that runs them as ring phases (the pipelined allreduce).
  Transport& onHost() { return host_; }
  const Blocks& shards() const { return shards_; }
  // Leg 2's ranks: the one with this rank's local index on every host, in
  // host order, numbered 0..hosts-1. Every rank of it holds the same shard.
  Transport& acrossHosts() { return across_; }
  size_t shardOffset() const { return shards_.offset[mine_]; }             // bytes
  size_t shardCount() const { return shards_.bytes[mine_] / element_; }    // elements
  // The largest shard, in elements (shards differ by at most one element, or one row).
  size_t largestShardCount() const { return shards_.maxBytes() / element_; }

 private:
  const HostLayout& layout_;
  GroupTransport host_;
  GroupTransport across_;
  Blocks shards_;
  size_t element_;
  size_t segmentBytes_;
  int mine_;
};

// The dense hierarchical allreduce's chunk, in elements, for `count` elements
// on `layout` (layout.chunkBytes, at least one element per cross-host piece,
// at most 256 chunks); the last chunk holds what is left.
size_t hierarchicalChunkElements(size_t count, size_t element, const HostLayout& layout);

}  // namespace shoal
