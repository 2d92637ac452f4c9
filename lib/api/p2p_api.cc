// Point-to-point: shoal_send, shoal_recv and shoal_sendrecv_many.
//
// Not a collective: only two ranks take part, so a send/recv takes no call
// sequence number (the others would fall out of step) and its messages live in
// a tag space of their own: kPointToPointBit (transport.h) set, which no
// collective's tag has, then a phase and the user's tag:
//   bit  27      kPointToPointBit
//   bits 25..26  the phase: header, data or acknowledgement
//   bits  0..24  the user's tag (0 .. SHOAL_TAG_MAX)
// Every point-to-point message carries one fixed signature (send/recv), so the
// transport's probe for "another call" never flags a send meant for a later
// receive. Messages with one (peer, tag) match in the order they were sent.
//
// One send is three messages: a 16-byte header (count and dtype), the data,
// and an empty acknowledgement back once the receiver checked the header and
// got the data. A receive whose count or dtype differs from the send fails on
// the receiver with text naming both, and aborts the communicator; the sender,
// waiting for its acknowledgement, gets that abort (MISMATCH) instead of OK.
// So a send completes only when its receive has (like MPI_Ssend): two ranks
// that both send first wait for each other until the deadline; post both
// directions in one shoal_sendrecv_many instead.
#include <cstring>
#include <vector>

#include "comm/agree.h"
#include "api/checks.h"
#include "comm/communicator.h"
#include "api/export.h"
#include "api/guard.h"
#include "runtime/engine.h"
#include "collectives/common/reducer.h"

using namespace shoal;

namespace {

constexpr int kUserTagBits = 25;
static_assert(SHOAL_TAG_MAX == (1 << kUserTagBits) - 1, "shoal.h's SHOAL_TAG_MAX is the tag field's range");
enum Phase : uint64_t { kHeader = 0, kData = 1, kAck = 2 };
constexpr uint32_t kHeaderMagic = 0x73703270;  // "p2ps"

struct Header {
  uint64_t count = 0;
  int32_t dtype = -1;
  uint32_t magic = kHeaderMagic;
};

uint64_t p2pTag(uint32_t signature, Phase phase, int userTag) {
  return (uint64_t(signature) << kSignatureShift & kSignatureMask) | kPointToPointBit |
         uint64_t(phase) << kUserTagBits | static_cast<uint64_t>(userTag);
}

std::string describeOp(const shoal_p2p_t& op) {
  return fmt::format("{} x {} {} rank {} (tag {})", op.count, dtypeText(op.dtype),
                     op.kind == SHOAL_P2P_SEND ? "to" : "from", op.peer, op.tag);
}

void checkOp(const char* call, const shoal_comm& c, const shoal_p2p_t& op, int index) {
  const std::string which = index < 0 ? std::string() : fmt::format("ops[{}]: ", index);
  if (op.kind != SHOAL_P2P_SEND && op.kind != SHOAL_P2P_RECV)
    fail(SHOAL_ERR_INVALID_ARGUMENT, "{}: {}kind {} is neither SHOAL_P2P_SEND nor SHOAL_P2P_RECV", call, which,
         static_cast<int>(op.kind));
  if (op.peer < 0 || op.peer >= c.size)
    fail(SHOAL_ERR_INVALID_ARGUMENT, "{}: {}peer {} is not a rank; use 0..{}", call, which, op.peer, c.size - 1);
  if (op.peer == c.rank)
    fail(SHOAL_ERR_INVALID_ARGUMENT, "{}: {}peer {} is this rank; copy the buffer instead of sending it to itself",
         call, which, op.peer);
  if (op.tag < 0 || op.tag > SHOAL_TAG_MAX)
    fail(SHOAL_ERR_INVALID_ARGUMENT, "{}: {}tag {} is out of range; use 0..SHOAL_TAG_MAX ({})", call, which, op.tag,
         SHOAL_TAG_MAX);
  const size_t bytes = checkedByteCount(call, "count", op.count, op.dtype);
  checkBuffer(call, index < 0 ? "buf" : "ops[i].buf", op.buf, bytes);
}

// Posts and completes every operation (checked already), in three rounds so
// that no rank waits for what its peer posts only later: headers and
// outgoing data first, then the incoming data once its header is checked,
// then the acknowledgements.
void exchange(shoal_comm& c, const char* call, const shoal_p2p_t* ops, int n) {
  Transport& transport = *c.transport;
  const Deadline deadline = deadlineAfter(c.timeoutS);
  const uint32_t signature = currentCallWord(c);
  std::vector<Header> outgoing(n), incoming(n);
  std::vector<Transport::Request> headers, later;
  std::vector<int> receives;
  uint8_t ackByte = 0;
  for (int i = 0; i < n; ++i) {
    const shoal_p2p_t& op = ops[i];
    const size_t bytes = op.count * dtypeSize(op.dtype);
    if (op.kind == SHOAL_P2P_SEND) {
      outgoing[i].count = op.count;
      outgoing[i].dtype = op.dtype;
      later.push_back(transport.isend(op.peer, p2pTag(signature, kHeader, op.tag), &outgoing[i], sizeof(Header)));
      later.push_back(transport.isend(op.peer, p2pTag(signature, kData, op.tag), op.buf, bytes));
      later.push_back(transport.irecv(op.peer, p2pTag(signature, kAck, op.tag), &ackByte, 0));
    } else {
      headers.push_back(transport.irecv(op.peer, p2pTag(signature, kHeader, op.tag), &incoming[i], sizeof(Header)));
      receives.push_back(i);
    }
  }
  transport.waitAll(headers.data(), headers.size(), deadline);
  std::vector<Transport::Request> data;
  for (int i : receives) {
    const shoal_p2p_t& op = ops[i];
    const Header& header = incoming[i];
    if (header.magic != kHeaderMagic)
      fail(SHOAL_ERR_MISMATCH, "{}: rank {} sent a malformed header (tag {}): is it running the same shoal?", call,
           op.peer, op.tag);
    if (header.count != op.count || header.dtype != op.dtype)
      fail(SHOAL_ERR_MISMATCH,
           "{}: rank {} sends {} x {} with tag {} but this rank receives {}; the send and its receive must pass the "
           "same count and dtype",
           call, op.peer, header.count, dtypeText(header.dtype), op.tag, describeOp(op));
    data.push_back(transport.irecv(op.peer, p2pTag(signature, kData, op.tag), op.buf, op.count * dtypeSize(op.dtype)));
  }
  transport.waitAll(data.data(), data.size(), deadline);
  for (int i : receives) later.push_back(transport.isend(ops[i].peer, p2pTag(signature, kAck, ops[i].tag), &ackByte, 0));
  transport.waitAll(later.data(), later.size(), deadline);
}

void runPointToPoint(shoal_comm_t comm, const char* call, const shoal_p2p_t* ops, int n, bool single) {
  shoal_comm& c = usableComm(comm, call);
  if (c.engine && c.engine->routesBlockingCalls())
    fail(SHOAL_ERR_INVALID_ARGUMENT,
         "{}: point-to-point calls are not available while the async runtime runs on this communicator (its engine "
         "orders collective calls across all ranks); use a communicator without it",
         call);
  if (n < 0) fail(SHOAL_ERR_INVALID_ARGUMENT, "{}: n is {}; pass n >= 0", call, n);
  if (n > 0 && ops == nullptr) fail(SHOAL_ERR_INVALID_ARGUMENT, "{}: ops is NULL but n is {}", call, n);
  for (int i = 0; i < n; ++i) checkOp(call, c, ops[i], single ? -1 : i);
  if (n == 0) return;
  CallScope scope(c, signatureOf(CallKind::SendRecv, -1, -1, 0));
  try {
    exchange(c, call, ops, n);
    c.transport->checkNotAborted();
  } catch (const Error& error) {
    if (!c.transport->failed()) c.transport->abort(error.what(), error.status());
    throw;
  }
}

}  // namespace

SHOAL_EXPORT shoal_status_t shoal_send(shoal_comm_t comm, const void* buf, size_t count, shoal_dtype_t dtype,
                                       int peer, int tag) {
  return guarded(comm, [&] {
    shoal_p2p_t op{SHOAL_P2P_SEND, peer, tag, const_cast<void*>(buf), count, dtype};
    runPointToPoint(comm, "shoal_send", &op, 1, true);
  });
}

SHOAL_EXPORT shoal_status_t shoal_recv(shoal_comm_t comm, void* buf, size_t count, shoal_dtype_t dtype, int peer,
                                       int tag) {
  return guarded(comm, [&] {
    shoal_p2p_t op{SHOAL_P2P_RECV, peer, tag, buf, count, dtype};
    runPointToPoint(comm, "shoal_recv", &op, 1, true);
  });
}

SHOAL_EXPORT shoal_status_t shoal_sendrecv_many(shoal_comm_t comm, const shoal_p2p_t* ops, int n) {
  return guarded(comm, [&] { runPointToPoint(comm, "shoal_sendrecv_many", ops, n, false); });
}
