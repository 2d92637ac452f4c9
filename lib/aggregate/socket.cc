// The aggregator's endpoints, listening and connecting (socket.h); the socket
// plumbing is the tcp store's (bootstrap/tcp/socket.cc).
#include "aggregate/socket.h"

#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <thread>

namespace shoal::aggregate {

Endpoint parseHostPort(const std::string& text, const char* what) {
  size_t colon = text.rfind(':');
  if (colon == std::string::npos || colon == 0 || colon + 1 == text.size())
    fail(SHOAL_ERR_INVALID_ARGUMENT, "{}: '{}' is not host:port (e.g. 10.0.0.1:29600)", what, text);
  Endpoint endpoint;
  endpoint.host = text.substr(0, colon);
  if (endpoint.host.size() > 2 && endpoint.host.front() == '[' && endpoint.host.back() == ']')
    endpoint.host = endpoint.host.substr(1, endpoint.host.size() - 2);
  std::string port = text.substr(colon + 1);
  char* end = nullptr;
  long value = std::strtol(port.c_str(), &end, 10);
  if (*end != '\0' || value < 0 || value > 65535)
    fail(SHOAL_ERR_INVALID_ARGUMENT, "{}: port '{}' of '{}' is not a number in 0..65535", what, port, text);
  endpoint.port = static_cast<int>(value);
  endpoint.url = "tcp://" + text;
  return endpoint;
}

std::vector<Endpoint> parseEndpoints(const std::string& list, const char* variable) {
  std::vector<Endpoint> endpoints;
  size_t begin = 0;
  while (begin <= list.size()) {
    size_t comma = list.find(',', begin);
    std::string item = list.substr(begin, comma == std::string::npos ? std::string::npos : comma - begin);
    if (item.rfind("tcp://", 0) == 0) item = item.substr(6);
    if (item.empty())
      fail(SHOAL_ERR_INVALID_ARGUMENT, "{}='{}' has an empty entry; use tcp://host:port[,tcp://host:port...]",
           variable, list);
    Endpoint endpoint = parseHostPort(item, variable);
    if (endpoint.port == 0)
      fail(SHOAL_ERR_INVALID_ARGUMENT, "{}: '{}' needs a port other than 0", variable, endpoint.url);
    endpoints.push_back(endpoint);
    if (comma == std::string::npos) break;
    begin = comma + 1;
  }
  return endpoints;
}

namespace {

addrinfo* resolvePassive(const Endpoint& where) {
  addrinfo hints{};
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE;
  addrinfo* found = nullptr;
  int rc = getaddrinfo(where.host.empty() ? nullptr : where.host.c_str(), std::to_string(where.port).c_str(), &hints,
                       &found);
  if (rc != 0)
    fail(SHOAL_ERR_SYSTEM, "cannot resolve host '{}' of {}: {}", where.host, where.url, gai_strerror(rc));
  return found;
}

}  // namespace

int listenTcp(const Endpoint& where, int* boundPort) {
  addrinfo* found = resolvePassive(where);
  int fd = -1;
  int err = EAFNOSUPPORT;
  for (addrinfo* ai = found; ai != nullptr && fd < 0; ai = ai->ai_next) {
    fd = socket(ai->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) {
      err = errno;
      continue;
    }
    int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (bind(fd, ai->ai_addr, ai->ai_addrlen) == 0 && listen(fd, SOMAXCONN) == 0) break;
    err = errno;
    close(fd);
    fd = -1;
  }
  freeaddrinfo(found);
  if (fd < 0)
    fail(SHOAL_ERR_SYSTEM, "cannot listen on {}: {}{}", where.url, errnoText(err),
         err == EADDRINUSE ? "; another process holds the port: choose another one" : "");
  sockaddr_storage bound{};
  socklen_t length = sizeof bound;
  getsockname(fd, reinterpret_cast<sockaddr*>(&bound), &length);
  *boundPort = ntohs(bound.ss_family == AF_INET6 ? reinterpret_cast<sockaddr_in6*>(&bound)->sin6_port
                                                 : reinterpret_cast<sockaddr_in*>(&bound)->sin_port);
  return fd;
}

int connectTcp(const Endpoint& where, Deadline deadline) {
  for (;;) {
    std::string lastError = "no address";
    bool unresolved = false;
    int fd = detail::tcp::connectTo(where.host, where.port, deadline, lastError, &unresolved);
    if (fd >= 0) return fd;
    if (unresolved) fail(SHOAL_ERR_SYSTEM, "{} (the aggregator {})", lastError, where.url);
    if (Clock::now() >= deadline)
      fail(SHOAL_ERR_REMOTE, "cannot reach the aggregator {} before the deadline (SHOAL_TIMEOUT_S): {}; is shoal-aggd "
           "running there?", where.url, lastError);
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
}

}  // namespace shoal::aggregate
