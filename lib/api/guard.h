// The guard that turns C++ exceptions into status codes: the only try/catch
// of the C API, around every entry point's body.
#pragma once

#include <string>

#include "core/error.h"
#include "shoal/shoal.h"

namespace shoal {

// Records the error text for shoal_last_error(comm) and shoal_last_error(NULL).
void setLastError(shoal_comm_t comm, const std::string& text);
// The text shoal_last_error(NULL) returns: this thread's last error.
const std::string& threadLastError();

// Runs body; returns SHOAL_OK or the status of what it threw, with its text recorded.
template <typename Body>
shoal_status_t guarded(shoal_comm_t comm, Body&& body) {
  try {
    body();
    return SHOAL_OK;
  } catch (const Error& error) {
    setLastError(comm, error.what());
    return error.status();
  } catch (const std::bad_alloc&) {
    setLastError(comm, "out of host memory");
    return SHOAL_ERR_NO_MEMORY;
  } catch (const std::exception& error) {
    setLastError(comm, std::string("internal error: ") + error.what());
    return SHOAL_ERR_INTERNAL;
  }
}

}  // namespace shoal
