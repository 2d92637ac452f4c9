#include "comm/shm_setup.h"

#include <algorithm>
#include <vector>

#include "comm/call.h"
#include "comm/communicator.h"
#include "collectives/collectives.h"
#include "core/config.h"
#include "core/log.h"

namespace shoal {

size_t sharedSlotBytes(int ranks) {
  if (config::getString("SHOAL_SHM_MAX_BYTES") != "auto") return static_cast<size_t>(config::getInt("SHOAL_SHM_MAX_BYTES"));
  // At 3+ ranks a piece runs as a reduce-scatter in the segment, which beat
  // the ring over UCX up to 2 MiB (docs/benchmarks.md, "The shared slot by rank
  // count"); at 2 ranks the one-round form loses to the ring above 256 KiB.
  // Above 16 ranks (never measured) the segment, 2 slots per rank, stays small.
  return ranks >= 3 && ranks <= 16 ? size_t(2) << 20 : size_t(256) << 10;
}

void attachSharedSegment(shoal_comm& comm) {
  const size_t slot = sharedSlotBytes(comm.size);
  std::string whyNot;
  comm.shm = SharedSegment::open(*comm.store, comm.keyPrefix, comm.rank, comm.size, slot,
                                 comm.timeoutS, &whyNot);
  comm.shmMaxBytes = comm.shm ? comm.shm->slotBytes() : 0;
  // A failure the transport finds itself writes the segment's abort word before its notices leave,
  // as failCommunicator does (transport.h, setBeforeNotices).
  if (comm.shm)
    comm.transport->setBeforeNotices(
        [segment = comm.shm.get()](const std::string& reason, shoal_status_t status) { segment->abort(reason, status); });
  if (!comm.shm && comm.algorithm == "shm")
    fail(SHOAL_ERR_INVALID_ARGUMENT,
         "SHOAL_ALGO=shm needs every rank on one host and a shared-memory segment, but this communicator has none: "
         "{}. Use SHOAL_ALGO=auto (it takes shared memory where it can)",
         whyNot);
  if (!comm.shm) SHOAL_LOG_DEBUG("rank {}: no shared-memory segment: {}", comm.rank, whyNot);
}

namespace {

// Like runCollective (api/run.h) without its final check for peers' aborts:
// a rank that finishes init late must not fail init because its peers have
// already moved on and failed a later call (that call reports it instead).
template <typename Body>
void initCollective(shoal_comm& comm, Body&& body) {
  Context context(*comm.transport, takeSequence(comm), deadlineAfter(comm.timeoutS), comm.segmentBytes, comm.scratch);
  context.shm = comm.shm.get();
  try {
    body(context);
  } catch (const Error& error) {
    failCommunicator(comm, error.what(), error.status());
    throw;
  }
}

}  // namespace

void warmUp(shoal_comm& comm) {
  if (comm.size == 1) return;
  // Recursive doubling at its largest auto size: its partners' endpoints and
  // the scratch slot it receives into.
  const size_t doublingBytes = std::max<size_t>(8, std::min<size_t>(comm.treeMaxBytes, 1 << 20)) / 8 * 8;
  std::vector<uint64_t> words(doublingBytes / 8, 0);
  initCollective(comm, [&](Context& context) {
    allreduceRecursiveDoubling(context, words.data(), words.size(), Reducer(SHOAL_U64, SHOAL_BOR));
  });
  // The ring at 4 MiB (at least full segments): ring neighbours, the
  // rendezvous protocol, and its two receive slots, faulted in at the block
  // size of a 4 MiB call (2 x 4 MiB / N resident; measured with
  // shoal-first-calls: a 1 MiB first call at N = 2 took ~100 page faults when
  // the warm-up stopped at 2 segments).
  const size_t ringBytes = std::max<size_t>(comm.segmentBytes * comm.size, 4 << 20) / 8 * 8;
  std::vector<uint64_t> ringWords(std::max<size_t>(ringBytes / 8, comm.size), 0);
  initCollective(comm, [&](Context& context) {
    allreduceRing(context, ringWords.data(), ringWords.size(), Reducer(SHOAL_U64, SHOAL_BOR));
  });
  if (comm.shm) initCollective(comm, [&](Context& context) { barrierShm(context); });
}

}  // namespace shoal
