// Rank launchers for tests: N ranks as threads in one process, each with its
// own communicator (its own UCX worker) over a shared in-memory store.
#pragma once

#include <functional>
#include <string>

#include "shoal/shoal.h"

namespace shoal::test {

struct RankOptions {
  const char* algorithm = nullptr;  // nullptr = SHOAL_ALGO / auto
  double timeoutS = 60;
};

// Runs body(rank, comm) on worldSize threads and joins them. A rank whose
// communicator fails to initialise records a test failure and skips body.
void runRanks(int worldSize, const std::function<void(int rank, shoal_comm_t comm)>& body,
              const RankOptions& options = {});

// A store URL no other test uses.
std::string freshMemoryStore();

}  // namespace shoal::test
