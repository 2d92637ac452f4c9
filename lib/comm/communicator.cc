// Making a communicator: discovery of rank, size and store from the config
// struct or the environment, rendezvous, transport connection, and a first
// collective that checks every rank agrees on the configuration. The C entry
// points (lib/api/comm_api.cc) add the layers above: compressors and engine.
#include "comm/communicator.h"

#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <atomic>
#include <unistd.h>

#include "comm/call.h"
#include "comm/describe.h"
#include "comm/hosts.h"
#include "comm/shm_setup.h"
#include "bootstrap/discovery.h"
#include "collectives/collectives.h"
#include "core/config.h"

namespace shoal {
namespace {

// The k-th communicator a rank creates on a store uses key prefix "comm<k>/",
// so successive (or simultaneous) communicators of one job do not read each
// other's keys; every rank must create its communicators in the same order.
//
// A store can outlive a job: a file:// folder used again, or a tcp server that
// stays up while other communicators of the process use it. So the ranks also
// count their arrivals on the store: the n-th arrival (1-based) belongs to
// generation (n - 1) / worldSize, and the keys live under "comm<k>/g<gen>/".
// The next job on a reused folder then gets generation 1 and never reads the
// previous job's keys. (A job that died before all its ranks arrived leaves the
// count misaligned: its successor times out naming the store; use a fresh folder.)
std::string nextKeyPrefix(Store& store, const std::string& storeUrl, int rank, int worldSize) {
  static std::mutex mutex;
  static std::map<std::pair<std::string, int>, int> created;
  std::string comm;
  {
    std::lock_guard<std::mutex> lock(mutex);
    comm = "comm" + std::to_string(created[{storeUrl, rank}]++) + "/";
  }
  int64_t arrival = store.add(comm + "arrivals", 1);
  return comm + "g" + std::to_string((arrival - 1) / worldSize) + "/";
}

// Every rank must use the same algorithm, pipelining and path-choice
// settings: the communicator's first collective is an agreement round on
// them. The thresholds decide which path a call takes (SHOAL_SHM_MAX_BYTES the
// shared segment against UCX, SHOAL_HIER_MIN_BYTES the hierarchical allreduce
// against the flat one); ranks that disagree on them would straddle a
// threshold with the same call, so they fail here, at init, on every rank.
// SHOAL_HIER_CHUNK_BYTES cuts the hierarchical allreduce into chunks, and so its tags.
void checkRanksAgree(shoal_comm& comm) {
  std::string settings = fmt::format("{}|{}|{}|{}|{}|{}", comm.algorithm, comm.segmentBytes, comm.treeMaxBytes,
                                     sharedSlotBytes(comm.size), config::getInt("SHOAL_HIER_MIN_BYTES"),
                                     config::getInt("SHOAL_HIER_CHUNK_BYTES"));
  if (!agree(comm, takeSequence(comm), settings).same)
    fail(SHOAL_ERR_MISMATCH,
         "ranks disagree on SHOAL_ALGO, SHOAL_SEGMENT_BYTES, SHOAL_TREE_MAX_BYTES, SHOAL_SHM_MAX_BYTES, "
         "SHOAL_HIER_MIN_BYTES or SHOAL_HIER_CHUNK_BYTES (this rank: {}): set them identically on every rank",
         settings);
}

}  // namespace

std::unique_ptr<shoal_comm> createComm(const shoal_config_t& config) {
  auto comm = std::make_unique<shoal_comm>();
  config::checkEnvironment();  // a malformed or out-of-range SHOAL_* variable fails here, by name
  Discovery discovery = discoverRanks(config.rank, config.world_size, config.store);
  comm->rank = discovery.rank;
  comm->size = discovery.worldSize;
  comm->timeoutS = config.timeout_s > 0 ? config.timeout_s : config::getDouble("SHOAL_TIMEOUT_S");
  if (!(comm->timeoutS > 0))
    fail(SHOAL_ERR_INVALID_ARGUMENT, "SHOAL_TIMEOUT_S must be a positive number of seconds, not {}", comm->timeoutS);
  comm->algorithm = config.algorithm ? config.algorithm : config::getString("SHOAL_ALGO");
  comm->allreduceChoice = AllreduceChoice::of(comm->algorithm);  // rejects an unknown name now, with the valid ones
  long long segment = config::getInt("SHOAL_SEGMENT_BYTES");
  long long treeMax = config::getInt("SHOAL_TREE_MAX_BYTES");
  if (segment < 1) fail(SHOAL_ERR_INVALID_ARGUMENT, "SHOAL_SEGMENT_BYTES must be >= 1, not {}", segment);
  if (treeMax < 0) fail(SHOAL_ERR_INVALID_ARGUMENT, "SHOAL_TREE_MAX_BYTES must be >= 0, not {}", treeMax);
  comm->segmentBytes = static_cast<size_t>(segment);
  comm->treeMaxBytes = static_cast<size_t>(treeMax);

  StoreOptions storeOptions;
  storeOptions.rank = comm->rank;
  storeOptions.worldSize = comm->size;
  storeOptions.timeoutS = comm->timeoutS;
  if (discovery.store) {
    storeOptions.url = *discovery.store;
  } else if (comm->size == 1) {
    static std::atomic<int> privateStores{0};
    storeOptions.url = fmt::format("memory://shoal-private-{}-{}", getpid(), privateStores++);
  } else {
    fail(SHOAL_ERR_INVALID_ARGUMENT,
         "no rendezvous store for {} ranks: launch with shoalrun, or set SHOAL_STORE=tcp://<rank 0 host>:<port> "
         "(and SHOAL_TOKEN) on every rank, or config.store",
         comm->size);
  }
  if (config.token != nullptr) {
    storeOptions.token = config.token;
  } else {
    storeOptions.token = config::getString("SHOAL_TOKEN");
  }
  comm->store = makeStore(storeOptions);
  comm->storeOptions = storeOptions;

  TransportOptions transportOptions;
  transportOptions.rank = comm->rank;
  transportOptions.worldSize = comm->size;
  transportOptions.store = comm->store.get();
  transportOptions.keyPrefix = nextKeyPrefix(*comm->store, storeOptions.url, comm->rank, comm->size);
  comm->keyPrefix = transportOptions.keyPrefix;
  transportOptions.timeoutS = comm->timeoutS;
  if (config::getString("SHOAL_SPIN_ROUNDS") != "auto") {
    long long spinRounds = config::getInt("SHOAL_SPIN_ROUNDS");
    if (spinRounds < 0)
      fail(SHOAL_ERR_INVALID_ARGUMENT, "SHOAL_SPIN_ROUNDS must be auto or >= 0, not {}", spinRounds);
    transportOptions.spinRounds = static_cast<int>(std::min<long long>(spinRounds, 1 << 30));
  }
  comm->spinRounds = transportOptions.spinRounds;
  comm->transport = makeUcxTransport(transportOptions);
  checkRanksAgree(*comm);
  learnHosts(*comm);  // the rank-to-host map of the hierarchical allreduce (comm/hosts.cc)
  attachSharedSegment(*comm);  // comm/shm_setup.h: ranks on one host
  warmUp(*comm);               // the first calls pay no wire-up or page faults
  describeCommunicator(*comm, storeOptions.url.c_str());  // SHOAL_LOG_LEVEL=info: once per communicator
  return comm;
}

void releaseConnections(shoal_comm& comm) {
  comm.nccl.reset();
  if (comm.transport) comm.transport->setBeforeNotices(nullptr);  // it names the segment
  comm.shm.reset();
  comm.transport.reset();
  comm.store.reset();
}

}  // namespace shoal
