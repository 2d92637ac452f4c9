// Communicator life cycle: discovery of rank, size and store from the config
// struct or the environment, rendezvous, transport connection, and a first
// collective that checks every rank agrees on the configuration.
#include "api/export.h"
#include "api/comm.h"

#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <atomic>
#include <unistd.h>

#include "api/comm_info.h"
#include "api/shm_setup.h"
#include "bootstrap/discovery.h"
#include "collectives/collectives.h"
#include "core/config.h"

namespace shoal {
namespace {

thread_local std::string threadLastError;

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

// Every rank must use the same algorithm and pipelining settings: a cheap
// check through a first allreduce of {hash, ~hash} with max.
void checkRanksAgree(shoal_comm& comm) {
  std::string settings = fmt::format("{}|{}|{}", comm.algorithm, comm.segmentBytes, comm.treeMaxBytes);
  uint64_t hash = std::hash<std::string>{}(settings);
  uint64_t both[2] = {hash, ~hash};
  Context context(*comm.transport, comm.sequence++, deadlineAfter(comm.timeoutS), comm.segmentBytes, comm.scratch);
  allreduceTree(context, both, 2, Reducer(SHOAL_U64, SHOAL_MAX));
  if (both[0] != hash || ~both[1] != hash)
    fail(SHOAL_ERR_MISMATCH,
         "ranks disagree on SHOAL_ALGO, SHOAL_SEGMENT_BYTES or SHOAL_TREE_MAX_BYTES (this rank: {}): set them "
         "identically on every rank",
         settings);
}

}  // namespace

void setLastError(shoal_comm_t comm, const std::string& text) {
  threadLastError = text;
  if (comm != nullptr) comm->lastError = text;
}

shoal_comm& usableComm(shoal_comm_t comm, const char* call) {
  if (comm == nullptr) fail(SHOAL_ERR_INVALID_ARGUMENT, "{}: comm is NULL; create one with shoal_comm_init", call);
  if (comm->finalized)
    fail(SHOAL_ERR_INVALID_ARGUMENT, "{}: the communicator was already finalized; create a new one", call);
  if (comm->transport && comm->transport->failed())
    fail(SHOAL_ERR_REMOTE, "{}: the communicator failed earlier and cannot be used; create a new one. Cause: {}", call,
         comm->transport->failure());
  return *comm;
}

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
  selectAllreduce(comm->algorithm, 0, 1, 0);  // rejects an unknown name now, with the valid ones
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
  comm->transport = makeUcxTransport(transportOptions);
  checkRanksAgree(*comm);
  attachSharedSegment(*comm);  // api/shm_setup.h: ranks on one host
  warmUp(*comm);               // the first calls pay no wire-up or page faults
  describeCommunicator(*comm, storeOptions.url.c_str());  // SHOAL_LOG_LEVEL=info: once per communicator
  comm->engine = std::make_unique<runtime::Engine>(*comm);  // its thread starts with the first async call
  return comm;
}

}  // namespace shoal

using shoal::guarded;

SHOAL_EXPORT shoal_status_t shoal_comm_init_config(const shoal_config_t* config,
                                                                             shoal_comm_t* comm) {
  return guarded(nullptr, [&] {
    if (comm == nullptr) shoal::fail(SHOAL_ERR_INVALID_ARGUMENT, "shoal_comm_init: comm (the out-parameter) is NULL");
    *comm = nullptr;
    shoal_config_t resolved = SHOAL_CONFIG_INIT;
    if (config != nullptr) {
      // A shorter struct (an older caller) keeps the defaults of the fields it lacks.
      if (config->struct_size == 0 || config->struct_size > sizeof(shoal_config_t))
        shoal::fail(SHOAL_ERR_INVALID_ARGUMENT,
                    "shoal_comm_init_config: config->struct_size is {}; initialise the struct with SHOAL_CONFIG_INIT",
                    config->struct_size);
      std::memcpy(&resolved, config, config->struct_size);
      resolved.struct_size = sizeof(shoal_config_t);
    }
    *comm = shoal::createComm(resolved).release();
  });
}

SHOAL_EXPORT shoal_status_t shoal_comm_init(shoal_comm_t* comm) {
  return shoal_comm_init_config(nullptr, comm);
}

SHOAL_EXPORT shoal_status_t shoal_comm_finalize(shoal_comm_t comm) {
  return guarded(comm, [&] {
    if (comm == nullptr) shoal::fail(SHOAL_ERR_INVALID_ARGUMENT, "shoal_comm_finalize: comm is NULL");
    if (comm->finalized) shoal::fail(SHOAL_ERR_INVALID_ARGUMENT, "shoal_comm_finalize: already finalized");
    comm->finalized = true;
    if (comm->engine) comm->engine->shutdown();
    comm->nccl.reset();
    comm->shm.reset();
    comm->transport.reset();
    comm->store.reset();
  });
}

SHOAL_EXPORT shoal_status_t shoal_comm_destroy(shoal_comm_t comm) {
  return guarded(nullptr, [&] {
    if (comm == nullptr) return;
    if (comm->engine) comm->engine->shutdown();
    comm->nccl.reset();
    comm->transport.reset();
    comm->store.reset();
    delete comm;
  });
}

SHOAL_EXPORT shoal_status_t shoal_comm_rank(shoal_comm_t comm, int* rank) {
  return guarded(comm, [&] {
    shoal_comm& c = shoal::usableComm(comm, "shoal_comm_rank");
    if (rank == nullptr) shoal::fail(SHOAL_ERR_INVALID_ARGUMENT, "shoal_comm_rank: rank (the out-parameter) is NULL");
    *rank = c.rank;
  });
}

SHOAL_EXPORT shoal_status_t shoal_comm_size(shoal_comm_t comm, int* size) {
  return guarded(comm, [&] {
    shoal_comm& c = shoal::usableComm(comm, "shoal_comm_size");
    if (size == nullptr) shoal::fail(SHOAL_ERR_INVALID_ARGUMENT, "shoal_comm_size: size (the out-parameter) is NULL");
    *size = c.size;
  });
}

SHOAL_EXPORT const char* shoal_last_error(shoal_comm_t comm) {
  return comm != nullptr ? comm->lastError.c_str() : shoal::threadLastError.c_str();
}

SHOAL_EXPORT shoal_status_t shoal_config_print(FILE* out, int markdown) {
  return guarded(nullptr, [&] {
    if (out == nullptr) shoal::fail(SHOAL_ERR_INVALID_ARGUMENT, "shoal_config_print: out is NULL");
    shoal::config::print(out, markdown != 0);
  });
}

