#include "comm/agree.h"

#include <fmt/format.h>

#include <cstring>
#include <type_traits>

#include "collectives/collectives.h"
#include "comm/call.h"
#include "comm/communicator.h"
#include "transport/transport.h"

namespace shoal {
namespace {

// The signature of the call this thread is running (for error text: the
// transport sees only the 19 tag bits).
thread_local const CallSignature* currentCall = nullptr;

constexpr int kKindBits = 4, kDtypeBits = 4, kOpBits = 3, kDigestBits = 7;
constexpr int kDtypeShift = kKindBits, kOpShift = kDtypeShift + kDtypeBits, kCompressedShift = kOpShift + kOpBits,
              kDigestShift = kCompressedShift + 1;
static_assert(kDigestShift + kDigestBits == kSignatureBits, "the signature fills the tag's signature field");

uint32_t field(uint32_t word, int shift, int bits) { return (word >> shift) & ((1u << bits) - 1); }

// Stable across standard libraries and runs: FNV-1a over text, a
// multiply-xorshift step over integers.
uint64_t mix(uint64_t hash, std::string_view text) {
  for (unsigned char c : text) hash = (hash ^ c) * 1099511628211ull;
  return (hash ^ 0xff) * 1099511628211ull;  // a separator: "ab","c" differs from "a","bc"
}
uint64_t mix(uint64_t hash, uint64_t value) {
  hash = (hash ^ value) * 0x9e3779b97f4a7c15ull;
  return hash ^ (hash >> 29);
}

// Rooted calls without an op carry the root where others carry the op.
bool rootInOpField(uint32_t kind) {
  switch (static_cast<CallKind>(kind)) {
    case CallKind::Broadcast: case CallKind::Gather: case CallKind::Gatherv: case CallKind::Scatter:
    case CallKind::Scatterv: return true;
    default: return false;
  }
}

const char* kindText(uint32_t kind) {
  static const char* const names[] = {
      "an internal collective", "allreduce", "allgather", "broadcast", "reduce_scatter", "barrier",
      "another call",           "alltoall",  "alltoallv", "send/recv", "reduce",         "gather",
      "gatherv",                "scatter",   "scatterv",  "comm_split"};
  static_assert(sizeof(names) / sizeof(names[0]) == 1u << kKindBits, "a name for every kind");
  return names[kind & ((1u << kKindBits) - 1)];
}

// The same text: the same view (the names a signature points at are kept
// unchanged for the communicator's life: comm/agree.h), else the same bytes.
bool sameText(std::string_view a, std::string_view b) {
  return (a.data() == b.data() && a.size() == b.size()) || a == b;
}

// Every field word() hashes (a new field must be added here and there).
bool sameSignature(const CallSignature& a, const CallSignature& b) {
  static_assert(sizeof(CallSignature) == 80, "compare (and hash) every field of CallSignature");
  return a.kind == b.kind && a.dtype == b.dtype && a.op == b.op && a.root == b.root && a.count == b.count &&
         a.layout == b.layout && a.compressed == b.compressed && sameText(a.algorithm, b.algorithm) &&
         sameText(a.compressor, b.compressor) && sameText(a.options, b.options);
}

// The same bytes: the same fields, texts at the same addresses (a call that
// repeats). Ten words XORed and ORed (vectorised), against sameSignature's
// field by field branches; a text of equal bytes elsewhere falls through to
// sameSignature. Every byte is a field's, so equal bytes are equal fields.
static_assert(std::has_unique_object_representations_v<CallSignature>, "CallSignature has no padding");
bool sameBytes(const CallSignature& a, const CallSignature& b) {
  using Words = uint64_t __attribute__((vector_size(16)));  // two words a load
  static_assert(sizeof(CallSignature) % sizeof(Words) == 0);
  const auto* pa = reinterpret_cast<const unsigned char*>(&a);
  const auto* pb = reinterpret_cast<const unsigned char*>(&b);
  Words differ = {0, 0};
  for (size_t at = 0; at < sizeof(CallSignature); at += sizeof(Words)) {
    Words x, y;
    std::memcpy(&x, pa + at, sizeof x);
    std::memcpy(&y, pb + at, sizeof y);
    differ |= x ^ y;
  }
  return (differ[0] | differ[1]) == 0;
}

// The memo's slow half, out of line: a signature of other bytes (the same
// fields with texts elsewhere keep the word, else it is hashed).
[[gnu::noinline]] void rememberCallWord(shoal_comm& comm) {
  CallWordMemo& memo = comm.callWordMemo;
  const bool same = memo.valid && sameSignature(memo.signature, comm.call);
  memo.signature = comm.call;
  if (!same) memo.word = comm.call.word();
  memo.valid = true;
}

}  // namespace

std::string dtypeText(int dtype) {
  const char* name = dtype >= 0 ? shoal_dtype_name(static_cast<shoal_dtype_t>(dtype)) : nullptr;
  return name ? name : fmt::format("dtype {}", dtype);
}

std::string opText(int op) {
  const char* name = op >= 0 ? shoal_op_name(static_cast<shoal_op_t>(op)) : nullptr;
  return name ? name : fmt::format("op {}", op);
}

uint32_t CallSignature::word() const {
  uint64_t digest = 1469598103934665603ull;
  digest = mix(digest, count);
  digest = mix(digest, layout);
  digest = mix(digest, static_cast<uint64_t>(root));
  digest = mix(digest, algorithm);
  if (compressed) digest = mix(mix(digest, compressor), options);
  digest ^= digest >> 32;
  digest ^= digest >> 16;
  digest ^= digest >> 8;
  uint32_t opOrRoot = rootInOpField(static_cast<uint32_t>(kind)) ? static_cast<uint32_t>(root) : static_cast<uint32_t>(op);
  return static_cast<uint32_t>(kind) | (static_cast<uint32_t>(dtype + 1) & 15u) << kDtypeShift |
         (opOrRoot & 7u) << kOpShift | uint32_t(compressed) << kCompressedShift |
         static_cast<uint32_t>(digest & ((1u << kDigestBits) - 1)) << kDigestShift;
}

uint64_t CallSignature::digest() const {
  uint64_t hash = 1469598103934665603ull;
  for (int64_t value : {int64_t(kind), int64_t(dtype), int64_t(op), int64_t(root), int64_t(compressed)})
    hash = mix(hash, static_cast<uint64_t>(value));
  hash = mix(mix(hash, count), layout);
  hash = mix(hash, algorithm);
  if (compressed) hash = mix(mix(hash, compressor), options);
  return hash;
}

std::string CallSignature::describe() const {
  std::string text = fmt::format("{}(count {}", kindText(static_cast<uint32_t>(kind)), count);
  if (dtype >= 0) text += ", " + dtypeText(dtype);
  if (op >= 0) text += ", " + opText(op);
  if (root >= 0) text += fmt::format(", root {}", root);
  if (!algorithm.empty()) text += fmt::format(", algorithm {}", algorithm);
  if (kind == CallKind::Allreduce)
    text += compressed ? fmt::format(", compressed by {}{}{}", compressor, options.empty() ? "" : " ", options)
                       : std::string(", not compressed");
  return text + ")";
}

CallScope::CallScope(shoal_comm& comm, const CallSignature& signature) : comm_(comm) {
  if (comm.callScopes++ > 0) saved_.emplace(comm.call);
  comm.call = signature;
  comm.callWordValid = false;
  // Read and written together: one lookup of the thread-local's address.
  const CallSignature*& current = currentCall;
  savedCurrent_ = current;
  current = &comm.call;
}

CallScope::~CallScope() {
  if (saved_) comm_.call = *saved_;
  else comm_.call = CallSignature{};
  --comm_.callScopes;
  comm_.callWordValid = false;
  currentCall = savedCurrent_;
}

void refreshCallWord(shoal_comm& comm) { comm.callWordValid = false; }

uint32_t currentCallWord(shoal_comm& comm) {
  if (!comm.callWordValid) {
    CallWordMemo& memo = comm.callWordMemo;
    if (!memo.valid || !sameBytes(memo.signature, comm.call)) rememberCallWord(comm);
    comm.callWord = memo.word;
    comm.callWordValid = true;
  }
  return comm.callWord;
}

uint64_t fingerprint(std::string_view text) { return mix(1469598103934665603ull, text); }

Agreement agree(shoal_comm& comm, uint64_t sequence, std::string_view description, shoal_status_t refusal) {
  const uint64_t hash = fingerprint(description);
  uint64_t words[3] = {hash, ~hash, static_cast<uint64_t>(-static_cast<int64_t>(refusal))};
  runCollective(comm, sequence, [&](Context& context) {
    allreduceTree(context, words, 3, Reducer(SHOAL_U64, SHOAL_MAX));
  });
  Agreement agreement;
  // A refusal beyond the last status code cannot come from a rank that ran
  // this round: the words were something else's data.
  const bool plausible = words[2] <= static_cast<uint64_t>(-SHOAL_ERR_INTERNAL);
  agreement.same = plausible && words[0] == hash && ~words[1] == hash;
  if (plausible) agreement.refusal = static_cast<shoal_status_t>(-static_cast<int64_t>(words[2]));
  return agreement;
}

// Called by the transport (transport.h) when a message's signature differs.
std::string describeSignatureMismatch(int rank, int peer, uint32_t mine, uint32_t theirs) {
  std::string differs;
  auto add = [&](const std::string& what) { differs += (differs.empty() ? "" : "; ") + what; };
  if (field(mine, 0, kKindBits) != field(theirs, 0, kKindBits))
    add(fmt::format("the collective (this rank: {}, rank {}: {})", kindText(field(mine, 0, kKindBits)), peer,
                    kindText(field(theirs, 0, kKindBits))));
  uint32_t myDtype = field(mine, kDtypeShift, kDtypeBits), theirDtype = field(theirs, kDtypeShift, kDtypeBits);
  if (myDtype != theirDtype)
    add(fmt::format("the dtype (this rank: {}, rank {}: {})", dtypeText(int(myDtype) - 1), peer,
                    dtypeText(int(theirDtype) - 1)));
  uint32_t myOp = field(mine, kOpShift, kOpBits), theirOp = field(theirs, kOpShift, kOpBits);
  bool rooted = rootInOpField(field(mine, 0, kKindBits));
  if (myOp != theirOp && field(mine, 0, kKindBits) == field(theirs, 0, kKindBits))
    add(rooted ? std::string("the root")
                  : fmt::format("the op (this rank: {}, rank {}: {})", opText(int(myOp)), peer, opText(int(theirOp))));
  bool myCompressed = field(mine, kCompressedShift, 1), theirCompressed = field(theirs, kCompressedShift, 1);
  if (myCompressed != theirCompressed)
    add(fmt::format("compression (this rank: {}, rank {}: {}; set SHOAL_COMPRESSOR, SHOAL_COMPRESSOR_OPTS and "
                    "SHOAL_COMPRESS_MIN_BYTES alike on every rank)",
                    myCompressed ? "compressed" : "plain", peer, theirCompressed ? "compressed" : "plain"));
  if (differs.empty()) add("the count, root, algorithm or compressor and options");
  return fmt::format("ranks disagree on a call: rank {} got a message from rank {} that differs in {}. This rank's "
                     "call: {}. Every rank must make the same calls in the same order with the same arguments",
                     rank, peer, differs,
                     currentCall ? currentCall->describe() : std::string("an internal collective"));
}

}  // namespace shoal
