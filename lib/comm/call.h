// Running one collective call on a communicator: the sequence number, the
// deadline and the abort-on-failure rule every collective shares.
#pragma once

#include <optional>
#include <string>
#include <utility>

#include "collectives/collectives.h"
#include "comm/agree.h"
#include "comm/communicator.h"

namespace shoal {

// The one place a sequence number is taken. Every API call takes one (its
// Call), and so does every internal round beyond it: an allgatherv's counts,
// a compressor's rounds, comm_split's two rounds, init's agreement and host
// map, a low-rank step's further allreduces. The number is in every message's
// tag, so ranks pair the rounds that took the same number: every rank must
// take its numbers in one order, a refused call included. A round that some
// rank skips (or runs alone) leaves that rank a number behind (ahead), and its
// next messages meet its peers' of another number: every rank fails, TIMEOUT
// or MISMATCH, instead of pairing unrelated rounds (unit.TakeSequence.*; the
// shared segment counts its own rounds, so there a skipped round shows as a
// wait that times out).
inline uint64_t takeSequence(shoal_comm& comm) { return comm.sequence++; }

// Fails the communicator after an error: peers are told in the shared
// segment, where they may wait, and over the transport (their calls fail with
// `reason` at once instead of at their deadline). The segment's abort word
// first: it is one store, and a peer told over the transport may exit before
// this rank's next step, so a rank waiting in the segment must find the word
// already there when it sees that peer gone (else it reports a bare "exited").
// The transport's abort writes it before its notices (setBeforeNotices, set
// where the segment is attached: comm/shm_setup.cc), for failures found here
// and in the transport alike; a transport that failed already sends nothing
// more, so then the word is written here.
inline void failCommunicator(shoal_comm& comm, const std::string& reason, shoal_status_t status) {
  if (!comm.transport->failed())
    comm.transport->abort(reason, status);
  else if (comm.shm)
    comm.shm->abort(reason, status);
}

// Runs one collective with its call's sequence number and signature
// (comm.call, comm/agree.h) over `transport`: the communicator's own, or a
// view of some of its ranks (a GroupTransport over comm.transport: the
// hierarchical compressed allreduce's cross-host leg), whose collectives know
// no host layout and no shared segment. The number is taken at entry, even
// when the arguments are then refused, so that a rank that skips a call can
// never pair its next call with its peers' current one: they see a timeout
// or mismatch instead of a silently wrong result. Any failure aborts the
// communicator (peers are told) and is rethrown.
template <typename Body>
void runCollectiveOn(shoal_comm& comm, Transport& transport, uint64_t sequence, Body&& body) {
  const bool own = &transport == comm.transport.get();
  Context context(transport, own ? comm.rank : transport.rank(), own ? comm.size : transport.size(), sequence,
                  CallDeadline(comm.timeoutS), comm.segmentBytes, comm.scratch, currentCallWord(comm));
  if (own) {
    context.hosts = comm.hosts.get();
    context.shm = comm.shm.get();
  }
  try {
    body(context);
    // A late rank fails a call its peers gave up on (transport.h): a call
    // that ran through the shared segment only asks the segment's abort word
    // (every rank that gives up writes it, below), which is one load where the
    // transport's check is a UCX progress call; a communicator of one rank
    // has no peers to ask.
    if (context.sharedSegmentOnly) comm.shm->checkNotAborted();
    else if (comm.size > 1) comm.transport->checkNotAborted();
  } catch (const Error& error) {
    failCommunicator(comm, error.what(), error.status());
    throw;
  }
}

// The same over the communicator's own transport.
template <typename Body>
void runCollective(shoal_comm& comm, uint64_t sequence, Body&& body) {
  runCollectiveOn(comm, *comm.transport, sequence, std::forward<Body>(body));
}

// A call with nothing to move still exchanges empty messages along a tree, so
// a rank whose peers passed a non-zero count fails with them instead of
// returning success alone.
inline void emptyCall(shoal_comm& comm, uint64_t sequence) {
  runCollective(comm, sequence, [](Context& context) {
    uint8_t unused = 0;
    allreduceTree(context, &unused, 0, Reducer(SHOAL_U8, SHOAL_SUM));
  });
}

// One API call on a communicator. It takes the call's sequence number once,
// when it is made, before any argument is checked: a refused call still uses
// up its number, so a rank that refuses can never pair its next call with its
// peers' current one. declare() states the call's signature once the
// arguments are known; run() runs the call's collective with both. Internal
// collectives the call needs beyond its own (an allgatherv's counts, a
// compressor's rounds) take further numbers with takeSequence, in the same
// order on every rank.
class Call {
 public:
  Call(shoal_comm& comm, const char* name) : comm_(comm), name_(name), sequence_(takeSequence(comm)) {}
  Call(const Call&) = delete;
  Call& operator=(const Call&) = delete;

  shoal_comm& comm() const { return comm_; }
  const char* name() const { return name_; }
  uint64_t sequence() const { return sequence_; }

  // From here on, the call's messages carry this signature (comm/agree.h).
  void declare(const CallSignature& signature) { scope_.emplace(comm_, signature); }

  template <typename Body>
  void run(Body&& body) {
    runCollective(comm_, sequence_, std::forward<Body>(body));
  }
  // The call moves nothing but still meets its peers (emptyCall).
  void runEmpty() { emptyCall(comm_, sequence_); }

 private:
  shoal_comm& comm_;
  const char* name_;
  const uint64_t sequence_;
  std::optional<CallScope> scope_;
};

}  // namespace shoal
