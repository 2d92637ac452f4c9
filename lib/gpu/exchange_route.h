// The CUDA route of alltoall(v), reduce, gather(v), scatter(v) and
// point-to-point (docs/collectives.md): the tensor entry points of
// lib/api/exchange_api.cc and p2p_api.cc check arguments, then call these for
// CUDA tensors. Each collective first runs route.h's agreement round (every
// rank can run it and describes it alike, else it fails on every rank); the
// per-peer (v) forms then compare every pair's counts over the host transport,
// so a disagreement is SHOAL_ERR_MISMATCH on every rank before NCCL sees
// mismatched sizes (which it would not detect: it would wait or truncate).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "gpu/route.h"

namespace shoal {

// One block per rank of a device buffer, in bytes: bytes[p] at offset[p].
struct DeviceBlocks {
  std::vector<size_t> bytes, offset;
};

// What moves between this rank and each peer in an exchange: `send` blocks
// leave this rank (to rank p), `recv` blocks arrive (from rank p). Empty
// blocks are skipped by both sides.
struct DeviceExchange {
  const char* kind = "";       // "alltoall", "gatherv", ... (descriptions, errors)
  shoal_dtype_t dtype = SHOAL_U8;
  size_t count = 0;            // the uniform count for the description (0 for the v forms)
  int root = -1;
  bool perPeerCounts = false;  // a v form: compare every pair's counts first
  const void* send = nullptr;
  DeviceBlocks sendBlocks;
  void* recv = nullptr;
  DeviceBlocks recvBlocks;
};

// The text of the first pair whose counts disagree, from every rank's
// outgoing byte counts (gathered[p * n + q]: what rank p sends to rank q) and
// this rank's expected incoming counts; "" when all agree. Pure: the routing
// tests call it.
std::string countsDisagreement(int rank, int size, const std::vector<uint64_t>& gathered,
                               const std::vector<size_t>& incoming, size_t element);

// alltoall(v), gather(v) and scatter(v) on CUDA tensors: one group of
// ncclSend/ncclRecv. In place (send blocks overlapping recv) the send side is
// staged in device memory first.
void cudaExchange(shoal_comm& comm, uint64_t sequence, const MemoryRoute& route, const DeviceExchange& exchange);
// Whether ncclReduce and ncclReduceScatter compute op (avg as a sum divided once on the
// device); NCCL has no bitwise reduction.
inline bool ncclReduces(shoal_op_t op) {
  return op == SHOAL_SUM || op == SHOAL_AVG || op == SHOAL_PROD || op == SHOAL_MIN || op == SHOAL_MAX;
}

// ncclReduce to root (sum, avg, prod, min, max; the entry point refuses the
// bitwise ops before the agreement round).
void cudaReduce(shoal_comm& comm, uint64_t sequence, const MemoryRoute& route, const void* send, void* recv,
                size_t count, shoal_dtype_t dtype, shoal_op_t op, int root);

// One CUDA point-to-point operation of shoal_sendrecv_many_tensor, after the
// host exchange of headers (p2p_api.cc) found both sides agree.
struct DevicePeerOp {
  bool send = false;
  int peer = 0;
  void* data = nullptr;
  size_t bytes = 0;
};
// Runs the operations over two-rank NCCL communicators, one per peer (made
// on first use by both ranks, as torch does for send/recv), peers in
// ascending order: every rank meets each pair in one global order, so a group
// of any shape cannot deadlock. Not collective: only the peers take part.
void cudaSendRecv(shoal_comm& comm, const MemoryRoute& route, const std::vector<DevicePeerOp>& ops);

}  // namespace shoal
