// Internal entry points of every collective algorithm. Each works on host
// buffers through a Context (transport, tags, deadline) and, where it reduces,
// a Reducer. The C API (lib/api) checks arguments before calling these.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "collectives/common/context.h"
#include "collectives/common/reducer.h"

namespace shoal {

// ---- building blocks (in place on `data`, laid out as `blocks`) ----------
// Ring reduce-scatter: afterwards block r of rank r's `data` holds the
// reduction of every rank's `input` (input may equal data: in place).
void ringReduceScatter(Context& context, const uint8_t* input, uint8_t* data, const Blocks& blocks,
                       const Reducer& reducer);
// Ring allgather: rank r's block r is already in place; afterwards all blocks are.
void ringAllgather(Context& context, uint8_t* data, const Blocks& blocks);

// ---- allreduce: recv already holds this rank's input ---------------------
using AllreduceFn = void (*)(Context& context, void* recv, size_t count, const Reducer& reducer);
void allreduceRing(Context& context, void* recv, size_t count, const Reducer& reducer);
// The ring, out of place: reads send, writes recv, no copy of the input first.
void allreduceRingOutOfPlace(Context& context, const void* send, void* recv, size_t count, const Reducer& reducer);
void allreduceTree(Context& context, void* recv, size_t count, const Reducer& reducer);
void allreduceRecursiveDoubling(Context& context, void* recv, size_t count, const Reducer& reducer);
// Inside hosts, then across, then inside again (context.hosts); the ring where the layout is not regular.
void allreduceHierarchical(Context& context, void* recv, size_t count, const Reducer& reducer);
// Through the shared-memory segment (context.shm): ranks on one host only.
void allreduceShm(Context& context, void* recv, size_t count, const Reducer& reducer);
// The same reading `send` into the segment directly (no copy into recv first).
void allreduceShmOutOfPlace(Context& context, const void* send, void* recv, size_t count, const Reducer& reducer);
// Whether a piece of this many bytes runs as a reduce-scatter in the segment (two rounds) at `size` ranks.
bool allreduceShmScatters(size_t pieceBytes, int size);

struct AllreduceAlgorithm {
  const char* name;
  const char* description;
  AllreduceFn run;
  // The name with its length, for a call's signature (comm/agree.h): a call
  // that declares its algorithm measures no string.
  std::string_view nameView = name;
};
const std::vector<AllreduceAlgorithm>& allreduceAlgorithms();
// The table's hierarchical entry (comm/hosts.cc chooses it for auto across hosts).
const AllreduceAlgorithm& hierarchicalAllreduce();
// auto's rule for a compressed allreduce whose size and layout take the hierarchical
// algorithm: whether compressing only the cross-host leg pays for the dense legs inside
// each host, judged from what the compressor does (its SHOAL_CAP_* bits), never its name.
// SHOAL_ALGO=hierarchical runs it whatever this says (lib/plugin/driver.cc).
bool hierarchicalSuitsCompressor(uint64_t compressorCaps);

// An algorithm name (SHOAL_ALGO) resolved once, when the communicator is
// made: what the name decides alone, so that choosing per call compares
// sizes, never strings. "auto", "" and "bruck" (an alltoall algorithm) leave
// the choice to the size; "aggregate" fixes the ring, its fallback.
struct AllreduceChoice {
  const AllreduceAlgorithm* fixed = nullptr;  // null: auto
  bool aggregate = false;                     // SHOAL_ALGO=aggregate
  // An unknown name is Error(SHOAL_ERR_NOT_FOUND) listing the valid ones.
  static AllreduceChoice of(const std::string& name);
  // The fixed algorithm, else auto's pick by message size and rank count
  // (the shared segment up to sharedMaxBytes, 0 where the communicator has none).
  const AllreduceAlgorithm& at(size_t bytes, int worldSize, size_t treeMaxBytes, size_t sharedMaxBytes = 0) const;
};
// AllreduceChoice::of(name).at(...), for a name that is not resolved already.
const AllreduceAlgorithm& selectAllreduce(const std::string& name, size_t bytes, int worldSize, size_t treeMaxBytes,
                                          size_t sharedMaxBytes = 0);

// ---- broadcast: on root, buf holds the data -----------------------------
void broadcastTree(Context& context, void* buf, size_t bytes, int root);
void broadcastChain(Context& context, void* buf, size_t bytes, int root);
void broadcastShm(Context& context, void* buf, size_t bytes, int root);  // context.shm: one host

// ---- barrier ------------------------------------------------------------
void barrierDissemination(Context& context);
void barrierShm(Context& context);  // context.shm: one host

}  // namespace shoal
