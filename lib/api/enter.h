// The shape of every C entry point that communicates:
//   return enter(comm, "shoal_allreduce", [&](Call& call) { checks...; work... });
// enter() turns exceptions into a status (guard.h), refuses an unusable
// communicator, runs the body as a blocking call (through the async engine
// once it runs: runtime/blocking.h) and gives it its one Call, which takes the
// sequence number (comm/call.h).
#pragma once

#include "api/guard.h"
#include "comm/call.h"
#include "comm/communicator.h"
#include "runtime/blocking.h"

namespace shoal {

template <typename Body>
shoal_status_t enter(shoal_comm_t comm, const char* name, Body&& body) {
  return guarded(comm, [&] {
    shoal_comm& communicator = usableComm(comm, name);
    runtime::blockingCall(communicator, name, [&] {
      Call call(communicator, name);
      body(call);
    });
  });
}

}  // namespace shoal
