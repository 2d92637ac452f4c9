// Transport: tagged point-to-point messages between the ranks of one
// communicator. Collectives are written only against this interface.
//
// Vocabulary: a *tag* is chosen by the collective (its call sequence number
// and step), so messages of different calls or steps never match each other.
// It also carries the *call signature* of the sender's call (comm/agree.h): a
// receive matches a message whatever its signature, then compares the
// sender's signature with its own, so ranks that make different calls (a
// dtype, op, root or compression decision that differs) fail with
// SHOAL_ERR_MISMATCH instead of combining unrelated data. A receive must be
// posted with the exact byte count the sender sends; a different size is a
// mismatch between ranks and fails the call.
//
// Failure model: any error (peer death, timeout, size mismatch) makes the
// communicator unusable. The rank that sees it first tells every peer
// (abort), so all ranks report an error promptly instead of waiting for their
// deadline.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "bootstrap/store.h"
#include "core/error.h"

namespace shoal {

// The 64-bit wire tag, from the top:
//   bit  63      an abort notice (see abort())
//   bits 47..62  the sender's rank (16 bits: at most 65536 ranks)
//   bits 28..46  the call signature (19 bits)
//   bits 16..27  the call's sequence number, wrapping at 2^11 (a call finishes
//                all its messages before the next starts); bit 27 set marks a
//                point-to-point message instead (kPointToPointBit)
//   bits  0..15  the sub-tag the algorithm hands out per step and segment
// A tag passed to isend/irecv holds the low 47 bits (signature and below).
constexpr int kSubTagBits = 16;
constexpr int kSequenceBits = 12;
constexpr int kTagBits = kSubTagBits + kSequenceBits;  // the collective's own part
constexpr int kSignatureBits = 19;
constexpr int kSignatureShift = kTagBits;
constexpr int kRankShift = kSignatureShift + kSignatureBits;
constexpr int kMaxRanks = 1 << 16;
constexpr uint64_t kMaxTag = (uint64_t(1) << kTagBits) - 1;
constexpr uint64_t kSignatureMask = ((uint64_t(1) << kSignatureBits) - 1) << kSignatureShift;
constexpr uint64_t kSequenceMask = ((uint64_t(1) << kSequenceBits) - 1) << kSubTagBits;
// The top bit of the sequence field marks point-to-point messages
// (shoal_send/recv, lib/api/p2p_api.cc): collectives number their calls
// modulo kCollectiveSequences and never set it, so no collective's receive or
// probe can match a point-to-point message, whatever the two sequences are.
constexpr uint64_t kPointToPointBit = uint64_t(1) << (kTagBits - 1);
constexpr uint64_t kCollectiveSequences = uint64_t(1) << (kSequenceBits - 1);

// A peer that gives up tells the others why (its abort notice, or the shared
// segment's abort word) and may then exit or cancel its messages at once, so
// a rank can see the peer gone before it reads why. Before reporting a bare
// SHOAL_ERR_REMOTE ("exited", "send failed") a wait looks this long for that
// notice, so that every rank reports the cause (a MISMATCH) with its text.
constexpr double kAbortNoticeGraceS = 0.2;

// The text of a signature disagreement found on a receive: this rank's call
// signature word `mine`, the word rank `peer` sent. Defined by the layer that
// builds signatures (lib/comm/agree.cc), which knows what the bits mean.
std::string describeSignatureMismatch(int rank, int peer, uint32_t mine, uint32_t theirs);

class Transport {
 public:
  // An outstanding send or receive. Owned by the transport until waited on.
  struct Request {
    void* handle = nullptr;  // backend request, nullptr once complete
    int peer = -1;
    size_t bytes = 0;
    bool isReceive = false;
    bool done = false;
    size_t receivedBytes = 0;  // backends fill this in for receives that complete immediately
    uint64_t tag = 0;          // as passed to isend/irecv (a receive's expected signature)
  };

  virtual ~Transport() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual const char* name() const = 0;

  virtual Request isend(int peer, uint64_t tag, const void* data, size_t bytes) = 0;
  virtual Request irecv(int peer, uint64_t tag, void* data, size_t bytes) = 0;
  // Completes every request or throws shoal::Error (TIMEOUT, REMOTE, MISMATCH,
  // SYSTEM). On a throw the transport is failed and peers have been told.
  virtual void waitAll(Request* requests, size_t count, Deadline deadline) = 0;
  // Returns once at least one of `requests` is complete (at once if one is
  // already), or throws as waitAll does: for a caller that drives several
  // operations at once and serves whichever can move (the pipelined
  // hierarchical allreduce). Every backend must implement it: waiting for one
  // particular request instead would block the caller's other operations,
  // which its ring neighbours may be waiting for (a cycle only the deadline
  // breaks).
  virtual void waitAny(Request* requests, size_t count, Deadline deadline) = 0;
  // Throws if a peer has aborted the communicator. Called when a collective
  // completes: its data may have been waiting for a late rank while the peers
  // gave up on the call, and then the late rank must fail too.
  virtual void checkNotAborted() = 0;
  // Tells every peer that this rank gave up on the communicator, with the
  // reason. A status of SHOAL_ERR_MISMATCH reaches the peers as MISMATCH (the
  // ranks disagree on a call); any other as SHOAL_ERR_REMOTE.
  virtual void abort(const std::string& reason, shoal_status_t status = SHOAL_ERR_REMOTE) = 0;
  // True once an error or abort (local or remote) made the transport unusable.
  virtual bool failed() const = 0;
  // Bytes handed to isend so far (what this rank put on the wire).
  virtual uint64_t bytesSent() const = 0;
  // Why the transport failed ("" while healthy). A copy: the engine thread may
  // fail the transport while the caller's thread reads this.
  virtual std::string failure() const = 0;
  // The status of that failure: SHOAL_ERR_MISMATCH when it was a disagreement
  // (this rank's or a peer's notice), so that a rank whose next call finds the
  // transport already failed reports the disagreement as the others do.
  virtual shoal_status_t failureStatus() const { return SHOAL_ERR_REMOTE; }
  // What the backend chose to reach `peer` (for diagnostics), e.g.
  // "shared memory (posix/memory, cma/memory), same host".
  virtual std::string describePeer(int peer) const { return peer == rank() ? "self" : "unknown"; }
  // For algorithms that wait outside the transport (the shared-memory
  // segment): throws SHOAL_ERR_MISMATCH when a peer's message of the call
  // `tag` (its sequence number and signature, as passed to isend) waits with
  // another signature, i.e. that peer makes another call (a compressed one,
  // or one that took another algorithm). The transport's own waits probe so.
  virtual void checkForOtherCalls(uint64_t tag) { (void)tag; }
  // Stricter, for a call that sends nothing over this transport (the shared
  // segment's collectives, the aggregator's allreduce): throws
  // SHOAL_ERR_MISMATCH when any peer's message of the call `tag` (its
  // sequence number, whatever its signature) waits, i.e. that peer took
  // another path for the same call (a count across SHOAL_SHM_MAX_BYTES, an op
  // the aggregator cannot add). It cannot miss a peer whose signature's digest
  // happens to equal this rank's.
  virtual void checkForMessagesOf(uint64_t tag) { checkForOtherCalls(tag); }

  // Whether a peer's message of the call `tag` (its sequence number, as
  // passed to isend; any signature, any sender) has arrived: a peer started
  // that call and this rank has not. An idle async runtime polls it to learn
  // that a peer began the next negotiation round. Throws, and fails the
  // transport, when a peer aborted or a peer is gone, as a wait would.
  // A backend that cannot tell says true: its caller then joins at once.
  virtual bool peerStartedCall(uint64_t tag) {
    (void)tag;
    return true;
  }
  // For a caller that would otherwise poll peerStartedCall: a file
  // descriptor that becomes readable when anything arrives from a peer,
  // armed by this call. Then look with peerStartedCall once more (a message
  // may have come before the arming) and poll(2) the descriptor. -1 when
  // the backend cannot tell (or some peer is on this host, whose shared
  // memory raises no event): keep polling. -2 when events are pending
  // already: look now.
  virtual int armPeerEvents() { return -1; }

  // What must happen before this rank's abort notices leave, whoever finds
  // the failure (the call layer's failCommunicator, or the backend itself: a
  // probe mismatch, a size mismatch, a refused send): the communicator
  // writes its shared segment's abort word here (comm/shm_setup.cc), so that
  // a rank waiting in the segment reads the cause before it can see this
  // rank's notice, or its exit. Set once after init's segment attach, cleared
  // before the segment goes; the backend calls it at the start of abort().
  using BeforeNotices = std::function<void(const std::string& reason, shoal_status_t status)>;
  void setBeforeNotices(BeforeNotices hook) { beforeNotices_ = std::move(hook); }

 protected:
  void runBeforeNotices(const std::string& reason, shoal_status_t status) const {
    if (beforeNotices_) beforeNotices_(reason, status);
  }

 private:
  BeforeNotices beforeNotices_;
};

struct TransportOptions {
  int rank = 0;
  int worldSize = 1;
  Store* store = nullptr;     // used only while connecting
  std::string keyPrefix;      // namespaces the store keys of this communicator
  double timeoutS = 300;
  int spinRounds = -1;        // idle polls before a wait yields the CPU; -1 = by cores per rank
};

std::unique_ptr<Transport> makeUcxTransport(const TransportOptions& options);

}  // namespace shoal
