// Routing by memory kind and the CUDA collectives over the NCCL transport
// (cuda_route.h). Compiled in every build: without NCCL every CUDA call is
// refused on every rank with the reason.
#include "gpu/route.h"

#include <cstring>

#include "comm/call.h"
#include "comm/host_ops.h"
#include "collectives/collectives.h"

#if SHOAL_WITH_CUDA
#include <cuda_runtime_api.h>

#include "gpu/cuda/device.h"
#endif
#if SHOAL_WITH_NCCL
#include "gpu/nccl/nccl_comm.h"
#endif

namespace shoal {

#if SHOAL_WITH_NCCL
void NcclRelease::operator()(nccl::Communicator* communicator) const { delete communicator; }
uint64_t cudaBytesSent(const shoal_comm& comm) { return comm.nccl ? comm.nccl->bytesSent() : 0; }
#else
void NcclRelease::operator()(nccl::Communicator*) const {}
uint64_t cudaBytesSent(const shoal_comm&) { return 0; }
#endif

void MemoryRoute::refuse(shoal_status_t status, std::string text) {
  if (refusal != SHOAL_OK) return;
  refusal = status;
  why = std::move(text);
}

namespace {

// Either overload's list, without copying it (every host allreduce asks twice).
template <typename Tensors>
MemoryRoute routeOfTensors(const char* call, const Tensors& tensors) {
  MemoryRoute route;
  route.call = call;
  bool host = false;
  for (const shoal_tensor_t* tensor : tensors) {
    // Read as the int a C caller may have stored: a value outside the enum is
    // undefined behaviour to load as shoal_memory_t in C++ (UBSan: enum).
    int memory = 0;
    static_assert(sizeof memory == sizeof tensor->memory);
    std::memcpy(&memory, &tensor->memory, sizeof memory);
    if (memory == SHOAL_MEMORY_HOST) {
      host = true;
    } else if (memory == SHOAL_MEMORY_CUDA) {
      if (!route.cuda) {
        route.device = tensor->device;
        route.stream = tensor->stream;
      }
      if (tensor->data != nullptr) route.data.push_back(tensor->data);
      if (route.cuda && tensor->device != route.device) {
        route.refuse(SHOAL_ERR_INVALID_ARGUMENT,
                     fmt::format("{}: the tensors are on CUDA devices {} and {}; put input and output on one device",
                                 call, route.device, tensor->device));
      }
      route.cuda = true;
    } else {
      // Counted as a CUDA call so that every rank hears of it (a host call has no agreement round).
      route.cuda = true;
      route.refuse(SHOAL_ERR_INVALID_ARGUMENT,
                   fmt::format("{}: memory {} is not a shoal_memory_t; use SHOAL_MEMORY_HOST or SHOAL_MEMORY_CUDA",
                               call, memory));
    }
  }
  if (route.cuda && host)
    route.refuse(SHOAL_ERR_INVALID_ARGUMENT,
                 fmt::format("{}: input and output are of different memory kinds (host and CUDA); shoal does not copy "
                             "between them: pass both in host memory or both in CUDA memory",
                             call));
  return route;
}

}  // namespace

MemoryRoute routeOf(const char* call, std::initializer_list<const shoal_tensor_t*> tensors) {
  return routeOfTensors(call, tensors);
}

MemoryRoute routeOf(const char* call, const std::vector<const shoal_tensor_t*>& tensors) {
  return routeOfTensors(call, tensors);
}

void checkCudaReady(shoal_comm& comm, const char* call, MemoryRoute& route) {
  if (!route.cuda || route.refusal != SHOAL_OK) return;
#if !SHOAL_WITH_CUDA
  (void)comm;
  route.refuse(SHOAL_ERR_UNSUPPORTED,
               fmt::format("{}: CUDA tensors need a CUDA-enabled build; this libshoal was built without CUDA "
                           "(configure with -DSHOAL_WITH_CUDA=ON where nvcc is installed) or pass host tensors",
                           call));
#elif !SHOAL_WITH_NCCL
  (void)comm;
  route.refuse(SHOAL_ERR_UNSUPPORTED,
               fmt::format("{}: CUDA tensors travel over NCCL, and this libshoal was built without it (install NCCL, "
                           "set NCCL_HOME, configure with -DSHOAL_WITH_NCCL=ON) or pass host tensors",
                           call));
#else
  std::string why;
  int devices = cuda::deviceCount(&why);
  if (devices == 0)
    return route.refuse(SHOAL_ERR_UNSUPPORTED,
                        fmt::format("{}: CUDA tensors but no CUDA device is usable by this process ({}); check the "
                                    "driver and CUDA_VISIBLE_DEVICES, or pass host tensors",
                                    call, why));
  if (route.device < 0 || route.device >= devices)
    return route.refuse(SHOAL_ERR_INVALID_ARGUMENT,
                        fmt::format("{}: tensor device {} is not a CUDA device of this process; use 0..{}", call,
                                    route.device, devices - 1));
  if (comm.nccl && comm.nccl->device() != route.device)
    return route.refuse(SHOAL_ERR_INVALID_ARGUMENT,
                        fmt::format("{}: this communicator runs NCCL on device {} (its first CUDA call); tensors on "
                                    "device {} need a communicator of their own",
                                    call, comm.nccl->device(), route.device));
  // A host pointer labelled CUDA would reach NCCL and fail there, on this
  // rank only: refuse it here, where every rank hears of it.
  for (const void* pointer : route.data) {
    cudaPointerAttributes attributes{};
    cudaError_t status = cudaPointerGetAttributes(&attributes, pointer);
    if (status != cudaSuccess) cudaGetLastError();  // not sticky: clear it
    bool device = status == cudaSuccess &&
                  (attributes.type == cudaMemoryTypeDevice || attributes.type == cudaMemoryTypeManaged);
    if (!device || attributes.device != route.device)
      return route.refuse(
          SHOAL_ERR_INVALID_ARGUMENT,
          fmt::format("{}: tensor data {} is {}, not CUDA memory of device {}: pass memory from cudaMalloc on that "
                      "device, or describe host memory as SHOAL_MEMORY_HOST",
                      call, pointer,
                      !device ? "host memory (or unknown to CUDA)" : fmt::format("on device {}", attributes.device),
                      route.device));
  }
#endif
}

std::string describeCudaCall(const char* kind, shoal_dtype_t dtype, size_t count, int opOrRoot) {
  return fmt::format("{}|{}|{}|{}", kind, static_cast<int>(dtype), count, opOrRoot);
}

namespace {
std::string describeCall(const char* kind, shoal_dtype_t dtype, size_t count, int opOrRoot) {
  return describeCudaCall(kind, dtype, count, opOrRoot);
}
}  // namespace

void agreeOnCudaCall(shoal_comm& comm, uint64_t sequence, const std::string& description, const MemoryRoute& route) {
  // This round compares the calls itself and must meet every rank's, the
  // refusing ones' too (whose arguments may be anything): one fixed signature.
  CallSignature round;
  round.kind = CallKind::Other;
  round.algorithm = "cuda-route-agreement";
  CallScope scope(comm, round);
  Agreement agreement;
  try {
    agreement = agree(comm, sequence, description, route.refusal);
  } catch (const Error& error) {
    // Peers that made a host call meet this round as a mismatch: this rank's own reason says more.
    if (route.refusal != SHOAL_OK)
      fail(route.refusal, "{} (then the ranks could not agree: {})", route.why, error.what());
    throw;
  }
  if (route.refusal != SHOAL_OK) fail(route.refusal, "{}", route.why);
  if (agreement.refusal != SHOAL_OK)  // a refusing rank's description may be incomplete: its refusal comes first
    fail(agreement.refusal, "another rank could not run this call on CUDA tensors ({}); that rank's error says why",
         shoal_status_string(agreement.refusal));
  if (!agreement.same)
    fail(SHOAL_ERR_MISMATCH,
         "ranks disagree on a call with CUDA tensors (this rank: {}): every rank must make the same call with the "
         "same counts, dtype, op and root, and all with CUDA tensors or all with host tensors",
         description);
}

void checkCudaArguments(shoal_comm& comm, uint64_t sequence, MemoryRoute& route, const std::function<void()>& checks) {
  try {
    checks();
  } catch (const Error& error) {
    if (!route.cuda) throw;
    route.refuse(error.status(), error.what());
    agreeOnCudaCall(comm, sequence, "refused", route);  // throws this rank's refusal once every rank knows
  }
}

#if SHOAL_WITH_NCCL
namespace {

// The communicator's NCCL communicator, created by its first CUDA call (every
// rank makes that call: the agreement round passed).
nccl::Communicator& ncclOf(shoal_comm& comm, int device, Deadline deadline) {
  if (!comm.nccl) {
    nccl::Options options;
    options.store = comm.store.get();
    options.key = fmt::format("{}nccl/{}/id", comm.keyPrefix, comm.ncclGeneration++);
    options.rank = comm.rank;
    options.size = comm.size;
    options.device = device;
    options.deadline = deadline;
    options.peerCheck = [&comm] { comm.transport->checkNotAborted(); };
    comm.nccl.reset(nccl::Communicator::create(options).release());
  }
  return *comm.nccl;
}

// Runs body on the NCCL communicator; a failure aborts the host transport too.
template <typename Body>
void onDevice(shoal_comm& comm, const MemoryRoute& route, Body&& body) {
  Deadline deadline = deadlineAfter(comm.timeoutS);
  try {
    body(ncclOf(comm, route.device, deadline), deadline);
  } catch (const Error& error) {
    failCommunicator(comm, error.what(), error.status());
    throw;
  }
}

}  // namespace

void onNccl(shoal_comm& comm, const MemoryRoute& route,
            const std::function<void(nccl::Communicator&, Deadline)>& body) {
  onDevice(comm, route, body);
}

void cudaAllreduce(shoal_comm& comm, uint64_t sequence, const MemoryRoute& route, const void* send, void* recv,
                   size_t count, shoal_dtype_t dtype, shoal_op_t op) {
  agreeOnCudaCall(comm, sequence, describeCall("allreduce", dtype, count, op), route);
  onDevice(comm, route, [&](nccl::Communicator& nc, Deadline deadline) {
    nc.allreduce(send, recv, count, dtype, op, route.stream, deadline);
  });
}

void cudaAllgather(shoal_comm& comm, uint64_t sequence, const MemoryRoute& route, const void* send, void* recv,
                   size_t sendcount, shoal_dtype_t dtype) {
  agreeOnCudaCall(comm, sequence, describeCall("allgather", dtype, sendcount, 0), route);
  onDevice(comm, route, [&](nccl::Communicator& nc, Deadline deadline) {
    nc.allgather(send, recv, sendcount, dtype, route.stream, deadline);
  });
}

void cudaBroadcast(shoal_comm& comm, uint64_t sequence, const MemoryRoute& route, const void* send, void* recv,
                   size_t count, shoal_dtype_t dtype, int root) {
  agreeOnCudaCall(comm, sequence, describeCall("broadcast", dtype, count, root), route);
  onDevice(comm, route, [&](nccl::Communicator& nc, Deadline deadline) {
    nc.broadcast(comm.rank == root ? send : recv, recv, count, dtype, root, route.stream, deadline);
  });
}

void cudaReduceScatter(shoal_comm& comm, uint64_t sequence, const MemoryRoute& route, const void* send, void* recv,
                       size_t recvcount, shoal_dtype_t dtype, shoal_op_t op) {
  agreeOnCudaCall(comm, sequence, describeCall("reduce_scatter", dtype, recvcount, op), route);
  onDevice(comm, route, [&](nccl::Communicator& nc, Deadline deadline) {
    nc.reduceScatter(send, recv, recvcount, dtype, op, route.stream, deadline);
  });
}

void cudaPayloadAllreduce(shoal_comm& comm, const MemoryRoute& route, void* buffer, size_t count, shoal_dtype_t dtype,
                          shoal_op_t op) {
  onDevice(comm, route, [&](nccl::Communicator& nc, Deadline deadline) {
    nc.allreduce(buffer, buffer, count, dtype, op, route.stream, deadline);
  });
}

const void* cudaPayloadAllgatherv(shoal_comm& comm, const MemoryRoute& route, int slot, const void* send, size_t count,
                                  shoal_dtype_t dtype, std::vector<size_t>& counts, std::vector<size_t>& displs) {
  size_t total = gatherCounts(comm, count, counts, displs);
  void* gathered = nullptr;
  onDevice(comm, route, [&](nccl::Communicator& nc, Deadline deadline) {
    gathered = nc.gatherSpace(slot, total * dtypeSize(dtype));
    nc.allgatherv(send, gathered, counts.data(), displs.data(), dtype, route.stream, deadline);
  });
  return gathered;
}

void cudaPayloadsDone(shoal_comm& comm, const MemoryRoute& route) {
  onDevice(comm, route, [&](nccl::Communicator& nc, Deadline deadline) {
    nc.synchronize(route.stream, "compressor's last round", deadline);
  });
}

#else  // without NCCL, agreeOnCudaCall always throws (checkCudaReady refused)

namespace {
[[noreturn]] void unreachable() { fail(SHOAL_ERR_INTERNAL, "a CUDA collective ran in a build without NCCL"); }
}  // namespace

void cudaAllreduce(shoal_comm& comm, uint64_t sequence, const MemoryRoute& route, const void*, void*, size_t count,
                   shoal_dtype_t dtype, shoal_op_t op) {
  agreeOnCudaCall(comm, sequence, describeCall("allreduce", dtype, count, op), route);
  unreachable();
}
void cudaAllgather(shoal_comm& comm, uint64_t sequence, const MemoryRoute& route, const void*, void*, size_t sendcount,
                   shoal_dtype_t dtype) {
  agreeOnCudaCall(comm, sequence, describeCall("allgather", dtype, sendcount, 0), route);
  unreachable();
}
void cudaBroadcast(shoal_comm& comm, uint64_t sequence, const MemoryRoute& route, const void*, void*, size_t count,
                   shoal_dtype_t dtype, int root) {
  agreeOnCudaCall(comm, sequence, describeCall("broadcast", dtype, count, root), route);
  unreachable();
}
void cudaReduceScatter(shoal_comm& comm, uint64_t sequence, const MemoryRoute& route, const void*, void*,
                       size_t recvcount, shoal_dtype_t dtype, shoal_op_t op) {
  agreeOnCudaCall(comm, sequence, describeCall("reduce_scatter", dtype, recvcount, op), route);
  unreachable();
}
void cudaPayloadAllreduce(shoal_comm&, const MemoryRoute&, void*, size_t, shoal_dtype_t, shoal_op_t) { unreachable(); }
void cudaPayloadsDone(shoal_comm&, const MemoryRoute&) { unreachable(); }
const void* cudaPayloadAllgatherv(shoal_comm&, const MemoryRoute&, int, const void*, size_t, shoal_dtype_t,
                                  std::vector<size_t>&, std::vector<size_t>&) {
  unreachable();
}
#endif

}  // namespace shoal
