// Socket helpers of the tcp store, also used by the aggregation client and
// shoal-aggd (lib/aggregate/socket.h): listening, connecting, names,
// timeouts, and reads and writes bounded by a deadline.
#pragma once

#include <sys/socket.h>

#include <cstddef>
#include <string>

#include "core/error.h"

namespace shoal::detail::tcp {

// Milliseconds until t for poll(), rounded up so that poll() returning 0 means t has passed.
int msUntil(Clock::time_point t);
// The same, but -1 (wait without end) for Clock::time_point::max().
int pollMsUntil(Clock::time_point t);

std::string errnoText(int err);
std::string errnoText();

// "127.0.0.1:41234", "[::1]:41234".
std::string peerName(const sockaddr* addr, socklen_t len);

void setNoDelay(int fd);
void setNonBlocking(int fd);

// Compares in time independent of where the tokens differ.
bool sameToken(const std::string& a, const std::string& b);

// A listening, non-blocking socket for the store's server. A loopback host
// keeps the store private to the machine; any other name is served on every
// interface, because the name often resolves locally to an address (127.0.1.1,
// another NIC) that peers do not use. Throws SYSTEM with text.
int listenOn(const std::string& host, int port, const std::string& url);

// One connection attempt to every address of host:port; -1 with lastError set
// when none answered. *unresolved (when given) says whether the name did not
// resolve at all, which waiting will not mend.
int connectTo(const std::string& host, int port, Clock::time_point deadline, std::string& lastError,
              bool* unresolved = nullptr);

enum class IoResult { kDone, kClosed, kTimedOut, kError };
// Reads / writes exactly `bytes`, waiting in poll() at most until `deadline`
// (Clock::time_point::max(): no deadline). Works on blocking and non-blocking
// sockets. kError leaves errno as the failed call set it.
IoResult readFull(int fd, void* data, size_t bytes, Clock::time_point deadline);
IoResult writeFull(int fd, const void* data, size_t bytes, Clock::time_point deadline);

}  // namespace shoal::detail::tcp
