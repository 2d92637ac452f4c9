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
//
// A call refused for its arguments fails the communicator: there is no
// agreement round that could tell the peer, which would otherwise wait in the
// matching call until its deadline (refuseFailingTheCommunicator).
#include <algorithm>
#include <cstring>
#include <tuple>
#include <vector>

#include "comm/agree.h"
#include "api/checks.h"
#include "comm/call.h"
#include "comm/communicator.h"
#include "api/export.h"
#include "api/guard.h"
#include "runtime/engine.h"
#include "collectives/common/reducer.h"
#include "gpu/exchange_route.h"

using namespace shoal;

namespace {

constexpr int kUserTagBits = 25;
static_assert(SHOAL_TAG_MAX == (1 << kUserTagBits) - 1, "shoal.h's SHOAL_TAG_MAX is the tag field's range");
enum Phase : uint64_t { kHeader = 0, kData = 1, kAck = 2 };
constexpr uint32_t kHeaderMagic = 0x73703270;      // "p2ps": host memory
constexpr uint32_t kHeaderMagicCuda = 0x63703270;  // "p2pc": CUDA memory (the data travels over NCCL)

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

// The operation array of the grouped forms (a single send or recv passes one).
void checkOps(const char* call, const void* ops, int n) {
  if (n < 0) fail(SHOAL_ERR_INVALID_ARGUMENT, "{}: n is {}; pass n >= 0", call, n);
  if (n > 0 && ops == nullptr) fail(SHOAL_ERR_INVALID_ARGUMENT, "{}: ops is NULL but n is {}", call, n);
}

void checkOp(const char* call, const shoal_comm& c, const shoal_p2p_t& op, int index) {
  const std::string which = index < 0 ? std::string() : fmt::format("ops[{}]: ", index);
  if (op.kind != SHOAL_P2P_SEND && op.kind != SHOAL_P2P_RECV)
    fail(SHOAL_ERR_INVALID_ARGUMENT, "{}: {}kind {} is neither SHOAL_P2P_SEND nor SHOAL_P2P_RECV", call, which,
         static_cast<int>(op.kind));
  checkRank(call, which + "peer", op.peer, c.size);
  if (op.peer == c.rank)
    fail(SHOAL_ERR_INVALID_ARGUMENT, "{}: {}peer {} is this rank; copy the buffer instead of sending it to itself",
         call, which, op.peer);
  if (op.tag < 0 || op.tag > SHOAL_TAG_MAX)
    fail(SHOAL_ERR_INVALID_ARGUMENT, "{}: {}tag {} is out of range; use 0..SHOAL_TAG_MAX ({})", call, which, op.tag,
         SHOAL_TAG_MAX);
  const size_t bytes = checkedByteCount(call, "count", op.count, op.dtype);
  checkBuffer(call, index < 0 ? "buf" : "ops[i].buf", op.buf, bytes);
}

const char* memoryOf(uint32_t magic) { return magic == kHeaderMagicCuda ? "CUDA memory" : "host memory"; }

// A received header against the receive it is for: throws MISMATCH naming both sides.
void checkHeader(const char* call, const shoal_p2p_t& op, const Header& header, uint32_t expected) {
  if (header.magic != kHeaderMagic && header.magic != kHeaderMagicCuda)
    fail(SHOAL_ERR_MISMATCH, "{}: rank {} sent a malformed header (tag {}): is it running the same shoal?", call,
         op.peer, op.tag);
  if (header.magic != expected)
    fail(SHOAL_ERR_MISMATCH,
         "{}: rank {} sends {} with tag {} but this rank receives into {}; pass both in host memory or both in CUDA "
         "memory",
         call, op.peer, memoryOf(header.magic), op.tag, memoryOf(expected));
  if (header.count != op.count || header.dtype != op.dtype)
    fail(SHOAL_ERR_MISMATCH,
         "{}: rank {} sends {} x {} with tag {} but this rank receives {}; the send and its receive must pass the "
         "same count and dtype",
         call, op.peer, header.count, dtypeText(header.dtype), op.tag, describeOp(op));
}

// One call's messages: the tags of its phases, the headers it sends and
// receives, and the requests it waits for last (its sends and their
// acknowledgements). Requests point into it, so it stays where it was made.
struct Exchange {
  Exchange(shoal_comm& c, int n)
      : transport(*c.transport), deadline(deadlineAfter(c.timeoutS)), signature(currentCallWord(c)),
        outgoing(n), incoming(n) {}
  Exchange(const Exchange&) = delete;
  Exchange& operator=(const Exchange&) = delete;

  uint64_t tag(Phase phase, const shoal_p2p_t& op) const { return p2pTag(signature, phase, op.tag); }

  Transport& transport;
  const Deadline deadline;
  const uint32_t signature;
  std::vector<Header> outgoing, incoming;
  std::vector<Transport::Request> later;
  std::vector<int> receives;  // the receives' indices in ops
  uint8_t ackByte = 0;
};

// The first round of both forms: every send's header (its data too when the
// data travels over the host transport: `magic` is kHeaderMagic) and the
// acknowledgement it waits for, then every receive's header, awaited and
// checked against the receive.
void postHeaders(Exchange& x, const char* call, const shoal_p2p_t* ops, int n, uint32_t magic) {
  std::vector<Transport::Request> headers;
  for (int i = 0; i < n; ++i) {
    const shoal_p2p_t& op = ops[i];
    if (op.kind == SHOAL_P2P_SEND) {
      x.outgoing[i] = Header{op.count, static_cast<int32_t>(op.dtype), magic};
      x.later.push_back(x.transport.isend(op.peer, x.tag(kHeader, op), &x.outgoing[i], sizeof(Header)));
      if (magic == kHeaderMagic)
        x.later.push_back(x.transport.isend(op.peer, x.tag(kData, op), op.buf, op.count * dtypeSize(op.dtype)));
      x.later.push_back(x.transport.irecv(op.peer, x.tag(kAck, op), &x.ackByte, 0));
    } else {
      headers.push_back(x.transport.irecv(op.peer, x.tag(kHeader, op), &x.incoming[i], sizeof(Header)));
      x.receives.push_back(i);
    }
  }
  x.transport.waitAll(headers.data(), headers.size(), x.deadline);
  for (int i : x.receives) checkHeader(call, ops[i], x.incoming[i], magic);
}

// The last round: every receive acknowledges its send (host memory: the data
// arrived; CUDA memory: the "go"), then every outstanding request completes.
void acknowledge(Exchange& x, const shoal_p2p_t* ops) {
  for (int i : x.receives) x.later.push_back(x.transport.isend(ops[i].peer, x.tag(kAck, ops[i]), &x.ackByte, 0));
  x.transport.waitAll(x.later.data(), x.later.size(), x.deadline);
}

// Posts and completes every operation (checked already), in three rounds so
// that no rank waits for what its peer posts only later: headers and
// outgoing data first, then the incoming data once its header is checked,
// then the acknowledgements.
void exchange(shoal_comm& c, const char* call, const shoal_p2p_t* ops, int n) {
  Exchange x(c, n);
  postHeaders(x, call, ops, n, kHeaderMagic);
  std::vector<Transport::Request> data;
  for (int i : x.receives)
    data.push_back(x.transport.irecv(ops[i].peer, x.tag(kData, ops[i]), ops[i].buf,
                                     ops[i].count * dtypeSize(ops[i].dtype)));
  x.transport.waitAll(data.data(), data.size(), x.deadline);
  acknowledge(x, ops);
}

// The CUDA form of exchange(): headers and a "go" back from every receiver
// over the host transport (so a count, dtype or memory-kind disagreement
// fails both sides there, before NCCL could wait on mismatched sizes), then
// the data over NCCL. NCCL matches a pair's operations in the order posted,
// the host transport by tag: both sides therefore order a pair's operations
// by tag, then as posted.
void exchangeCuda(shoal_comm& c, const char* call, const MemoryRoute& route, const shoal_p2p_t* ops, int n) {
  {
    Exchange x(c, n);
    postHeaders(x, call, ops, n, kHeaderMagicCuda);
    acknowledge(x, ops);
  }
  std::vector<int> order(n);
  for (int i = 0; i < n; ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) {
    return std::tie(ops[a].peer, ops[a].tag) < std::tie(ops[b].peer, ops[b].tag);
  });
  std::vector<DevicePeerOp> device;
  for (int i : order)
    device.push_back({ops[i].kind == SHOAL_P2P_SEND, ops[i].peer, ops[i].buf, ops[i].count * dtypeSize(ops[i].dtype)});
  cudaSendRecv(c, route, device);
}

// Point-to-point has no agreement round: a peer waiting in the matching call
// would hear of a refusal only at its deadline. So a refused call fails the
// communicator, and the peer's call (any rank's next call) fails at once with
// SHOAL_ERR_REMOTE and this rank's reason; this rank reports the refusal.
template <typename Checks>
void refuseFailingTheCommunicator(shoal_comm& c, Checks&& checks) {
  try {
    checks();
  } catch (const Error& error) {
    failCommunicator(c, fmt::format("rank {} refused its point-to-point call: {}", c.rank, error.what()),
                     error.status());
    throw;
  }
}

// route: the memory of the tensor form's operations (nullptr: host buffers).
void runPointToPoint(shoal_comm_t comm, const char* call, const shoal_p2p_t* ops, int n, bool single,
                     const MemoryRoute* route = nullptr) {
  shoal_comm& c = usableComm(comm, call);
  // Refused on this rank alone, the communicator kept: the runtime runs on
  // every rank of a communicator, so its peers refuse their calls too.
  if (c.engine && c.engine->routesBlockingCalls())
    fail(SHOAL_ERR_INVALID_ARGUMENT,
         "{}: point-to-point calls are not available while the async runtime runs on this communicator (its engine "
         "orders collective calls across all ranks); use a communicator without it",
         call);
  refuseFailingTheCommunicator(c, [&] {
    checkOps(call, ops, n);
    for (int i = 0; i < n; ++i) checkOp(call, c, ops[i], single ? -1 : i);
  });
  if (n == 0) return;
  CallScope scope(c, signatureOf(CallKind::SendRecv, -1, -1, 0));
  try {
    if (route != nullptr && route->cuda) exchangeCuda(c, call, *route, ops, n);
    else exchange(c, call, ops, n);
    c.transport->checkNotAborted();
  } catch (const Error& error) {
    failCommunicator(c, error.what(), error.status());
    throw;
  }
}

// shoal_send and shoal_recv: a group of one.
shoal_status_t sendOrRecv(shoal_comm_t comm, const char* call, shoal_p2p_t op) {
  return guarded(comm, [&] { runPointToPoint(comm, call, &op, 1, true); });
}

}  // namespace

SHOAL_EXPORT shoal_status_t shoal_send(shoal_comm_t comm, const void* buf, size_t count, shoal_dtype_t dtype,
                                       int peer, int tag) {
  return sendOrRecv(comm, "shoal_send", {SHOAL_P2P_SEND, peer, tag, const_cast<void*>(buf), count, dtype});
}

SHOAL_EXPORT shoal_status_t shoal_recv(shoal_comm_t comm, void* buf, size_t count, shoal_dtype_t dtype, int peer,
                                       int tag) {
  return sendOrRecv(comm, "shoal_recv", {SHOAL_P2P_RECV, peer, tag, buf, count, dtype});
}

SHOAL_EXPORT shoal_status_t shoal_sendrecv_many(shoal_comm_t comm, const shoal_p2p_t* ops, int n) {
  return guarded(comm, [&] { runPointToPoint(comm, "shoal_sendrecv_many", ops, n, false); });
}

SHOAL_EXPORT shoal_status_t shoal_sendrecv_many_tensor(shoal_comm_t comm, const shoal_p2p_tensor_t* ops, int n) {
  const char* call = "shoal_sendrecv_many_tensor";
  return guarded(comm, [&] {
    shoal_comm& c = usableComm(comm, call);
    MemoryRoute route;
    std::vector<shoal_p2p_t> plain(n > 0 ? n : 0);
    refuseFailingTheCommunicator(c, [&] {
      checkOps(call, ops, n);
      std::vector<const shoal_tensor_t*> tensors;
      for (int i = 0; i < n; ++i) tensors.push_back(&ops[i].tensor);
      route = routeOf(call, tensors);
      for (int i = 0; i < n; ++i) {
        const size_t count = checkedTensorElements(call, "ops[i].tensor", ops[i].tensor);
        plain[i] = {ops[i].kind, ops[i].peer, ops[i].tag, ops[i].tensor.data, count, ops[i].tensor.dtype};
      }
      checkCudaReady(c, call, route);
      if (route.refusal != SHOAL_OK) fail(route.refusal, "{}", route.why);
    });
    runPointToPoint(comm, call, plain.data(), n, false, &route);
  });
}
