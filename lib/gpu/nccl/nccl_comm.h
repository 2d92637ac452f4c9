// The NCCL transport: one NCCL communicator per shoal communicator, created on
// its first call with CUDA tensors. Plain C++ (no NCCL or CUDA headers): the
// rest of shoal includes it under #if SHOAL_WITH_NCCL.
//
// Every call enqueues on the caller's stream (cudaStream_t as void*, nullptr =
// the default stream) and then waits, polling the stream and NCCL's
// asynchronous error, until the work is done or the deadline passes. The NCCL
// communicator is non-blocking (ncclConfig_t.blocking = 0), so a dead or late
// peer never hangs a call: on an error or the deadline the communicator is
// aborted (ncclCommAbort), the call throws shoal::Error, and the Communicator
// is failed for good (the caller aborts the host transport too, so peers see
// the error promptly).
#pragma once

#include <cstddef>
#include <functional>
#include <memory>
#include <string>

#include "bootstrap/store.h"
#include "core/error.h"
#include "shoal/shoal.h"

namespace shoal::nccl {

struct Options {
  Store* store = nullptr;       // rank 0 publishes the NCCL unique id here
  std::string key;              // ... under this key (include a generation: ids are single-use)
  int rank = 0;
  int size = 1;
  int device = 0;               // CUDA ordinal this rank's NCCL communicator uses
  Deadline deadline;            // for the id and the initialisation
  // Called now and then while waiting: throws when the host transport has
  // learnt that a peer gave up, so this rank gives up too instead of waiting.
  std::function<void()> peerCheck;
};

class Communicator {
 public:
  // Fetches or publishes the unique id and initialises; throws on error or deadline.
  static std::unique_ptr<Communicator> create(const Options& options);
  ~Communicator();
  Communicator(const Communicator&) = delete;
  Communicator& operator=(const Communicator&) = delete;

  int device() const;
  bool failed() const;
  const std::string& failure() const;

  // Allreduce of device buffers (send may equal recv). NCCL's own allreduce
  // for sum/prod/min/max (avg: sum, then one division on the device, as the
  // host reducer does); shoal's ring over ncclSend/ncclRecv for the bitwise ops.
  void allreduce(const void* send, void* recv, size_t count, shoal_dtype_t dtype, shoal_op_t op, void* stream,
                 Deadline deadline);
  // shoal's own ring (ringSchedule.h) over grouped ncclSend/ncclRecv and the
  // device reducer: any (dtype, op) the host Reducer takes.
  void ringAllreduce(const void* send, void* recv, size_t count, shoal_dtype_t dtype, shoal_op_t op, void* stream,
                     Deadline deadline);
  // recv holds size * sendcount elements, rank r's at r * sendcount.
  void allgather(const void* send, void* recv, size_t sendcount, shoal_dtype_t dtype, void* stream,
                 Deadline deadline);
  // Rank r's counts[r] elements land at recv + displs[r] (grouped send/recv).
  void allgatherv(const void* send, void* recv, const size_t* counts, const size_t* displs, shoal_dtype_t dtype,
                  void* stream, Deadline deadline);
  void broadcast(const void* send, void* recv, size_t count, shoal_dtype_t dtype, int root, void* stream,
                 Deadline deadline);
  // send holds size * recvcount elements; rank r gets the reduction of block r.
  void reduceScatter(const void* send, void* recv, size_t recvcount, shoal_dtype_t dtype, shoal_op_t op,
                     void* stream, Deadline deadline);

  // Root's recv gets the reduction of every rank's send (ncclReduce; avg is a
  // sum divided once on root). Sum, avg, prod, min and max only: NCCL has no
  // bitwise reduction. recv is written on root only.
  void reduce(const void* send, void* recv, size_t count, shoal_dtype_t dtype, shoal_op_t op, int root, void* stream,
              Deadline deadline);
  // One group of ncclSend/ncclRecv (alltoall(v), gather(v) and scatter(v) are
  // patterns of it, as in nccl-tests and torch): sendBytes[p] bytes at
  // send + sendOffset[p] go to rank p, recvBytes[p] bytes from rank p land at
  // recv + recvOffset[p]. Empty blocks are skipped (both sides know them:
  // the caller checked the counts agree); the own block is copied on the
  // device. Blocks of send and recv must not overlap (see staging()).
  void exchange(const void* send, const size_t* sendBytes, const size_t* sendOffset, void* recv,
                const size_t* recvBytes, const size_t* recvOffset, void* stream, const char* what, Deadline deadline);
  // Point-to-point inside one group: every send goes to and every receive
  // comes from `peer` (a rank of this communicator). Used on the two-rank
  // communicators of shoal_sendrecv_many_tensor.
  struct PeerOp {
    bool send = false;
    void* data = nullptr;
    size_t bytes = 0;
  };
  void sendRecv(int peer, const PeerOp* ops, size_t n, void* stream, Deadline deadline);
  // Device memory for staging an in-place exchange's send side, copied from
  // `from` on the stream; valid until the next call.
  const void* staged(const void* from, size_t bytes, void* stream);

  // Waits for everything enqueued on stream so far (a compressor's last
  // kernels), watching NCCL's async error, within the deadline.
  void synchronize(void* stream, const char* what, Deadline deadline);

  // Device memory on this communicator's device that lives as long as it,
  // one buffer per slot (the driver's gathered payloads): grows, never shrinks.
  void* gatherSpace(int slot, size_t bytes);
  // Bytes this rank has sent: exact for shoal's own ring and allgatherv; for
  // NCCL's collectives what a ring moves (NCCL's own choice is not visible).
  uint64_t bytesSent() const;

 private:
  struct Impl;
  explicit Communicator(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// True when ncclAllReduce computes (dtype, op) itself (avg via sum + device division).
bool isNativeAllreduce(shoal_dtype_t dtype, shoal_op_t op);

}  // namespace shoal::nccl
