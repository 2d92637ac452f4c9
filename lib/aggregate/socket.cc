#include "aggregate/socket.h"

#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <climits>
#include <cstring>
#include <thread>

namespace shoal::aggregate {

std::string errnoText(int err) { return std::strerror(err); }

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

int pollMsUntil(Deadline t) {
  if (t == Deadline::max()) return -1;
  Clock::time_point now = Clock::now();
  if (t <= now) return 0;
  auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(t - now).count() + 1;
  return ms > INT_MAX ? INT_MAX : static_cast<int>(ms);
}

void setNoDelay(int fd) {
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
}

void setNonBlocking(int fd) { fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK); }

bool sameToken(const std::string& a, const std::string& b) {
  unsigned diff = a.size() != b.size();
  for (size_t i = 0; i < a.size(); ++i) diff |= static_cast<unsigned char>(a[i] ^ (b.empty() ? 0 : b[i % b.size()]));
  return diff == 0;
}

namespace {

addrinfo* resolve(const Endpoint& where, bool passive) {
  addrinfo hints{};
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = passive ? AI_PASSIVE : 0;
  addrinfo* found = nullptr;
  int rc = getaddrinfo(where.host.empty() ? nullptr : where.host.c_str(), std::to_string(where.port).c_str(), &hints,
                       &found);
  if (rc != 0)
    fail(SHOAL_ERR_SYSTEM, "cannot resolve host '{}' of {}: {}", where.host, where.url, gai_strerror(rc));
  return found;
}

// Waits for one event on fd; false when the deadline passed first.
bool waitFor(int fd, short events, Deadline deadline) {
  for (;;) {
    pollfd p{fd, events, 0};
    int rc = poll(&p, 1, pollMsUntil(deadline));
    if (rc > 0) return true;
    if (rc == 0) return false;
    if (errno != EINTR) return true;  // let the read or write report it
  }
}

}  // namespace

int listenTcp(const Endpoint& where, int* boundPort) {
  addrinfo* found = resolve(where, true);
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
  std::string lastError = "no address";
  for (;;) {
    addrinfo* found = resolve(where, false);
    for (addrinfo* ai = found; ai != nullptr; ai = ai->ai_next) {
      int fd = socket(ai->ai_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
      if (fd < 0) {
        lastError = errnoText(errno);
        continue;
      }
      int rc = connect(fd, ai->ai_addr, ai->ai_addrlen);
      int err = rc == 0 ? 0 : errno;
      if (err == EINPROGRESS) {
        if (!waitFor(fd, POLLOUT, deadline)) {
          err = ETIMEDOUT;
        } else {
          socklen_t length = sizeof err;
          getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &length);
        }
      }
      if (err == 0) {
        freeaddrinfo(found);
        setNoDelay(fd);
        return fd;
      }
      lastError = errnoText(err);
      close(fd);
    }
    freeaddrinfo(found);
    if (Clock::now() >= deadline)
      fail(SHOAL_ERR_REMOTE, "cannot reach the aggregator {} before the deadline (SHOAL_TIMEOUT_S): {}; is shoal-aggd "
           "running there?", where.url, lastError);
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
}

IoResult readFull(int fd, void* data, size_t bytes, Deadline deadline) {
  auto* p = static_cast<uint8_t*>(data);
  while (bytes > 0) {
    ssize_t n = recv(fd, p, bytes, 0);
    if (n > 0) {
      p += n;
      bytes -= static_cast<size_t>(n);
      continue;
    }
    if (n == 0) return IoResult::kClosed;
    if (errno == EINTR) continue;
    if (errno != EAGAIN && errno != EWOULDBLOCK) return IoResult::kError;
    if (!waitFor(fd, POLLIN, deadline)) return IoResult::kTimedOut;
  }
  return IoResult::kDone;
}

IoResult writeFull(int fd, const void* data, size_t bytes, Deadline deadline) {
  auto* p = static_cast<const uint8_t*>(data);
  while (bytes > 0) {
    ssize_t n = send(fd, p, bytes, MSG_NOSIGNAL);
    if (n > 0) {
      p += n;
      bytes -= static_cast<size_t>(n);
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK) return IoResult::kError;
    if (!waitFor(fd, POLLOUT, deadline)) return IoResult::kTimedOut;
  }
  return IoResult::kDone;
}

}  // namespace shoal::aggregate
