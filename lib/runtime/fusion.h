// Tensor fusion: ready allreduces with the same dtype, op and compression are
// grouped (in negotiated order) up to SHOAL_FUSION_THRESHOLD bytes and run as
// one collective: uncompressed ones packed into a fusion buffer, compressed
// ones as ONE compressor operation over the whole group (e.g. PowerSGD sees
// all its matrices at once). Either takes the path a blocking allreduce of
// the group's size would: across hosts where the layout and SHOAL_ALGO make
// that hierarchical (compressed: only the cross-host leg, state per tensor
// shard; lib/plugin/driver.cc, docs/groups.md). Other collectives run one by one.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "runtime/request.h"

struct shoal_comm;

namespace shoal::runtime {

class Timeline;

struct Ready {
  std::shared_ptr<Request> request;
  bool compress = false;            // allreduce through its compressor
  Clock::time_point readyAt;        // when the negotiation found it ready everywhere
};

struct Group {
  std::vector<Ready*> members;      // in negotiated order
  // An allreduce group's algorithm as the code that ran it names it (runGroup
  // sets it; the debug line and the timeline say it): a plain algorithm's name,
  // "aggregate", "compressed" or "hierarchical" (compressed across hosts only).
  const char* algorithm = nullptr;
};

// Groups ready requests; deterministic, so every rank forms the same groups.
// threshold 0 disables fusion (every request is its own group).
std::vector<Group> planGroups(std::vector<Ready>& ready, size_t threshold);

// Whether an allreduce goes through its compressor (else the plain path):
// a compressor other than "none", op sum/avg, at least minBytes and a dtype it takes.
// Throws when the compressor is unknown or refuses its options.
bool compresses(shoal_comm& comm, const Metadata& meta);

// Runs one group on the engine thread and throws on failure; the caller
// completes the requests. fusionBuffer is reused between groups.
void runGroup(shoal_comm& comm, Group& group, std::vector<uint8_t>& fusionBuffer, Timeline* timeline);

}  // namespace shoal::runtime
