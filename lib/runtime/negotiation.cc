#include "runtime/negotiation.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <map>

#include "runtime/join.h"

namespace shoal::runtime {

std::string cacheKey(const std::string& name, const Metadata& meta) {
  return meta.kind == OpKind::Blocking ? name + "/" + meta.call : name;
}

int ResponseCache::lookup(const std::string& key, const Metadata& meta) const {
  auto found = index_.find(key);
  if (found == index_.end() || !(entries_[found->second].meta == meta)) return -1;
  return static_cast<int>(found->second);
}

void ResponseCache::put(const std::string& key, const std::string& name, const Metadata& meta, uint64_t cycle) {
  if (capacity_ == 0) return;
  auto found = index_.find(key);
  if (found != index_.end()) {
    entries_[found->second].meta = meta;
    entries_[found->second].lastUsed = cycle;
    return;
  }
  size_t slot = entries_.size();
  if (slot < capacity_) {
    entries_.push_back({});
  } else {
    slot = 0;
    for (size_t i = 1; i < entries_.size(); ++i)
      if (entries_[i].lastUsed < entries_[slot].lastUsed) slot = i;
    index_.erase(entries_[slot].key);
  }
  entries_[slot] = {key, name, meta, cycle};
  index_[key] = slot;
}

std::string encodeAnnouncements(const std::vector<Announcement>& announcements) {
  std::string out;
  appendU64(out, announcements.size());
  for (const Announcement& a : announcements) {
    appendString(out, a.name);
    appendMetadata(out, a.meta);
    uint64_t micros = static_cast<uint64_t>(std::max(0.0, a.ageS) * 1e6);
    appendU64(out, micros);
  }
  return out;
}

std::vector<Announcement> decodeAnnouncements(const uint8_t* data, size_t bytes) {
  const uint8_t* cursor = data;
  const uint8_t* end = data + bytes;
  std::vector<Announcement> result;
  if (bytes == 0) return result;
  uint64_t count = readU64(cursor, end);
  for (uint64_t i = 0; i < count; ++i) {
    Announcement a;
    a.name = readString(cursor, end);
    a.meta = readMetadata(cursor, end);
    a.ageS = static_cast<double>(readU64(cursor, end)) / 1e6;
    result.push_back(std::move(a));
  }
  return result;
}

Verdict decide(const std::vector<std::vector<Announcement>>& perRank) {
  const int ranks = static_cast<int>(perRank.size());
  struct Seen {
    std::vector<const Announcement*> byRank;
    size_t firstRank = 0, firstPosition = 0;  // where it first appears: rank-major order
  };
  std::map<std::string, Seen> seen;
  Verdict verdict;
  std::vector<bool> joined(ranks, false);
  for (int r = 0; r < ranks; ++r) {
    for (size_t p = 0; p < perRank[r].size(); ++p) {
      const Announcement& a = perRank[r][p];
      if (a.name == kJoinName) {
        joined[r] = true;
        continue;
      }
      auto [it, inserted] = seen.try_emplace(a.name);
      if (inserted) {
        it->second.byRank.assign(ranks, nullptr);
        it->second.firstRank = r;
        it->second.firstPosition = p;
      }
      it->second.byRank[r] = &a;
    }
  }
  // Every name in the order it first appears (rank 0's submission order first).
  std::vector<std::pair<std::string, const Seen*>> ordered;
  for (const auto& [name, s] : seen) ordered.push_back({name, &s});
  std::sort(ordered.begin(), ordered.end(), [](const auto& a, const auto& b) {
    return std::tie(a.second->firstRank, a.second->firstPosition) < std::tie(b.second->firstRank, b.second->firstPosition);
  });

  for (int r = 0; r < ranks; ++r)
    if (joined[r]) verdict.joined.push_back(r);
  verdict.allJoined = ranks > 0 && static_cast<int>(verdict.joined.size()) == ranks;

  for (const auto& [name, s] : ordered) {
    Partial partial;
    partial.name = name;
    std::vector<int> standingIn;  // joined ranks that did not submit it
    for (int r = 0; r < ranks; ++r) {
      if (s->byRank[r] != nullptr) {
        partial.submitted.push_back(r);
        partial.ageS = std::max(partial.ageS, s->byRank[r]->ageS);
      } else if (joined[r]) {
        standingIn.push_back(r);
      } else {
        partial.missing.push_back(r);
      }
    }
    const int first = partial.submitted.front();
    const Announcement& reference = *s->byRank[first];
    if (!partial.missing.empty()) {
      partial.meta = reference.meta;
      verdict.partial.push_back(std::move(partial));
      continue;
    }
    std::string disagreement;
    for (int r : partial.submitted) {
      if (s->byRank[r]->meta == reference.meta) continue;
      disagreement = fmt::format("rank {} submitted {}, rank {} submitted {} (they differ in {})", first,
                                 reference.meta.describe(), r, s->byRank[r]->meta.describe(),
                                 differences(reference.meta, s->byRank[r]->meta));
      break;
    }
    const std::string refusal = standingIn.empty() || !disagreement.empty() ? std::string()
                                                                           : whyNoStandIn(reference.meta);
    if (!refusal.empty()) {
      verdict.joinErrors.push_back(
          {name, fmt::format("{}: rank(s) {} called shoal_join (they ran out of data) and {}; finish every such "
                             "collective before any rank joins, or join only after the last one",
                             name == kBlockingName ? fmt::format("blocking call {}", reference.meta.call)
                                                   : fmt::format("tensor '{}'", name),
                             fmt::join(standingIn, ", "), refusal)});
    } else if (disagreement.empty()) {
      verdict.ready.push_back(name);
      if (!standingIn.empty()) verdict.standIn.emplace(name, reference.meta);
    } else {
      std::string what = name == kBlockingName ? std::string("a blocking call") : fmt::format("tensor '{}'", name);
      verdict.errors.push_back(
          {name, fmt::format("{}: ranks disagree: {}; submit the same collective, dtype, shape, op, root and compressor "
                             "for a name on every rank", what, disagreement)});
    }
  }
  return verdict;
}

}  // namespace shoal::runtime
