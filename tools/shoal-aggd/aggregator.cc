#include "aggregator.h"

#include <arpa/inet.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstring>
#include <thread>

#include "collectives/common/reducer.h"
#include "core/log.h"

namespace shoal::aggregate {
namespace {

constexpr auto kHelloDeadline = std::chrono::seconds(10);  // a connection that never says hello is dropped
constexpr auto kReapEvery = std::chrono::milliseconds(100);

std::string dtypeText(uint8_t dtype) {
  const char* name = shoal_dtype_name(static_cast<shoal_dtype_t>(dtype));
  return name ? name : fmt::format("dtype {}", dtype);
}

std::string opText(uint8_t op) {
  const char* name = shoal_op_name(static_cast<shoal_op_t>(op));
  return name ? name : fmt::format("op {}", op);
}

// Reads the little-endian fields of a hello body; ok() turns false past the end.
struct HelloReader {
  const uint8_t* p;
  size_t n;
  bool ok = true;
  uint64_t le(int k) {
    if (!ok || n < static_cast<size_t>(k)) return ok = false, 0;
    uint64_t v = getLE(p, k);
    p += k;
    n -= k;
    return v;
  }
  std::string str() {
    uint32_t length = static_cast<uint32_t>(le(4));
    if (!ok || n < length) return ok = false, std::string();
    std::string s(reinterpret_cast<const char*>(p), length);
    p += length;
    n -= length;
    return s;
  }
};

}  // namespace

Aggregator::Aggregator(AggregatorOptions options) : options_(std::move(options)) {
  if (options_.token.empty())
    fail(SHOAL_ERR_INVALID_ARGUMENT, "shoal-aggd: no token: export SHOAL_TOKEN, the same secret the job's ranks use");
  if (options_.slotBytes < 64 || options_.slotBytes > kMaxSlotBytes || options_.slotBytes % 8 != 0)
    fail(SHOAL_ERR_INVALID_ARGUMENT, "shoal-aggd: --slot-bytes {} must be a multiple of 8 in 64..{}",
         options_.slotBytes, kMaxSlotBytes);
  if (options_.poolSlots < 1) fail(SHOAL_ERR_INVALID_ARGUMENT, "shoal-aggd: --pool-slots must be at least 1");
  if (!(options_.timeoutS > 0)) fail(SHOAL_ERR_INVALID_ARGUMENT, "shoal-aggd: the timeout must be positive");
  listenFd_ = listenTcp(options_.listen, &port_);
}

Aggregator::~Aggregator() {
  if (listenFd_ >= 0) close(listenFd_);
}

void Aggregator::serve() {
  std::thread([this] {
    for (;;) {
      std::this_thread::sleep_for(kReapEvery);
      reapExpired();
    }
  }).detach();
  for (;;) {
    sockaddr_storage address{};
    socklen_t length = sizeof address;
    int fd = accept4(listenFd_, reinterpret_cast<sockaddr*>(&address), &length, SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (fd < 0) {
      if (errno != EINTR && errno != ECONNABORTED)
        SHOAL_LOG_WARN("shoal-aggd: accept failed: {}", errnoText(errno));
      if (errno == EMFILE || errno == ENFILE) std::this_thread::sleep_for(std::chrono::milliseconds(100));
      continue;
    }
    setNoDelay(fd);
    auto connection = std::make_shared<Connection>();
    connection->fd = fd;
    connection->self = connection;
    char host[64] = "?";
    if (address.ss_family == AF_INET)
      inet_ntop(AF_INET, &reinterpret_cast<sockaddr_in*>(&address)->sin_addr, host, sizeof host);
    else if (address.ss_family == AF_INET6)
      inet_ntop(AF_INET6, &reinterpret_cast<sockaddr_in6*>(&address)->sin6_addr, host, sizeof host);
    connection->peer = host;
    std::thread([this, connection] { serveConnection(connection); }).detach();
  }
}

bool Aggregator::handshake(Connection& connection) {
  Deadline deadline = Clock::now() + kHelloDeadline;
  uint8_t lengthBytes[4];
  if (readFull(connection.fd, lengthBytes, 4, deadline) != IoResult::kDone) return false;
  uint32_t length = static_cast<uint32_t>(getLE(lengthBytes, 4));
  if (length > kMaxHello) {
    SHOAL_LOG_WARN("shoal-aggd: {} sent a {}-byte hello; not a shoal rank, dropped", connection.peer, length);
    return false;
  }
  std::vector<uint8_t> body(length);
  if (readFull(connection.fd, body.data(), length, deadline) != IoResult::kDone) return false;
  HelloReader r{body.data(), body.size()};
  uint32_t magic = static_cast<uint32_t>(r.le(4));
  uint8_t version = static_cast<uint8_t>(r.le(1));
  std::string token = r.str();
  std::string key = r.str();
  int rank = static_cast<int>(r.le(4));
  int worldSize = static_cast<int>(r.le(4));

  auto reply = [&](HelloStatus status, const std::string& text) {
    std::vector<uint8_t> out(4 + 1 + 4 + 4 + text.size());
    putLE(out.data(), out.size() - 4, 4);
    out[4] = status;
    putLE(out.data() + 5, options_.slotBytes, 4);
    putLE(out.data() + 9, text.size(), 4);
    std::memcpy(out.data() + 13, text.data(), text.size());
    writeFull(connection.fd, out.data(), out.size(), Clock::now() + kHelloDeadline);
    return status == kAccepted;
  };
  if (!r.ok || magic != kMagic) {
    SHOAL_LOG_WARN("shoal-aggd: {} is not a shoal rank (bad hello); dropped", connection.peer);
    return false;
  }
  if (version != kVersion)
    return reply(kRefused, fmt::format("shoal-aggd speaks wire version {}, this rank {}: use the same shoal release",
                                       kVersion, version));
  if (!sameToken(token, options_.token)) {
    // Never log the expected token: the log may be readable by the process that guessed wrong.
    SHOAL_LOG_WARN("shoal-aggd: refused {} (claiming rank {}): wrong job token", connection.peer, rank);
    return reply(kRefused, "wrong job token: the ranks' SHOAL_TOKEN must equal the one shoal-aggd was started with");
  }
  if (worldSize < 1 || worldSize > (1 << 20) || rank < 0 || rank >= worldSize || key.empty())
    return reply(kRefused, fmt::format("rank {} of world size {} (communicator '{}') is not a valid member", rank,
                                       worldSize, key));
  std::string refusal;
  HelloStatus refusalStatus = kRefused;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    std::shared_ptr<Group>& group = groups_[key];
    if (!group) {
      group = std::make_shared<Group>();
      group->key = key;
      group->worldSize = worldSize;
      group->members.resize(worldSize);
    }
    if (group->worldSize != worldSize)
      refusal = fmt::format("rank {} says the communicator has {} ranks, an earlier rank said {}", rank, worldSize,
                            group->worldSize);
    else if (!group->broken.empty()) {
      refusal = "this communicator already failed here: " + group->broken;
      if (group->brokenKind == kDisagreement) refusalStatus = kRefusedDisagreement;
    } else if (group->members[rank])
      refusal = fmt::format("rank {} of this communicator is already connected (from {})", rank,
                            group->members[rank]->peer);
    if (refusal.empty()) {
      connection.group = group;
      connection.rank = rank;
      group->members[rank] = connection.self.lock();
    }
  }
  return reply(refusal.empty() ? kAccepted : refusalStatus, refusal);
}

void Aggregator::serveConnection(std::shared_ptr<Connection> connection) {
  bool joined = handshake(*connection);
  if (joined) {
    std::vector<uint8_t> body(options_.slotBytes);
    uint8_t headerBytes[kHeaderBytes];
    for (;;) {
      // Idle between calls is fine; a message, once begun, arrives within the timeout.
      if (readFull(connection->fd, headerBytes, 1, Deadline::max()) != IoResult::kDone) break;
      Deadline deadline = deadlineAfter(options_.timeoutS);
      if (readFull(connection->fd, headerBytes + 1, kHeaderBytes - 1, deadline) != IoResult::kDone) break;
      Header header = decode(headerBytes);
      size_t element = dtypeSize(static_cast<shoal_dtype_t>(header.dtype));
      std::string bad;
      if (header.type != kSlot) bad = fmt::format("message type {} (ranks send only slots)", header.type);
      else if (!aggregatable(static_cast<shoal_dtype_t>(header.dtype), static_cast<shoal_op_t>(header.op)))
        bad = fmt::format("{} of {} (the aggregator adds sums and bitwise ors of integers, sums of floats)",
                          opText(header.op), dtypeText(header.dtype));
      else if (header.bytes == 0 || header.bytes > options_.slotBytes || header.bytes % element != 0)
        bad = fmt::format("a {}-byte slot (1..{} bytes, whole {} elements)", header.bytes, options_.slotBytes,
                          dtypeText(header.dtype));
      else if (header.slot >= header.slots) bad = fmt::format("slot {} of {}", header.slot, header.slots);
      if (!bad.empty()) {
        std::vector<std::shared_ptr<Connection>> tell;
        std::string why = fmt::format("rank {} sent a malformed message: {}", connection->rank, bad);
        {
          std::lock_guard<std::mutex> lock(mutex_);
          tell = breakGroupLocked(*connection->group, why);
        }
        for (auto& member : tell) sendError(*member, header.sequence, header.slot, why);
        break;
      }
      if (readFull(connection->fd, body.data(), header.bytes, deadline) != IoResult::kDone) break;
      contribute(connection, header, body.data());
    }
    leave(connection);
  }
  shutdown(connection->fd, SHUT_RDWR);  // the last shared_ptr closes it
}

Aggregator::Connection::~Connection() {
  if (fd >= 0) close(fd);
}

uint8_t* Aggregator::takeBufferLocked() {
  if (!freeBuffers_.empty()) {
    uint8_t* buffer = freeBuffers_.back();
    freeBuffers_.pop_back();
    return buffer;
  }
  if (buffers_.size() >= options_.poolSlots) return nullptr;
  buffers_.emplace_back(new uint8_t[options_.slotBytes]);
  return buffers_.back().get();
}

void Aggregator::returnBufferLocked(uint8_t* buffer) {
  freeBuffers_.push_back(buffer);
  bufferFreed_.notify_all();
}

void Aggregator::contribute(const std::shared_ptr<Connection>& connection, const Header& header,
                            const uint8_t* body) {
  std::shared_ptr<Group> group = connection->group;
  const int rank = connection->rank;
  std::unique_lock<std::mutex> lock(mutex_);
  auto refuse = [&](const std::string& why, bool breakGroup, ErrorKind kind = kFailure) {
    std::vector<std::shared_ptr<Connection>> tell = {connection};
    if (breakGroup) tell = breakGroupLocked(*group, why, kind);
    lock.unlock();
    for (auto& member : tell) sendError(*member, header.sequence, header.slot, why, kind);
  };
  if (!group->broken.empty()) return refuse(group->broken, false, group->brokenKind);
  SlotKey key{group.get(), header.sequence, header.slot};
  Deadline poolDeadline = deadlineAfter(options_.timeoutS);
  auto found = slots_.find(key);
  bool created = false;
  while (found == slots_.end()) {
    // The first arrival takes a buffer from the bounded pool; when none is
    // free it waits (other ranks' arrivals need none, so pending slots keep
    // completing and returning theirs).
    if (uint8_t* buffer = takeBufferLocked()) {
      auto slot = std::make_unique<Slot>();
      slot->group = group;
      slot->sequence = header.sequence;
      slot->index = header.slot;
      slot->header = header;
      slot->sum = buffer;
      slot->arrived.assign(group->worldSize, false);
      slot->started = Clock::now();
      std::memcpy(buffer, body, header.bytes);
      slot->arrived[rank] = true;
      slot->firstRank = rank;
      slot->arrivals = 1;
      found = slots_.emplace(key, std::move(slot)).first;
      created = true;
      break;
    }
    if (bufferFreed_.wait_until(lock, poolDeadline) == std::cv_status::timeout)
      return refuse(fmt::format("the aggregator's pool of {} slots stayed full for {} s (too many jobs at once?): "
                                "start shoal-aggd with a larger --pool-slots",
                                options_.poolSlots, options_.timeoutS),
                    true);
    if (!group->broken.empty()) return refuse(group->broken, false, group->brokenKind);
    found = slots_.find(key);
  }
  Slot& slot = *found->second;
  if (!created && slot.arrived[rank])
    return refuse(fmt::format("rank {} sent call {} slot {} twice", rank, header.sequence, header.slot), true);
  if (!created) {
    const Header& first = slot.header;
    if (first.dtype != header.dtype || first.op != header.op || first.bytes != header.bytes ||
        first.slots != header.slots)
      return refuse(fmt::format("ranks disagree on call {} slot {}: rank {} sent {} {} bytes of {} ({} slots), rank {} "
                                "{} {} bytes of {} ({} slots); every rank must pass the same count, dtype and op",
                                header.sequence, header.slot, slot.firstRank, opText(first.op), first.bytes,
                                dtypeText(first.dtype), first.slots, rank, opText(header.op), header.bytes,
                                dtypeText(header.dtype), header.slots),
                    true, kDisagreement);
    // The payloads look alike but the calls differ (a dtype of the same size,
    // avg against sum, another compressor): the digests of the ranks' call
    // signatures tell.
    if (first.signature != header.signature)
      return refuse(fmt::format("ranks disagree on call {}: rank {} and rank {} make different calls (another dtype, "
                                "op, count, algorithm or compressor: the digests of their call signatures are {:016x} "
                                "and {:016x}); every rank must make the same calls in the same order with the same "
                                "arguments",
                                header.sequence, slot.firstRank, rank, first.signature, header.signature),
                    true, kDisagreement);
    Reducer(static_cast<shoal_dtype_t>(header.dtype), static_cast<shoal_op_t>(header.op))
        .combine(slot.sum, body, header.bytes / dtypeSize(static_cast<shoal_dtype_t>(header.dtype)));
    slot.arrived[rank] = true;
    ++slot.arrivals;
  }
  if (slot.arrivals < group->worldSize) return;
  // Complete: take it out, send it to every rank outside the lock, free it.
  std::unique_ptr<Slot> done = std::move(found->second);
  slots_.erase(found);
  std::vector<std::shared_ptr<Connection>> members = group->members;
  lock.unlock();
  Header result = done->header;
  result.type = kResult;
  for (auto& member : members)
    if (member) sendMessage(*member, result, done->sum);
  lock.lock();
  returnBufferLocked(done->sum);
}

std::vector<std::shared_ptr<Aggregator::Connection>> Aggregator::breakGroupLocked(Group& group, const std::string& why,
                                                                                  ErrorKind kind) {
  if (group.broken.empty()) {
    group.broken = why;
    group.brokenKind = kind;
  }
  for (auto it = slots_.begin(); it != slots_.end();) {
    if (it->second->group.get() == &group) {
      returnBufferLocked(it->second->sum);
      it = slots_.erase(it);
    } else {
      ++it;
    }
  }
  std::vector<std::shared_ptr<Connection>> members;
  for (auto& member : group.members)
    if (member) members.push_back(member);
  return members;
}

void Aggregator::leave(const std::shared_ptr<Connection>& connection) {
  std::shared_ptr<Group> group = connection->group;
  std::vector<std::shared_ptr<Connection>> tell;
  std::string why = fmt::format("rank {} left the aggregator (its process ended or closed the communicator)",
                                connection->rank);
  {
    std::lock_guard<std::mutex> lock(mutex_);
    group->members[connection->rank].reset();
    bool pending = false;
    for (auto& [key, slot] : slots_) pending = pending || slot->group == group;
    // A rank that leaves with slots pending died in a call: the others hear it now.
    if (pending) tell = breakGroupLocked(*group, why);
    else if (group->broken.empty()) group->broken = why;  // a later slot of this communicator cannot complete
    bool empty = true;
    for (auto& member : group->members) empty = empty && !member;
    if (empty) {
      auto found = groups_.find(group->key);
      if (found != groups_.end() && found->second == group) groups_.erase(found);
    }
  }
  for (auto& member : tell) sendError(*member, 0, 0, why);
}

void Aggregator::reapExpired() {
  std::vector<std::pair<std::vector<std::shared_ptr<Connection>>, std::string>> tell;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    Clock::time_point limit = Clock::now() - std::chrono::duration_cast<Clock::duration>(
                                                 std::chrono::duration<double>(options_.timeoutS));
    for (bool again = true; again;) {
      again = false;
      for (auto& [key, slot] : slots_) {
        if (slot->started > limit) continue;
        std::string missing;
        for (int r = 0; r < slot->group->worldSize; ++r)
          if (!slot->arrived[r]) missing += (missing.empty() ? "" : ", ") + std::to_string(r);
        std::string why = fmt::format("call {} slot {}: rank(s) {} sent nothing within {} s (SHOAL_TIMEOUT_S of "
                                      "shoal-aggd); the slot was freed",
                                      slot->sequence, slot->index, missing, options_.timeoutS);
        std::shared_ptr<Group> group = slot->group;
        tell.emplace_back(breakGroupLocked(*group, why), why);
        again = true;  // breakGroupLocked erased entries: start over
        break;
      }
    }
  }
  for (auto& [members, why] : tell)
    for (auto& member : members) sendError(*member, 0, 0, why);
}

void Aggregator::sendError(Connection& connection, uint64_t sequence, uint32_t slot, const std::string& text,
                           ErrorKind kind) {
  Header header;
  header.type = kError;
  header.errorKind = kind;
  header.sequence = sequence;
  header.slot = slot;
  std::string body = text.substr(0, kMaxErrorText);
  header.bytes = static_cast<uint32_t>(body.size());
  sendMessage(connection, header, body.data());
}

void Aggregator::sendMessage(Connection& connection, const Header& header, const void* body) {
  uint8_t bytes[kHeaderBytes];
  encode(header, bytes);
  std::lock_guard<std::mutex> lock(connection.writeMutex);
  Deadline deadline = deadlineAfter(options_.timeoutS);
  if (writeFull(connection.fd, bytes, kHeaderBytes, deadline) != IoResult::kDone ||
      writeFull(connection.fd, body, header.bytes, deadline) != IoResult::kDone)
    shutdown(connection.fd, SHUT_RDWR);  // its reader sees the end and the group hears that the rank left
}

}  // namespace shoal::aggregate
