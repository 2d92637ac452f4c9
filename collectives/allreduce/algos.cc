// The allreduce algorithm table and the `auto` choice.
#include "collectives/collectives.h"

#include <iterator>
#include <string_view>

#include "shoal/compressor.h"

namespace shoal {
namespace {

// The table's order, for the choices made by size (AllreduceChoice::at).
enum TableIndex { kRing, kTree, kDoubling, kHierarchical, kShm, kTableSize };

constexpr AllreduceAlgorithm kTable[kTableSize] = {
    {"ring", "reduce-scatter + allgather around a ring, pipelined; bandwidth-optimal", allreduceRing},
    {"tree", "binomial reduce to rank 0 + binomial broadcast; 2 log2(n) hops", allreduceTree},
    {"doubling", "recursive doubling: partners swap and combine, log2(n) hops; lowest latency for small messages",
     allreduceRecursiveDoubling},
    {"hierarchical",
     "reduce-scatter inside each host, ring across hosts per shard, allgather inside, the legs overlapped over "
     "chunks; for >= 2 hosts with the same number (>= 2) of ranks on each, else the ring",
     allreduceHierarchical},
    {"shm", "every rank writes its data into a shared-memory slot and reduces all slots in rank order; ranks on "
            "one host, small messages", allreduceShm},
};

}  // namespace

const std::vector<AllreduceAlgorithm>& allreduceAlgorithms() {
  static const std::vector<AllreduceAlgorithm> table(std::begin(kTable), std::end(kTable));
  return table;
}

const AllreduceAlgorithm& hierarchicalAllreduce() { return kTable[kHierarchical]; }

bool hierarchicalSuitsCompressor(uint64_t compressorCaps) {
  // A low-rank compressor (SHOAL_CAP_MATRIX: PowerSGD's factors, (rows + cols) r
  // floats a matrix, which the ring adds as they go) sends so few bytes across
  // hosts that the dense reduce-scatter and allgather inside each host cost more
  // than compressing across hosts only saves: 0.83x of the flat call at 2 hosts x
  // 2 ranks, 1 Gbit/s. It stays flat. Payloads that grow with the tensor (topk's
  // pairs: 1.13x faster hierarchical; casts; sketches) gain from it (docs/groups.md).
  return (compressorCaps & SHOAL_CAP_MATRIX) == 0;
}

AllreduceChoice AllreduceChoice::of(const std::string& name) {
  std::string_view wanted = name;
  AllreduceChoice choice;
  // bruck names an alltoall algorithm (alltoall/algos.cc): allreduce chooses as auto does.
  if (wanted.empty() || wanted == "auto" || wanted == "bruck") return choice;
  // aggregate: what the aggregators cannot add takes the ring (lib/aggregate/client.h).
  choice.aggregate = wanted == "aggregate";
  if (choice.aggregate) wanted = "ring";
  for (const AllreduceAlgorithm& algorithm : kTable)
    if (wanted == algorithm.name) {
      choice.fixed = &algorithm;
      return choice;
    }
  std::string names;
  for (const AllreduceAlgorithm& algorithm : kTable) names += std::string(names.empty() ? "" : ", ") + algorithm.name;
  fail(SHOAL_ERR_NOT_FOUND, "unknown allreduce algorithm '{}'; use auto, aggregate, bruck (an alltoall algorithm), {}",
       name, names);
}

const AllreduceAlgorithm& AllreduceChoice::at(size_t bytes, int worldSize, size_t treeMaxBytes,
                                              size_t sharedMaxBytes) const {
  if (fixed != nullptr) return *fixed;
  // One host: flags in shared memory beat any rendezvous for small messages.
  if (worldSize > 1 && bytes <= sharedMaxBytes) return kTable[kShm];
  // Recursive doubling wins while latency dominates (log2 n hops against
  // the ring's 2(n-1)); beyond treeMaxBytes the ring's bandwidth wins.
  return bytes <= treeMaxBytes || worldSize == 1 ? kTable[kDoubling] : kTable[kRing];
}

const AllreduceAlgorithm& selectAllreduce(const std::string& name, size_t bytes, int worldSize,
                                          size_t treeMaxBytes, size_t sharedMaxBytes) {
  return AllreduceChoice::of(name).at(bytes, worldSize, treeMaxBytes, sharedMaxBytes);
}

}  // namespace shoal
