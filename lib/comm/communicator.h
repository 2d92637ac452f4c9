// The communicator behind the opaque shoal_comm_t handle. It is the comm
// layer's object: the layers above it (lib/plugin's compressor cache,
// lib/runtime's engine) hang off it through pointers whose deleters those
// layers define, so this header includes only downward.
#pragma once

#include <map>
#include <memory>
#include <string>

#include "comm/agree.h"
#include "aggregate/client.h"
#include "bootstrap/store.h"
#include "transport/shm/segment.h"
#include "collectives/collectives.h"
#include "collectives/common/context.h"
#include "core/error.h"
#include "shoal/shoal.h"
#include "transport/transport.h"

namespace shoal::nccl { class Communicator; }
namespace shoal { struct NcclRelease { void operator()(nccl::Communicator* communicator) const; }; }
namespace shoal::plugin {
class CompressorCache;
struct CompressorCacheRelease { void operator()(CompressorCache* cache) const; };  // lib/plugin/driver.cc
}  // namespace shoal::plugin
namespace shoal::runtime {
class Engine;
struct EngineRelease { void operator()(Engine* engine) const; };  // lib/runtime/engine.cc
}  // namespace shoal::runtime

namespace shoal {

// What the last allreduce moved (shoal_last_compress_stats): written by the
// compressed-collective driver (lib/plugin) and the call trace (lib/runtime).
struct CompressStats {
  std::string compressor = "none";
  uint64_t inputBytes = 0;
  uint64_t payloadBytes = 0;
  uint64_t wireBytes = 0;
  int rounds = 0;
  bool acrossHostsOnly = false;  // the hierarchical compressed allreduce: the rounds ran across hosts, on shards
  // What ran, as the debug log and the trace name it (a static name): the plain
  // algorithm's, "aggregate", "nccl" (CUDA tensors), "compressed" (flat) or
  // "hierarchical" (compressed across hosts only).
  const char* algorithm = nullptr;
};

}  // namespace shoal

struct shoal_comm {
  int rank = 0;
  int size = 1;
  std::string algorithm;   // "auto", "ring", "tree"
  shoal::AllreduceChoice allreduceChoice;  // the name resolved once (createComm; a split copies it)
  double timeoutS = 300;
  size_t segmentBytes = 0;
  size_t treeMaxBytes = 0;
  uint64_t sequence = 0;   // collective calls so far: feeds the message tags
  shoal::CallSignature call;  // of the call running now (comm/agree.h): its messages carry callWord
  uint32_t callWord = 0;      // comm/agree.cc: currentCallWord()
  bool callWordValid = false;
  int callScopes = 0;         // CallScopes open on it now (comm/agree.cc)
  shoal::CallWordMemo callWordMemo;  // the last signature hashed into a word, and the word
  std::unique_ptr<shoal::Store> store;
  std::unique_ptr<shoal::Transport> transport;  // destroyed before the store
  std::string keyPrefix;   // this communicator's store keys (the NCCL unique id goes under it)
  shoal::StoreOptions storeOptions;  // how this rank reached the store: a split reconnects with them (api/split.cc)
  int spinRounds = -1;               // the transport's, for a split's transport
  uint64_t splits = 0;               // splits so far: each child's store keys live under "<keyPrefix>split<n>/"
  std::shared_ptr<const shoal::HostLayout> hosts;  // which ranks share a host (comm/hosts.cc)
  size_t hierMinBytes = 0;                         // SHOAL_HIER_MIN_BYTES
  size_t hierChunkBytes = 0;                       // SHOAL_HIER_CHUNK_BYTES (the layout carries it to the algorithm)
  std::unique_ptr<shoal::SharedSegment> shm;  // ranks all on one host (lib/transport/shm); else null
  size_t shmMaxBytes = 0;  // auto takes shm up to this size: the segment's slot, 0 without one
  std::unique_ptr<shoal::aggregate::Client, shoal::aggregate::ClientRelease> aggregator;  // SHOAL_ALGO=aggregate (lib/aggregate)
  std::unique_ptr<shoal::nccl::Communicator, shoal::NcclRelease> nccl;  // made by the first CUDA call (gpu/route.cc)
  int ncclGeneration = 0;  // NCCL communicators made so far: a fresh store key for each unique id
  // Two-rank NCCL communicators of CUDA point-to-point calls, by peer (gpu/exchange_route.cc).
  std::map<int, std::unique_ptr<shoal::nccl::Communicator, shoal::NcclRelease>> ncclPeers;
  shoal::Scratch scratch;  // reused by every call
  std::unique_ptr<shoal::plugin::CompressorCache, shoal::plugin::CompressorCacheRelease>
      compressors;  // compressor instances and per-tensor state (made by shoal_comm_init)
  shoal::CompressStats lastStats;
  std::string lastError;
  bool finalized = false;
  std::unique_ptr<shoal::runtime::Engine, shoal::runtime::EngineRelease>
      engine;  // the async runtime (lib/runtime, made by shoal_comm_init); declared last: stops first
};

namespace shoal {

// Makes a communicator from a resolved config: rank, size, store, transport,
// a first agreement round. The compressor cache and the engine are added by
// shoal_comm_init (lib/api/comm_api.cc).
std::unique_ptr<shoal_comm> createComm(const shoal_config_t& config);

// Closes NCCL, the transport and the store (finalize and destroy).
void releaseConnections(shoal_comm& comm);

// The communicator, usable for a collective: non-null, not finalized, not failed.
// Inline: every call asks, and the answer is three loads and a branch each.
inline shoal_comm& usableComm(shoal_comm_t comm, const char* call) {
  if (comm == nullptr) fail(SHOAL_ERR_INVALID_ARGUMENT, "{}: comm is NULL; create one with shoal_comm_init", call);
  if (comm->finalized)
    fail(SHOAL_ERR_INVALID_ARGUMENT, "{}: the communicator was already finalized; create a new one", call);
  // A disagreement stays a disagreement: a rank whose transport a peer's
  // mismatch notice failed before this call began reports MISMATCH, as the
  // ranks that saw it inside the call do.
  if (comm->transport && comm->transport->failed())
    fail(comm->transport->failureStatus() == SHOAL_ERR_MISMATCH ? SHOAL_ERR_MISMATCH : SHOAL_ERR_REMOTE,
         "{}: the communicator failed earlier and cannot be used; create a new one. Cause: {}", call,
         comm->transport->failure());
  return *comm;
}

}  // namespace shoal
