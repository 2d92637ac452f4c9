// The rule for blocking collectives once a communicator's async runtime runs:
// every collective must be issued by the engine thread, in negotiated order,
// or ranks would interleave their calls differently. So a blocking call made
// on a user thread after the engine started is submitted to the engine (under
// the reserved name kBlockingName, negotiated like any request) and waited
// for; before that, and on the engine thread itself, it runs directly.
// Either way its body runs inside a CallTrace (timeline span, debug line).
#pragma once

#include <functional>

#include "comm/communicator.h"
#include "runtime/engine.h"
#include "runtime/call_trace.h"

namespace shoal::runtime {

template <typename Body>
void blockingCall(shoal_comm& comm, const char* call, Body&& body) {
  auto traced = [&] {
    CallTrace trace(comm, call);
    body();
    trace.succeeded();
  };
  if (comm.engine && comm.engine->routesBlockingCalls())
    return comm.engine->runBlocking(call, std::function<void()>(std::ref(traced)));
  traced();
}

}  // namespace shoal::runtime
