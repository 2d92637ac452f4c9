#include "comm/describe.h"

#include <unistd.h>

#include <string>

#include "comm/communicator.h"
#include "core/config.h"
#include "core/log.h"

namespace shoal {
namespace {

std::string hostName() {
  char name[256] = {};
  if (gethostname(name, sizeof name - 1) != 0) return "?";
  return name;
}

// The store URL carries no secret (SHOAL_TOKEN travels separately).
std::string storeWhere(const char* url) { return url != nullptr && url[0] != '\0' ? url : "(none)"; }

std::string orUnset(const std::string& value) { return value.empty() ? "(unset)" : "'" + value + "'"; }

}  // namespace

void describeCommunicator(shoal_comm& comm, const char* storeUrl) {
  // Read the level now, while the configuration table exists: a first log
  // line written during exit() (a store thread seeing peers leave) must not
  // read a table that exit() already destroyed.
  if (log::threshold() < log::Level::Info) return;
  const int r = comm.rank;
  int version = 0;
  shoal_get_version(&version);
  SHOAL_LOG_INFO("rank {}: shoal {}.{}.{} (library version code {}), rank {} of {} on host {} (pid {}, local rank {} "
                 "of {}), store {}, timeout {} s, communicator {}",
                 r, version / 10000, version / 100 % 100, version % 100, version, r, comm.size, hostName(), getpid(),
                 orUnset(config::getString("SHOAL_LOCAL_RANK")), orUnset(config::getString("SHOAL_LOCAL_SIZE")),
                 storeWhere(storeUrl), comm.timeoutS, comm.keyPrefix);
  const std::string spin = config::getString("SHOAL_SPIN_ROUNDS");
  if (comm.algorithm == "bruck")
    SHOAL_LOG_INFO("rank {}: alltoall algorithm bruck (SHOAL_ALGO; alltoallv stays pairwise); allreduce as under auto", r);
  if (comm.algorithm.empty() || comm.algorithm == "auto" || comm.algorithm == "bruck")
    SHOAL_LOG_INFO("rank {}: allreduce algorithm auto: {}recursive doubling up to {} bytes (SHOAL_TREE_MAX_BYTES), the "
                   "ring above; broadcast tree up to {} bytes, chain above; segment {} bytes (SHOAL_SEGMENT_BYTES); "
                   "spin rounds {}",
                   r,
                   comm.shm ? fmt::format("shared memory up to {} bytes (SHOAL_SHM_MAX_BYTES), then ", comm.shmMaxBytes)
                            : std::string(),
                   comm.treeMaxBytes, comm.treeMaxBytes, comm.segmentBytes, spin);
  else
    SHOAL_LOG_INFO("rank {}: allreduce algorithm {} for every size (SHOAL_ALGO); segment {} bytes "
                   "(SHOAL_SEGMENT_BYTES); spin rounds {}",
                   r, comm.algorithm, comm.segmentBytes, spin);
  SHOAL_LOG_INFO("rank {}: compressor {} (SHOAL_COMPRESSOR), options {} (SHOAL_COMPRESSOR_OPTS), tensors under {} "
                 "bytes uncompressed (SHOAL_COMPRESS_MIN_BYTES), plugin path {}",
                 r, config::getString("SHOAL_COMPRESSOR"), orUnset(config::getString("SHOAL_COMPRESSOR_OPTS")),
                 config::getString("SHOAL_COMPRESS_MIN_BYTES"), orUnset(config::getString("SHOAL_PLUGIN_PATH")));
  SHOAL_LOG_INFO("rank {}: async runtime (starts with the first async call): cycle {} ms, fusion threshold {} bytes, "
                 "response cache {} entries, timeline {}",
                 r, config::getString("SHOAL_CYCLE_TIME_MS"), config::getString("SHOAL_FUSION_THRESHOLD"),
                 config::getString("SHOAL_CACHE_CAPACITY"),
                 r == 0 ? orUnset(config::getString("SHOAL_TIMELINE")) : std::string("(rank 0 writes it)"));
  if (!comm.transport) return;
  for (int peer = 0; peer < comm.size; ++peer)
    if (peer != r)
      SHOAL_LOG_INFO("rank {}: peer {} via {} {}", r, peer, comm.transport->name(),
                     comm.transport->describePeer(peer));
}

}  // namespace shoal
