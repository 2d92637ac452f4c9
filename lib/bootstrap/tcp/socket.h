// Socket helpers of the tcp store: listening, connecting, names and timeouts.
#pragma once

#include <sys/socket.h>

#include <string>

#include "core/error.h"

namespace shoal::detail::tcp {

// Milliseconds until t for poll(), rounded up so that poll() returning 0 means t has passed.
int msUntil(Clock::time_point t);

std::string errnoText(int err);
std::string errnoText();

// "127.0.0.1:41234", "[::1]:41234".
std::string peerName(const sockaddr* addr, socklen_t len);

void setNoDelay(int fd);

// Compares in time independent of where the tokens differ.
bool sameToken(const std::string& a, const std::string& b);

// A listening, non-blocking socket for the store's server. A loopback host
// keeps the store private to the machine; any other name is served on every
// interface, because the name often resolves locally to an address (127.0.1.1,
// another NIC) that peers do not use. Throws SYSTEM with text.
int listenOn(const std::string& host, int port, const std::string& url);

// One connection attempt to every address of host:port; -1 with lastError set when none answered.
int connectTo(const std::string& host, int port, Clock::time_point deadline, std::string& lastError);

}  // namespace shoal::detail::tcp
