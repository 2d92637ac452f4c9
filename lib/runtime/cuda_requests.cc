#include "runtime/cuda_requests.h"

#include <cstdint>
#include <memory>

#include <fmt/format.h>

#include "comm/call.h"
#include "gpu/exchange_route.h"
#include "gpu/route.h"
#include "plugin/driver.h"
#include "runtime/alltoall.h"
#include "runtime/reduce_scatter.h"
#include "runtime/timeline.h"

#if SHOAL_WITH_CUDA
#include "gpu/cuda/stream_memory.h"
#endif
#if SHOAL_WITH_NCCL
#include "gpu/nccl/nccl_comm.h"
#endif

namespace shoal::runtime {

namespace {

// Byte counts and packed offsets of per-peer element counts (device exchange blocks).
DeviceBlocks packedBlocks(const std::vector<size_t>& counts, size_t element, size_t* total) {
  DeviceBlocks blocks;
  *total = 0;
  for (size_t count : counts) {
    blocks.bytes.push_back(count * element);
    blocks.offset.push_back(*total);
    *total += count * element;
  }
  return blocks;
}

// The async alltoall on CUDA memory: the counts as the host form gets them
// (runtime/alltoall.h), then device memory for what arrives (on the input's
// device, held by the request), then the exchange over NCCL. A rank that
// cannot allocate refuses in the exchange's agreement round, so every rank
// fails the request with its reason.
void runCudaAlltoall(shoal_comm& comm, uint64_t sequence, Request& r) {
  const char* call = "shoal_ialltoall";
  const size_t element = dtypeSize(r.meta.dtype);
  CallScope scope(comm, alltoallSignature(r, comm.size));
  r.recvcounts = alltoallRecvCounts(comm, r);
  size_t sendBytes = 0, recvBytes = 0;
  DeviceBlocks send = packedBlocks(r.sendcounts, element, &sendBytes);
  DeviceBlocks recv = packedBlocks(r.recvcounts, element, &recvBytes);
  MemoryRoute route = routeOf(call, {&r.input});
  checkCudaReady(comm, call, route);
#if SHOAL_WITH_CUDA
  if (route.refusal == SHOAL_OK) {
    cuda::DeviceScope onDevice(route.device);
    void* received = nullptr;
    const char* error = onDevice.error() ? onDevice.error() : cuda::allocDevice(&received, recvBytes);
    if (error != nullptr)
      route.refuse(SHOAL_ERR_NO_MEMORY, fmt::format("{}: {} bytes of device memory on device {} for what arrives: {}",
                                                    call, recvBytes, route.device, error));
    else
      r.deviceReceived = std::shared_ptr<void>(received, [](void* p) { cuda::freeDevice(p); });
  }
#endif
  r.receivedBytes = recvBytes;
  const bool perPeer = r.meta.kind == OpKind::Alltoallv;
  cudaExchange(comm, sequence, route,
               DeviceExchange{perPeer ? "alltoallv" : "alltoall", r.meta.dtype,
                              perPeer ? 0 : r.meta.elements() / comm.size, -1, false, r.input.data, std::move(send),
                              r.deviceReceived.get(), std::move(recv)});
}

// The async reduce-scatter on CUDA memory, with the host form's shares
// (runtime/reduce_scatter.h). Rows that split evenly under an op NCCL reduces:
// ncclReduceScatter, straight into the output. Otherwise (uneven rows, the
// bitwise ops) the CUDA allreduce into scratch, then this rank's rows copied
// out. Every rank takes the same branch (rows and op were negotiated), so the
// ranks run one NCCL collective. An output that overlaps the input other than
// at this rank's own rows (NCCL's in-place layout) is legal here, as on the
// host, which reduces in scratch: the even branch then writes scratch too.
// Scratch is stream-ordered (no device-wide synchronisation when it is freed);
// a rank that cannot allocate it refuses in the agreement round.
void runCudaReduceScatter(shoal_comm& comm, uint64_t sequence, Request& r) {
  const char* call = "shoal_ireduce_scatter";
  const size_t element = dtypeSize(r.meta.dtype), total = r.meta.elements();
  const size_t rows = static_cast<size_t>(r.meta.shape.front()), row = rowElements(r.meta.shape);
  const RowShare share = shareOf(rows, comm.size, comm.rank);
  const size_t bytes = share.rows * row * element, mineAt = share.first * row * element;
  const auto input = reinterpret_cast<uintptr_t>(r.input.data), output = reinterpret_cast<uintptr_t>(r.output.data);
  const bool overlaps = bytes > 0 && output < input + total * element && input < output + bytes;
  const bool direct = rows % static_cast<size_t>(comm.size) == 0 && ncclReduces(r.meta.op);
  [[maybe_unused]] const size_t scratchBytes = !direct ? total * element : overlaps && output != input + mineAt ? bytes : 0;
  MemoryRoute route = routeOf(call, {&r.input, &r.output});
  checkCudaReady(comm, call, route);
  void* scratch = nullptr;
  std::shared_ptr<void> holder;  // freed on the stream on return, after the copy (or the failure)
#if SHOAL_WITH_CUDA && SHOAL_WITH_NCCL
  if (route.refusal == SHOAL_OK && scratchBytes > 0) {
    cuda::DeviceScope onDevice(route.device);
    const char* error = onDevice.error() ? onDevice.error() : cuda::allocAsync(&scratch, scratchBytes, route.stream);
    if (error != nullptr)
      route.refuse(SHOAL_ERR_NO_MEMORY, fmt::format("{}: {} bytes of device memory on device {} for the reduction: {}",
                                                    call, scratchBytes, route.device, error));
    else
      holder = std::shared_ptr<void>(scratch, [device = route.device, stream = route.stream](void* p) {
        cuda::DeviceScope onDevice(device);
        cuda::freeAsync(p, stream);
      });
  }
#endif
  if (direct)
    cudaReduceScatter(comm, sequence, route, r.input.data, scratch != nullptr ? scratch : r.output.data,
                      total / comm.size, r.meta.dtype, r.meta.op);
  else
    cudaAllreduce(comm, sequence, route, r.input.data, scratch, total, r.meta.dtype, r.meta.op);
  if (scratch == nullptr || bytes == 0) return;
#if SHOAL_WITH_CUDA && SHOAL_WITH_NCCL
  const uint8_t* mine = static_cast<const uint8_t*>(scratch) + (direct ? 0 : mineAt);
  {
    cuda::DeviceScope onDevice(route.device);
    const char* error = onDevice.error() ? onDevice.error() : cuda::copyAsync(r.output.data, mine, bytes, route.stream);
    if (error != nullptr)
      fail(SHOAL_ERR_SYSTEM, "{}: copying rank {}'s {} bytes of the reduction into the output on CUDA device {}: {}",
           call, comm.rank, bytes, route.device, error);
  }
  // The copy's wait, under the call's deadline, up to the copy only (work the
  // caller queued on the stream since is not waited for).
  onNccl(comm, route, [&](nccl::Communicator& nc, Deadline deadline) {
    nc.synchronize(route.stream, "the reduce-scatter's copy into the output", deadline);
  });
#endif
}

}  // namespace

void runCudaRequest(shoal_comm& comm, Request& r, Timeline* timeline) {
  const Clock::time_point begin = Clock::now();
  // The sequence number first, as a blocking call's Call takes it: a rank
  // that refuses still takes part in the call's agreement round.
  const uint64_t sequence = takeSequence(comm);
  const size_t count = r.meta.elements();
  const char* phase = "";
  switch (r.meta.kind) {
    case OpKind::Allreduce: {
      // The driver's own path: plain NCCL allreduce, or the compressor when
      // it has SHOAL_CAP_CUDA (refused on every rank otherwise).
      shoal_allreduce_options_t options = SHOAL_ALLREDUCE_OPTIONS_INIT;
      options.name = r.name.c_str();
      options.compressor = r.meta.compressor.c_str();
      options.compressor_options = r.meta.options.c_str();  // resolved at submission: "" is none
      options.compress_min_bytes = r.meta.minBytes;
      MemoryRoute route = routeOf("shoal_iallreduce", {&r.input, &r.output});
      allreduceTensor(comm, sequence, r.input, r.output, r.meta.op, &options, route);
      phase = "CUDA_ALLREDUCE";
      break;
    }
    case OpKind::Allgather: {
      MemoryRoute route = routeOf("shoal_iallgather", {&r.input, &r.output});
      checkCudaReady(comm, "shoal_iallgather", route);
      cudaAllgather(comm, sequence, route, r.input.data, r.output.data, count, r.meta.dtype);
      phase = "CUDA_ALLGATHER";
      break;
    }
    case OpKind::Broadcast: {
      MemoryRoute route = routeOf("shoal_ibroadcast", {&r.output});
      checkCudaReady(comm, "shoal_ibroadcast", route);
      cudaBroadcast(comm, sequence, route, r.output.data, r.output.data, count, r.meta.dtype, r.meta.root);
      phase = "CUDA_BROADCAST";
      break;
    }
    case OpKind::Alltoall:
    case OpKind::Alltoallv:
      runCudaAlltoall(comm, sequence, r);
      phase = "CUDA_ALLTOALL";
      break;
    case OpKind::ReduceScatter:
      runCudaReduceScatter(comm, sequence, r);
      phase = "CUDA_REDUCESCATTER";
      break;
    default:  // submission refuses every other kind on CUDA tensors
      fail(SHOAL_ERR_INTERNAL, "async runtime: a {} request on CUDA tensors reached the engine",
           opKindName(r.meta.kind));
  }
  if (timeline != nullptr)
    timeline->span(r.name, phase, begin, Clock::now(), fmt::format("\"bytes\": {}", r.meta.bytes()));
}

}  // namespace shoal::runtime
