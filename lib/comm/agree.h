// One agreement mechanism for every collective call: each call declares its
// signature (collective, count, dtype, op, root, algorithm, compressed or not,
// the compressor and its options) and every message of the call carries a
// compact form of it in the transport's tag (transport.h). A receive compares
// the sender's signature with its own; while a wait is idle the transport also
// looks for unmatched messages of the same call with another signature. So
// ranks that make different calls fail with SHOAL_ERR_MISMATCH and text naming
// what differs and on which rank, instead of combining unrelated data, and a
// large message pays no extra round trip. docs/reliability-agreement.md has
// the layout and what it cannot see.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "shoal/shoal.h"

struct shoal_comm;

namespace shoal {

// Four bits in the tag: at most 16 kinds.
enum class CallKind : uint8_t {
  Internal = 0,
  Allreduce,
  Allgather,
  Broadcast,
  ReduceScatter,
  Barrier,
  Other,
  Alltoall,
  Alltoallv,
  SendRecv,
  Reduce,
  Gather,
  Gatherv,
  Scatter,
  Scatterv,
  Split,
};

// No padding (every byte is a field's, checked below): two signatures with
// the same bytes are the same signature, so the call word's memo compares
// bytes first (currentCallWord).
struct CallSignature {
  CallKind kind = CallKind::Internal;
  bool compressed = false;
  uint16_t unused = 0;     // fills the gap to dtype: always 0
  int dtype = -1;          // shoal_dtype_t, -1 where the call has none
  int op = -1;             // shoal_op_t, -1 where the call has none
  int root = -1;           // rooted calls (broadcast, reduce, gather, scatter)
  uint64_t count = 0;      // elements (allgather: of every rank together)
  uint64_t layout = 0;     // allgatherv: every rank's count, hashed
  // Views of text that outlives the call: the algorithm tables' names, the
  // compressor instance's name and options (kept for the communicator's life).
  std::string_view algorithm;   // the algorithm the call runs (resolved, not "auto")
  std::string_view compressor;  // with its options, when compressed
  std::string_view options;

  // The 19 bits the tags carry: kind (4), dtype (4), op or root mod 8 (3),
  // compressed (1), and a 7-bit digest of count, layout, root, algorithm,
  // compressor and options.
  uint32_t word() const;
  // All of it in 64 bits, for a carrier with room for more than the tag's 19:
  // the aggregator compares it between ranks slot by slot (lib/aggregate).
  uint64_t digest() const;
  // For error text: "allreduce(count 6, f32, sum, algorithm doubling, plain)".
  std::string describe() const;
};

// A signature from its common fields (the others keep their defaults).
inline CallSignature signatureOf(CallKind kind, int dtype, int op, uint64_t count, int root = -1,
                                 std::string_view algorithm = {}) {
  CallSignature signature;
  signature.kind = kind;
  signature.dtype = dtype;
  signature.op = op;
  signature.count = count;
  signature.root = root;
  signature.algorithm = algorithm;
  return signature;
}

// Declares the call that a C entry point runs on a communicator: every
// collective it runs (runCollective, comm/call.h) tags its messages with the
// signature. Restores the previous one on exit (calls do not nest across
// ranks, but the scope keeps a stray internal collective honest): the
// outermost scope restores "no call" (the default signature); a nested one
// (a CUDA call's host round) keeps its enclosing call's signature to restore.
class CallScope {
 public:
  CallScope(shoal_comm& comm, const CallSignature& signature);
  ~CallScope();
  CallScope(const CallScope&) = delete;
  CallScope& operator=(const CallScope&) = delete;

 private:
  shoal_comm& comm_;
  std::optional<CallSignature> saved_;  // the enclosing scope's, where this one is nested
  const CallSignature* savedCurrent_;
};

// The last signature whose tag word a communicator computed, and the word:
// a communicator's calls repeat, and the same signature again costs a
// comparison instead of the hash (currentCallWord).
struct CallWordMemo {
  CallSignature signature;
  uint32_t word = 0;
  bool valid = false;
};

// Marks comm.call changed (the driver adds the compression decision once it
// is made): the tag word is recomputed by the call's next collective.
void refreshCallWord(shoal_comm& comm);
// The tag word of the running call, computed once per change.
uint32_t currentCallWord(shoal_comm& comm);

// ---- Agreement rounds ----
// Some things cannot ride in the tag's 19 bits: a compressor's options and
// shapes, a CUDA call's memory kinds, the async runtime's settings, a
// low-rank plan, a refusal on one rank. Those take one agreement round.

// FNV-1a over text: the stable fingerprint every agreement round compares.
uint64_t fingerprint(std::string_view text);

// What an agreement round found.
struct Agreement {
  bool same = true;                   // every rank described the same thing
  shoal_status_t refusal = SHOAL_OK;  // the most severe refusal any rank reported (also when !same)
};

// The one cross-rank agreement round: a max-allreduce of
// {fingerprint(description), its complement, -refusal} (three words, up a
// tree and down again) with the given sequence number and the running call's
// signature. The tree, not recursive doubling: each rank gets the result from
// its parent, which sends it before moving on, so an abort caused by a next
// call rarely overtakes it; with doubling the extra rank of a non-power-of-two
// count was routinely still waiting while the others had moved on (measured:
// collectives Disagreement.AllgatherCounts at 3 ranks). Every rank learns whether all descriptions were equal and the
// most severe refusal, so it can fail with every other rank. Failures of the
// round itself (a dead peer, a mismatched tag) throw as usual.
Agreement agree(shoal_comm& comm, uint64_t sequence, std::string_view description,
                shoal_status_t refusal = SHOAL_OK);

// "f32" style names (shoal_dtype_name / shoal_op_name with a fallback).
std::string dtypeText(int dtype);
std::string opText(int op);

}  // namespace shoal
