// The alltoall algorithm table and the choice between its entries.
#include <string_view>

#include "collectives/exchange.h"

namespace shoal {

const std::vector<AlltoallAlgorithm>& alltoallAlgorithms() {
  static const std::vector<AlltoallAlgorithm> table = {
      {"pairwise", "n-1 steps, in step k rank r sends to r+k and receives from r-k; each byte moves once; any block "
                   "sizes (alltoallv); the default", alltoallvPairwise, false},
      {"bruck", "Bruck's algorithm: ceil(log2 n) rounds, each moving the blocks whose index has bit k set, with a "
                "local rotation before and after; fewer messages for small blocks, each block sent up to log2 n "
                "times; one block size (alltoall, not alltoallv); SHOAL_ALGO=bruck", alltoallBruck, true},
  };
  return table;
}

const AlltoallAlgorithm& selectAlltoall(const std::string& name, bool uniform, size_t bytesPerRank) {
  // SHOAL_ALGO=bruck asks for Bruck, auto lets the size decide: up to
  // kBruckMaxBytes of send buffer per rank Bruck's log2 n messages beat
  // pairwise's n - 1 on one host (docs/collectives.md: 1.3-1.8x at n = 4 from
  // 16 B to 4 KiB, slower from 64 KiB); any other value (another collective's
  // algorithm) leaves alltoall pairwise. Every rank passes the same count
  // (it is in the call's signature), so every rank chooses alike.
  constexpr size_t kBruckMaxBytes = 16 * 1024;
  const bool bruck = uniform && (name == "bruck" || (name == "auto" && bytesPerRank <= kBruckMaxBytes));
  const std::string_view wanted = bruck ? "bruck" : "pairwise";
  for (const AlltoallAlgorithm& algorithm : alltoallAlgorithms())
    if (wanted == algorithm.name) return algorithm;
  fail(SHOAL_ERR_INTERNAL, "alltoall algorithm '{}' is missing from its table", wanted);
}

}  // namespace shoal
