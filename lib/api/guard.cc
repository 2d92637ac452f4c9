#include "api/guard.h"

#include "comm/communicator.h"

namespace shoal {
namespace {
thread_local std::string lastErrorOfThread;
}  // namespace

void setLastError(shoal_comm_t comm, const std::string& text) {
  lastErrorOfThread = text;
  if (comm != nullptr) comm->lastError = text;
}

const std::string& threadLastError() { return lastErrorOfThread; }

}  // namespace shoal
