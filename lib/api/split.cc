// The C entry points of sub-communicators: shoal_comm_split and
// shoal_comm_create_group. The split itself (the exchange, the checks every
// rank makes alike, the child's construction) is lib/comm/split.cc; this layer
// checks the arguments, runs it as one blocking call and adds the layers above
// lib/comm to the child.
#include <string>
#include <vector>

#include "api/attach.h"
#include "api/export.h"
#include "api/guard.h"
#include "comm/communicator.h"
#include "comm/split.h"
#include "runtime/blocking.h"

namespace shoal {
namespace {

shoal_comm_t split(shoal_comm_t comm, const char* call, const SplitRequest& request) {
  shoal_comm& parent = usableComm(comm, call);
  std::unique_ptr<shoal_comm> child;
  // Once the parent's async runtime runs, its engine thread issues every
  // collective, in negotiated order (runtime/blocking.h): the split too.
  runtime::blockingCall(parent, call, [&] { child = splitComm(parent, call, request, attachUpperLayers); });
  return child.release();
}

}  // namespace
}  // namespace shoal

using shoal::guarded;

SHOAL_EXPORT shoal_status_t shoal_comm_split(shoal_comm_t comm, int color, int key, shoal_comm_t* newcomm) {
  return guarded(comm, [&] {
    if (newcomm == nullptr)
      shoal::fail(SHOAL_ERR_INVALID_ARGUMENT, "shoal_comm_split: newcomm (the out-parameter) is NULL");
    *newcomm = nullptr;
    *newcomm = shoal::split(comm, "shoal_comm_split", shoal::SplitRequest{color, key, 0, {}});
  });
}

SHOAL_EXPORT shoal_status_t shoal_comm_create_group(shoal_comm_t comm, const int* ranks, int n,
                                                     shoal_comm_t* newcomm) {
  return guarded(comm, [&] {
    if (newcomm == nullptr)
      shoal::fail(SHOAL_ERR_INVALID_ARGUMENT, "shoal_comm_create_group: newcomm (the out-parameter) is NULL");
    *newcomm = nullptr;
    shoal_comm& parent = shoal::usableComm(comm, "shoal_comm_create_group");
    // A bad list is refused after the exchange, not before: ranks with the
    // same bad list then all refuse it alike, and a rank whose list differs
    // makes every rank fail with MISMATCH instead of leaving them waiting.
    std::string listError;
    int position = -1;
    if (n < 1 || ranks == nullptr) {
      listError = fmt::format("{} ranks listed{}; list at least one", n, ranks == nullptr ? " (ranks is NULL)" : "");
      n = 0;
    }
    std::vector<bool> seen(parent.size, false);
    for (int i = 0; i < n && listError.empty(); ++i) {
      if (ranks[i] < 0 || ranks[i] >= parent.size)
        listError = fmt::format("ranks[{}] = {} is not a rank of the communicator (0..{})", i, ranks[i],
                                parent.size - 1);
      else if (seen[ranks[i]])
        listError = fmt::format("rank {} is listed twice", ranks[i]);
      else
        seen[ranks[i]] = true;
      if (listError.empty() && ranks[i] == parent.rank) position = i;
    }
    *newcomm = shoal::split(comm, "shoal_comm_create_group",
                            shoal::SplitRequest{position < 0 ? SHOAL_SPLIT_UNDEFINED : 0, position,
                                                shoal::hashRankList(n > 0 ? ranks : nullptr, n), listError});
  });
}
