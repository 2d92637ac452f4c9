// Entry points of the exchanging and rooted collectives: alltoall(v), reduce,
// gather(v), scatter(v). Like collectives.h, each works on host buffers
// through a Context; byte counts and offsets are already checked by the C
// API (lib/api/exchange_api.cc).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "collectives/common/context.h"
#include "collectives/common/reducer.h"

namespace shoal {

// One block of a rank's buffer per peer: bytes[p] at offset[p].
struct PeerBlocks {
  const size_t* bytes;
  const size_t* offset;
};

// Pairwise exchange: in step k (1..n-1) rank r sends its block for r+k and
// receives the block of r-k, so every step is a permutation and no rank
// receives from two peers at once. The own block is copied. send and recv
// must not overlap (the C API stages the in-place form).
void alltoallvPairwise(Context& context, const uint8_t* send, PeerBlocks sendBlocks, uint8_t* recv,
                       PeerBlocks recvBlocks);
// Bruck's algorithm (alltoall/bruck.cc): ceil(log2 n) rounds for blocks of one
// size (every bytes[p] equal; anything else is an internal error). The same
// contract as pairwise otherwise; recv is its work buffer.
void alltoallBruck(Context& context, const uint8_t* send, PeerBlocks sendBlocks, uint8_t* recv,
                   PeerBlocks recvBlocks);

// The alltoall algorithm table (alltoall/algos.cc), as allreduce has one.
struct AlltoallAlgorithm {
  const char* name;
  const char* description;
  void (*run)(Context& context, const uint8_t* send, PeerBlocks sendBlocks, uint8_t* recv, PeerBlocks recvBlocks);
  bool uniformOnly;  // takes blocks of one size only (alltoall, not alltoallv)
};
const std::vector<AlltoallAlgorithm>& alltoallAlgorithms();
// The algorithm for the communicator's SHOAL_ALGO value `name` and a send
// buffer of `bytesPerRank`: for blocks of one size (`uniform`), bruck where it
// says bruck, or under auto for small buffers; else pairwise.
const AlltoallAlgorithm& selectAlltoall(const std::string& name, bool uniform, size_t bytesPerRank);

// Binomial-tree reduce to root: recv (significant on root only) gets the
// reduction of every rank's send, avg divided on root. send may equal recv on
// root (in place).
void reduceTree(Context& context, const void* send, void* recv, size_t count, const Reducer& reducer, int root);

// Root receives every other rank's block into recv at recvBlocks (its own
// block is copied by the caller); the others send `bytes` from send.
void gatherLinear(Context& context, const void* send, size_t bytes, uint8_t* recv, PeerBlocks recvBlocks, int root);
// Root sends block p of send to rank p (its own is copied by the caller); the
// others receive `bytes` into recv.
void scatterLinear(Context& context, const uint8_t* send, PeerBlocks sendBlocks, void* recv, size_t bytes, int root);

}  // namespace shoal
