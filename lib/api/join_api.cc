// shoal_join: a blocking C call over the async runtime's join (runtime/join.h).
// Blocking rather than a request handle because Horovod's join blocks too and
// its one result (the last rank) then needs no accessor; the wait has the
// usual deadline, and a timed-out join stays in flight for the next call.
#include "api/checks.h"
#include "comm/communicator.h"
#include "api/export.h"
#include "api/guard.h"
#include "runtime/engine.h"

using namespace shoal;

SHOAL_EXPORT shoal_status_t shoal_join(shoal_comm_t comm, double timeout_s, int* last_rank) {
  const char* call = "shoal_join";
  return guarded(comm, [&] {
    if (last_rank != nullptr) *last_rank = -1;
    shoal_comm& c = usableComm(comm, call);
    const double timeoutS = checkedTimeout(call, "timeout_s", timeout_s, c.timeoutS);
    c.engine->ensureStarted(call);
    const int last = c.engine->join(call, timeoutS);
    if (last_rank != nullptr) *last_rank = last;
  });
}
