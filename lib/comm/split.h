// Sub-communicators, made from a parent (shoal_comm_split,
// shoal_comm_create_group in lib/api/split.cc): the exchange, the checks every
// rank makes alike, and the child's construction. split.cc explains the protocol.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "comm/communicator.h"

namespace shoal {

// What this rank asks of a split.
struct SplitRequest {
  int color = 0;          // SHOAL_SPLIT_UNDEFINED: this rank joins no child
  int key = 0;            // the order within the child (ties: parent rank)
  uint64_t listHash = 0;  // create_group: hashRankList of its list, the same on every rank; 0 for a split
  std::string listError;  // create_group: what is wrong with the list (the same on every rank), empty if nothing
};

// The hash of a create_group list that every rank compares; never 0.
uint64_t hashRankList(const int* ranks, int n);

// Runs the split on the parent (two numbered calls) and returns this rank's
// child, or null for SHOAL_SPLIT_UNDEFINED. `attach` adds the layers above
// lib/comm to the child (the API layer's attachUpperLayers) before the closing
// barrier, so a failure there fails the split on every rank too. The caller
// runs it as one blocking call (runtime::blockingCall) after usableComm.
std::unique_ptr<shoal_comm> splitComm(shoal_comm& parent, const char* call, const SplitRequest& request,
                                      const std::function<void(shoal_comm&)>& attach);

}  // namespace shoal
