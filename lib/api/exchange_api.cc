// C entry points of alltoall(v), reduce, gather(v) and scatter(v). Like
// collectives_api.cc: every argument is checked before any communication,
// the call's sequence number is taken first (a refusal takes it too), and the
// body runs under the call's signature through runCollective.
//
// Agreement: a uniform count, the dtype, op and root travel in every
// message's signature (api/agree.h). Where a call's data flows one way (the
// rooted calls), empty messages along a dissemination pattern first carry
// every rank's signature to every rank, as broadcast does, so a rank naming
// another root or count fails everywhere. Per-peer counts (the v forms)
// cannot be in a common signature: a message's size is checked by its
// receiver, and a closing dissemination round makes every rank wait until all
// receivers checked theirs, so a disagreement fails on every rank, not only
// on the receiver.
#include <cstring>
#include <limits>
#include <vector>

#include "comm/agree.h"
#include "api/checks.h"
#include "comm/communicator.h"
#include "api/enter.h"
#include "api/export.h"
#include "api/guard.h"
#include "comm/call.h"
#include "collectives/collectives.h"
#include "collectives/exchange.h"
#include "runtime/blocking.h"

using namespace shoal;

namespace {

// Per-peer byte counts and offsets from element counts and displacements
// (NULL displacements pack the blocks), with the end of the furthest block.
struct Layout {
  std::vector<size_t> bytes, offset;
  size_t end = 0;
  PeerBlocks blocks() const { return {bytes.data(), offset.data()}; }
};

Layout layoutOf(const char* call, const char* countsName, const char* displsName, const size_t* counts,
                const size_t* displs, int peers, shoal_dtype_t dtype) {
  if (counts == nullptr)
    fail(SHOAL_ERR_INVALID_ARGUMENT, "{}: {} is NULL; pass one count per rank", call, countsName);
  Layout layout;
  layout.bytes.resize(peers);
  layout.offset.resize(peers);
  size_t packed = 0;
  for (int p = 0; p < peers; ++p) {
    const size_t bytes = checkedByteCount(call, countsName, counts[p], dtype);
    const size_t place = displs ? checkedByteCount(call, displsName, displs[p], dtype) : packed;
    if (std::numeric_limits<size_t>::max() - place < bytes || std::numeric_limits<size_t>::max() - packed < bytes ||
        place + bytes > kMaxBufferBytes)
      fail(SHOAL_ERR_INVALID_ARGUMENT, "{}: {}[{}] and {}[{}] reach beyond the largest buffer ({} bytes)", call,
           countsName, p, displsName, p, kMaxBufferBytes);
    layout.bytes[p] = bytes;
    layout.offset[p] = place;
    packed += bytes;
    layout.end = std::max(layout.end, place + bytes);
  }
  return layout;
}

Layout uniformLayout(size_t bytesEach, int peers) {
  Layout layout;
  layout.bytes.assign(peers, bytesEach);
  layout.offset.resize(peers);
  for (int p = 0; p < peers; ++p) layout.offset[p] = p * bytesEach;
  layout.end = bytesEach * peers;
  return layout;
}

void checkRoot(const char* call, int root, int size) {
  if (root < 0 || root >= size)
    fail(SHOAL_ERR_INVALID_ARGUMENT, "{}: root {} is not a rank; use 0..{}", call, root, size - 1);
}

// Alltoall(v) once arguments are checked. In place (send == recv) the send
// side is staged in scratch slot 2 (the algorithms use 0 and 1).
void runAlltoallv(shoal_comm& c, uint64_t sequence, const void* sendbuf, const Layout& send, void* recvbuf,
                  const Layout& recv, bool closingRound) {
  const uint8_t* source = static_cast<const uint8_t*>(sendbuf);
  if (sendbuf == recvbuf && send.end > 0) {
    uint8_t* staged = c.scratch.get(2, send.end);
    std::memcpy(staged, sendbuf, send.end);
    source = staged;
  }
  runCollective(c, sequence, [&](Context& context) {
    alltoallvPairwise(context, source, send.blocks(), static_cast<uint8_t*>(recvbuf), recv.blocks());
    if (closingRound) barrierDissemination(context);
  });
}

}  // namespace

SHOAL_EXPORT shoal_status_t shoal_alltoall(shoal_comm_t comm, const void* sendbuf, void* recvbuf, size_t count,
                                           shoal_dtype_t dtype) {
  return enter(comm, "shoal_alltoall", [&](Call& thisCall) {
    const char* call = thisCall.name();
    shoal_comm& c = thisCall.comm();
    const uint64_t sequence = thisCall.sequence();
    checkDtype(call, dtype);
    const size_t total = checkedByteCount(call, "count x world size", count, dtype, static_cast<size_t>(c.size));
    checkBuffer(call, "sendbuf", sendbuf, total);
    checkBuffer(call, "recvbuf", recvbuf, total);
    checkNoPartialOverlap(call, sendbuf, total, recvbuf, total, sendbuf == recvbuf);
    // Every rank receives from every other: a count that differs anywhere
    // fails some receive on every rank, no closing round needed.
    CallScope scope(c, signatureOf(CallKind::Alltoall, dtype, -1, count, -1, "pairwise"));
    Layout layout = uniformLayout(count * dtypeSize(dtype), c.size);
    runAlltoallv(c, sequence, sendbuf, layout, recvbuf, layout, false);
  });
}

SHOAL_EXPORT shoal_status_t shoal_alltoallv(shoal_comm_t comm, const void* sendbuf, const size_t* sendcounts,
                                            const size_t* sdispls, void* recvbuf, const size_t* recvcounts,
                                            const size_t* rdispls, shoal_dtype_t dtype) {
  return enter(comm, "shoal_alltoallv", [&](Call& thisCall) {
    const char* call = thisCall.name();
    shoal_comm& c = thisCall.comm();
    const uint64_t sequence = thisCall.sequence();
    checkDtype(call, dtype);
    Layout send = layoutOf(call, "sendcounts", "sdispls", sendcounts, sdispls, c.size, dtype);
    Layout recv = layoutOf(call, "recvcounts", "rdispls", recvcounts, rdispls, c.size, dtype);
    if (send.bytes[c.rank] != recv.bytes[c.rank])
      fail(SHOAL_ERR_INVALID_ARGUMENT, "{}: sendcounts[{}] = {} differs from recvcounts[{}] = {}; a rank's block "
           "to itself must have one size", call, c.rank, sendcounts[c.rank], c.rank, recvcounts[c.rank]);
    checkBuffer(call, "sendbuf", sendbuf, send.end);
    checkBuffer(call, "recvbuf", recvbuf, recv.end);
    checkNoPartialOverlap(call, sendbuf, send.end, recvbuf, recv.end, sendbuf == recvbuf);
    CallScope scope(c, signatureOf(CallKind::Alltoallv, dtype, -1, 0, -1, "pairwise"));
    runAlltoallv(c, sequence, sendbuf, send, recvbuf, recv, true);
  });
}

SHOAL_EXPORT shoal_status_t shoal_reduce(shoal_comm_t comm, const void* sendbuf, void* recvbuf, size_t count,
                                         shoal_dtype_t dtype, shoal_op_t op, int root) {
  return enter(comm, "shoal_reduce", [&](Call& thisCall) {
    const char* call = thisCall.name();
    shoal_comm& c = thisCall.comm();
    const uint64_t sequence = thisCall.sequence();
    checkDtypeOp(call, dtype, op);
    checkRoot(call, root, c.size);
    const size_t bytes = checkedByteCount(call, "count", count, dtype);
    checkBuffer(call, "sendbuf", sendbuf, bytes);
    if (c.rank == root) {
      checkBuffer(call, "recvbuf (on root)", recvbuf, bytes);
      checkNoPartialOverlap(call, sendbuf, bytes, recvbuf, bytes, sendbuf == recvbuf);
    }
    CallScope scope(c, signatureOf(CallKind::Reduce, dtype, op, count, root, "tree"));
    Reducer reducer(dtype, op);
    runCollective(c, sequence, [&](Context& context) {
      barrierDissemination(context);  // the root and count reach every rank first (see the top)
      reduceTree(context, sendbuf, recvbuf, count, reducer, root);
    });
  });
}

namespace {

// gather and gatherv after their own checks: root's layout, this rank's block.
void runGather(shoal_comm& c, uint64_t sequence, const void* sendbuf, size_t sendBytes, void* recvbuf,
               const Layout& recv, int root, bool closingRound) {
  uint8_t* out = static_cast<uint8_t*>(recvbuf);
  if (c.rank == root && sendBytes > 0 && sendbuf != out + recv.offset[root])
    std::memcpy(out + recv.offset[root], sendbuf, sendBytes);
  runCollective(c, sequence, [&](Context& context) {
    barrierDissemination(context);
    gatherLinear(context, sendbuf, sendBytes, out, recv.blocks(), root);
    if (closingRound) barrierDissemination(context);
  });
}

void runScatter(shoal_comm& c, uint64_t sequence, const void* sendbuf, const Layout& send, void* recvbuf,
                size_t recvBytes, int root, bool closingRound) {
  const uint8_t* in = static_cast<const uint8_t*>(sendbuf);
  if (c.rank == root && recvBytes > 0 && recvbuf != in + send.offset[root])
    std::memcpy(recvbuf, in + send.offset[root], recvBytes);
  runCollective(c, sequence, [&](Context& context) {
    barrierDissemination(context);
    scatterLinear(context, in, send.blocks(), recvbuf, recvBytes, root);
    if (closingRound) barrierDissemination(context);
  });
}

}  // namespace

SHOAL_EXPORT shoal_status_t shoal_gather(shoal_comm_t comm, const void* sendbuf, void* recvbuf, size_t sendcount,
                                         shoal_dtype_t dtype, int root) {
  return enter(comm, "shoal_gather", [&](Call& thisCall) {
    const char* call = thisCall.name();
    shoal_comm& c = thisCall.comm();
    const uint64_t sequence = thisCall.sequence();
    checkDtype(call, dtype);
    checkRoot(call, root, c.size);
    const size_t total = checkedByteCount(call, "sendcount x world size", sendcount, dtype, c.size);
    const size_t bytes = total / c.size;
    Layout recv = uniformLayout(bytes, c.size);
    if (c.rank == root) {
      checkBuffer(call, "recvbuf (on root)", recvbuf, total);
      const void* inPlace = static_cast<uint8_t*>(recvbuf) + recv.offset[root];
      if (sendbuf != inPlace) checkBuffer(call, "sendbuf", sendbuf, bytes);
      checkNoPartialOverlap(call, sendbuf, bytes, recvbuf, total, sendbuf == inPlace);
    } else {
      checkBuffer(call, "sendbuf", sendbuf, bytes);
    }
    CallScope scope(c, signatureOf(CallKind::Gather, dtype, -1, sendcount, root, "linear"));
    runGather(c, sequence, sendbuf, bytes, recvbuf, recv, root, false);
  });
}

SHOAL_EXPORT shoal_status_t shoal_gatherv(shoal_comm_t comm, const void* sendbuf, size_t sendcount, void* recvbuf,
                                          const size_t* recvcounts, const size_t* displs, shoal_dtype_t dtype,
                                          int root) {
  return enter(comm, "shoal_gatherv", [&](Call& thisCall) {
    const char* call = thisCall.name();
    shoal_comm& c = thisCall.comm();
    const uint64_t sequence = thisCall.sequence();
    checkDtype(call, dtype);
    checkRoot(call, root, c.size);
    const size_t bytes = checkedByteCount(call, "sendcount", sendcount, dtype);
    Layout recv;
    if (c.rank == root) {
      recv = layoutOf(call, "recvcounts", "displs", recvcounts, displs, c.size, dtype);
      if (recv.bytes[root] != bytes)
        fail(SHOAL_ERR_INVALID_ARGUMENT, "{}: sendcount {} differs from recvcounts[{}] = {} on root; they must be "
             "equal", call, sendcount, root, recvcounts[root]);
      checkBuffer(call, "recvbuf (on root)", recvbuf, recv.end);
      const void* inPlace = static_cast<uint8_t*>(recvbuf) + recv.offset[root];
      if (sendbuf != inPlace) checkBuffer(call, "sendbuf", sendbuf, bytes);
      checkNoPartialOverlap(call, sendbuf, bytes, recvbuf, recv.end, sendbuf == inPlace);
    } else {
      checkBuffer(call, "sendbuf", sendbuf, bytes);
    }
    CallScope scope(c, signatureOf(CallKind::Gatherv, dtype, -1, 0, root, "linear"));
    runGather(c, sequence, sendbuf, bytes, recvbuf, recv, root, true);
  });
}

SHOAL_EXPORT shoal_status_t shoal_scatter(shoal_comm_t comm, const void* sendbuf, void* recvbuf, size_t recvcount,
                                          shoal_dtype_t dtype, int root) {
  return enter(comm, "shoal_scatter", [&](Call& thisCall) {
    const char* call = thisCall.name();
    shoal_comm& c = thisCall.comm();
    const uint64_t sequence = thisCall.sequence();
    checkDtype(call, dtype);
    checkRoot(call, root, c.size);
    const size_t total = checkedByteCount(call, "recvcount x world size", recvcount, dtype, c.size);
    const size_t bytes = total / c.size;
    Layout send = uniformLayout(bytes, c.size);
    if (c.rank == root) {
      checkBuffer(call, "sendbuf (on root)", sendbuf, total);
      const void* inPlace = static_cast<const uint8_t*>(sendbuf) + send.offset[root];
      if (recvbuf != inPlace) checkBuffer(call, "recvbuf", recvbuf, bytes);
      checkNoPartialOverlap(call, sendbuf, total, recvbuf, bytes, recvbuf == inPlace);
    } else {
      checkBuffer(call, "recvbuf", recvbuf, bytes);
    }
    CallScope scope(c, signatureOf(CallKind::Scatter, dtype, -1, recvcount, root, "linear"));
    runScatter(c, sequence, sendbuf, send, recvbuf, bytes, root, false);
  });
}

SHOAL_EXPORT shoal_status_t shoal_scatterv(shoal_comm_t comm, const void* sendbuf, const size_t* sendcounts,
                                           const size_t* displs, void* recvbuf, size_t recvcount,
                                           shoal_dtype_t dtype, int root) {
  return enter(comm, "shoal_scatterv", [&](Call& thisCall) {
    const char* call = thisCall.name();
    shoal_comm& c = thisCall.comm();
    const uint64_t sequence = thisCall.sequence();
    checkDtype(call, dtype);
    checkRoot(call, root, c.size);
    const size_t bytes = checkedByteCount(call, "recvcount", recvcount, dtype);
    Layout send;
    if (c.rank == root) {
      send = layoutOf(call, "sendcounts", "displs", sendcounts, displs, c.size, dtype);
      if (send.bytes[root] != bytes)
        fail(SHOAL_ERR_INVALID_ARGUMENT, "{}: recvcount {} differs from sendcounts[{}] = {} on root; they must be "
             "equal", call, recvcount, root, sendcounts[root]);
      checkBuffer(call, "sendbuf (on root)", sendbuf, send.end);
      const void* inPlace = static_cast<const uint8_t*>(sendbuf) + send.offset[root];
      if (recvbuf != inPlace) checkBuffer(call, "recvbuf", recvbuf, bytes);
      checkNoPartialOverlap(call, sendbuf, send.end, recvbuf, bytes, recvbuf == inPlace);
    } else {
      checkBuffer(call, "recvbuf", recvbuf, bytes);
    }
    CallScope scope(c, signatureOf(CallKind::Scatterv, dtype, -1, 0, root, "linear"));
    runScatter(c, sequence, sendbuf, send, recvbuf, bytes, root, true);
  });
}
