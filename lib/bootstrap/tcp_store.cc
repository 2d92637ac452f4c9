// tcp://host:port: rank 0 runs a single-threaded poll() server; every rank,
// rank 0 included, is a client with one connection.
//
// Protocol: every message is a frame, a little-endian u32 body length and
// the body. Requests start with an op byte, replies with a status byte;
// strings and byte strings are a u32 length and the bytes. The first request
// of a connection is HELLO (magic, version, rank, job token); the server
// refuses a wrong token and closes. GET and WAIT carry how long the server may
// hold them (at most kWaitSlice): it answers as soon as the keys exist, or
// NOT_YET when that time is up and the client asks again. So no reply is ever
// outstanding for long, and every client read is bounded by poll() timeouts.
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <climits>
#include <condition_variable>
#include <cstring>
#include <mutex>
#include <optional>
#include <string_view>
#include <thread>
#include <unordered_map>

#include "bootstrap/store.h"
#include "core/log.h"

namespace shoal::detail {
namespace {

using namespace std::chrono_literals;

constexpr uint32_t kMagic = 0x4c4f4853;     // "SHOL": tells a shoal store from another service on the port
constexpr uint8_t kVersion = 1;
constexpr uint32_t kMaxHello = 4096;        // a peer that has not shown the token gets little buffer
constexpr uint32_t kMaxMessage = 256u << 20;
constexpr auto kWaitSlice = 500ms;          // the longest the server holds one GET or WAIT
constexpr auto kReplyGrace = 250ms;         // network slack on top of a server-side wait

enum Op : uint8_t { kHello = 1, kSet = 2, kGet = 3, kWait = 4, kAdd = 5 };
enum Status : uint8_t { kOk = 0, kNotYet = 1, kRefused = 2, kBadRequest = 3 };

class Writer {
 public:
  // Room for the frame length. (Reserving first also quiets a GCC 12 -Warray-bounds false positive.)
  Writer() {
    buf_.reserve(64);
    buf_.resize(4);
  }
  Writer& u8(uint8_t v) { buf_.push_back(v); return *this; }
  Writer& u32(uint32_t v) { return le(v, 4); }
  Writer& u64(uint64_t v) { return le(v, 8); }
  Writer& str(std::string_view s) { return blob(s.begin(), s.end()); }
  Writer& bytes(const Bytes& b) { return blob(b.begin(), b.end()); }
  Bytes frame() {
    uint32_t n = static_cast<uint32_t>(buf_.size() - 4);
    for (int i = 0; i < 4; ++i) buf_[i] = static_cast<uint8_t>(n >> (8 * i));
    return std::move(buf_);
  }

 private:
  Writer& le(uint64_t v, int n) {
    for (int i = 0; i < n; ++i) buf_.push_back(static_cast<uint8_t>(v >> (8 * i)));
    return *this;
  }
  template <typename It>
  Writer& blob(It begin, It end) {
    u32(static_cast<uint32_t>(end - begin));
    buf_.insert(buf_.end(), begin, end);
    return *this;
  }
  Bytes buf_;
};

// Reads past the end set ok() false instead of throwing, so callers check once.
class Reader {
 public:
  Reader(const uint8_t* data, size_t size) : p_(data), n_(size) {}
  explicit Reader(const Bytes& b) : Reader(b.data(), b.size()) {}
  bool ok() const { return ok_; }
  bool done() const { return ok_ && n_ == 0; }
  uint8_t u8() { const uint8_t* p = take(1); return p ? p[0] : 0; }
  uint32_t u32() { return static_cast<uint32_t>(le(4)); }
  uint64_t u64() { return le(8); }
  std::string str() { return blob<std::string>(); }
  Bytes bytes() { return blob<Bytes>(); }

 private:
  const uint8_t* take(size_t k) {
    if (!ok_ || n_ < k) {
      ok_ = false;
      return nullptr;
    }
    const uint8_t* p = p_;
    p_ += k;
    n_ -= k;
    return p;
  }
  template <typename T>
  T blob() {
    uint32_t n = u32();
    const uint8_t* p = take(n);
    return p ? T(p, p + n) : T();
  }
  uint64_t le(int k) {
    const uint8_t* p = take(k);
    uint64_t v = 0;
    for (int i = 0; p && i < k; ++i) v |= uint64_t{p[i]} << (8 * i);
    return v;
  }
  const uint8_t* p_;
  size_t n_;
  bool ok_ = true;
};

uint32_t frameLength(const uint8_t* p) { return p[0] | p[1] << 8 | p[2] << 16 | uint32_t{p[3]} << 24; }

// Rounded up, so that poll() returning 0 means the deadline has passed.
int msUntil(Clock::time_point t) {
  Clock::time_point now = Clock::now();
  if (t <= now) return 0;
  auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(t - now).count() + 1;
  return ms > INT_MAX ? INT_MAX : static_cast<int>(ms);
}

std::string errnoText(int err = errno) { return std::strerror(err); }

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

// Compares in time independent of where the tokens differ.
bool sameToken(const std::string& a, const std::string& b) {
  unsigned diff = a.size() != b.size();
  for (size_t i = 0; i < a.size(); ++i) diff |= static_cast<unsigned char>(a[i] ^ (b.empty() ? 0 : b[i % b.size()]));
  return diff == 0;
}

bool isLoopback(const sockaddr* addr) {
  if (addr->sa_family == AF_INET)
    return (ntohl(reinterpret_cast<const sockaddr_in*>(addr)->sin_addr.s_addr) >> 24) == 127;
  return addr->sa_family == AF_INET6 && IN6_IS_ADDR_LOOPBACK(&reinterpret_cast<const sockaddr_in6*>(addr)->sin6_addr);
}

// A loopback host keeps the store private to the machine; any other name is served on every interface,
// because the name often resolves locally to an address (127.0.1.1, another NIC) that peers do not use.
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

class Server {
 public:
  Server(const std::string& host, int port, std::string token, std::string url)
      : token_(std::move(token)), url_(std::move(url)) {
    listenFd_ = listenOn(host, port, url_);
    int pipeFds[2];
    if (pipe2(pipeFds, O_CLOEXEC | O_NONBLOCK) != 0) {
      close(listenFd_);
      fail(SHOAL_ERR_SYSTEM, "rank 0 cannot serve the tcp store {}: pipe: {}", url_, errnoText());
    }
    wakeRead_ = pipeFds[0];
    wakeWrite_ = pipeFds[1];
    thread_ = std::thread([this] { run(); });
  }

  ~Server() {
    char byte = 1;
    while (write(wakeWrite_, &byte, 1) < 0 && errno == EINTR) {
    }
    thread_.join();
    for (auto& c : conns_) close(c->fd);
    close(listenFd_);
    close(wakeRead_);
    close(wakeWrite_);
  }

 private:
  struct Conn {
    int fd;
    std::string peer;
    uint32_t rank = 0;
    bool hello = false;
    bool closing = false;  // refused: close once the reply is out
    bool dead = false;
    Bytes in;
    Bytes out;
    size_t outDone = 0;
    // A GET or WAIT whose keys are missing: answered when they all exist or at waitUntil.
    bool waiting = false;
    uint8_t waitOp = 0;
    std::vector<std::string> waitKeys;
    size_t waitNext = 0;  // keys before this one are known to exist
    Clock::time_point waitUntil;
  };

  void run() {
    std::vector<pollfd> fds;
    for (;;) {
      bool accepting = Clock::now() >= acceptPausedUntil_;
      fds.assign({{wakeRead_, POLLIN, 0}, {listenFd_, static_cast<short>(accepting ? POLLIN : 0), 0}});
      Clock::time_point nextExpiry = accepting ? Clock::time_point::max() : acceptPausedUntil_;
      for (auto& c : conns_) {
        short events = c->closing ? 0 : POLLIN;  // read while waiting too, to notice a client that left
        if (c->outDone < c->out.size()) events |= POLLOUT;
        fds.push_back({c->fd, events, 0});
        if (c->waiting) nextExpiry = std::min(nextExpiry, c->waitUntil);
      }
      int timeout = nextExpiry == Clock::time_point::max() ? -1 : msUntil(nextExpiry);
      if (poll(fds.data(), fds.size(), timeout) < 0) {
        if (errno == EINTR) continue;
        SHOAL_LOG_ERROR("tcp store {}: the server stopped: poll: {}", url_, errnoText());
        return;
      }
      if (fds[0].revents) return;  // the owning Store is being destroyed
      for (size_t i = 2; i < fds.size(); ++i) {
        Conn& c = *conns_[i - 2];
        if (fds[i].revents & (POLLIN | POLLHUP | POLLERR)) readFrom(c);
        if (!c.dead && (fds[i].revents & POLLOUT)) flush(c);
      }
      Clock::time_point now = Clock::now();
      for (auto& c : conns_)
        if (c->waiting && !c->dead && c->waitUntil <= now) answerWait(*c, true);
      // Answering one client may unblock frames another has queued; repeat until nothing moves.
      for (bool moved = true; moved;) {
        moved = false;
        for (auto& c : conns_) moved |= process(*c);
      }
      std::erase_if(conns_, [](const std::unique_ptr<Conn>& c) {
        if (c->dead) close(c->fd);
        return c->dead;
      });
      if (fds[1].revents & POLLIN) acceptAll();
    }
  }

  void acceptAll() {
    for (;;) {
      sockaddr_storage addr{};
      socklen_t len = sizeof addr;
      int fd = accept4(listenFd_, reinterpret_cast<sockaddr*>(&addr), &len, SOCK_NONBLOCK | SOCK_CLOEXEC);
      if (fd < 0) {
        if (errno == EINTR || errno == ECONNABORTED) continue;
        if (errno != EAGAIN && errno != EWOULDBLOCK) {
          // Out of descriptors, say: the listen socket stays readable, so back off instead of spinning.
          SHOAL_LOG_WARN("tcp store {}: cannot accept a connection: {}", url_, errnoText());
          acceptPausedUntil_ = Clock::now() + 100ms;
        }
        return;
      }
      setNoDelay(fd);
      auto c = std::make_unique<Conn>();
      c->fd = fd;
      c->peer = peerName(reinterpret_cast<sockaddr*>(&addr), len);
      conns_.push_back(std::move(c));
    }
  }

  void readFrom(Conn& c) {
    uint8_t buf[65536];
    for (;;) {
      ssize_t n = recv(c.fd, buf, sizeof buf, 0);
      if (n > 0) {
        c.in.insert(c.in.end(), buf, buf + n);
        if (c.in.size() > size_t{c.hello ? kMaxMessage : kMaxHello} + 4) {
          SHOAL_LOG_WARN("tcp store {}: dropped the connection from {}: it sent more than a request can hold", url_,
                         c.peer);
          c.dead = true;
          return;
        }
        if (static_cast<size_t>(n) < sizeof buf) return;
      } else if (n == 0) {
        SHOAL_LOG_DEBUG("tcp store {}: {} (rank {}) disconnected", url_, c.peer, c.rank);
        c.dead = true;
        return;
      } else if (errno != EINTR) {
        if (errno != EAGAIN && errno != EWOULDBLOCK) c.dead = true;
        return;
      }
    }
  }

  // Handles the complete frames buffered on c, stopping at a request that has to wait.
  bool process(Conn& c) {
    size_t pos = 0;
    while (!c.dead && !c.closing && !c.waiting && c.in.size() - pos >= 4) {
      uint32_t len = frameLength(&c.in[pos]);
      if (len > (c.hello ? kMaxMessage : kMaxHello)) {
        SHOAL_LOG_WARN("tcp store {}: dropped the connection from {}: it sent a {} byte message", url_, c.peer, len);
        c.dead = true;
        break;
      }
      if (c.in.size() - pos - 4 < len) break;
      handle(c, Reader(&c.in[pos + 4], len));
      pos += 4 + len;
    }
    c.in.erase(c.in.begin(), c.in.begin() + static_cast<ptrdiff_t>(pos));
    return pos > 0;
  }

  void handle(Conn& c, Reader r) {
    uint8_t op = r.u8();
    if (!c.hello) {
      uint32_t magic = r.u32();
      uint8_t version = r.u8();
      c.rank = r.u32();
      std::string token = r.str();
      if (op != kHello || magic != kMagic || !r.done()) {
        SHOAL_LOG_WARN("tcp store {}: dropped the connection from {}: it did not begin with a shoal handshake", url_,
                       c.peer);
        c.dead = true;
      } else if (version != kVersion) {
        refuse(c, kBadRequest, fmt::format("the store speaks protocol version {} and this rank {}: every rank must "
                                           "run the same shoal version", kVersion, version));
      } else if (!sameToken(token, token_)) {
        // Never log the expected token: the log may be readable by the process that guessed wrong.
        SHOAL_LOG_WARN("tcp store {}: refused a connection from {} (claiming rank {}): wrong job token; a process of "
                       "another job, or one started with a different SHOAL_TOKEN, tried to join", url_, c.peer, c.rank);
        refuse(c, kRefused, "");
      } else {
        c.hello = true;
        reply(c, Writer().u8(kOk).frame());
      }
      return;
    }
    if (op == kSet) {
      std::string key = r.str();
      Bytes value = r.bytes();
      if (!r.done()) return malformed(c);
      values_[key] = std::move(value);
      reply(c, Writer().u8(kOk).frame());
      wakeWaiters();
    } else if (op == kGet || op == kWait) {
      std::vector<std::string> keys;
      uint32_t count = op == kGet ? 1 : r.u32();
      for (uint32_t i = 0; i < count && r.ok(); ++i) keys.push_back(r.str());
      uint32_t waitMs = r.u32();
      if (!r.done() || keys.size() != count) return malformed(c);
      c.waiting = true;
      c.waitOp = op;
      c.waitKeys = std::move(keys);
      c.waitNext = 0;
      c.waitUntil = Clock::now() + std::chrono::milliseconds(std::min<uint32_t>(waitMs, 60000));
      answerWait(c, false);
    } else if (op == kAdd) {
      std::string key = r.str();
      auto delta = static_cast<int64_t>(r.u64());
      if (!r.done()) return malformed(c);
      auto it = values_.find(key);
      int64_t sum = 0;
      try {
        sum = addCounter(key, it == values_.end() ? nullptr : &it->second, delta);
      } catch (const Error& e) {
        reply(c, Writer().u8(kBadRequest).str(e.what()).frame());
        return;
      }
      values_[key] = counterBytes(sum);
      reply(c, Writer().u8(kOk).u64(static_cast<uint64_t>(sum)).frame());
      wakeWaiters();
    } else {
      malformed(c);
    }
  }

  void malformed(Conn& c) {
    SHOAL_LOG_WARN("tcp store {}: dropped the connection from {} (rank {}): malformed request", url_, c.peer, c.rank);
    c.dead = true;
  }

  void refuse(Conn& c, Status status, const std::string& text) {
    Writer w;
    w.u8(status).str(text);
    c.closing = true;
    reply(c, w.frame());
  }

  // Answers c's pending GET/WAIT when its keys all exist, or with NOT_YET when expired. Keys only ever
  // appear, so the scan resumes at waitNext and a job-wide WAIT costs O(keys) in total, not per set.
  void answerWait(Conn& c, bool expired) {
    while (c.waitNext < c.waitKeys.size() && values_.count(c.waitKeys[c.waitNext])) ++c.waitNext;
    bool ready = c.waitNext == c.waitKeys.size();
    if (!ready && !expired) return;
    c.waiting = false;
    Writer w;
    if (ready) {
      w.u8(kOk);
      if (c.waitOp == kGet) w.bytes(values_[c.waitKeys[0]]);
    } else {
      std::vector<std::string> missing;
      for (size_t i = c.waitNext; i < c.waitKeys.size(); ++i)
        if (!values_.count(c.waitKeys[i])) missing.push_back(c.waitKeys[i]);
      w.u8(kNotYet).u32(static_cast<uint32_t>(missing.size()));
      for (const std::string& key : missing) w.str(key);
    }
    c.waitKeys.clear();
    reply(c, w.frame());
  }

  void wakeWaiters() {
    for (auto& c : conns_)
      if (c->waiting && !c->dead) answerWait(*c, false);
  }

  void reply(Conn& c, const Bytes& frame) {
    c.out.insert(c.out.end(), frame.begin(), frame.end());
    flush(c);
  }

  void flush(Conn& c) {
    while (c.outDone < c.out.size()) {
      ssize_t n = send(c.fd, c.out.data() + c.outDone, c.out.size() - c.outDone, MSG_NOSIGNAL);
      if (n > 0) {
        c.outDone += static_cast<size_t>(n);
      } else if (errno == EAGAIN || errno == EWOULDBLOCK) {
        return;  // poll() reports POLLOUT when there is room
      } else if (errno != EINTR) {
        c.dead = true;
        return;
      }
    }
    c.out.clear();
    c.outDone = 0;
    if (c.closing) c.dead = true;
  }

  int listenFd_ = -1;
  int wakeRead_ = -1;
  int wakeWrite_ = -1;
  std::string token_;
  std::string url_;
  std::unordered_map<std::string, Bytes> values_;  // touched only by the server thread
  std::vector<std::unique_ptr<Conn>> conns_;
  Clock::time_point acceptPausedUntil_;
  std::thread thread_;
};

// FIFO hand-off, so a thread looping on get() cannot starve another thread's set() on the same Store.
class FairMutex {
 public:
  void lock() {
    std::unique_lock<std::mutex> lock(mutex_);
    uint64_t ticket = next_++;
    turn_.wait(lock, [&] { return serving_ == ticket; });
  }
  void unlock() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      ++serving_;
    }
    turn_.notify_all();
  }

 private:
  std::mutex mutex_;
  std::condition_variable turn_;
  uint64_t next_ = 0;
  uint64_t serving_ = 0;
};

class TcpStore : public Store {
 public:
  TcpStore(std::string host, int port, const StoreOptions& options)
      : host_(std::move(host)), port_(port), url_(options.url), token_(options.token), rank_(options.rank),
        timeoutS_(options.timeoutS) {
    if (token_.empty())
      fail(SHOAL_ERR_INVALID_ARGUMENT, "tcp store {}: no job token: set SHOAL_TOKEN to the same secret value on every "
           "rank (shoalrun sets it)", url_);
    if (rank_ == 0) server_ = std::make_unique<Server>(host_, port_, token_, url_);
    connect(deadlineAfter(timeoutS_), true);
  }

  ~TcpStore() override { disconnect(); }  // then server_ stops, closing every client's connection

  void set(const std::string& key, const Bytes& value) override {
    Bytes reply = call(Writer().u8(kSet).str(key).bytes(value).frame(), fmt::format("set of key '{}'", key));
    Reader r(reply);
    if (r.u8() != kOk || !r.done()) badReply();
  }

  Bytes get(const std::string& key, Deadline deadline) override {
    Clock::time_point start = Clock::now();
    for (;;) {
      Clock::time_point sliceEnd = std::min(deadline, Clock::now() + kWaitSlice);
      std::optional<Bytes> reply = exchange(Writer().u8(kGet).str(key).u32(sliceMs(sliceEnd)).frame(), sliceEnd);
      if (reply) {
        Reader r(*reply);
        uint8_t status = r.u8();
        if (status == kOk) {
          Bytes value = r.bytes();
          if (r.done()) return value;
        }
        if (status != kNotYet) badReply();
      }
      if (Clock::now() >= deadline) failTimeout({key}, url_, start);
    }
  }

  void wait(const std::vector<std::string>& keys, Deadline deadline) override {
    Clock::time_point start = Clock::now();
    std::vector<std::string> missing = keys;
    while (!missing.empty()) {
      Clock::time_point sliceEnd = std::min(deadline, Clock::now() + kWaitSlice);
      Writer w;
      w.u8(kWait).u32(static_cast<uint32_t>(missing.size()));
      for (const std::string& key : missing) w.str(key);
      std::optional<Bytes> reply = exchange(w.u32(sliceMs(sliceEnd)).frame(), sliceEnd);
      if (reply) {
        Reader r(*reply);
        uint8_t status = r.u8();
        if (status == kOk && r.done()) return;
        if (status != kNotYet) badReply();
        uint32_t left = r.u32();
        if (left == 0 || left > missing.size()) badReply();
        missing.assign(left, std::string());
        for (std::string& key : missing) key = r.str();
        if (!r.done()) badReply();
      }
      if (Clock::now() >= deadline) failTimeout(missing, url_, start);
    }
  }

  int64_t add(const std::string& key, int64_t delta) override {
    Bytes reply = call(Writer().u8(kAdd).str(key).u64(static_cast<uint64_t>(delta)).frame(),
                       fmt::format("add to key '{}'", key));
    Reader r(reply);
    uint8_t status = r.u8();
    if (status == kBadRequest) {
      std::string text = r.str();
      throw Error(SHOAL_ERR_INVALID_ARGUMENT, text);
    }
    auto sum = static_cast<int64_t>(r.u64());
    if (status != kOk || !r.done()) badReply();
    return sum;
  }

 private:
  static uint32_t sliceMs(Clock::time_point sliceEnd) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(sliceEnd - Clock::now()).count();
    return static_cast<uint32_t>(std::max<int64_t>(left, 0));
  }

  // A request whose answer is immediate; the store's timeout bounds it.
  Bytes call(const Bytes& frame, const std::string& what) {
    std::optional<Bytes> reply = exchange(frame, deadlineAfter(timeoutS_) - kReplyGrace);
    if (!reply)
      fail(SHOAL_ERR_TIMEOUT, "the tcp store at {} did not answer a {} within {} s: is rank 0, which serves it, "
           "alive and not stopped?", url_, what, timeoutS_);
    return *reply;
  }

  // Sends a request and reads its reply, giving up at answerBy + kReplyGrace; nullopt when that passes, after
  // dropping the connection (a late reply would be read as the answer to the next request).
  std::optional<Bytes> exchange(const Bytes& frame, Clock::time_point answerBy) {
    std::lock_guard<FairMutex> lock(mutex_);
    Clock::time_point limit = answerBy + kReplyGrace;
    if (fd_ < 0) connect(limit, false);
    Bytes reply;
    if (!sendAll(frame, limit) || !receive(reply, limit)) {
      disconnect();
      return std::nullopt;
    }
    return reply;
  }

  void connect(Clock::time_point deadline, bool firstTime) {
    std::string lastError = "no address to try";
    for (auto pause = 10ms;; pause = std::min(pause * 2, std::chrono::milliseconds(250))) {
      fd_ = tryConnect(deadline, lastError);
      if (fd_ >= 0) break;
      if (!firstTime)
        fail(SHOAL_ERR_REMOTE, "lost the connection to the tcp store at {} and cannot reconnect ({}): rank 0, which "
             "serves it, may have exited", url_, lastError);
      if (Clock::now() >= deadline)
        fail(SHOAL_ERR_TIMEOUT, "could not connect to the tcp store at {} within {} s (last error: {}): is rank 0 "
             "running, and does SHOAL_STORE name rank 0's host and a port it can listen on?", url_, timeoutS_,
             lastError);
      std::this_thread::sleep_until(std::min(Clock::now() + pause, deadline));  // one last try at the deadline
    }
    Writer hello;
    hello.u8(kHello).u32(kMagic).u8(kVersion).u32(static_cast<uint32_t>(rank_)).str(token_);
    Bytes reply;
    if (!sendAll(hello.frame(), deadline) || !receive(reply, deadline)) {
      disconnect();
      fail(SHOAL_ERR_TIMEOUT, "the tcp store at {} accepted a connection but did not answer the handshake in time: "
           "is SHOAL_STORE pointing at rank 0's shoal store and not another service?", url_);
    }
    Reader r(reply);
    uint8_t status = r.u8();
    if (status == kOk && r.done()) return;
    disconnect();
    if (status == kRefused)
      fail(SHOAL_ERR_INVALID_ARGUMENT, "tcp store at {} refused the job token; all ranks must use the same "
           "SHOAL_TOKEN (shoalrun sets it)", url_);
    if (status == kBadRequest)
      fail(SHOAL_ERR_INVALID_ARGUMENT, "tcp store at {} refused this rank: {}", url_, r.str());
    badReply();
  }

  int tryConnect(Clock::time_point deadline, std::string& lastError) {
    addrinfo hints{};
    hints.ai_socktype = SOCK_STREAM;
    addrinfo* found = nullptr;
    if (int rc = getaddrinfo(host_.c_str(), std::to_string(port_).c_str(), &hints, &found); rc != 0) {
      lastError = fmt::format("cannot resolve host '{}': {}", host_, gai_strerror(rc));
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

  // Waits for the socket; false when the deadline passed.
  bool ready(short events, Clock::time_point deadline) {
    for (;;) {
      pollfd p{fd_, events, 0};
      int rc = poll(&p, 1, msUntil(deadline));
      if (rc > 0) return true;  // errors and hang-ups surface in the send/recv that follows
      if (rc == 0 && Clock::now() >= deadline) return false;
      if (rc < 0 && errno != EINTR) lost("poll: " + errnoText());
    }
  }

  bool sendAll(const Bytes& data, Clock::time_point deadline) {
    for (size_t done = 0; done < data.size();) {
      ssize_t n = send(fd_, data.data() + done, data.size() - done, MSG_NOSIGNAL);
      if (n > 0) {
        done += static_cast<size_t>(n);
      } else if (errno == EAGAIN || errno == EWOULDBLOCK) {
        if (!ready(POLLOUT, deadline)) return false;
      } else if (errno != EINTR) {
        lost(errnoText());
      }
    }
    return true;
  }

  bool receiveExact(uint8_t* data, size_t size, Clock::time_point deadline) {
    for (size_t done = 0; done < size;) {
      ssize_t n = recv(fd_, data + done, size - done, 0);
      if (n > 0) {
        done += static_cast<size_t>(n);
      } else if (n == 0) {
        lost("the server closed the connection");
      } else if (errno == EAGAIN || errno == EWOULDBLOCK) {
        if (!ready(POLLIN, deadline)) return false;
      } else if (errno != EINTR) {
        lost(errnoText());
      }
    }
    return true;
  }

  bool receive(Bytes& body, Clock::time_point deadline) {
    uint8_t header[4];
    if (!receiveExact(header, 4, deadline)) return false;
    uint32_t len = frameLength(header);
    if (len > kMaxMessage) badReply();
    body.resize(len);
    return receiveExact(body.data(), len, deadline);
  }

  [[noreturn]] void lost(const std::string& why) {
    disconnect();
    fail(SHOAL_ERR_REMOTE, "lost the connection to the tcp store at {} ({}): rank 0, which serves it, may have exited "
         "or crashed", url_, why);
  }

  [[noreturn]] void badReply() {
    disconnect();
    fail(SHOAL_ERR_REMOTE, "the tcp store at {} sent a reply this rank does not understand: do all ranks run the "
         "same shoal version?", url_);
  }

  void disconnect() {
    if (fd_ >= 0) close(fd_);
    fd_ = -1;
  }

  std::string host_;
  int port_;
  std::string url_;
  std::string token_;
  int rank_;
  double timeoutS_;
  std::unique_ptr<Server> server_;  // rank 0 only; declared first among the stateful members so it dies last
  FairMutex mutex_;                 // one request at a time on the connection
  int fd_ = -1;
};

}  // namespace

std::unique_ptr<Store> makeTcpStore(const std::string& host, int port, const StoreOptions& options) {
  return std::make_unique<TcpStore>(host, port, options);
}

}  // namespace shoal::detail
