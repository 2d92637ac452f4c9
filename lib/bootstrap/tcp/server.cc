// The tcp store's server (server.h): one poll() thread per served port.
#include "bootstrap/tcp/server.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cerrno>
#include <map>
#include <mutex>
#include <thread>
#include <unordered_map>
#include <vector>

#include "bootstrap/tcp/socket.h"
#include "bootstrap/tcp/wire.h"
#include "core/log.h"

namespace shoal::detail::tcp {
namespace {

// At most kWarnBurst warnings per kWarnWindow reach the log; the rest are
// counted and summed up in one line when the window ends. A stranger flooding
// the port must not flood the job's log too.
class WarnLimiter {
 public:
  explicit WarnLimiter(const std::string& url) : url_(url) {}

  template <typename... Args>
  void warn(fmt::format_string<Args...> format, Args&&... args) {
    roll(Clock::now());
    if (shown_ < kWarnBurst) {
      ++shown_;
      SHOAL_LOG_WARN("tcp store {}: {}", url_, fmt::format(format, std::forward<Args>(args)...));
    } else {
      ++suppressed_;
    }
  }

  // Closes the window once it is over, reporting what it held back.
  void roll(Clock::time_point now) {
    if (now < windowEnd_) return;
    if (suppressed_ > 0)
      SHOAL_LOG_WARN("tcp store {}: {} more warnings about connections in the last {} s (rate-limited, not shown "
                     "one by one)", url_, suppressed_, std::chrono::duration_cast<std::chrono::seconds>(kWarnWindow).count());
    shown_ = 0;
    suppressed_ = 0;
    windowEnd_ = now + kWarnWindow;
  }

  // When roll() has something to report.
  Clock::time_point due() const { return suppressed_ > 0 ? windowEnd_ : Clock::time_point::max(); }

 private:
  const std::string& url_;
  Clock::time_point windowEnd_{};
  int shown_ = 0;
  long suppressed_ = 0;
};

}  // namespace

// The poll thread is detached and holds a reference to its Server, so the object outlives the thread
// however the server ends (stopped, idle, or at exit), and a process that leaves with _exit() does not
// leave an unjoined thread behind.
class Server : public std::enable_shared_from_this<Server> {
 public:
  Server(const std::string& host, int port, std::string token, std::string url)
      : token_(std::move(token)), url_(std::move(url)), warnings_(url_) {
    listenFd_ = listenOn(host, port, url_);
    int pipeFds[2];
    if (pipe2(pipeFds, O_CLOEXEC | O_NONBLOCK) != 0) {
      close(listenFd_);
      fail(SHOAL_ERR_SYSTEM, "rank 0 cannot serve the tcp store {}: pipe: {}", url_, errnoText());
    }
    wakeRead_ = pipeFds[0];
    wakeWrite_ = pipeFds[1];
    users_ = 1;
  }

  ~Server() {
    if (listenFd_ >= 0) close(listenFd_);  // never started
    close(wakeRead_);
    close(wakeWrite_);
  }

  void start() {
    std::lock_guard<std::mutex> lock(mutex_);
    started_ = true;
    std::thread([self = shared_from_this()] { self->run(); }).detach();
  }

  // Adds a user; false when this server has stopped and cannot be reused, or serves another
  // job's token and nobody uses it (the caller then replaces it).
  bool acquire(const std::string& token) {
    std::lock_guard<std::mutex> lock(mutex_);
    if (stopped_) return false;
    if (!sameToken(token, token_)) {
      if (users_ > 0)
        fail(SHOAL_ERR_INVALID_ARGUMENT, "tcp store {}: a communicator of this process already serves this port "
             "with another job token; use another port (or the same SHOAL_TOKEN)", url_);
      return false;
    }
    ++users_;
    return true;
  }

  void release() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      --users_;
    }
    wake();
  }

  // Stops serving now (closing every connection and the port) and waits until the thread is done.
  void stop() {
    stopRequested_ = true;
    wake();
    std::unique_lock<std::mutex> lock(mutex_);
    exitedChanged_.wait(lock, [&] { return exited_ || !started_; });
  }

 private:
  struct Conn {
    int fd;
    std::string peer;
    Clock::time_point acceptedAt;
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

  void wake() {
    char byte = 1;
    while (write(wakeWrite_, &byte, 1) < 0 && errno == EINTR) {
    }
  }

  // True when the server should stop because nothing uses it: no communicator of this process
  // and no verified client, for kIdleLinger. Decided under the mutex, so acquire() never revives
  // a server that is shutting down.
  bool idleTooLong(Clock::time_point now, Clock::time_point& idleSince) {
    bool anyClient = std::any_of(conns_.begin(), conns_.end(), [](const auto& c) { return c->hello && !c->dead; });
    std::lock_guard<std::mutex> lock(mutex_);
    if (users_ > 0 || anyClient) {
      idleSince = Clock::time_point::max();
      return false;
    }
    if (idleSince == Clock::time_point::max()) idleSince = now;
    if (now < idleSince + kIdleLinger) return false;
    stopped_ = true;
    return true;
  }

  void run() {
    std::vector<pollfd> fds;
    Clock::time_point idleSince = Clock::time_point::max();
    for (;;) {
      Clock::time_point now = Clock::now();
      if (stopRequested_ || idleTooLong(now, idleSince)) break;
      bool accepting = now >= acceptPausedUntil_;
      fds.assign({{wakeRead_, POLLIN, 0}, {listenFd_, static_cast<short>(accepting ? POLLIN : 0), 0}});
      Clock::time_point nextExpiry = std::min(accepting ? Clock::time_point::max() : acceptPausedUntil_,
                                              warnings_.due());
      if (idleSince != Clock::time_point::max()) nextExpiry = std::min(nextExpiry, idleSince + kIdleLinger);
      for (auto& c : conns_) {
        short events = c->closing ? 0 : POLLIN;  // read while waiting too, to notice a client that left
        if (c->outDone < c->out.size()) events |= POLLOUT;
        fds.push_back({c->fd, events, 0});
        if (c->waiting) nextExpiry = std::min(nextExpiry, c->waitUntil);
        if (!c->hello) nextExpiry = std::min(nextExpiry, c->acceptedAt + kHandshakeDeadline);
      }
      int timeout = nextExpiry == Clock::time_point::max() ? -1 : msUntil(nextExpiry);
      if (poll(fds.data(), fds.size(), timeout) < 0) {
        if (errno == EINTR) continue;
        SHOAL_LOG_ERROR("tcp store {}: the server stopped: poll: {}", url_, errnoText());
        break;
      }
      if (fds[0].revents) {
        char drain[64];
        while (read(wakeRead_, drain, sizeof drain) > 0) {
        }
      }
      for (size_t i = 2; i < fds.size(); ++i) {
        Conn& c = *conns_[i - 2];
        if (fds[i].revents & (POLLIN | POLLHUP | POLLERR)) readFrom(c);
        if (!c.dead && (fds[i].revents & POLLOUT)) flush(c);
      }
      now = Clock::now();
      for (auto& c : conns_) {
        if (c->waiting && !c->dead && c->waitUntil <= now) answerWait(*c, true);
        if (!c->hello && !c->dead && now >= c->acceptedAt + kHandshakeDeadline) {
          warnings_.warn("closed the connection from {}: no handshake within {} s", c->peer,
                         std::chrono::duration_cast<std::chrono::seconds>(kHandshakeDeadline).count());
          c->dead = true;
        }
      }
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
      warnings_.roll(Clock::now());
    }
    // Free the port at once: a later communicator of this process (or another job) may want it.
    for (auto& c : conns_) close(c->fd);
    conns_.clear();
    close(listenFd_);
    listenFd_ = -1;
    std::lock_guard<std::mutex> lock(mutex_);
    stopped_ = true;
    exited_ = true;
    exitedChanged_.notify_all();
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
          warnings_.warn("cannot accept a connection: {}", errnoText());
          acceptPausedUntil_ = Clock::now() + 100ms;
        }
        return;
      }
      setNoDelay(fd);
      auto c = std::make_unique<Conn>();
      c->fd = fd;
      c->peer = peerName(reinterpret_cast<sockaddr*>(&addr), len);
      c->acceptedAt = Clock::now();
      conns_.push_back(std::move(c));
      evictIfTooManyUnverified();
    }
  }

  // Closes the oldest connection that has not shown the token once more than kMaxUnverified wait.
  // Ranks send their handshake as soon as they connect, so the oldest is the likeliest stranger.
  void evictIfTooManyUnverified() {
    size_t unverified = 0;
    Conn* oldest = nullptr;
    for (auto& c : conns_) {
      if (c->hello || c->dead) continue;
      ++unverified;
      if (oldest == nullptr) oldest = c.get();
    }
    if (unverified <= kMaxUnverified) return;
    warnings_.warn("closed the connection from {}: more than {} connections have not presented the job token", oldest->peer,
                   kMaxUnverified);
    close(oldest->fd);
    std::erase_if(conns_, [oldest](const std::unique_ptr<Conn>& c) { return c.get() == oldest; });
  }

  void readFrom(Conn& c) {
    uint8_t buf[65536];
    for (;;) {
      ssize_t n = recv(c.fd, buf, sizeof buf, 0);
      if (n > 0) {
        c.in.insert(c.in.end(), buf, buf + n);
        if (c.in.size() > size_t{c.hello ? kMaxMessage : kMaxHello} + 4) {
          warnings_.warn("dropped the connection from {}: it sent more than a request can hold", c.peer);
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
    while (!c.dead && !c.closing && !c.waiting) {
      uint32_t len = 0;
      FrameScan scan = scanFrame(c.in.data() + pos, c.in.size() - pos, c.hello ? kMaxMessage : kMaxHello, len);
      if (scan == FrameScan::kTooLarge) {
        warnings_.warn("dropped the connection from {}: it sent a {} byte message", c.peer, len);
        c.dead = true;
      }
      if (scan != FrameScan::kComplete) break;
      handle(c, c.in.data() + pos + 4, len);
      pos += 4 + len;
    }
    c.in.erase(c.in.begin(), c.in.begin() + static_cast<ptrdiff_t>(pos));
    return pos > 0;
  }

  void handle(Conn& c, const uint8_t* body, size_t size) {
    std::optional<Request> request = decodeRequest(body, size, !c.hello);
    if (!c.hello) {
      if (!request || request->magic != kMagic) {
        warnings_.warn("dropped the connection from {}: it did not begin with a shoal handshake", c.peer);
        c.dead = true;
        return;
      }
      c.rank = request->rank;
      if (request->version != kVersion) {
        refuse(c, kBadRequest, fmt::format("the store speaks protocol version {} and this rank {}: every rank must "
                                           "run the same shoal version", kVersion, request->version));
      } else if (!sameToken(request->token, token_)) {
        // Never log the expected token: the log may be readable by the process that guessed wrong.
        warnings_.warn("refused a connection from {} (claiming rank {}): wrong job token; a process of another job, "
                       "or one started with a different SHOAL_TOKEN, tried to join", c.peer, c.rank);
        refuse(c, kRefused, "");
      } else {
        c.hello = true;
        reply(c, Writer().u8(kOk).frame());
      }
      return;
    }
    if (!request) {
      warnings_.warn("dropped the connection from {} (rank {}): malformed request", c.peer, c.rank);
      c.dead = true;
      return;
    }
    switch (request->op) {
      case kSet:
        values_[request->keys[0]] = std::move(request->value);
        reply(c, Writer().u8(kOk).frame());
        wakeWaiters();
        break;
      case kGet:
      case kWait:
        c.waiting = true;
        c.waitOp = request->op;
        c.waitKeys = std::move(request->keys);
        c.waitNext = 0;
        c.waitUntil = Clock::now() + std::chrono::milliseconds(std::min(request->waitMs, kMaxHeldMs));
        answerWait(c, false);
        break;
      case kAdd: {
        const std::string& key = request->keys[0];
        auto it = values_.find(key);
        int64_t sum = 0;
        try {
          sum = addCounter(key, it == values_.end() ? nullptr : &it->second, request->delta);
        } catch (const Error& e) {
          reply(c, Writer().u8(kBadRequest).str(e.what()).frame());
          return;
        }
        values_[key] = counterBytes(sum);
        reply(c, Writer().u8(kOk).u64(static_cast<uint64_t>(sum)).frame());
        wakeWaiters();
        break;
      }
      default:  // HELLO again
        warnings_.warn("dropped the connection from {} (rank {}): a second handshake", c.peer, c.rank);
        c.dead = true;
    }
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
  WarnLimiter warnings_;
  // Touched only by the server thread:
  std::unordered_map<std::string, Bytes> values_;
  std::vector<std::unique_ptr<Conn>> conns_;
  Clock::time_point acceptPausedUntil_;
  // Shared with the communicators' threads:
  std::mutex mutex_;
  int users_ = 0;         // ServerLeases held
  bool stopped_ = false;  // the thread has stopped or is stopping: never reused
  bool started_ = false;
  bool exited_ = false;   // run() has closed everything and returned
  std::condition_variable exitedChanged_;
  std::atomic<bool> stopRequested_{false};
};

namespace {

// The servers of this process, by host and port. At exit every one is stopped and joined, even
// those a leaked communicator still leases, so no server thread outlives static destruction.
class Registry {
 public:
  ~Registry() {
    std::lock_guard<std::mutex> lock(mutex);
    for (auto& [key, server] : servers)
      if (server) server->stop();
  }
  std::mutex mutex;
  std::map<std::string, std::shared_ptr<Server>> servers;
};

Registry& registry() {
  static Registry instance;
  return instance;
}

}  // namespace

ServerLease::ServerLease(const std::string& host, int port, const std::string& token, const std::string& url) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  std::shared_ptr<Server>& slot = r.servers[host + "|" + std::to_string(port)];
  if (slot && slot->acquire(token)) {
    server_ = slot;
    return;
  }
  if (slot) slot->stop();  // stopped when idle, or another job's and unused: free the port first
  slot.reset();
  slot = std::make_shared<Server>(host, port, token, url);
  slot->start();
  server_ = slot;
}

ServerLease::~ServerLease() { server_->release(); }

}  // namespace shoal::detail::tcp
