#include "runtime/stall.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>

#include "core/log.h"

namespace shoal::runtime {

std::string describeStalls(const std::vector<const Partial*>& stalls, size_t limit) {
  std::vector<std::string> parts;
  for (size_t i = 0; i < stalls.size() && i < limit; ++i) {
    const Partial& p = *stalls[i];
    std::string what = p.name == kBlockingName ? fmt::format("blocking call {}", p.meta.call) : "'" + p.name + "'";
    parts.push_back(fmt::format("{} (missing ranks {}; submitted by {}; waiting {:.1f} s)", what,
                                fmt::join(p.missing, ", "), fmt::join(p.submitted, ", "), p.ageS));
  }
  if (stalls.size() > limit) parts.push_back(fmt::format("and {} more", stalls.size() - limit));
  return fmt::format("{}", fmt::join(parts, ", "));
}

double StallInspector::probeIntervalS() const {
  double shortest = settings_.blockingTimeoutS;
  if (settings_.checkS > 0) shortest = std::min(shortest, settings_.checkS);
  if (settings_.shutdownS > 0) shortest = std::min(shortest, settings_.shutdownS);
  return std::clamp(shortest / 4, 0.02, 5.0);
}

namespace {

bool intersects(const std::vector<int>& a, const std::vector<int>& b) {
  for (int x : a)
    if (std::find(b.begin(), b.end(), x) != b.end()) return true;
  return false;
}

// A name some fatal stall waits for and another pending name that waits the
// other way round (each side submitted what the other did not): not a slow
// rank but ranks that made different calls. "" when there is none.
std::string crossedCalls(const std::vector<const Partial*>& stalled, const std::vector<Partial>& partial) {
  auto describe = [](const Partial& p) {
    return p.name == kBlockingName ? fmt::format("blocking call {}", p.meta.call) : "'" + p.name + "'";
  };
  for (const Partial* p : stalled)
    for (const Partial& q : partial) {
      if (&q == p || !intersects(p->missing, q.submitted) || !intersects(q.missing, p->submitted)) continue;
      return fmt::format("; the ranks wait for each other's different calls: rank(s) {} made {} while rank(s) {} "
                         "made {}: make the same calls in the same order on every rank",
                         fmt::join(p->submitted, ", "), describe(*p), fmt::join(q.submitted, ", "), describe(q));
    }
  return "";
}

}  // namespace

std::optional<std::string> StallInspector::inspect(const std::vector<Partial>& partial) {
  std::vector<const Partial*> warn, fatal, blocking;
  for (const Partial& p : partial) {
    if (p.name == kBlockingName) {
      if (p.ageS >= settings_.blockingTimeoutS) blocking.push_back(&p);
      continue;
    }
    if (settings_.shutdownS > 0 && p.ageS >= settings_.shutdownS) fatal.push_back(&p);
    if (settings_.checkS > 0 && p.ageS >= settings_.checkS) {
      auto last = warnedAtAge_.find(p.name);
      if (last == warnedAtAge_.end() || p.ageS < last->second || p.ageS - last->second >= settings_.checkS) {
        warn.push_back(&p);
        warnedAtAge_[p.name] = p.ageS;
      }
    }
  }
  if (rank_ == 0 && !warn.empty())
    SHOAL_LOG_WARN(
        "async runtime: stall: {} tensor(s) submitted by some ranks but not all for more than {} s "
        "(SHOAL_STALL_CHECK_S): {}. A rank that never submits them blocks them forever; "
        "SHOAL_STALL_SHUTDOWN_S turns this into an error",
        warn.size(), settings_.checkS, describeStalls(warn));
  if (warnedAtAge_.size() > 4096) warnedAtAge_.clear();  // names come and go; keep the map small
  if (!blocking.empty()) {
    const std::string crossed = crossedCalls(blocking, partial);
    fatalStatus_ = crossed.empty() ? SHOAL_ERR_TIMEOUT : SHOAL_ERR_MISMATCH;
    return fmt::format(
        "a blocking call waited more than SHOAL_TIMEOUT_S = {} s for the other ranks: {}{}; every rank must make the "
        "same blocking calls in the same order",
        settings_.blockingTimeoutS, describeStalls(blocking), crossed);
  }
  if (!fatal.empty()) {
    const std::string crossed = crossedCalls(fatal, partial);
    fatalStatus_ = crossed.empty() ? SHOAL_ERR_TIMEOUT : SHOAL_ERR_MISMATCH;
    return fmt::format("stall: tensors submitted by some ranks but not all for more than SHOAL_STALL_SHUTDOWN_S = {} "
                       "s: {}{}",
                       settings_.shutdownS, describeStalls(fatal), crossed);
  }
  return std::nullopt;
}

}  // namespace shoal::runtime
