// Where the ranks of a communicator run: which ranks share a host. The
// hierarchical allreduce (collectives/allreduce/hierarchical.cc) works inside
// each host first and across hosts second; lib/api/hosts.cc learns the layout.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace shoal {

struct HostLayout {
  std::vector<uint64_t> hostOf;  // every rank's host id (a hash of its name)
  int hosts = 1;                 // distinct hosts
  std::vector<int> local;        // the ranks on this rank's host, in rank order
  int localRank = 0;             // this rank's index in `local`
  std::vector<int> peers;        // the rank with this rank's local index on every host, in host order
  bool regular = false;          // every host has the same number of ranks
  std::string description;       // "2 hosts x 2 ranks", "2 hosts, irregular (3, 1 ranks)"
  // The dense hierarchical allreduce runs in chunks of about this many bytes,
  // its legs overlapped (SHOAL_HIER_CHUNK_BYTES; 0: the whole buffer at once).
  size_t chunkBytes = 0;

  // The layout of `rank` given every rank's host id.
  static HostLayout from(const std::vector<uint64_t>& hostOf, int rank);
  // Worth a hierarchy: >= 2 hosts, the same number >= 2 of ranks on each.
  bool hierarchical() const { return regular && hosts >= 2 && local.size() >= 2; }
};

}  // namespace shoal
