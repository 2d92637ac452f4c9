// TCP helpers of the aggregation client (lib/aggregate/client.cc) and the
// aggregator (tools/shoal-aggd): endpoint lists, listening and connecting
// with the aggregator's messages. The socket plumbing under them (deadline-
// bounded reads and writes, poll timeouts, tokens) is the tcp store's, one
// layer down (bootstrap/tcp/socket.h), named here for both users.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "bootstrap/tcp/socket.h"
#include "core/error.h"

namespace shoal::aggregate {

using detail::tcp::errnoText;
using detail::tcp::IoResult;
using detail::tcp::pollMsUntil;
using detail::tcp::readFull;
using detail::tcp::sameToken;
using detail::tcp::setNoDelay;
using detail::tcp::setNonBlocking;
using detail::tcp::writeFull;

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

}  // namespace shoal::aggregate
