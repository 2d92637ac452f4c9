// A shared-memory segment for the small collectives of a communicator whose
// ranks all share one host: flags in shared memory instead of a rendezvous
// (the model is Open MPI's sm/vader collectives and NCCL's LL protocol).
//
// Each rank owns two slots, one per parity of the round number: a header
// (round number, the call's tag, count, offset) and the data right behind it,
// so that a piece of up to kInlineBytes travels in the header's cache line. A
// round is: write your data and header into your slot of this parity,
// release-store the round number, then wait (acquire) until every rank's slot
// of this parity shows the same round. Reading peers' slots afterwards is
// safe until round + 2 overwrites them, and no rank can start round + 2
// before every rank has published round + 1, which each does only after it
// finished reading round: so the next round's flags are the "done" flags, and
// a round costs one store and N loads of a flag.
//
// Failure: a rank that gives up writes an abort word (and its reason) into the
// segment so that the others fail at once; a peer whose process is gone, a
// deadline that passes, or a peer's signature that differs is an error with
// text on every rank, never a hang.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "bootstrap/store.h"
#include "core/deadline.h"
#include "core/error.h"
#include "transport/transport.h"

namespace shoal {

class SharedSegment {
 public:
  struct Mapping;  // the mapped memory, shared by the ranks of one process (segment.cc)
  // A slot: a header of kHeaderBytes, then the data, from a cache line's
  // start; a piece of up to kInlineBytes shares the header's line.
  static constexpr size_t kHeaderBytes = 32;
  static constexpr size_t kInlineBytes = 64 - kHeaderBytes;
  static constexpr size_t kMaxSlotBytes = size_t(1) << 31;  // a piece's size is a 32-bit field

  // Called by every rank of a communicator at init (after the transport
  // connected, with the same store and key prefix). Returns the segment when
  // every rank is on this host and could map it, else null with the reason in
  // whyNot (the same answer on every rank: rank 0 decides through the store).
  // slotBytes = 0 returns null ("disabled").
  static std::unique_ptr<SharedSegment> open(Store& store, const std::string& keyPrefix, int rank, int size,
                                             size_t slotBytes, double timeoutS, std::string* whyNot);
  ~SharedSegment();
  SharedSegment(const SharedSegment&) = delete;
  SharedSegment& operator=(const SharedSegment&) = delete;

  int rank() const { return rank_; }
  int size() const { return size_; }
  size_t slotBytes() const { return slotBytes_; }

  // What every rank of one round declares; the call's tag (its signature
  // word and sequence number), the count and the offset must agree between
  // ranks (else SHOAL_ERR_MISMATCH).
  struct Round {
    uint64_t tag = 0;       // the call's transport tag: a peer in another call shows there (checkForOtherCalls)
    uint64_t count = 0;     // elements of the whole call
    uint64_t offset = 0;    // first element of this round's piece
    const char* what = "";  // for error text: "allreduce", "broadcast", "barrier"
  };
  // Publishes `bytes` of `data` (data may be null: a rank that only reads,
  // still declaring the piece's size) and waits for every rank's slot of
  // the same round. Afterwards peerData(r) is rank r's data of this round.
  // Throws Error (TIMEOUT, REMOTE, MISMATCH) and then marks the segment aborted.
  void exchange(const Round& round, const void* data, size_t bytes, Transport& transport, const CallDeadline& deadline);
  const uint8_t* peerData(int rank) const { return slot(rank, static_cast<int>(rounds_ & 1)) + kHeaderBytes; }
  // This rank's data area in the slot that the next round publishes, for data
  // this rank computes from the round just done (the allreduce's reduced
  // share) without a copy: write it here between two rounds, then publish it
  // with exchangeWritten(). Safe: every peer finished reading that slot (two
  // rounds ago) before it published the round just done.
  uint8_t* nextData() const { return slot(rank_, static_cast<int>((rounds_ + 1) & 1)) + kHeaderBytes; }
  // exchange() for the `written` bytes this rank put into nextData(), every
  // rank declaring the same `bytes` (the piece's size) for the check.
  void exchangeWritten(const Round& round, size_t bytes, size_t written, Transport& transport,
                       const CallDeadline& deadline);
  // Bytes this rank wrote into its slots for its peers so far: what it "sent"
  // through the segment (a compressor's payload on one host, for its stats).
  uint64_t bytesPublished() const { return bytesPublished_; }

  // Throws when a rank gave up on the communicator (the abort word; MISMATCH
  // or REMOTE). One load: the end-of-call check of a call that ran through
  // the segment only (comm/call.h), where every rank that gives up on a call
  // writes the word. (Not after init's rounds: a late rank's init must not
  // fail for its peers' later calls.)
  void checkNotAborted();
  // Tells every rank in (or entering) a round that this rank gave up. Idempotent.
  void abort(const std::string& reason, shoal_status_t status);

 private:
  SharedSegment(std::shared_ptr<Mapping> mapping, int rank, int size, size_t slotBytes, std::vector<long> pids);
  // Publishes this rank's header of the next round in `mine` (its slot of that round, the data in
  // place) and waits for every peer's. Inlined into both callers: a small call pays no second call.
  [[gnu::always_inline]] inline void publishAndWait(const Round& round, size_t bytes, uint8_t* mine,
                                                    Transport& transport, const CallDeadline& deadline);
  // Throws the first failure's error when this rank gave up (a later call on an aborted segment).
  void failIfAborted() {
    if (aborted_) checkNotAborted();
  }
  void waitFor(int peer, uint64_t number, const Round& round, Transport& transport, const CallDeadline& deadline);
  [[noreturn]] void failFromAbortWord(uint64_t word);
  // A peer's process is gone: the cause it left (abort word or notice), else REMOTE.
  [[noreturn]] void failFromDeadPeer(int peer, Transport& transport);
  // A peer's slot header (theirHeader) that differs from this round: MISMATCH
  // naming what differs (the signature, the sizes, or the call's sequence).
  [[noreturn]] void failRound(const Round& round, size_t bytes, int peer, const void* theirHeader);
  uint8_t* slot(int rank, int parity) const { return slots_ + (size_t(rank) * 2 + size_t(parity)) * slotStride_; }

  std::shared_ptr<Mapping> mapping_;
  int rank_;
  int size_;
  size_t slotBytes_;
  size_t slotStride_;
  uint8_t* slots_;          // the first slot (rank 0, parity 0): computed once, read every round
  std::vector<long> pids_;  // every rank's process (0 or this process: not checked)
  uint64_t rounds_ = 0;     // rounds done on this communicator (the same count on every rank)
  uint64_t bytesPublished_ = 0;
  int spinPolls_;           // polls before a wait starts yielding its core
  bool aborted_ = false;
};

}  // namespace shoal
