// The allreduce algorithm table and the `auto` choice.
#include "collectives/collectives.h"

#include <string_view>

namespace shoal {

const std::vector<AllreduceAlgorithm>& allreduceAlgorithms() {
  static const std::vector<AllreduceAlgorithm> table = {
      {"ring", "reduce-scatter + allgather around a ring, pipelined; bandwidth-optimal", allreduceRing},
      {"tree", "binomial reduce to rank 0 + binomial broadcast; 2 log2(n) hops", allreduceTree},
      {"doubling", "recursive doubling: partners swap and combine, log2(n) hops; lowest latency for small messages",
       allreduceRecursiveDoubling},
      {"hierarchical", "reduce-scatter inside each host, ring across hosts per shard, allgather inside; for >= 2 hosts with "
       "the same number (>= 2) of ranks on each, else the ring", allreduceHierarchical},
      {"shm", "every rank writes its data into a shared-memory slot and reduces all slots in rank order; ranks on "
              "one host, small messages", allreduceShm},
  };
  return table;
}

const AllreduceAlgorithm& selectAllreduce(const std::string& name, size_t bytes, int worldSize,
                                          size_t treeMaxBytes, size_t sharedMaxBytes) {
  // Views, and the names list only on failure: this runs on every small allreduce.
  std::string_view wanted = name;
  if (wanted == "bruck") wanted = "auto";  // an alltoall algorithm (alltoall/algos.cc): allreduce chooses as auto does
  if ((wanted.empty() || wanted == "auto") && worldSize > 1 && bytes <= sharedMaxBytes) {
    wanted = "shm";  // one host: flags in shared memory beat any rendezvous for small messages
  } else if (wanted.empty() || wanted == "auto") {
    // Recursive doubling wins while latency dominates (log2 n hops against
    // the ring's 2(n-1)); beyond treeMaxBytes the ring's bandwidth wins.
    wanted = (bytes <= treeMaxBytes || worldSize == 1) ? "doubling" : "ring";
  }
  // aggregate: what the aggregators cannot add takes the ring (lib/aggregate/client.h).
  if (wanted == "aggregate") wanted = "ring";
  for (const AllreduceAlgorithm& algorithm : allreduceAlgorithms())
    if (wanted == algorithm.name) return algorithm;
  std::string names;
  for (const AllreduceAlgorithm& algorithm : allreduceAlgorithms())
    names += std::string(names.empty() ? "" : ", ") + algorithm.name;
  fail(SHOAL_ERR_NOT_FOUND, "unknown allreduce algorithm '{}'; use auto, aggregate, bruck (an alltoall algorithm), {}",
       name, names);
}

}  // namespace shoal
