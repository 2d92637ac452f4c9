// Routing by memory kind (docs/gpu.md): host tensors take the UCX path, CUDA
// tensors the NCCL transport. A CUDA call first runs one small host round in
// which every rank says whether it can run the call, so a rank that cannot
// (wrong memory kinds, no device, a CPU-only build, a compressor without
// SHOAL_CAP_CUDA) makes the call fail on every rank with its reason, before
// any device work, and the communicator stays usable.
#pragma once

#include <cstdint>
#include <functional>
#include <initializer_list>
#include <string>
#include <vector>

#include "comm/communicator.h"

namespace shoal {

struct MemoryRoute {
  bool cuda = false;      // a tensor is CUDA memory: the call goes to NCCL (or is refused)
  int device = 0;         // of the CUDA tensors
  void* stream = nullptr; // of the first CUDA tensor (the input): work is ordered on it
  std::vector<const void*> data;  // the CUDA tensors' pointers, checked to be device memory
  shoal_status_t refusal = SHOAL_OK;
  std::string why;        // the refusal's text, naming the fix
  const char* call = "";  // the entry point the user called (routeOf's): refusals name it
  // Keeps the first refusal: the most basic one is checked first.
  void refuse(shoal_status_t status, std::string text);
};

// The memory kinds of a call's tensors (refusals recorded, not thrown):
// every kind valid, all of one kind, all CUDA tensors on one device.
MemoryRoute routeOf(const char* call, std::initializer_list<const shoal_tensor_t*> tensors);
MemoryRoute routeOf(const char* call, const std::vector<const shoal_tensor_t*>& tensors);
// Whether this process can run a CUDA call now: built with CUDA and NCCL, a
// device present, the ordinal valid, the communicator's NCCL device, and the
// tensors' pointers really device memory of that device.
void checkCudaReady(shoal_comm& comm, const char* call, MemoryRoute& route);
// The host round before a CUDA call (uses `sequence`): throws on every rank
// when any rank refused (the local reason, or which status another rank
// gave) or when ranks describe the call differently (MISMATCH).
void agreeOnCudaCall(shoal_comm& comm, uint64_t sequence, const std::string& description, const MemoryRoute& route);

// Runs a call's argument checks. For a CUDA call a failed check becomes a
// refusal that every rank hears of through the agreement round (then it is
// thrown here); a host call's failure is thrown at once.
void checkCudaArguments(shoal_comm& comm, uint64_t sequence, MemoryRoute& route, const std::function<void()>& checks);

// The CUDA collectives, after argument checks; each runs agreeOnCudaCall
// first. A failure on the device aborts the communicator (peers are told).
void cudaAllreduce(shoal_comm& comm, uint64_t sequence, const MemoryRoute& route, const void* send, void* recv,
                   size_t count, shoal_dtype_t dtype, shoal_op_t op);
void cudaAllgather(shoal_comm& comm, uint64_t sequence, const MemoryRoute& route, const void* send, void* recv,
                   size_t sendcount, shoal_dtype_t dtype);
void cudaBroadcast(shoal_comm& comm, uint64_t sequence, const MemoryRoute& route, const void* send, void* recv,
                   size_t count, shoal_dtype_t dtype, int root);
// ncclReduceScatter: send holds size x recvcount elements, recv gets block
// rank's reduction (sum, avg, prod, min, max: the entry point refuses the
// bitwise ops before the agreement round).
void cudaReduceScatter(shoal_comm& comm, uint64_t sequence, const MemoryRoute& route, const void* send, void* recv,
                       size_t recvcount, shoal_dtype_t dtype, shoal_op_t op);

// A compressed payload's collective on device memory, inside a call the
// ranks already agreed on (no host round): allreduce in place; allgatherv
// into driver-owned device memory (counts travel over the host transport).
void cudaPayloadAllreduce(shoal_comm& comm, const MemoryRoute& route, void* buffer, size_t count, shoal_dtype_t dtype,
                          shoal_op_t op);
// Returns where the gathered data lies: device memory of slot `slot` that stays
// valid until the next gather into that slot.
const void* cudaPayloadAllgatherv(shoal_comm& comm, const MemoryRoute& route, int slot, const void* send, size_t count,
                                  shoal_dtype_t dtype, std::vector<size_t>& counts, std::vector<size_t>& displs);
// Waits until the work a compressor enqueued on the route's stream (its last
// decode) is done, so a compressed CUDA call returns with its outputs written.
void cudaPayloadsDone(shoal_comm& comm, const MemoryRoute& route);
// Bytes this rank sent over NCCL so far (0 without an NCCL communicator).
uint64_t cudaBytesSent(const shoal_comm& comm);

// What every rank must agree on for a CUDA call: its kind, dtype, count and op
// or root (the description agreeOnCudaCall compares).
std::string describeCudaCall(const char* kind, shoal_dtype_t dtype, size_t count, int opOrRoot);

#if SHOAL_WITH_NCCL
// Runs body on the communicator's NCCL communicator (made by its first CUDA
// call, which every rank makes); a failure aborts the host transport too, so
// peers hear of it. For the CUDA collectives of other files (exchange_route.cc).
void onNccl(shoal_comm& comm, const MemoryRoute& route,
            const std::function<void(nccl::Communicator&, Deadline)>& body);
#endif

}  // namespace shoal
