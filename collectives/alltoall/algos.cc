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

const AlltoallAlgorithm& selectAlltoall(const std::string& name, bool uniform) {
  // SHOAL_ALGO names one algorithm for the whole communicator: bruck is the
  // only alltoall one; every other value (auto, or another collective's
  // algorithm) leaves alltoall pairwise.
  const std::string_view wanted = name == "bruck" && uniform ? "bruck" : "pairwise";
  for (const AlltoallAlgorithm& algorithm : alltoallAlgorithms())
    if (wanted == algorithm.name) return algorithm;
  fail(SHOAL_ERR_INTERNAL, "alltoall algorithm '{}' is missing from its table", wanted);
}

}  // namespace shoal
