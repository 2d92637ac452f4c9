// Sub-communicators (split.h).
//
// A split is one collective call on the parent. Every rank contributes its
// (color, key) and, for create_group, a hash of its rank list; one allgather
// gives every rank the whole table, so every rank computes every group and
// every rank sees the same disagreement, if any. Each group then wires up a
// transport of its own through the parent's store, under a fresh key prefix
// ("<parent prefix>split<n>/c<color>/"), and a closing barrier over the
// parent makes a rank that failed or died during the wiring fail the split on
// every rank, not only in its own group.
//
// The child shares nothing with the parent but a copy of its settings and a
// connection to the same store: both can be used (one call at a time each)
// and destroyed in either order.
#include "comm/split.h"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <vector>

#include "collectives/collectives.h"
#include "comm/call.h"
#include "comm/describe.h"
#include "comm/hosts.h"
#include "core/log.h"

namespace shoal {
namespace {

// What each rank contributes to the split's allgather.
struct SplitEntry {
  int64_t color;
  int64_t key;
  uint64_t listHash;  // create_group: the rank list's hash (checked after the exchange); 0 for a split
};

// Every rank's entry, in parent rank order.
std::vector<SplitEntry> exchangeEntries(shoal_comm& parent, Context& context, const SplitEntry& mine) {
  std::vector<SplitEntry> entries(parent.size);
  entries[parent.rank] = mine;
  Blocks blocks = blocksFrom(std::vector<size_t>(parent.size, 1).data(), nullptr, sizeof(SplitEntry), parent.size,
                             parent.segmentBytes, parent.size);
  ringAllgather(context, reinterpret_cast<uint8_t*>(entries.data()), blocks);
  return entries;
}

// The same checks on every rank, over the same table: every rank fails alike.
void checkEntries(const std::vector<SplitEntry>& entries, const char* call) {
  for (size_t r = 0; r < entries.size(); ++r) {
    if (entries[r].listHash != entries[0].listHash)
      fail(SHOAL_ERR_MISMATCH,
           "{}: rank {} passed a different list of ranks than rank 0; every rank of the communicator must pass the "
           "same list, in the same order",
           call, r);
    if (entries[r].color < 0 && entries[r].color != SHOAL_SPLIT_UNDEFINED)
      fail(SHOAL_ERR_INVALID_ARGUMENT, "{}: rank {} passed color {}; colors are >= 0, or SHOAL_SPLIT_UNDEFINED (-1)",
           call, r, entries[r].color);
  }
}

// The parent ranks of this rank's group, in the new communicator's order:
// by key, ties by parent rank (MPI_Comm_split's rule).
std::vector<int> groupOf(const std::vector<SplitEntry>& entries, int64_t color) {
  std::vector<int> members;
  for (size_t r = 0; r < entries.size(); ++r)
    if (entries[r].color == color) members.push_back(static_cast<int>(r));
  std::stable_sort(members.begin(), members.end(),
                   [&](int a, int b) { return entries[a].key < entries[b].key; });
  return members;
}

// Connects the new communicator of `members` (this rank among them).
std::unique_ptr<shoal_comm> connectChild(shoal_comm& parent, const std::vector<int>& members, int64_t color,
                                         uint64_t splitIndex, const std::function<void(shoal_comm&)>& attach) {
  auto child = std::make_unique<shoal_comm>();
  child->rank = static_cast<int>(std::find(members.begin(), members.end(), parent.rank) - members.begin());
  child->size = static_cast<int>(members.size());
  child->algorithm = parent.algorithm;
  child->allreduceChoice = parent.allreduceChoice;
  child->timeoutS = parent.timeoutS;
  child->segmentBytes = parent.segmentBytes;
  child->treeMaxBytes = parent.treeMaxBytes;
  child->spinRounds = parent.spinRounds;
  child->keyPrefix = fmt::format("{}split{}/c{}/", parent.keyPrefix, splitIndex, color);
  // The child reaches the parent's store as the parent's rank does: on a tcp
  // store the parent's rank 0 keeps serving (one server per port, shared), and
  // every other rank is a client. A group of one needs no store at all.
  child->storeOptions = parent.storeOptions;
  if (child->size == 1) {
    static std::atomic<int> privateStores{0};
    child->storeOptions = StoreOptions{};
    child->storeOptions.url = fmt::format("memory://shoal-split-{}-{}", getpid(), privateStores++);
    child->storeOptions.timeoutS = parent.timeoutS;
  }
  child->store = makeStore(child->storeOptions);

  TransportOptions options;
  options.rank = child->rank;
  options.worldSize = child->size;
  options.store = child->store.get();
  options.keyPrefix = child->keyPrefix;
  options.timeoutS = child->timeoutS;
  options.spinRounds = child->spinRounds;
  child->transport = makeUcxTransport(options);
  inheritHosts(*child, parent, members);
  describeCommunicator(*child, child->storeOptions.url.c_str());
  if (attach) attach(*child);
  return child;
}

}  // namespace

uint64_t hashRankList(const int* ranks, int n) {
  uint64_t hash = 0xcbf29ce484222325ull ^ static_cast<uint64_t>(n);
  for (int i = 0; i < n; ++i) {
    hash ^= static_cast<uint32_t>(ranks[i]);
    hash *= 0x100000001b3ull;
    hash ^= hash >> 29;
  }
  return hash | 1;  // never 0, which marks a split
}

std::unique_ptr<shoal_comm> splitComm(shoal_comm& parent, const char* call, const SplitRequest& request,
                                      const std::function<void(shoal_comm&)>& attach) {
  std::unique_ptr<shoal_comm> child;
  CallSignature signature;
  signature.kind = CallKind::Split;
  CallScope scope(parent, signature);
  // Two numbered steps. The exchange; then checks that every rank makes on
  // the same table, so a refusal (a differing list, a bad color) is the same
  // on every rank and leaves the parent usable; then the wiring, where any
  // failure aborts the parent so that every rank, in every group, fails.
  std::vector<SplitEntry> entries;
  runCollective(parent, takeSequence(parent), [&](Context& context) {
    entries = exchangeEntries(parent, context, SplitEntry{request.color, request.key, request.listHash});
  });
  checkEntries(entries, call);
  if (!request.listError.empty()) fail(SHOAL_ERR_INVALID_ARGUMENT, "{}: {}", call, request.listError);
  const uint64_t splitIndex = parent.splits++;
  runCollective(parent, takeSequence(parent), [&](Context& context) {
    if (request.color != SHOAL_SPLIT_UNDEFINED)
      child = connectChild(parent, groupOf(entries, request.color), request.color, splitIndex, attach);
    // Every rank got this far: none died or failed while its group wired up.
    barrierDissemination(context);
  });
  if (child)
    SHOAL_LOG_INFO("rank {}: {} made communicator {} (rank {} of {})", parent.rank, call, child->keyPrefix,
                   child->rank, child->size);
  return child;
}

}  // namespace shoal
