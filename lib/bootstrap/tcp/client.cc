// tcp://host:port: the client side. Every rank, rank 0 included, is a client
// with one connection; rank 0 also leases the port's server (server.h). The
// protocol is in wire.h.
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <condition_variable>
#include <mutex>
#include <optional>
#include <thread>

#include "bootstrap/store.h"
#include "bootstrap/tcp/server.h"
#include "bootstrap/tcp/socket.h"
#include "bootstrap/tcp/wire.h"

namespace shoal::detail {
namespace {

using namespace tcp;

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
    if (rank_ == 0) server_ = std::make_unique<ServerLease>(host_, port_, token_, url_);
    connect(deadlineAfter(timeoutS_), true);
  }

  ~TcpStore() override { disconnect(); }  // then server_ lets go of the server (it stops once nobody uses it)

  void set(const std::string& key, const Bytes& value) override {
    Bytes frame = call(Writer().u8(kSet).str(key).bytes(value).frame(), fmt::format("set of key '{}'", key));
    Reply reply = decode(kSet, frame);
    if (reply.status != kOk) badReply();
  }

  Bytes get(const std::string& key, Deadline deadline) override {
    Clock::time_point start = Clock::now();
    for (;;) {
      Clock::time_point sliceEnd = std::min(deadline, Clock::now() + kWaitSlice);
      std::optional<Bytes> frame = exchange(Writer().u8(kGet).str(key).u32(sliceMs(sliceEnd)).frame(), sliceEnd);
      if (frame) {
        Reply reply = decode(kGet, *frame);
        if (reply.status == kOk) return std::move(reply.value);
        if (reply.status != kNotYet) badReply();
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
      std::optional<Bytes> frame = exchange(w.u32(sliceMs(sliceEnd)).frame(), sliceEnd);
      if (frame) {
        Reply reply = decode(kWait, *frame);
        if (reply.status == kOk) return;
        if (reply.status != kNotYet || reply.missing.size() > missing.size()) badReply();
        missing = std::move(reply.missing);
      }
      if (Clock::now() >= deadline) failTimeout(missing, url_, start);
    }
  }

  int64_t add(const std::string& key, int64_t delta) override {
    Bytes frame = call(Writer().u8(kAdd).str(key).u64(static_cast<uint64_t>(delta)).frame(),
                       fmt::format("add to key '{}'", key));
    Reply reply = decode(kAdd, frame);
    if (reply.status == kBadRequest) throw Error(SHOAL_ERR_INVALID_ARGUMENT, reply.text);
    if (reply.status != kOk) badReply();
    return reply.sum;
  }

 private:
  static uint32_t sliceMs(Clock::time_point sliceEnd) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(sliceEnd - Clock::now()).count();
    return static_cast<uint32_t>(std::max<int64_t>(left, 0));
  }

  Reply decode(Op op, const Bytes& frame) {
    std::optional<Reply> reply = decodeReply(op, frame.data(), frame.size());
    if (!reply) badReply();
    return std::move(*reply);
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

  // Connects and presents the token. The first time, a refused or dropped connection is retried
  // until the deadline: rank 0 may not listen yet, or its server may be replacing an idle one.
  void connect(Clock::time_point deadline, bool firstTime) {
    std::string lastError = "no address to try";
    for (auto pause = 10ms;; pause = std::min(pause * 2, std::chrono::milliseconds(250))) {
      fd_ = connectTo(host_, port_, deadline, lastError);
      if (fd_ >= 0) {
        try {
          if (handshake(deadline)) return;
        } catch (const Error& e) {
          if (!firstTime || e.status() != SHOAL_ERR_REMOTE || Clock::now() >= deadline) throw;
          lastError = e.what();
        }
      } else if (!firstTime) {
        fail(SHOAL_ERR_REMOTE, "lost the connection to the tcp store at {} and cannot reconnect ({}): rank 0, which "
             "serves it, may have exited", url_, lastError);
      }
      if (Clock::now() >= deadline)
        fail(SHOAL_ERR_TIMEOUT, "could not connect to the tcp store at {} within {} s (last error: {}): is rank 0 "
             "running, and does SHOAL_STORE name rank 0's host and a port it can listen on?", url_, timeoutS_,
             lastError);
      std::this_thread::sleep_until(std::min(Clock::now() + pause, deadline));  // one last try at the deadline
    }
  }

  // True once the server accepted the token; throws with text when it refused it.
  bool handshake(Clock::time_point deadline) {
    Writer hello;
    hello.u8(kHello).u32(kMagic).u8(kVersion).u32(static_cast<uint32_t>(rank_)).str(token_);
    Bytes frame;
    if (!sendAll(hello.frame(), deadline) || !receive(frame, deadline)) {
      disconnect();
      fail(SHOAL_ERR_TIMEOUT, "the tcp store at {} accepted a connection but did not answer the handshake in time: "
           "is SHOAL_STORE pointing at rank 0's shoal store and not another service?", url_);
    }
    Reply reply = decode(kHello, frame);
    if (reply.status == kOk) return true;
    disconnect();
    if (reply.status == kRefused)
      fail(SHOAL_ERR_INVALID_ARGUMENT, "tcp store at {} refused the job token; all ranks must use the same "
           "SHOAL_TOKEN (shoalrun sets it)", url_);
    if (reply.status == kBadRequest)
      fail(SHOAL_ERR_INVALID_ARGUMENT, "tcp store at {} refused this rank: {}", url_, reply.text);
    badReply();
  }

  // False when the deadline passed first; a broken connection throws.
  bool sendAll(const Bytes& data, Clock::time_point deadline) {
    IoResult result = writeFull(fd_, data.data(), data.size(), deadline);
    if (result == IoResult::kError) lost(errnoText());
    return result == IoResult::kDone;
  }

  bool receiveExact(uint8_t* data, size_t size, Clock::time_point deadline) {
    IoResult result = readFull(fd_, data, size, deadline);
    if (result == IoResult::kClosed) lost("the server closed the connection");
    if (result == IoResult::kError) lost(errnoText());
    return result == IoResult::kDone;
  }

  bool receive(Bytes& body, Clock::time_point deadline) {
    uint8_t header[4];
    if (!receiveExact(header, 4, deadline)) return false;
    uint32_t len = 0;
    if (scanFrame(header, 4, kMaxMessage, len) == FrameScan::kTooLarge) badReply();
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
  std::unique_ptr<ServerLease> server_;  // rank 0 only; declared first among the stateful members so it dies last
  FairMutex mutex_;                 // one request at a time on the connection
  int fd_ = -1;
};

}  // namespace

std::unique_ptr<Store> makeTcpStore(const std::string& host, int port, const StoreOptions& options) {
  return std::make_unique<TcpStore>(host, port, options);
}

}  // namespace shoal::detail
