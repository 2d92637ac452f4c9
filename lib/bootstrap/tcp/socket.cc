// Socket helpers of the tcp store (socket.h).
#include "bootstrap/tcp/socket.h"

#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <unistd.h>

#include <cerrno>
#include <climits>
#include <cstdint>
#include <cstring>

namespace shoal::detail::tcp {

int msUntil(Clock::time_point t) {
  Clock::time_point now = Clock::now();
  if (t <= now) return 0;
  auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(t - now).count() + 1;
  return ms > INT_MAX ? INT_MAX : static_cast<int>(ms);
}

int pollMsUntil(Clock::time_point t) { return t == Clock::time_point::max() ? -1 : msUntil(t); }

std::string errnoText(int err) { return std::strerror(err); }
std::string errnoText() { return errnoText(errno); }

std::string peerName(const sockaddr* addr, socklen_t len) {
  char host[NI_MAXHOST] = "?";
  char port[NI_MAXSERV] = "?";
  getnameinfo(addr, len, host, sizeof host, port, sizeof port, NI_NUMERICHOST | NI_NUMERICSERV);
  return addr->sa_family == AF_INET6 ? fmt::format("[{}]:{}", host, port) : fmt::format("{}:{}", host, port);
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

bool isLoopback(const sockaddr* addr) {
  if (addr->sa_family == AF_INET)
    return (ntohl(reinterpret_cast<const sockaddr_in*>(addr)->sin_addr.s_addr) >> 24) == 127;
  return addr->sa_family == AF_INET6 && IN6_IS_ADDR_LOOPBACK(&reinterpret_cast<const sockaddr_in6*>(addr)->sin6_addr);
}

}  // namespace

int listenOn(const std::string& host, int port, const std::string& url) {
  addrinfo hints{};
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  int rc = getaddrinfo(host.c_str(), nullptr, &hints, &found);
  bool loopback = rc == 0 && isLoopback(found->ai_addr);
  if (rc == 0) {
    freeaddrinfo(found);
    hints.ai_flags = AI_PASSIVE;  // with no host: the wildcard addresses
    rc = getaddrinfo(loopback ? host.c_str() : nullptr, std::to_string(port).c_str(), &hints, &found);
  }
  if (rc != 0)
    fail(SHOAL_ERR_SYSTEM, "rank 0 cannot serve the tcp store {}: cannot resolve host '{}': {}", url, host,
         gai_strerror(rc));
  int fd = -1;
  int err = EAFNOSUPPORT;
  for (int family : {AF_INET6, AF_INET}) {  // IPv6 first: with V6ONLY off, one wildcard socket serves both
    for (addrinfo* ai = found; ai != nullptr && fd < 0; ai = ai->ai_next) {
      if (ai->ai_family != family) continue;
      fd = socket(family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
      if (fd < 0) {
        err = errno;
        continue;
      }
      int zero = 0;
      int one = 1;  // a restarted job can reuse the port while old connections sit in TIME_WAIT
      if (family == AF_INET6) setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &zero, sizeof zero);
      setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
      if (bind(fd, ai->ai_addr, ai->ai_addrlen) == 0 && listen(fd, SOMAXCONN) == 0) break;
      err = errno;
      close(fd);
      fd = -1;
    }
  }
  freeaddrinfo(found);
  if (fd < 0)
    fail(SHOAL_ERR_SYSTEM, "rank 0 cannot serve the tcp store {}: cannot listen on port {}: {}{}", url, port,
         errnoText(err),
         err == EADDRINUSE ? "; another process (perhaps an earlier job) holds the port: choose another port in "
                             "SHOAL_STORE"
                           : "");
  return fd;
}

int connectTo(const std::string& host, int port, Clock::time_point deadline, std::string& lastError,
              bool* unresolved) {
  if (unresolved) *unresolved = false;
  addrinfo hints{};
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  if (int rc = getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &found); rc != 0) {
    lastError = fmt::format("cannot resolve host '{}': {}", host, gai_strerror(rc));
    if (unresolved) *unresolved = true;
    return -1;
  }
  int fd = -1;
  for (addrinfo* ai = found; ai != nullptr && fd < 0; ai = ai->ai_next) {
    fd = socket(ai->ai_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) {
      lastError = "socket: " + errnoText();
      continue;
    }
    int err = ::connect(fd, ai->ai_addr, ai->ai_addrlen) == 0 ? 0 : errno;
    if (err == EINPROGRESS) {
      pollfd p{fd, POLLOUT, 0};
      int rc;
      while ((rc = poll(&p, 1, msUntil(deadline))) < 0 && errno == EINTR) {
      }
      socklen_t len = sizeof err;
      if (rc <= 0)
        err = ETIMEDOUT;
      else if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) != 0)
        err = errno;
    }
    if (err != 0) {
      lastError = errnoText(err);
      close(fd);
      fd = -1;
    }
  }
  freeaddrinfo(found);
  if (fd >= 0) setNoDelay(fd);
  return fd;
}

namespace {

// Waits for one event on fd; false when the deadline passed first. A poll
// error other than EINTR returns true: the read or write that follows reports it.
bool waitFor(int fd, short events, Clock::time_point deadline) {
  for (;;) {
    pollfd p{fd, events, 0};
    int rc = poll(&p, 1, pollMsUntil(deadline));
    if (rc > 0) return true;
    if (rc == 0) return false;
    if (errno != EINTR) return true;
  }
}

}  // namespace

IoResult readFull(int fd, void* data, size_t bytes, Clock::time_point deadline) {
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

IoResult writeFull(int fd, const void* data, size_t bytes, Clock::time_point deadline) {
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

}  // namespace shoal::detail::tcp
