// The CUDA route of alltoall(v), reduce, gather(v), scatter(v) and
// point-to-point over NCCL (exchange_route.h). Compiled in every build:
// without NCCL the agreement round refuses every call on every rank
// (checkCudaReady said why) before anything here touches a device.
#include "gpu/exchange_route.h"

#include <algorithm>
#include <cstring>

#include "comm/agree.h"
#include "comm/call.h"
#include "comm/host_ops.h"

#if SHOAL_WITH_NCCL
#include "gpu/nccl/nccl_comm.h"
#endif

namespace shoal {

std::string countsDisagreement(int rank, int size, const std::vector<uint64_t>& gathered,
                               const std::vector<size_t>& incoming, size_t element) {
  for (int p = 0; p < size; ++p) {
    const uint64_t sent = gathered[static_cast<size_t>(p) * size + rank];
    if (sent != incoming[p])
      return fmt::format("rank {} sends {} elements to rank {}, which expects {} from it; every rank's receive "
                         "count from a peer must equal that peer's send count to it",
                         p, sent / element, rank, incoming[p] / element);
  }
  return "";
}

namespace {

// The v forms' count check after the agreement round: every rank's outgoing
// byte counts reach every rank (one host allgather), each compares what its
// peers send it with what it expects, and one more agreement round turns any
// rank's disagreement into SHOAL_ERR_MISMATCH on every rank.
void agreeOnCounts(shoal_comm& comm, const DeviceExchange& exchange) {
  CallSignature round;
  round.kind = CallKind::Other;
  round.algorithm = "cuda-count-agreement";
  CallScope scope(comm, round);
  std::vector<uint64_t> outgoing(comm.size);
  for (int p = 0; p < comm.size; ++p) outgoing[p] = exchange.sendBlocks.bytes[p];
  std::vector<uint8_t> gathered;
  std::vector<size_t> counts, displs;
  allgathervBytes(comm, outgoing.data(), outgoing.size(), SHOAL_U64, gathered, counts, displs);
  std::vector<uint64_t> all(static_cast<size_t>(comm.size) * comm.size);
  if (gathered.size() != all.size() * sizeof(uint64_t))
    fail(SHOAL_ERR_INTERNAL, "{}: the count exchange gathered {} bytes, not {}", exchange.kind, gathered.size(),
         all.size() * sizeof(uint64_t));
  std::memcpy(all.data(), gathered.data(), gathered.size());
  const std::string why = countsDisagreement(comm.rank, comm.size, all, exchange.recvBlocks.bytes,
                                             dtypeSize(exchange.dtype));
  Agreement agreement = agree(comm, takeSequence(comm), "cuda-counts", why.empty() ? SHOAL_OK : SHOAL_ERR_MISMATCH);
  if (!why.empty()) fail(SHOAL_ERR_MISMATCH, "{} on CUDA tensors: {}", exchange.kind, why);
  if (agreement.refusal != SHOAL_OK)
    fail(SHOAL_ERR_MISMATCH, "{} on CUDA tensors: the counts of another pair of ranks disagree (that receiving "
         "rank's error names them); every rank's receive count from a peer must equal that peer's send count to it",
         exchange.kind);
}

}  // namespace

#if SHOAL_WITH_NCCL

namespace {

// Whether [a, a + na) and [b, b + nb) share a byte (device addresses compare as numbers).
bool overlaps(const void* a, size_t na, const void* b, size_t nb) {
  if (na == 0 || nb == 0) return false;
  auto x = reinterpret_cast<uintptr_t>(a), y = reinterpret_cast<uintptr_t>(b);
  return x < y + nb && y < x + na;
}

size_t extent(const DeviceBlocks& blocks) {
  size_t end = 0;
  for (size_t p = 0; p < blocks.bytes.size(); ++p)
    if (blocks.bytes[p] > 0) end = std::max(end, blocks.offset[p] + blocks.bytes[p]);
  return end;
}

}  // namespace

void cudaExchange(shoal_comm& comm, uint64_t sequence, const MemoryRoute& route, const DeviceExchange& exchange) {
  agreeOnCudaCall(comm, sequence,
                  describeCudaCall(exchange.kind, exchange.dtype, exchange.count, exchange.root), route);
  if (exchange.perPeerCounts) agreeOnCounts(comm, exchange);
  onNccl(comm, route, [&](nccl::Communicator& nc, Deadline deadline) {
    const void* send = exchange.send;
    const size_t sendEnd = extent(exchange.sendBlocks);
    // In place: every peer's block is read before any is written only in
    // staging memory (NCCL runs a group's operations concurrently).
    if (overlaps(send, sendEnd, exchange.recv, extent(exchange.recvBlocks)))
      send = nc.staged(send, sendEnd, route.stream);
    nc.exchange(send, exchange.sendBlocks.bytes.data(), exchange.sendBlocks.offset.data(), exchange.recv,
                exchange.recvBlocks.bytes.data(), exchange.recvBlocks.offset.data(), route.stream, exchange.kind,
                deadline);
  });
}

void cudaReduce(shoal_comm& comm, uint64_t sequence, const MemoryRoute& route, const void* send, void* recv,
                size_t count, shoal_dtype_t dtype, shoal_op_t op, int root) {
  agreeOnCudaCall(comm, sequence, describeCudaCall("reduce", dtype, count, op * 1024 + root), route);
  onNccl(comm, route, [&](nccl::Communicator& nc, Deadline deadline) {
    nc.reduce(send, recv, count, dtype, op, root, route.stream, deadline);
  });
}

namespace {

// The two-rank NCCL communicator shared with `peer`, made by both on first
// use: the lower rank publishes the unique id.
nccl::Communicator& peerCommunicator(shoal_comm& comm, int peer, int device, Deadline deadline) {
  auto found = comm.ncclPeers.find(peer);
  if (found != comm.ncclPeers.end()) {
    if (found->second->device() != device)
      fail(SHOAL_ERR_INVALID_ARGUMENT,
           "CUDA point-to-point with rank {} runs on device {} (its first call); tensors on device {} need a "
           "communicator of their own",
           peer, found->second->device(), device);
    return *found->second;
  }
  const int low = std::min(comm.rank, peer), high = std::max(comm.rank, peer);
  nccl::Options options;
  options.store = comm.store.get();
  options.key = fmt::format("{}nccl/peers/{}-{}/id", comm.keyPrefix, low, high);
  options.rank = comm.rank == low ? 0 : 1;
  options.size = 2;
  options.device = device;
  options.deadline = deadline;
  options.peerCheck = [&comm] { comm.transport->checkNotAborted(); };
  auto made = nccl::Communicator::create(options);
  return *(comm.ncclPeers[peer] = std::unique_ptr<nccl::Communicator, NcclRelease>(made.release()));
}

}  // namespace

void cudaSendRecv(shoal_comm& comm, const MemoryRoute& route, const std::vector<DevicePeerOp>& ops) {
  std::vector<int> peers;
  for (const DevicePeerOp& op : ops) peers.push_back(op.peer);
  std::sort(peers.begin(), peers.end());
  peers.erase(std::unique(peers.begin(), peers.end()), peers.end());
  const Deadline deadline = deadlineAfter(comm.timeoutS);
  try {
    for (int peer : peers) {
      // The caller orders ops so that both sides list a pair's matching
      // operations alike (by tag, then as posted): NCCL matches in order.
      std::vector<nccl::Communicator::PeerOp> mine;
      for (const DevicePeerOp& op : ops)
        if (op.peer == peer) mine.push_back({op.send, op.data, op.bytes});
      nccl::Communicator& pair = peerCommunicator(comm, peer, route.device, deadline);
      pair.sendRecv(comm.rank < peer ? 1 : 0, mine.data(), mine.size(), route.stream, deadline);
    }
  } catch (const Error& error) {
    failCommunicator(comm, error.what(), error.status());
    throw;
  }
}

#else  // without NCCL, agreeOnCudaCall always throws (checkCudaReady refused)

namespace {
[[noreturn]] void unreachable() { fail(SHOAL_ERR_INTERNAL, "a CUDA collective ran in a build without NCCL"); }
}  // namespace

void cudaExchange(shoal_comm& comm, uint64_t sequence, const MemoryRoute& route, const DeviceExchange& exchange) {
  agreeOnCudaCall(comm, sequence,
                  describeCudaCall(exchange.kind, exchange.dtype, exchange.count, exchange.root), route);
  if (exchange.perPeerCounts) agreeOnCounts(comm, exchange);
  unreachable();
}

void cudaReduce(shoal_comm& comm, uint64_t sequence, const MemoryRoute& route, const void*, void*, size_t count,
                shoal_dtype_t dtype, shoal_op_t op, int root) {
  agreeOnCudaCall(comm, sequence, describeCudaCall("reduce", dtype, count, op * 1024 + root), route);
  unreachable();
}

void cudaSendRecv(shoal_comm&, const MemoryRoute& route, const std::vector<DevicePeerOp>&) {
  // Point-to-point has no agreement round: the refusal is this rank's, and
  // its peer learns of it through the host header exchange (p2p_api.cc).
  fail(route.refusal != SHOAL_OK ? route.refusal : SHOAL_ERR_INTERNAL, "{}",
       route.why.empty() ? "a CUDA point-to-point call ran in a build without NCCL" : route.why);
}
#endif

}  // namespace shoal
