#include "transport/shm/segment.h"
#include "transport/host.h"

#include <fcntl.h>
#include <sched.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <map>
#include <mutex>
#include <sstream>
#include <thread>

namespace shoal {
namespace {

constexpr uint64_t kMagic = 0x73686f616c73686dull;  // "shoalshm"
constexpr size_t kLine = 64;
constexpr size_t kAbortTextBytes = 256;
constexpr auto kLivenessPeriod = std::chrono::milliseconds(20);
// A wait yields its core for kYieldPhase, then sleeps in slices of 1/20 of
// the time it has waited (100 us to 1 ms: at most 5 % late): a peer that late
// is a straggler, not a message on its way (the UCX transport's waits sleep
// too). Measured: a rank waiting 1 s for a late peer on this host spent
// 324-380 ms of CPU yielding, 15-19 ms in the UCX wait.
constexpr auto kYieldPhase = std::chrono::milliseconds(5);
constexpr Clock::duration kSleepMin = std::chrono::microseconds(100), kSleepMax = std::chrono::milliseconds(1);

size_t roundUp(size_t value, size_t unit) { return (value + unit - 1) / unit * unit; }

// The segment's fixed part, at offset 0. Written by rank 0 before any peer maps it.
struct Control {
  uint64_t magic;
  uint64_t worldSize;
  uint64_t slotBytes;
  alignas(kLine) uint64_t abortWord;  // 0, or (status << 32) | (rank + 1) of the first rank that gave up
};

// A slot's header, in the first half of its first cache line; the data
// follows it directly (SharedSegment::kHeaderBytes). A piece of up to
// kInlineBytes (32) therefore shares the line with its round number and tag:
// a reader that sees the number has the data too, one line moved between
// cores instead of a flag line and then a data line (the layout of NCCL's LL
// protocol and Open MPI vader's fast boxes: data next to its flag).
struct SlotHeader {
  uint32_t number;  // the round (mod 2^32) whose data the slot holds: release-stored last
  uint32_t bytes;   // of this round's piece (a slot holds at most 2^26: SHOAL_SHM_MAX_BYTES)
  uint64_t tag;     // the call's transport tag: its signature word and sequence number
  uint64_t count;   // elements of the whole call
  uint64_t offset;  // first element of this round's piece
};
static_assert(sizeof(SlotHeader) == SharedSegment::kHeaderBytes);
static_assert(SharedSegment::kHeaderBytes + SharedSegment::kInlineBytes == kLine);

size_t abortTextOffset() { return roundUp(sizeof(Control), kLine); }
size_t slotsOffset(int size) { return roundUp(abortTextOffset() + size_t(size) * kAbortTextBytes, 4096); }
// Slots start on a cache line: the header, then the data, to the next line.
size_t slotStrideFor(size_t slotBytes) { return roundUp(SharedSegment::kHeaderBytes + slotBytes, kLine); }
size_t segmentBytes(int size, size_t slotBytes) {
  return roundUp(slotsOffset(size) + size_t(size) * 2 * slotStrideFor(slotBytes), 4096);
}

std::atomic_ref<uint64_t> atomicAt(uint64_t& word) { return std::atomic_ref<uint64_t>(word); }
std::atomic_ref<uint32_t> atomicAt(uint32_t& word) { return std::atomic_ref<uint32_t>(word); }

// memcpy of a piece that fits the header's line, inline: a head and a tail
// word that may overlap, instead of a library call (for a small call's few
// bytes the call cost more than the copy).
inline void copyInline(uint8_t* to, const uint8_t* from, size_t n) {
  if (n >= 16) {
    std::memcpy(to, from, 16);
    std::memcpy(to + n - 16, from + n - 16, 16);
  } else if (n >= 8) {
    std::memcpy(to, from, 8);
    std::memcpy(to + n - 8, from + n - 8, 8);
  } else if (n >= 4) {
    std::memcpy(to, from, 4);
    std::memcpy(to + n - 4, from + n - 4, 4);
  } else if (n > 0) {
    to[0] = from[0];
    to[n / 2] = from[n / 2];
    to[n - 1] = from[n - 1];
  }
}

inline void cpuRelax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}


std::string text(const Bytes& bytes) { return std::string(bytes.begin(), bytes.end()); }
Bytes bytesOf(const std::string& value) { return Bytes(value.begin(), value.end()); }

}  // namespace

// One mapping per segment and process: ranks that are threads of one process
// (the tests' launcher) share the addresses, so that their flags are one
// memory location to the compiler and to ThreadSanitizer.
struct SharedSegment::Mapping {
  uint8_t* base = nullptr;
  size_t bytes = 0;
  std::pair<dev_t, ino_t> id{};
  ~Mapping() {
    if (base != nullptr) munmap(base, bytes);
  }
};

namespace {

std::mutex registryMutex;
std::map<std::pair<dev_t, ino_t>, std::weak_ptr<SharedSegment::Mapping>>& registry() {
  static auto* mappings = new std::map<std::pair<dev_t, ino_t>, std::weak_ptr<SharedSegment::Mapping>>;
  return *mappings;
}

// Maps the memfd (or reuses this process's mapping of it); "" or why not.
std::string mapDescriptor(int fd, size_t bytes, std::shared_ptr<SharedSegment::Mapping>& out) {
  struct stat info {};
  if (fstat(fd, &info) != 0) return fmt::format("fstat: {}", std::strerror(errno));
  if (static_cast<size_t>(info.st_size) != bytes)
    return fmt::format("the segment has {} bytes, expected {}", static_cast<long long>(info.st_size), bytes);
  std::lock_guard<std::mutex> lock(registryMutex);
  auto id = std::make_pair(info.st_dev, info.st_ino);
  auto found = registry().find(id);
  if (found != registry().end()) {
    if ((out = found->second.lock())) return "";
  }
  // MAP_POPULATE faults every page in now, not in the first calls.
  void* base = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd, 0);
  if (base == MAP_FAILED) return fmt::format("mmap of {} bytes: {}", bytes, std::strerror(errno));
  auto mapping = std::make_shared<SharedSegment::Mapping>();
  mapping->base = static_cast<uint8_t*>(base);
  mapping->bytes = bytes;
  mapping->id = id;
  for (auto it = registry().begin(); it != registry().end();)  // forget mappings already gone
    it = it->second.expired() ? registry().erase(it) : std::next(it);
  registry()[id] = mapping;
  out = std::move(mapping);
  return "";
}

}  // namespace

std::unique_ptr<SharedSegment> SharedSegment::open(Store& store, const std::string& keyPrefix, int rank, int size,
                                                   size_t slotBytes, double timeoutS, std::string* whyNot) {
  auto refuse = [&](const std::string& reason) -> std::unique_ptr<SharedSegment> {
    if (whyNot != nullptr) *whyNot = reason;
    return nullptr;
  };
  if (slotBytes == 0) return refuse("disabled (SHOAL_SHM_MAX_BYTES=0)");
  if (slotBytes > kMaxSlotBytes)
    return refuse(fmt::format("a slot of {} bytes is larger than the segment allows ({})", slotBytes, kMaxSlotBytes));
  const Deadline deadline = deadlineAfter(timeoutS);
  const std::string prefix = keyPrefix + "shm/";
  const size_t bytes = segmentBytes(size, slotBytes);
  store.set(prefix + "host/" + std::to_string(rank),
            bytesOf(fmt::format("{} {}", static_cast<long>(getpid()), hostIdentity())));

  // Rank 0 decides: "none <reason>" or "fd <pid> <fd> <pid of every rank...>".
  std::shared_ptr<Mapping> mapping;
  std::vector<long> pids(size, 0);
  int ownFd = -1;
  std::string decision;
  if (rank == 0) {
    const std::string identity = hostIdentity();
    for (int peer = 0; peer < size && decision.empty(); ++peer) {
      std::string value = text(store.get(prefix + "host/" + std::to_string(peer), deadline));
      size_t space = value.find(' ');
      if (space == std::string::npos || value.substr(space + 1) != identity)
        decision = fmt::format("none rank {} is on another host (or PID/network namespace) than rank 0", peer);
      else
        pids[peer] = std::stol(value.substr(0, space));
    }
    if (decision.empty()) {
      ownFd = memfd_create("shoal-shm", MFD_CLOEXEC);
      if (ownFd < 0) {
        decision = fmt::format("none memfd_create: {}", std::strerror(errno));
      } else if (ftruncate(ownFd, static_cast<off_t>(bytes)) != 0) {
        decision = fmt::format("none ftruncate to {} bytes: {}", bytes, std::strerror(errno));
      } else if (std::string why = mapDescriptor(ownFd, bytes, mapping); !why.empty()) {
        decision = "none rank 0: " + why;
      } else {
        auto* control = reinterpret_cast<Control*>(mapping->base);
        control->magic = kMagic;
        control->worldSize = static_cast<uint64_t>(size);
        control->slotBytes = slotBytes;
        decision = fmt::format("fd {} {}", static_cast<long>(getpid()), ownFd);
        for (long pid : pids) decision += fmt::format(" {}", pid);
      }
    }
    store.set(prefix + "decision", bytesOf(decision));
  } else {
    decision = text(store.get(prefix + "decision", deadline));
  }
  auto closeOwn = [&] {
    if (ownFd >= 0) close(ownFd);
    ownFd = -1;
  };
  if (decision.rfind("none ", 0) == 0) {
    closeOwn();
    return refuse(decision.substr(5));
  }

  // Every other rank maps rank 0's descriptor through /proc and says whether it could.
  if (rank != 0) {
    std::istringstream fields(decision.substr(3));
    long ownerPid = 0;
    int ownerFd = -1;
    fields >> ownerPid >> ownerFd;
    for (long& pid : pids) fields >> pid;
    std::string path = fmt::format("/proc/{}/fd/{}", ownerPid, ownerFd);
    std::string why;
    int fd = ::open(path.c_str(), O_RDWR | O_CLOEXEC);
    if (fd < 0) {
      why = fmt::format("open {}: {}", path, std::strerror(errno));
    } else {
      why = mapDescriptor(fd, bytes, mapping);
      close(fd);
    }
    if (why.empty() && reinterpret_cast<Control*>(mapping->base)->magic != kMagic) why = "not a shoal segment";
    store.set(prefix + "mapped/" + std::to_string(rank), bytesOf(why.empty() ? "ok" : "failed " + why));
    std::string ready = text(store.get(prefix + "ready", deadline));
    if (ready != "ok") return refuse(ready);
  } else {
    std::string ready = "ok";
    for (int peer = 1; peer < size; ++peer) {
      std::string value = text(store.get(prefix + "mapped/" + std::to_string(peer), deadline));
      if (value != "ok" && ready == "ok") ready = fmt::format("rank {} could not map the segment: {}", peer, value.substr(7));
    }
    store.set(prefix + "ready", bytesOf(ready));
    closeOwn();  // every rank has its mapping (or gave up): the memory lives as long as they do
    if (ready != "ok") return refuse(ready);
  }
  const long self = getpid();
  for (long& pid : pids)
    if (pid == self) pid = 0;  // threads of this process: nothing to check
  return std::unique_ptr<SharedSegment>(new SharedSegment(std::move(mapping), rank, size, slotBytes, std::move(pids)));
}

SharedSegment::SharedSegment(std::shared_ptr<Mapping> mapping, int rank, int size, size_t slotBytes,
                             std::vector<long> pids)
    : mapping_(std::move(mapping)), rank_(rank), size_(size), slotBytes_(slotBytes),
      slotStride_(slotStrideFor(slotBytes)), slots_(mapping_->base + slotsOffset(size)), pids_(std::move(pids)) {
  // Spin a few microseconds (a peer that runs arrives within one or two),
  // then yield: a rank that keeps spinning while its peer waits for a core
  // (more ranks than cores, or a loaded machine) steals that core.
  // A pause is about 30 ns on current x86 cores.
  unsigned cores = std::max(1u, std::thread::hardware_concurrency());
  spinPolls_ = static_cast<unsigned>(size_) > cores ? 16 : 256;
}

SharedSegment::~SharedSegment() = default;

void SharedSegment::abort(const std::string& reason, shoal_status_t status) {
  if (aborted_) return;
  aborted_ = true;
  // This rank's text is written once, before the word that publishes it.
  char* textArea = reinterpret_cast<char*>(mapping_->base + abortTextOffset() + size_t(rank_) * kAbortTextBytes);
  size_t length = std::min(reason.size(), kAbortTextBytes - 1);
  std::memcpy(textArea, reason.data(), length);
  textArea[length] = '\0';
  uint64_t expected = 0;
  uint64_t word = uint64_t(static_cast<uint32_t>(status)) << 32 | uint64_t(rank_ + 1);
  atomicAt(reinterpret_cast<Control*>(mapping_->base)->abortWord)
      .compare_exchange_strong(expected, word, std::memory_order_release, std::memory_order_relaxed);
}

void SharedSegment::failFromAbortWord(uint64_t word) {
  int sender = static_cast<int>(word & 0xffffffffu) - 1;
  auto status = static_cast<shoal_status_t>(static_cast<int32_t>(word >> 32));
  const char* reason =
      reinterpret_cast<const char*>(mapping_->base + abortTextOffset() + size_t(sender) * kAbortTextBytes);
  std::string why(reason, strnlen(reason, kAbortTextBytes));
  aborted_ = true;  // the word is already set: nothing more to tell
  if (status == SHOAL_ERR_MISMATCH) throw Error(SHOAL_ERR_MISMATCH, fmt::format("rank {} reports: {}", sender, why));
  throw Error(SHOAL_ERR_REMOTE, fmt::format("rank {} aborted the communicator: {}", sender, why));
}

void SharedSegment::failFromDeadPeer(int peer, Transport& transport) {
  // A rank that gave up may exit before this rank reads why: the abort word
  // (every rank in the segment writes it before its transport's notices:
  // failCommunicator, comm/call.h, and the transport's own abort through
  // setBeforeNotices) or, from a rank outside the segment, the transport's
  // notice, which may come a moment after that rank is seen gone. Either one
  // is the cause.
  auto abortWord = atomicAt(reinterpret_cast<Control*>(mapping_->base)->abortWord);
  const Deadline grace = deadlineAfter(kAbortNoticeGraceS);
  for (;;) {
    if (uint64_t word = abortWord.load(std::memory_order_acquire); word != 0) failFromAbortWord(word);
    transport.checkNotAborted();
    if (Clock::now() > grace) break;
    std::this_thread::sleep_for(kSleepMax);
  }
  throw Error(SHOAL_ERR_REMOTE, fmt::format("rank {} (pid {}, on this host) exited or crashed; rank {} cannot "
                                            "complete the collective",
                                            peer, pids_[peer], rank_));
}

void SharedSegment::waitFor(int peer, uint64_t number, const Round& round, Transport& transport,
                            const CallDeadline& deadline) {
  auto* header = reinterpret_cast<SlotHeader*>(slot(peer, static_cast<int>(number & 1)));
  auto flag = atomicAt(header->number);
  auto abortWord = atomicAt(reinterpret_cast<Control*>(mapping_->base)->abortWord);
  Clock::time_point nextLivenessCheck{};  // from the first yield: the spin reads no clock
  // A failure seen while waiting counts only if the flag still has not come:
  // a rank that was descheduled may find its peers already past this round
  // and failed in a later call, and this round's data is complete.
  const auto expected = static_cast<uint32_t>(number);
  auto arrived = [&] { return flag.load(std::memory_order_acquire) == expected; };
  Clock::time_point yieldingSince{};
  Clock::duration sleep{};  // zero: yield
  Deadline until{};  // the call's deadline: read (for the call) once a wait stops spinning
  for (long polls = 0;; ++polls) {
    if (arrived()) return;
    if (uint64_t word = abortWord.load(std::memory_order_acquire); word != 0) {
      if (arrived()) return;
      failFromAbortWord(word);
    }
    if (polls < spinPolls_) {
      cpuRelax();
      continue;
    }
    if (polls == spinPolls_) {
      yieldingSince = Clock::now();
      until = deadline.from(yieldingSince);
      nextLivenessCheck = yieldingSince + kLivenessPeriod;
    }
    if (sleep > Clock::duration::zero()) std::this_thread::sleep_for(sleep);
    else sched_yield();
    if (polls % 16 != 0) continue;
    Clock::time_point now = Clock::now();
    if (now - yieldingSince > kYieldPhase)
      sleep = std::clamp<Clock::duration>((now - yieldingSince) / 20, kSleepMin, kSleepMax);
    if (now > until && !arrived())
      throw Error(SHOAL_ERR_TIMEOUT,
                  fmt::format("rank {} timed out (SHOAL_TIMEOUT_S) waiting for rank {} in the shared-memory {}: is "
                              "that rank alive and calling the same collective?",
                              rank_, peer, round.what));
    if (now >= nextLivenessCheck) {
      nextLivenessCheck = now + kLivenessPeriod;
      if (pids_[peer] != 0 && !processAlive(pids_[peer]) && !arrived()) failFromDeadPeer(peer, transport);
      try {
        transport.checkNotAborted();  // an abort notice that came the other way
        // A peer that made another call (compressed, or another algorithm)
        // waits in the transport with messages of this call's number.
        if (round.tag != 0 && !arrived()) transport.checkForMessagesOf(round.tag);
      } catch (const Error&) {
        if (arrived()) return;  // the transport stays failed: the next call reports it
        throw;
      }
    }
  }
}

// The tag's signature bits: the call's word (comm/agree.h), for error text.
namespace {
uint32_t signatureWord(uint64_t tag) { return static_cast<uint32_t>((tag & kSignatureMask) >> kSignatureShift); }
}  // namespace

void SharedSegment::failRound(const Round& round, size_t bytes, int peer, const void* theirHeader) {
  const auto* theirs = static_cast<const SlotHeader*>(theirHeader);
  const uint32_t mine = signatureWord(round.tag), their = signatureWord(theirs->tag);
  if (their != mine) throw Error(SHOAL_ERR_MISMATCH, describeSignatureMismatch(rank_, peer, mine, their));
  if (theirs->count != round.count || theirs->offset != round.offset || theirs->bytes != bytes)
    throw Error(SHOAL_ERR_MISMATCH,
                fmt::format("ranks disagree on a call: in the shared-memory {}, rank {} has {} elements (this "
                            "piece: {} bytes from element {}), rank {} has {} ({} bytes from element {}). Every "
                            "rank must make the same calls in the same order with the same arguments",
                            round.what, rank_, round.count, bytes, round.offset, peer, theirs->count, theirs->bytes,
                            theirs->offset));
  // The segment counts its own rounds, so ranks whose sequence numbers
  // drifted apart (a call or an internal round made on one rank only) would
  // still meet here: the tag carries the number and tells them apart.
  throw Error(SHOAL_ERR_MISMATCH,
              fmt::format("ranks are in different calls: in the shared-memory {}, rank {} has call tag {:#x} and "
                          "rank {} has {:#x} (the same collective, but not the same call of the communicator: one "
                          "rank made a call, or ran an internal round, that the other did not). Every rank must make "
                          "the same calls in the same order",
                          round.what, rank_, round.tag, peer, theirs->tag));
}

void SharedSegment::publishAndWait(const Round& round, size_t bytes, uint8_t* mine, Transport& transport,
                                   const CallDeadline& deadline) {
  const uint64_t number = ++rounds_;
  const auto published = static_cast<uint32_t>(number);
  const int parity = static_cast<int>(number & 1);
  auto* header = reinterpret_cast<SlotHeader*>(mine);
  header->bytes = static_cast<uint32_t>(bytes);
  header->tag = round.tag;
  header->count = round.count;
  header->offset = round.offset;
  atomicAt(header->number).store(published, std::memory_order_release);
  try {
    for (int step = 1; step < size_; ++step) {
      // Staggered: not every rank polls rank 0 first ((rank + step) mod size, without dividing).
      const int peer = rank_ + step < size_ ? rank_ + step : rank_ + step - size_;
      auto* theirs = reinterpret_cast<SlotHeader*>(slot(peer, parity));
      // A peer already there costs one load; waitFor() spins, yields and checks.
      if (atomicAt(theirs->number).load(std::memory_order_acquire) != published)
        waitFor(peer, number, round, transport, deadline);
      // The signature, count, offset, piece size and sequence number, in one
      // test; failRound says which differs.
      if ((theirs->tag ^ round.tag) | (theirs->count ^ round.count) | (theirs->offset ^ round.offset) |
          (theirs->bytes ^ bytes))
        failRound(round, bytes, peer, theirs);
    }
  } catch (const Error& error) {
    abort(error.what(), error.status());
    throw;
  }
}

void SharedSegment::exchange(const Round& round, const void* data, size_t bytes, Transport& transport,
                             const CallDeadline& deadline) {
  failIfAborted();
  if (bytes > slotBytes_)
    fail(SHOAL_ERR_INTERNAL, "shared-memory round of {} bytes exceeds the slot's {}", bytes, slotBytes_);
  // The slot is found before the copy: the copy's stores may alias any member to the compiler.
  uint8_t* mine = slot(rank_, static_cast<int>((rounds_ + 1) & 1));
  // The data right behind the header: up to kInlineBytes of it in the
  // header's line, which the number's release-store publishes with it.
  if (data != nullptr) {
    if (bytes <= kInlineBytes) copyInline(mine + kHeaderBytes, static_cast<const uint8_t*>(data), bytes);
    else std::memcpy(mine + kHeaderBytes, data, bytes);
    bytesPublished_ += bytes;
  }
  publishAndWait(round, bytes, mine, transport, deadline);
}

void SharedSegment::exchangeWritten(const Round& round, size_t bytes, size_t written, Transport& transport,
                                    const CallDeadline& deadline) {
  failIfAborted();
  if (bytes > slotBytes_ || written > bytes)
    fail(SHOAL_ERR_INTERNAL, "shared-memory round of {} bytes ({} written) exceeds the slot's {}", bytes, written,
         slotBytes_);
  bytesPublished_ += written;
  publishAndWait(round, bytes, nextData() - kHeaderBytes, transport, deadline);
}

void SharedSegment::checkNotAborted() {
  if (uint64_t word = atomicAt(reinterpret_cast<Control*>(mapping_->base)->abortWord).load(std::memory_order_acquire);
      word != 0)
    failFromAbortWord(word);
}

}  // namespace shoal
