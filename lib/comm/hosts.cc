// The rank-to-host map (collectives/common/host_layout.h): learned once per
// communicator, at init, by an allgather of a hash of each rank's host name.
// Ranks in different network namespaces count as different hosts, so the
// emulated cluster of bench/netns has hosts as it should; SHOAL_HOST_ID
// overrides it (tests fake several hosts on one machine).
#include "comm/hosts.h"

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <fstream>
#include <functional>
#include <map>

#include "collectives/common/host_layout.h"
#include "comm/call.h"
#include "core/config.h"
#include "core/log.h"

namespace shoal {
namespace {

std::string hostIdentity() {
  std::string chosen = config::getString("SHOAL_HOST_ID");
  if (!chosen.empty()) return "id:" + chosen;
  char host[256] = {};
  gethostname(host, sizeof host - 1);
  std::string bootId;
  std::ifstream("/proc/sys/kernel/random/boot_id") >> bootId;
  struct stat netNamespace {};
  stat("/proc/self/ns/net", &netNamespace);
  return fmt::format("{}/{}/{}", host, bootId, static_cast<unsigned long>(netNamespace.st_ino));
}

void adopt(shoal_comm& comm, std::vector<uint64_t> hostOf) {
  auto layout = std::make_shared<HostLayout>(HostLayout::from(hostOf, comm.rank));
  if (comm.rank == 0 && layout->hosts >= 2 && !layout->regular && comm.size > layout->hosts)
    SHOAL_LOG_INFO("rank 0: communicator {}: {}: the hierarchical allreduce needs the same number of ranks on every "
                   "host, so allreduce stays flat",
                   comm.keyPrefix, layout->description);
  else if (comm.rank == 0 && layout->hierarchical())
    SHOAL_LOG_INFO("rank 0: communicator {}: {}: auto takes the hierarchical allreduce from {} bytes "
                   "(SHOAL_HIER_MIN_BYTES)",
                   comm.keyPrefix, layout->description, comm.hierMinBytes);
  layout->chunkBytes = comm.hierChunkBytes;
  comm.hosts = std::move(layout);
}

}  // namespace

HostLayout HostLayout::from(const std::vector<uint64_t>& hostOf, int rank) {
  HostLayout layout;
  layout.hostOf = hostOf;
  std::vector<uint64_t> order;  // hosts by their first rank
  std::map<uint64_t, std::vector<int>> ranksOn;
  for (size_t r = 0; r < hostOf.size(); ++r) {
    if (ranksOn.find(hostOf[r]) == ranksOn.end()) order.push_back(hostOf[r]);
    ranksOn[hostOf[r]].push_back(static_cast<int>(r));
  }
  layout.hosts = static_cast<int>(order.size());
  layout.local = ranksOn[hostOf[rank]];
  layout.localRank = static_cast<int>(std::find(layout.local.begin(), layout.local.end(), rank) - layout.local.begin());
  layout.regular = true;
  std::string counts;
  for (uint64_t host : order) {
    const std::vector<int>& ranks = ranksOn[host];
    if (ranks.size() != layout.local.size()) layout.regular = false;
    counts += fmt::format("{}{}", counts.empty() ? "" : ", ", ranks.size());
    if (static_cast<size_t>(layout.localRank) < ranks.size()) layout.peers.push_back(ranks[layout.localRank]);
  }
  layout.description = layout.regular
                           ? fmt::format("{} host{} x {} rank{}", layout.hosts, layout.hosts == 1 ? "" : "s",
                                         layout.local.size(), layout.local.size() == 1 ? "" : "s")
                           : fmt::format("{} hosts, irregular ({} ranks)", layout.hosts, counts);
  return layout;
}

void learnHosts(shoal_comm& comm) {
  comm.hierMinBytes = static_cast<size_t>(config::getInt("SHOAL_HIER_MIN_BYTES"));
  comm.hierChunkBytes = static_cast<size_t>(config::getInt("SHOAL_HIER_CHUNK_BYTES"));
  std::vector<uint64_t> hostOf(comm.size, 0);
  hostOf[comm.rank] = std::hash<std::string>{}(hostIdentity());
  if (comm.size > 1) {
    Blocks blocks = blocksFrom(std::vector<size_t>(comm.size, 1).data(), nullptr, sizeof(uint64_t), comm.size,
                               comm.segmentBytes, comm.size);
    Context context(*comm.transport, takeSequence(comm), deadlineAfter(comm.timeoutS), comm.segmentBytes, comm.scratch);
    ringAllgather(context, reinterpret_cast<uint8_t*>(hostOf.data()), blocks);
  }
  adopt(comm, std::move(hostOf));
}

void inheritHosts(shoal_comm& child, const shoal_comm& parent, const std::vector<int>& members) {
  child.hierMinBytes = parent.hierMinBytes;
  child.hierChunkBytes = parent.hierChunkBytes;
  std::vector<uint64_t> hostOf;
  for (int member : members)
    hostOf.push_back(parent.hosts ? parent.hosts->hostOf[member] : 0);
  adopt(child, std::move(hostOf));
}

const AllreduceAlgorithm& chooseAllreduce(const shoal_comm& comm, size_t bytes) {
  // The name was resolved when the communicator was made (comm.allreduceChoice):
  // per call this compares sizes only.
  const AllreduceChoice& choice = comm.allreduceChoice;
  const bool hierarchicalLayout = comm.hosts && comm.hosts->hierarchical();
  if (choice.fixed == nullptr && hierarchicalLayout && bytes >= comm.hierMinBytes && bytes > comm.treeMaxBytes)
    return hierarchicalAllreduce();
  const AllreduceAlgorithm& chosen = choice.at(bytes, comm.size, comm.treeMaxBytes, comm.shmMaxBytes);
  // Asked for where the layout has no hierarchy, the hierarchical algorithm
  // runs the ring (hierarchical.cc): say so, so that the call's signature,
  // debug line and trace name what runs.
  if (chosen.run == allreduceHierarchical && !hierarchicalLayout)
    return selectAllreduce("ring", bytes, comm.size, comm.treeMaxBytes);
  return chosen;
}

}  // namespace shoal
