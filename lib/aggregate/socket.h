// Small blocking-with-deadline TCP helpers shared by the aggregation client
// (lib/aggregate/client.cc) and the aggregator (tools/shoal-aggd).
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "core/error.h"

namespace shoal::aggregate {

struct Endpoint {
  std::string host;
  int port = 0;
  std::string url;  // as written, for messages
};

// "tcp://a:p[,tcp://b:p...]" (the tcp:// may be left out); Error naming the
// bad entry otherwise.
std::vector<Endpoint> parseEndpoints(const std::string& list, const char* variable);
// "host:port" (port may be 0: any free port).
Endpoint parseHostPort(const std::string& text, const char* what);

// A listening socket; *boundPort receives the port it got.
int listenTcp(const Endpoint& where, int* boundPort);
// Connects, retrying refused connections until the deadline (an aggregator
// that is still starting); Error with the reason once the deadline is past.
int connectTcp(const Endpoint& where, Deadline deadline);

enum class IoResult { kDone, kClosed, kTimedOut, kError };
// Reads / writes exactly `bytes`, waiting in poll() at most until `deadline`
// (Deadline::max(): no deadline). Works on blocking and non-blocking sockets.
IoResult readFull(int fd, void* data, size_t bytes, Deadline deadline);
IoResult writeFull(int fd, const void* data, size_t bytes, Deadline deadline);

// Milliseconds until t for poll(), rounded up; 0 once passed, -1 for Deadline::max().
int pollMsUntil(Deadline t);
void setNoDelay(int fd);
void setNonBlocking(int fd);
std::string errnoText(int err);

// Compares in time independent of where the tokens differ.
bool sameToken(const std::string& a, const std::string& b);

}  // namespace shoal::aggregate
