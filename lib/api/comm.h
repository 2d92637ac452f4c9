// The communicator behind the opaque shoal_comm_t handle, and the guard that
// turns C++ exceptions into status codes (the only try/catch of the C API).
#pragma once

#include <memory>
#include <string>

#include "api/agree.h"
#include "bootstrap/store.h"
#include "collectives/common/context.h"
#include "plugin/driver.h"
#include "runtime/engine.h"
#include "core/error.h"
#include "shoal/shoal.h"
#include "transport/shm/segment.h"
#include "transport/transport.h"

namespace shoal::nccl { class Communicator; }
namespace shoal::aggregate { class Client; struct ClientRelease { void operator()(Client* client) const; }; }
namespace shoal { struct NcclRelease { void operator()(nccl::Communicator* communicator) const; }; }

struct shoal_comm {
  int rank = 0;
  int size = 1;
  std::string algorithm;   // "auto", "ring", "tree"
  double timeoutS = 300;
  size_t segmentBytes = 0;
  size_t treeMaxBytes = 0;
  uint64_t sequence = 0;   // collective calls so far: feeds the message tags
  shoal::CallSignature call;  // of the call running now (api/agree.h): its messages carry callWord
  uint32_t callWord = 0;      // api/agree.cc: currentCallWord()
  bool callWordValid = false;
  std::unique_ptr<shoal::Store> store;
  std::unique_ptr<shoal::Transport> transport;  // destroyed before the store
  std::unique_ptr<shoal::SharedSegment> shm;    // ranks all on one host (lib/transport/shm); else null
  size_t shmMaxBytes = 0;  // auto takes shm up to this size: the segment's slot, 0 without one
  std::string keyPrefix;   // this communicator's store keys (the NCCL unique id goes under it)
  std::unique_ptr<shoal::aggregate::Client, shoal::aggregate::ClientRelease> aggregator;  // SHOAL_ALGO=aggregate (lib/aggregate)
  std::unique_ptr<shoal::nccl::Communicator, shoal::NcclRelease> nccl;  // made by the first CUDA call (api/cuda_route.cc)
  int ncclGeneration = 0;  // NCCL communicators made so far: a fresh store key for each unique id
  shoal::Scratch scratch;  // reused by every call
  shoal::plugin::CompressorCache compressors;  // compressor instances and per-tensor state
  shoal::plugin::CompressStats lastStats;
  std::string lastError;
  bool finalized = false;
  std::unique_ptr<shoal::runtime::Engine> engine;  // the async runtime (lib/runtime); declared last: stops first
};

namespace shoal {

// Records the error text for shoal_last_error(comm) and shoal_last_error(NULL).
void setLastError(shoal_comm_t comm, const std::string& text);

// Runs body; returns SHOAL_OK or the status of what it threw, with its text recorded.
template <typename Body>
shoal_status_t guarded(shoal_comm_t comm, Body&& body) {
  try {
    body();
    return SHOAL_OK;
  } catch (const Error& error) {
    setLastError(comm, error.what());
    return error.status();
  } catch (const std::bad_alloc&) {
    setLastError(comm, "out of host memory");
    return SHOAL_ERR_NO_MEMORY;
  } catch (const std::exception& error) {
    setLastError(comm, std::string("internal error: ") + error.what());
    return SHOAL_ERR_INTERNAL;
  }
}

// The communicator, usable for a collective: non-null, not finalized, not failed.
shoal_comm& usableComm(shoal_comm_t comm, const char* call);

}  // namespace shoal
