// Coordinator-free negotiation: which named requests are ready on every rank,
// in which order, and which disagree. Every rank computes the same answer
// from the same gathered data, so no rank has to broadcast a decision.
//
// Each cycle costs one small bitwise-AND allreduce of [flags, cache bits]:
// a bit per response-cache entry that this rank has pending, plus (inverted,
// so AND acts as OR) "some rank needs a full round" and "some rank shuts
// down". Only when some rank holds an uncached request (or probes for
// stalls) do the ranks allgather every pending request's name and metadata
// (a full round) and decide() on them.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "runtime/request.h"

namespace shoal::runtime {

// Names whose responses were negotiated before, with their metadata, so the
// same request next step needs only its bit. Every rank updates its cache with
// the same calls in the same order, so the caches stay identical.
//
// Entries are keyed by cacheKey(): the name, except for blocking calls, which
// all travel under kBlockingName and get one entry per C call, so a loop that
// alternates shoal_barrier and shoal_allreduce stays on the fast path.
class ResponseCache {
 public:
  explicit ResponseCache(size_t capacity) : capacity_(capacity) {}
  // The entry's index if `key` is cached with exactly `meta`, else -1.
  int lookup(const std::string& key, const Metadata& meta) const;
  // Entries (bits) in use; never more than the capacity.
  size_t slots() const { return entries_.size(); }
  // The request name of an entry.
  const std::string& nameAt(size_t index) const { return entries_[index].name; }
  // Records a negotiated response: updates its entry, or takes a free one, or
  // replaces the least recently used (ties: lowest index). `cycle` is the
  // negotiation cycle, the same number on every rank.
  void put(const std::string& key, const std::string& name, const Metadata& meta, uint64_t cycle);
  void touch(size_t index, uint64_t cycle) { entries_[index].lastUsed = cycle; }

 private:
  struct Entry {
    std::string key;
    std::string name;
    Metadata meta;
    uint64_t lastUsed = 0;
  };
  size_t capacity_;
  std::vector<Entry> entries_;
  std::unordered_map<std::string, size_t> index_;
};

std::string cacheKey(const std::string& name, const Metadata& meta);

// A pending request as one rank announces it in a full round.
struct Announcement {
  std::string name;
  Metadata meta;
  double ageS = 0;  // how long the rank has had it pending
};

std::string encodeAnnouncements(const std::vector<Announcement>& announcements);
std::vector<Announcement> decodeAnnouncements(const uint8_t* data, size_t bytes);

// A name some ranks submitted and others did not (yet).
struct Partial {
  std::string name;
  Metadata meta;                // as the lowest submitting rank has it
  std::vector<int> submitted;
  std::vector<int> missing;
  double ageS = 0;              // the longest any rank has waited for it
};

struct Verdict {
  std::vector<std::string> ready;                            // submitted everywhere, consistent: run in this order
  std::vector<std::pair<std::string, std::string>> errors;   // submitted everywhere but inconsistent: name, text
  std::vector<Partial> partial;
  // Join (runtime/join.h). A name is ready once every rank submitted it or has
  // joined; joined ranks that did not submit it stand in with the metadata in
  // standIn. Names they cannot stand in for fail on the submitters (joinErrors).
  std::vector<int> joined;                                   // ranks with a pending shoal_join
  bool allJoined = false;                                    // every rank: the joins complete
  std::map<std::string, Metadata> standIn;                   // ready names some joined rank lacks
  std::vector<std::pair<std::string, std::string>> joinErrors;  // name, text
};

// The decision of a full round from every rank's announcements (index = rank).
// Ready names run in rank 0's submission order.
Verdict decide(const std::vector<std::vector<Announcement>>& perRank);

// The bit-vector words of a cycle: word 0 holds the inverted flags, then one
// bit per cache entry.
constexpr uint64_t kFlagNeedFullRound = 1;
constexpr uint64_t kFlagShutdown = 2;
inline size_t bitWords(size_t slots) { return 1 + (slots + 63) / 64; }

}  // namespace shoal::runtime
