// The NCCL transport (nccl_comm.h): a non-blocking NCCL communicator whose
// every wait is bounded by a deadline.
#include "gpu/nccl/nccl_comm.h"

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <chrono>
#include <cstring>
#include <thread>
#include <vector>

#include "collectives/common/device_reducer.h"
#include "collectives/common/reducer.h"
#include "collectives/common/ring.h"

namespace shoal::nccl {
namespace {

// Makes `device` current for a scope and restores the caller's device after.
class DeviceGuard {
 public:
  explicit DeviceGuard(int device) {
    cudaGetDevice(&previous_);
    if (previous_ != device) check(cudaSetDevice(device), "cudaSetDevice");
    restore_ = previous_ != device;
  }
  ~DeviceGuard() {
    if (restore_) cudaSetDevice(previous_);
  }
  static void check(cudaError_t status, const char* what) {
    if (status != cudaSuccess) fail(SHOAL_ERR_SYSTEM, "{} failed: {}", what, cudaGetErrorString(status));
  }

 private:
  int previous_ = 0;
  bool restore_ = false;
};

ncclDataType_t ncclType(shoal_dtype_t dtype) {
  switch (dtype) {
    case SHOAL_F16: return ncclFloat16;
    case SHOAL_BF16: return ncclBfloat16;
    case SHOAL_F32: return ncclFloat32;
    case SHOAL_F64: return ncclFloat64;
    case SHOAL_I8: return ncclInt8;
    case SHOAL_U8: return ncclUint8;
    case SHOAL_I32: return ncclInt32;
    case SHOAL_U32: return ncclUint32;
    case SHOAL_I64: return ncclInt64;
    case SHOAL_U64: return ncclUint64;
    default: fail(SHOAL_ERR_INVALID_ARGUMENT, "dtype {} has no NCCL type", static_cast<int>(dtype));
  }
}

// Avg is a sum here: the division follows on the device, once, as on the host.
ncclRedOp_t ncclOp(shoal_op_t op) {
  switch (op) {
    case SHOAL_SUM:
    case SHOAL_AVG: return ncclSum;
    case SHOAL_PROD: return ncclProd;
    case SHOAL_MIN: return ncclMin;
    case SHOAL_MAX: return ncclMax;
    default: fail(SHOAL_ERR_INVALID_ARGUMENT, "op {} has no NCCL reduction", shoal_op_name(op));
  }
}

cudaStream_t asStream(void* stream) { return static_cast<cudaStream_t>(stream); }

}  // namespace

bool isNativeAllreduce(shoal_dtype_t dtype, shoal_op_t op) {
  return dtypeSize(dtype) != 0 && (op == SHOAL_SUM || op == SHOAL_AVG || op == SHOAL_PROD || op == SHOAL_MIN ||
                                   op == SHOAL_MAX);
}

struct Communicator::Impl {
  ncclComm_t comm = nullptr;
  int rank = 0, size = 1, device = 0;
  cudaEvent_t done = nullptr;
  struct Buffer {
    void* data = nullptr;
    size_t bytes = 0;
  };
  Buffer scratch;              // the device ring's receive block
  Buffer staging;              // an in-place exchange's send side (staged())
  std::vector<Buffer> gathers;  // gatherSpace() slots
  uint64_t sent = 0;
  std::function<void()> peerCheck;
  std::string failure;

  Impl() = default;
  ~Impl();  // also on a failed create(): nothing leaks

  // Aborts the NCCL communicator and throws: the communicator is unusable after.
  [[noreturn]] void failWith(shoal_status_t status, const std::string& text) {
    if (comm != nullptr) {
      ncclCommAbort(comm);
      comm = nullptr;
    }
    failure = text;
    throw Error(status, text);
  }

  std::string ncclText(ncclResult_t result) const {
    const char* detail = comm != nullptr ? ncclGetLastError(comm) : nullptr;
    return fmt::format("{}{}{}", ncclGetErrorString(result), detail && detail[0] ? ": " : "", detail ? detail : "");
  }

  // One idle moment of a wait: gives up at the deadline or when a peer did.
  void idle(const char* what, Deadline deadline, long polls) {
    if (polls % 1024 == 1023 && peerCheck) {
      try {
        peerCheck();
      } catch (const Error& error) {
        // A peer's MISMATCH stays one here, as it is on the host paths.
        failWith(error.status(), fmt::format("NCCL {}: a peer gave up: {}", what, error.what()));
      }
    }
    if (Clock::now() > deadline)
      failWith(SHOAL_ERR_TIMEOUT,
               fmt::format("NCCL {} did not complete within the deadline (SHOAL_TIMEOUT_S): a peer is dead, late or "
                           "called a different collective; the NCCL communicator was aborted",
                           what));
    if (polls < 256) std::this_thread::yield();
    else std::this_thread::sleep_for(std::chrono::microseconds(50));
  }

  // A call on a non-blocking communicator may return ncclInProgress: the
  // communicator must settle before the next call.
  void settle(ncclResult_t result, const char* what, Deadline deadline) {
    for (long polls = 0; result == ncclInProgress; ++polls) {
      idle(what, deadline, polls);
      if (ncclCommGetAsyncError(comm, &result) != ncclSuccess) break;
    }
    if (result != ncclSuccess)
      failWith(result == ncclRemoteError ? SHOAL_ERR_REMOTE : SHOAL_ERR_SYSTEM,
               fmt::format("NCCL {} failed: {}", what, ncclText(result)));
  }

  // Waits for everything enqueued on stream so far, watching NCCL's async error.
  void complete(cudaStream_t stream, const char* what, Deadline deadline) {
    DeviceGuard::check(cudaEventRecord(done, stream), "cudaEventRecord");
    for (long polls = 0;; ++polls) {
      cudaError_t status = cudaEventQuery(done);
      if (status == cudaSuccess) return;
      if (status != cudaErrorNotReady)
        failWith(SHOAL_ERR_SYSTEM,
                 fmt::format("NCCL {}: the CUDA stream failed: {}", what, cudaGetErrorString(status)));
      ncclResult_t async = ncclSuccess;
      ncclCommGetAsyncError(comm, &async);
      if (async != ncclSuccess && async != ncclInProgress)
        failWith(async == ncclRemoteError ? SHOAL_ERR_REMOTE : SHOAL_ERR_SYSTEM,
                 fmt::format("NCCL {} failed: {}", what, ncclText(async)));
      idle(what, deadline, polls);
    }
  }

  void usable() const {
    if (comm == nullptr)
      fail(SHOAL_ERR_REMOTE, "the NCCL communicator failed earlier and cannot be used; create a new shoal "
                             "communicator. Cause: {}", failure);
  }

  // Device memory on this communicator's device (the current one: callers hold a DeviceGuard).
  static void* grow(Buffer& buffer, size_t bytes, const char* what) {
    if (buffer.bytes < bytes || buffer.data == nullptr) {
      if (buffer.data != nullptr) cudaFree(buffer.data);
      buffer = Buffer{};
      DeviceGuard::check(cudaMalloc(&buffer.data, bytes > 0 ? bytes : 1), what);
      buffer.bytes = bytes;
    }
    return buffer.data;
  }
};

Communicator::Communicator(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

std::unique_ptr<Communicator> Communicator::create(const Options& options) {
  auto impl = std::make_unique<Impl>();
  impl->rank = options.rank;
  impl->size = options.size;
  impl->device = options.device;
  impl->peerCheck = options.peerCheck;
  DeviceGuard guard(options.device);

  ncclUniqueId id;
  if (options.rank == 0) {
    ncclResult_t result = ncclGetUniqueId(&id);
    if (result != ncclSuccess) fail(SHOAL_ERR_SYSTEM, "ncclGetUniqueId failed: {}", ncclGetErrorString(result));
    const auto* bytes = reinterpret_cast<const uint8_t*>(&id);
    options.store->set(options.key, Bytes(bytes, bytes + sizeof id));
  } else {
    Bytes bytes = options.store->get(options.key, options.deadline);
    if (bytes.size() != sizeof id)
      fail(SHOAL_ERR_MISMATCH, "the NCCL unique id under '{}' has {} bytes, not {}: ranks run different NCCL builds",
           options.key, bytes.size(), sizeof id);
    std::memcpy(&id, bytes.data(), sizeof id);
  }

  DeviceGuard::check(cudaEventCreateWithFlags(&impl->done, cudaEventDisableTiming), "cudaEventCreate");
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;  // every wait below is ours, with a deadline
  ncclResult_t result = ncclCommInitRankConfig(&impl->comm, options.size, id, options.rank, &config);
  if (impl->comm == nullptr && result != ncclSuccess)
    fail(SHOAL_ERR_SYSTEM, "ncclCommInitRankConfig failed: {}", ncclGetErrorString(result));
  impl->settle(result, "initialisation (ncclCommInitRankConfig)", options.deadline);
  return std::unique_ptr<Communicator>(new Communicator(std::move(impl)));
}

Communicator::~Communicator() = default;

Communicator::Impl::~Impl() {
  int previous = 0;
  cudaGetDevice(&previous);
  cudaSetDevice(device);
  if (comm != nullptr) {
    // Finalize flushes outstanding work; bounded, then the communicator goes either way.
    ncclResult_t result = ncclCommFinalize(comm);
    Deadline deadline = deadlineAfter(10);
    while (result == ncclInProgress && Clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::microseconds(100));
      ncclCommGetAsyncError(comm, &result);
    }
    if (result == ncclSuccess) ncclCommDestroy(comm);
    else ncclCommAbort(comm);
  }
  if (scratch.data != nullptr) cudaFree(scratch.data);
  if (staging.data != nullptr) cudaFree(staging.data);
  for (Buffer& buffer : gathers)
    if (buffer.data != nullptr) cudaFree(buffer.data);
  if (done != nullptr) cudaEventDestroy(done);
  cudaSetDevice(previous);
}

int Communicator::device() const { return impl_->device; }
bool Communicator::failed() const { return impl_->comm == nullptr; }
const std::string& Communicator::failure() const { return impl_->failure; }

void Communicator::allreduce(const void* send, void* recv, size_t count, shoal_dtype_t dtype, shoal_op_t op,
                             void* stream, Deadline deadline) {
  if (!isNativeAllreduce(dtype, op)) return ringAllreduce(send, recv, count, dtype, op, stream, deadline);
  Impl& m = *impl_;
  m.usable();
  DeviceGuard guard(m.device);
  if (count > 0) {
    m.settle(ncclAllReduce(send, recv, count, ncclType(dtype), ncclOp(op), m.comm, asStream(stream)), "allreduce",
             deadline);
    m.sent += 2 * (count * dtypeSize(dtype)) * (m.size - 1) / m.size;
    cuda::finishOnDevice(recv, count, dtype, op, m.size, stream);
  }
  m.complete(asStream(stream), "allreduce", deadline);
}

void Communicator::synchronize(void* stream, const char* what, Deadline deadline) {
  Impl& m = *impl_;
  m.usable();
  DeviceGuard guard(m.device);
  m.complete(asStream(stream), what, deadline);
}

void Communicator::ringAllreduce(const void* send, void* recv, size_t count, shoal_dtype_t dtype, shoal_op_t op,
                                 void* stream, Deadline deadline) {
  Impl& m = *impl_;
  m.usable();
  DeviceGuard guard(m.device);
  const size_t element = dtypeSize(dtype);
  auto* data = static_cast<uint8_t*>(recv);
  cudaStream_t s = asStream(stream);
  if (send != recv && count > 0)
    DeviceGuard::check(cudaMemcpyAsync(recv, send, count * element, cudaMemcpyDeviceToDevice, s), "cudaMemcpyAsync");
  const int n = m.size, r = m.rank;
  const int left = ring::leftOf(r, n), right = ring::rightOf(r, n);
  auto block = [&](int b) { return ring::blockOf(count, n, b); };
  uint8_t* scratch = n > 1 && count > 0
                         ? static_cast<uint8_t*>(m.grow(m.scratch, block(0).count * element, "cudaMalloc (ring scratch)"))
                         : nullptr;
  // One grouped send/receive per step; zero-length blocks (count < n) are skipped on both sides.
  auto exchange = [&](const uint8_t* sendFrom, size_t sendBytes, uint8_t* receiveInto, size_t receiveBytes) {
    m.settle(ncclGroupStart(), "ring group start", deadline);
    if (sendBytes > 0) m.settle(ncclSend(sendFrom, sendBytes, ncclUint8, right, m.comm, s), "ring send", deadline);
    m.sent += sendBytes;
    if (receiveBytes > 0)
      m.settle(ncclRecv(receiveInto, receiveBytes, ncclUint8, left, m.comm, s), "ring receive", deadline);
    m.settle(ncclGroupEnd(), "ring step", deadline);
  };
  if (count > 0) {
    for (int step = 0; step + 1 < n; ++step) {
      ring::Step at = ring::reduceScatterStep(r, n, step);
      ring::Block out = block(at.sendBlock), in = block(at.receiveBlock);
      exchange(data + out.offset * element, out.count * element, scratch, in.count * element);
      cuda::reduceOnDevice(data + in.offset * element, scratch, in.count, dtype, op, stream);
    }
    ring::Block own = block(r);
    cuda::finishOnDevice(data + own.offset * element, own.count, dtype, op, n, stream);
    for (int step = 0; step + 1 < n; ++step) {
      ring::Step at = ring::allgatherStep(r, n, step);
      ring::Block out = block(at.sendBlock), in = block(at.receiveBlock);
      exchange(data + out.offset * element, out.count * element, data + in.offset * element, in.count * element);
    }
  }
  m.complete(s, "ring allreduce", deadline);
}

void Communicator::allgather(const void* send, void* recv, size_t sendcount, shoal_dtype_t dtype, void* stream,
                             Deadline deadline) {
  Impl& m = *impl_;
  m.usable();
  DeviceGuard guard(m.device);
  if (sendcount > 0)
    m.settle(ncclAllGather(send, recv, sendcount, ncclType(dtype), m.comm, asStream(stream)), "allgather", deadline);
  m.sent += sendcount * dtypeSize(dtype) * (m.size - 1);
  m.complete(asStream(stream), "allgather", deadline);
}

void Communicator::allgatherv(const void* send, void* recv, const size_t* counts, const size_t* displs,
                              shoal_dtype_t dtype, void* stream, Deadline deadline) {
  Impl& m = *impl_;
  m.usable();
  DeviceGuard guard(m.device);
  const size_t element = dtypeSize(dtype);
  cudaStream_t s = asStream(stream);
  auto* out = static_cast<uint8_t*>(recv);
  const size_t mine = counts[m.rank] * element;
  if (mine > 0 && send != out + displs[m.rank] * element)
    DeviceGuard::check(cudaMemcpyAsync(out + displs[m.rank] * element, send, mine, cudaMemcpyDeviceToDevice, s),
                       "cudaMemcpyAsync");
  // Every rank sends its block to every other and receives theirs in place, in one group.
  m.settle(ncclGroupStart(), "allgatherv group start", deadline);
  for (int peer = 0; peer < m.size; ++peer) {
    if (peer == m.rank) continue;
    if (mine > 0) m.settle(ncclSend(send, mine, ncclUint8, peer, m.comm, s), "allgatherv send", deadline);
    m.sent += mine;
    if (counts[peer] > 0)
      m.settle(ncclRecv(out + displs[peer] * element, counts[peer] * element, ncclUint8, peer, m.comm, s),
               "allgatherv receive", deadline);
  }
  m.settle(ncclGroupEnd(), "allgatherv", deadline);
  m.complete(s, "allgatherv", deadline);
}

void Communicator::broadcast(const void* send, void* recv, size_t count, shoal_dtype_t dtype, int root, void* stream,
                             Deadline deadline) {
  Impl& m = *impl_;
  m.usable();
  DeviceGuard guard(m.device);
  if (count > 0)
    m.settle(ncclBroadcast(send, recv, count, ncclType(dtype), root, m.comm, asStream(stream)), "broadcast", deadline);
  if (m.rank != (root + m.size - 1) % m.size) m.sent += count * dtypeSize(dtype);  // a chain: all but its end send
  m.complete(asStream(stream), "broadcast", deadline);
}

void Communicator::reduceScatter(const void* send, void* recv, size_t recvcount, shoal_dtype_t dtype, shoal_op_t op,
                                 void* stream, Deadline deadline) {
  Impl& m = *impl_;
  m.usable();
  if (!isNativeAllreduce(dtype, op))
    fail(SHOAL_ERR_UNSUPPORTED, "NCCL reduce-scatter takes sum, avg, prod, min and max; {} needs the allreduce",
         shoal_op_name(op));
  DeviceGuard guard(m.device);
  if (recvcount > 0) {
    m.settle(ncclReduceScatter(send, recv, recvcount, ncclType(dtype), ncclOp(op), m.comm, asStream(stream)),
             "reduce-scatter", deadline);
    m.sent += recvcount * dtypeSize(dtype) * (m.size - 1);
    cuda::finishOnDevice(recv, recvcount, dtype, op, m.size, stream);
  }
  m.complete(asStream(stream), "reduce-scatter", deadline);
}

void Communicator::reduce(const void* send, void* recv, size_t count, shoal_dtype_t dtype, shoal_op_t op, int root,
                          void* stream, Deadline deadline) {
  Impl& m = *impl_;
  m.usable();
  if (!isNativeAllreduce(dtype, op))
    fail(SHOAL_ERR_UNSUPPORTED, "NCCL reduce takes sum, avg, prod, min and max, not {}", shoal_op_name(op));
  DeviceGuard guard(m.device);
  if (count > 0) {
    // recv matters on root only; NCCL ignores it elsewhere.
    m.settle(ncclReduce(send, m.rank == root ? recv : nullptr, count, ncclType(dtype), ncclOp(op), root, m.comm,
                        asStream(stream)),
             "reduce", deadline);
    if (m.rank != root) m.sent += count * dtypeSize(dtype);  // what a tree moves up: one block per non-root rank
    if (m.rank == root) cuda::finishOnDevice(recv, count, dtype, op, m.size, stream);
  }
  m.complete(asStream(stream), "reduce", deadline);
}

void Communicator::exchange(const void* send, const size_t* sendBytes, const size_t* sendOffset, void* recv,
                            const size_t* recvBytes, const size_t* recvOffset, void* stream, const char* what,
                            Deadline deadline) {
  Impl& m = *impl_;
  m.usable();
  DeviceGuard guard(m.device);
  cudaStream_t s = asStream(stream);
  const auto* in = static_cast<const uint8_t*>(send);
  auto* out = static_cast<uint8_t*>(recv);
  if (sendBytes[m.rank] != recvBytes[m.rank])
    fail(SHOAL_ERR_INTERNAL, "NCCL {}: this rank's block to itself has {} bytes out and {} in", what,
         sendBytes[m.rank], recvBytes[m.rank]);
  if (sendBytes[m.rank] > 0 && in + sendOffset[m.rank] != out + recvOffset[m.rank])
    DeviceGuard::check(cudaMemcpyAsync(out + recvOffset[m.rank], in + sendOffset[m.rank], sendBytes[m.rank],
                                       cudaMemcpyDeviceToDevice, s),
                       "cudaMemcpyAsync");
  m.settle(ncclGroupStart(), what, deadline);
  for (int peer = 0; peer < m.size; ++peer) {
    if (peer == m.rank) continue;
    if (sendBytes[peer] > 0) {
      m.settle(ncclSend(in + sendOffset[peer], sendBytes[peer], ncclUint8, peer, m.comm, s), what, deadline);
      m.sent += sendBytes[peer];
    }
    if (recvBytes[peer] > 0)
      m.settle(ncclRecv(out + recvOffset[peer], recvBytes[peer], ncclUint8, peer, m.comm, s), what, deadline);
  }
  m.settle(ncclGroupEnd(), what, deadline);
  m.complete(s, what, deadline);
}

void Communicator::sendRecv(int peer, const PeerOp* ops, size_t n, void* stream, Deadline deadline) {
  Impl& m = *impl_;
  m.usable();
  DeviceGuard guard(m.device);
  cudaStream_t s = asStream(stream);
  m.settle(ncclGroupStart(), "send/recv", deadline);
  for (size_t i = 0; i < n; ++i) {
    if (ops[i].bytes == 0) continue;
    if (ops[i].send) {
      m.settle(ncclSend(ops[i].data, ops[i].bytes, ncclUint8, peer, m.comm, s), "send", deadline);
      m.sent += ops[i].bytes;
    } else {
      m.settle(ncclRecv(ops[i].data, ops[i].bytes, ncclUint8, peer, m.comm, s), "receive", deadline);
    }
  }
  m.settle(ncclGroupEnd(), "send/recv", deadline);
  m.complete(s, "send/recv", deadline);
}

const void* Communicator::staged(const void* from, size_t bytes, void* stream) {
  Impl& m = *impl_;
  m.usable();
  DeviceGuard guard(m.device);
  void* staging = m.grow(m.staging, bytes, "cudaMalloc (staging)");
  if (bytes > 0)
    DeviceGuard::check(cudaMemcpyAsync(staging, from, bytes, cudaMemcpyDeviceToDevice, asStream(stream)),
                       "cudaMemcpyAsync");
  return staging;
}

void* Communicator::gatherSpace(int slot, size_t bytes) {
  Impl& m = *impl_;
  DeviceGuard guard(m.device);
  if (m.gathers.size() <= static_cast<size_t>(slot)) m.gathers.resize(slot + 1);
  return m.grow(m.gathers[slot], bytes, "cudaMalloc (gather space)");
}

uint64_t Communicator::bytesSent() const { return impl_->sent; }

}  // namespace shoal::nccl
