#include "aggregate/client.h"

#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstring>
#include <mutex>
#include <random>
#include <set>

#include "aggregate/wire.h"
#include "collectives/common/reducer.h"
#include "core/config.h"
#include "core/log.h"

namespace shoal::aggregate {
namespace {

constexpr uint32_t kWindowSlots = 16;  // slots a rank has sent to one aggregator and not yet had back
constexpr int kPollSliceMs = 50;       // how often a waiting rank looks for aborts from its peers

// One aggregator's share of one call: elements [begin, begin + count) cut into slots.
struct Shard {
  size_t link = 0;
  const uint8_t* send = nullptr;
  uint8_t* recv = nullptr;
  size_t bytes = 0;
  size_t slotBytes = 0;
  uint32_t slots = 0;
  // Sending: slot `nextSend`, `sendPos` bytes of header + body written so far.
  uint32_t nextSend = 0;
  size_t sendPos = 0;
  uint8_t sendHeader[kHeaderBytes];
  // Receiving: a header, then its body straight into recv (or into errorText).
  uint32_t received = 0;
  std::vector<bool> got;
  uint8_t recvHeader[kHeaderBytes];
  size_t headerHave = 0;
  bool inBody = false;
  Header current;
  size_t bodyHave = 0;
  std::string errorText;

  size_t slotLength(uint32_t slot) const { return std::min(slotBytes, bytes - size_t{slot} * slotBytes); }
  bool done() const { return received == slots; }
  bool canSend() const { return nextSend < slots && (sendPos > 0 || nextSend - received < kWindowSlots); }
};


}  // namespace

std::string randomNonce() {
  std::random_device device;
  std::string text;
  for (int i = 0; i < 4; ++i) text += fmt::format("{:08x}", device());
  return text;
}

Client::Client(const std::vector<Endpoint>& endpoints, const std::string& token, const std::string& key, int rank,
               int worldSize, Deadline deadline) {
  if (token.empty())
    fail(SHOAL_ERR_INVALID_ARGUMENT, "SHOAL_ALGO=aggregate: no job token: export SHOAL_TOKEN (the one shoal-aggd "
         "was started with) to every rank");
  for (const Endpoint& endpoint : endpoints) {
    Link link;
    link.where = endpoint;
    link.fd = connectTcp(endpoint, deadline);
    links_.push_back(link);  // closed by the destructor from here on
    std::vector<uint8_t> hello(4);
    auto le = [&](uint64_t v, int n) {
      for (int i = 0; i < n; ++i) hello.push_back(static_cast<uint8_t>(v >> (8 * i)));
    };
    auto str = [&](const std::string& s) {
      le(s.size(), 4);
      hello.insert(hello.end(), s.begin(), s.end());
    };
    le(kMagic, 4);
    le(kVersion, 1);
    str(token);
    str(key);
    le(static_cast<uint32_t>(rank), 4);
    le(static_cast<uint32_t>(worldSize), 4);
    putLE(hello.data(), hello.size() - 4, 4);
    if (writeFull(link.fd, hello.data(), hello.size(), deadline) != IoResult::kDone)
      fail(SHOAL_ERR_REMOTE, "aggregator {} dropped the connection during the hello: is it shoal-aggd?", endpoint.url);
    uint8_t head[13];
    IoResult got = readFull(link.fd, head, sizeof head, deadline);
    if (got == IoResult::kTimedOut)
      fail(SHOAL_ERR_TIMEOUT, "aggregator {} did not answer the hello before the deadline (SHOAL_TIMEOUT_S)",
           endpoint.url);
    if (got != IoResult::kDone)
      fail(SHOAL_ERR_REMOTE, "aggregator {} closed the connection during the hello: is it shoal-aggd of this "
           "release?", endpoint.url);
    uint32_t textLength = static_cast<uint32_t>(getLE(head + 9, 4));
    std::string text(std::min(textLength, kMaxErrorText), '\0');
    if (textLength > kMaxErrorText || readFull(link.fd, text.data(), text.size(), deadline) != IoResult::kDone)
      fail(SHOAL_ERR_REMOTE, "aggregator {} sent a malformed hello reply", endpoint.url);
    if (head[4] != kAccepted)
      fail(head[4] == kRefusedDisagreement ? SHOAL_ERR_MISMATCH : SHOAL_ERR_REMOTE, "aggregator {} refused rank {}: {}",
           endpoint.url, rank, text);
    links_.back().slotBytes = static_cast<uint32_t>(getLE(head + 5, 4));
    if (links_.back().slotBytes < 8 || links_.back().slotBytes > kMaxSlotBytes)
      fail(SHOAL_ERR_REMOTE, "aggregator {} announced a slot of {} bytes; not a shoal-aggd of this release",
           endpoint.url, links_.back().slotBytes);
    setNonBlocking(link.fd);
  }
}

Client::~Client() {
  for (Link& link : links_)
    if (link.fd >= 0) close(link.fd);
}

void ClientRelease::operator()(Client* client) const { delete client; }

void Client::allreduce(uint64_t sequence, uint64_t signature, const void* send, void* recv, size_t count,
                       shoal_dtype_t dtype, shoal_op_t op, Deadline deadline, const std::function<void()>& checkPeers) {
  for (const Link& link : links_)
    if (!link.broken.empty())
      fail(SHOAL_ERR_REMOTE, "aggregator {} failed in an earlier call ({}); create a new communicator",
           link.where.url, link.broken);
  const size_t element = dtypeSize(dtype);
  std::vector<Shard> shards;
  for (size_t a = 0; a < links_.size(); ++a) {
    size_t begin = count * a / links_.size(), end = count * (a + 1) / links_.size();
    if (begin == end) continue;
    Shard shard;
    shard.link = a;
    shard.send = static_cast<const uint8_t*>(send) + begin * element;
    shard.recv = static_cast<uint8_t*>(recv) + begin * element;
    shard.bytes = (end - begin) * element;
    shard.slotBytes = links_[a].slotBytes / element * element;
    size_t slots = (shard.bytes + shard.slotBytes - 1) / shard.slotBytes;
    if (slots > UINT32_MAX) fail(SHOAL_ERR_INVALID_ARGUMENT, "allreduce of {} bytes is too large for the aggregator",
                                 shard.bytes);
    shard.slots = static_cast<uint32_t>(slots);
    shard.got.assign(shard.slots, false);
    shards.push_back(std::move(shard));
  }

  auto broken = [&](Shard& shard, shoal_status_t status, const std::string& why) {
    Link& link = links_[shard.link];
    link.broken = why;
    fail(status, "aggregator {}: {}", link.where.url, why);
  };
  auto sendSome = [&](Shard& shard) {
    int fd = links_[shard.link].fd;
    while (shard.canSend()) {
      size_t length = shard.slotLength(shard.nextSend);
      if (shard.sendPos == 0) {
        Header header;
        header.type = kSlot;
        header.dtype = static_cast<uint8_t>(dtype);
        header.op = static_cast<uint8_t>(op);
        header.slot = shard.nextSend;
        header.sequence = sequence;
        header.bytes = static_cast<uint32_t>(length);
        header.slots = shard.slots;
        header.signature = signature;
        encode(header, shard.sendHeader);
      }
      const uint8_t* body = shard.send + size_t{shard.nextSend} * shard.slotBytes;
      ssize_t n;
      if (shard.sendPos < kHeaderBytes) {
        iovec parts[2] = {{shard.sendHeader + shard.sendPos, kHeaderBytes - shard.sendPos},
                          {const_cast<uint8_t*>(body), length}};
        msghdr message{};
        message.msg_iov = parts;
        message.msg_iovlen = 2;
        n = sendmsg(fd, &message, MSG_NOSIGNAL);
      } else {
        n = ::send(fd, body + (shard.sendPos - kHeaderBytes), length - (shard.sendPos - kHeaderBytes), MSG_NOSIGNAL);
      }
      if (n < 0) {
        if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) return;
        broken(shard, SHOAL_ERR_REMOTE, fmt::format("lost the connection while sending: {}", errnoText(errno)));
      }
      shard.sendPos += static_cast<size_t>(n);
      if (shard.sendPos == kHeaderBytes + length) {
        shard.sendPos = 0;
        ++shard.nextSend;
      }
    }
  };
  auto receiveSome = [&](Shard& shard) {
    int fd = links_[shard.link].fd;
    for (;;) {
      uint8_t* into;
      size_t want;
      if (!shard.inBody) {
        into = shard.recvHeader + shard.headerHave;
        want = kHeaderBytes - shard.headerHave;
      } else if (shard.current.type == kError) {
        into = reinterpret_cast<uint8_t*>(shard.errorText.data()) + shard.bodyHave;
        want = shard.current.bytes - shard.bodyHave;
      } else {
        into = shard.recv + size_t{shard.current.slot} * shard.slotBytes + shard.bodyHave;
        want = shard.current.bytes - shard.bodyHave;
      }
      ssize_t n = want == 0 ? 0 : ::recv(fd, into, want, 0);
      if (want != 0 && n == 0)
        broken(shard, SHOAL_ERR_REMOTE, "closed the connection in the middle of a call (it stopped or was killed)");
      if (n < 0) {
        if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) return;
        broken(shard, SHOAL_ERR_REMOTE, fmt::format("lost the connection: {}", errnoText(errno)));
      }
      if (!shard.inBody) {
        shard.headerHave += static_cast<size_t>(n);
        if (shard.headerHave < kHeaderBytes) continue;
        Header header = decode(shard.recvHeader);
        if (header.type == kError) {
          if (header.bytes > kMaxErrorText) broken(shard, SHOAL_ERR_REMOTE, "sent a malformed error message");
          shard.errorText.assign(header.bytes, '\0');
        } else if (header.type != kResult || header.sequence != sequence || header.slot >= shard.slots ||
                   header.slot >= shard.nextSend || shard.got[header.slot] ||
                   header.bytes != shard.slotLength(header.slot)) {
          broken(shard, SHOAL_ERR_INTERNAL,
                 fmt::format("sent a result this rank did not expect (type {}, call {} slot {}, {} bytes; this call "
                             "is {} with {} slots): a bug in shoal-aggd or the client",
                             header.type, header.sequence, header.slot, header.bytes, sequence, shard.slots));
        }
        shard.current = header;
        shard.inBody = true;
        shard.bodyHave = 0;
      } else {
        shard.bodyHave += static_cast<size_t>(n);
      }
      if (shard.inBody && shard.bodyHave == shard.current.bytes) {
        if (shard.current.type == kError)
          broken(shard, shard.current.errorKind == kDisagreement ? SHOAL_ERR_MISMATCH : SHOAL_ERR_REMOTE,
                 shard.errorText);
        shard.got[shard.current.slot] = true;
        ++shard.received;
        shard.inBody = false;
        shard.headerHave = 0;
        if (shard.done()) return;
      }
    }
  };

  std::vector<pollfd> polls;
  std::vector<Shard*> polled;
  for (;;) {
    polls.clear();
    polled.clear();
    for (Shard& shard : shards) {
      if (shard.done()) continue;
      polls.push_back({links_[shard.link].fd, static_cast<short>(POLLIN | (shard.canSend() ? POLLOUT : 0)), 0});
      polled.push_back(&shard);
    }
    if (polls.empty()) break;
    int rc = poll(polls.data(), polls.size(), std::min(kPollSliceMs, pollMsUntil(deadline)));
    if (rc < 0 && errno != EINTR) fail(SHOAL_ERR_SYSTEM, "poll on the aggregator connections: {}", errnoText(errno));
    for (size_t i = 0; rc > 0 && i < polls.size(); ++i) {
      if (polls[i].revents & (POLLIN | POLLHUP | POLLERR)) receiveSome(*polled[i]);
      if (!polled[i]->done() && (polls[i].revents & POLLOUT)) sendSome(*polled[i]);
    }
    checkPeers();
    if (Clock::now() >= deadline) {
      for (Shard& shard : shards)
        if (!shard.done())
          broken(shard, SHOAL_ERR_TIMEOUT,
                 fmt::format("returned {} of the {} slots of call {} before the deadline (SHOAL_TIMEOUT_S): another "
                             "rank did not send its part, or the aggregator is stuck",
                             shard.received, shard.slots, sequence));
    }
  }
}

bool carries(shoal_dtype_t dtype, shoal_op_t op) {
  shoal_op_t wireOp = op == SHOAL_AVG ? SHOAL_SUM : op;
  if (aggregatable(dtype, wireOp)) return true;
  static std::mutex mutex;
  static std::set<std::pair<int, int>> told;
  std::lock_guard<std::mutex> lock(mutex);
  if (told.insert({dtype, op}).second)
    SHOAL_LOG_INFO("SHOAL_ALGO=aggregate: {} of {} is not something the aggregator adds (it adds sums and averages, "
                   "and bitwise ors of integers); these allreduces take the ring",
                   shoal_op_name(op), shoal_dtype_name(dtype));
  return false;
}

void noteGathersTakeTheRing() {
  static std::once_flag told;
  std::call_once(told, [] {
    SHOAL_LOG_INFO("SHOAL_ALGO=aggregate: compressor rounds that gather (allgatherv, e.g. topk's) are not sums the "
                   "aggregator adds; they take the ring");
  });
}

}  // namespace shoal::aggregate
