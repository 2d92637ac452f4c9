// C entry points of the blocking collectives. Arguments are checked here, in
// one place, before any communication; a failure during communication aborts
// the communicator so every rank reports an error.
#include <cstring>
#include <limits>

#include "api/checks.h"
#include "api/enter.h"
#include "api/export.h"
#include "api/versioned.h"
#include "comm/hosts.h"
#include "collectives/collectives.h"
#include "comm/agree.h"
#include "comm/call.h"
#include "gpu/exchange_route.h"
#include "gpu/route.h"
#include "plugin/driver.h"

namespace shoal {
namespace {


// count x elementSize x factor bytes within the largest buffer (api/checks.h).
size_t checkedBytes(const char* call, const char* what, size_t count, shoal_dtype_t dtype, size_t factor = 1) {
  return checkedByteCount(call, what, count, dtype, factor);
}

// Elements of a tensor after checking its rank and shape (api/checks.h).
size_t checkedElements(const char* call, const char* name, const shoal_tensor_t* tensor) {
  if (tensor == nullptr) fail(SHOAL_ERR_INVALID_ARGUMENT, "{}: {} is NULL", call, name);
  return checkedTensorElements(call, name, *tensor);
}

// Broadcasts and barriers take the shared segment (lib/transport/shm) under
// SHOAL_ALGO=shm, and under auto up to the segment's slot size.
bool sharedSegmentFor(const shoal_comm& c, size_t bytes) {
  if (!c.shm || c.size == 1) return false;
  return c.algorithm == "shm" || ((c.algorithm.empty() || c.algorithm == "auto") && bytes <= c.shmMaxBytes);
}

// A tensor in host memory: its kind read as the int a C caller stored, as
// routeOf reads it (a value outside the enum is UB to load as the enum).
bool isHostTensor(const shoal_tensor_t& tensor) {
  int memory = 0;
  static_assert(sizeof memory == sizeof tensor.memory);
  std::memcpy(&memory, &tensor.memory, sizeof memory);
  return memory == SHOAL_MEMORY_HOST;
}

}  // namespace
}  // namespace shoal

using namespace shoal;


SHOAL_EXPORT shoal_status_t shoal_allreduce(shoal_comm_t comm, const void* sendbuf, void* recvbuf, size_t count,
                                            shoal_dtype_t dtype, shoal_op_t op) {
  return enter(comm, "shoal_allreduce", [&](Call& call) {
    const char* name = call.name();
    checkDtypeOp(name, dtype, op);
    size_t bytes = checkedBytes(name, "count", count, dtype);
    checkBuffer(name, "sendbuf", sendbuf, bytes);
    checkBuffer(name, "recvbuf", recvbuf, bytes);
    checkNoPartialOverlap(name, sendbuf, bytes, recvbuf, bytes, sendbuf == recvbuf);
    shoal_tensor_t input = shoal_tensor_1d(const_cast<void*>(sendbuf), count, dtype);
    shoal_tensor_t output = shoal_tensor_1d(recvbuf, count, dtype);
    call.declare(signatureOf(CallKind::Allreduce, dtype, op, count));
    allreduceHostTensor(call.comm(), call.sequence(), input, output, op, nullptr);  // both buffers are host memory
  });
}

SHOAL_EXPORT shoal_status_t shoal_allreduce_tensor(shoal_comm_t comm, const shoal_tensor_t* input,
                                                   const shoal_tensor_t* output, shoal_op_t op,
                                                   const shoal_allreduce_options_t* options) {
  return enter(comm, "shoal_allreduce_tensor", [&](Call& call) {
    const char* name = call.name();
    shoal_comm& c = call.comm();
    if (input == nullptr || output == nullptr)
      fail(SHOAL_ERR_INVALID_ARGUMENT, "{}: input and output must not be NULL", name);
    // The options the driver reads: the caller's own struct when it is of
    // this size (read in place: the call is blocking), else a copy of the
    // fields it has over SHOAL_ALLREDUCE_OPTIONS_INIT.
    shoal_allreduce_options_t resolved;
    const shoal_allreduce_options_t* effective = options;
    size_t count = 0;
    auto checks = [&] {
      if (options == nullptr || options->struct_size != sizeof resolved) {
        resolved = readVersioned<shoal_allreduce_options_t>(name, "options", options, SHOAL_ALLREDUCE_OPTIONS_INIT);
        effective = &resolved;
      }
      checkDtypeOp(name, input->dtype, op);
      if (output->dtype != input->dtype)
        fail(SHOAL_ERR_INVALID_ARGUMENT, "{}: output dtype {} differs from input dtype {}", name,
             shoal_dtype_name(output->dtype), shoal_dtype_name(input->dtype));
      count = checkedTensorElements(name, "input", *input);
      // An output of the input's shape (the usual call) passes the same
      // check with the same count: only another shape is checked on its own.
      const size_t outputCount = sameShape(*input, *output) ? count : checkedTensorElements(name, "output", *output);
      if (count != outputCount)
        fail(SHOAL_ERR_INVALID_ARGUMENT, "{}: input has {} elements but output {}; shapes must hold the same count",
             name, count, outputCount);
      // Within kMaxBufferBytes: checkedTensorElements refuses a larger product.
      const size_t bytes = count * dtypeSize(input->dtype);
      checkBuffer(name, "input->data", input->data, bytes);
      checkBuffer(name, "output->data", output->data, bytes);
      checkNoPartialOverlap(name, input->data, bytes, output->data, bytes, input->data == output->data);
    };
    // Host tensors (the common call) have the default route, which is what
    // routeOf answers for them: their refusal is thrown at once, and the
    // driver needs no route (nor a std::function) for them.
    if (isHostTensor(*input) && isHostTensor(*output)) {
      checks();
      call.declare(signatureOf(CallKind::Allreduce, input->dtype, op, count));
      return allreduceHostTensor(c, call.sequence(), *input, *output, op, effective);
    }
    // The driver routes the call by this (and adds a compressor's refusal).
    MemoryRoute route = routeOf(name, {input, output});
    checkCudaArguments(c, call.sequence(), route, checks);  // returns only when the checks passed
    call.declare(signatureOf(CallKind::Allreduce, input->dtype, op, count));
    allreduceTensor(c, call.sequence(), *input, *output, op, effective, route);
  });
}

namespace {

// shoal_allgatherv's work after its entry checks; shoal_allgather's too.
void allgathervBody(Call& call, const void* sendbuf, size_t sendcount, void* recvbuf, const size_t* recvcounts,
                    const size_t* displs, shoal_dtype_t dtype) {
  const char* name = call.name();
  shoal_comm& c = call.comm();
  checkDtype(name, dtype);
  if (recvcounts == nullptr)
    fail(SHOAL_ERR_INVALID_ARGUMENT, "{}: recvcounts is NULL; pass one count per rank", name);
  if (recvcounts[c.rank] != sendcount)
    fail(SHOAL_ERR_INVALID_ARGUMENT, "{}: sendcount {} differs from recvcounts[{}] = {}; they must be equal", name,
         sendcount, c.rank, recvcounts[c.rank]);
  size_t element = dtypeSize(dtype), totalBytes = 0, end = 0;
  for (int r = 0; r < c.size; ++r) {
    size_t bytes = checkedBytes(name, "recvcounts[r]", recvcounts[r], dtype);
    size_t place = displs ? checkedBytes(name, "displs[r]", displs[r], dtype) : totalBytes;
    if (std::numeric_limits<size_t>::max() - totalBytes < bytes || std::numeric_limits<size_t>::max() - place < bytes)
      fail(SHOAL_ERR_INVALID_ARGUMENT, "{}: recvcounts/displs overflow the addressable size", name);
    totalBytes += bytes;
    end = std::max(end, place + bytes);
  }
  size_t sendBytes = sendcount * element;
  checkBuffer(name, "sendbuf", sendbuf, sendBytes);
  checkBuffer(name, "recvbuf", recvbuf, end);
  uint8_t* ownPlace = static_cast<uint8_t*>(recvbuf) + (displs ? displs[c.rank] : [&] {
    size_t packed = 0;
    for (int r = 0; r < c.rank; ++r) packed += recvcounts[r];
    return packed;
  }()) * element;
  checkNoPartialOverlap(name, sendbuf, sendBytes, recvbuf, end, sendbuf == ownPlace);
  if (sendBytes > 0 && sendbuf != ownPlace) std::memmove(ownPlace, sendbuf, sendBytes);
  // Every rank's count, as every rank sees it, in one digest. (Displacements
  // place blocks in this rank's buffer only: they may differ between ranks.)
  uint64_t layout = 1469598103934665603ull;
  for (int r = 0; r < c.size; ++r) layout = (layout ^ recvcounts[r]) * 1099511628211ull;
  CallSignature signature = signatureOf(CallKind::Allgather, dtype, -1, totalBytes / element, -1, "ring");
  signature.layout = layout;
  call.declare(signature);
  if (totalBytes == 0) return call.runEmpty();
  // Every rank forwards every block: one tag per segment and step.
  Blocks blocks = blocksFrom(recvcounts, displs, element, c.size, c.segmentBytes, c.size);
  call.run([&](Context& context) { ringAllgather(context, static_cast<uint8_t*>(recvbuf), blocks); });
}

}  // namespace

SHOAL_EXPORT shoal_status_t shoal_allgatherv(shoal_comm_t comm, const void* sendbuf, size_t sendcount, void* recvbuf,
                                             const size_t* recvcounts, const size_t* displs, shoal_dtype_t dtype) {
  return enter(comm, "shoal_allgatherv", [&](Call& call) {
    allgathervBody(call, sendbuf, sendcount, recvbuf, recvcounts, displs, dtype);
  });
}

SHOAL_EXPORT shoal_status_t shoal_allgather(shoal_comm_t comm, const void* sendbuf, void* recvbuf, size_t sendcount,
                                            shoal_dtype_t dtype) {
  return enter(comm, "shoal_allgather", [&](Call& call) {
    checkDtype(call.name(), dtype);
    checkedBytes(call.name(), "sendcount x world size", sendcount, dtype, static_cast<size_t>(call.comm().size));
    std::vector<size_t> counts(static_cast<size_t>(call.comm().size), sendcount);
    allgathervBody(call, sendbuf, sendcount, recvbuf, counts.data(), nullptr, dtype);
  });
}

namespace {

// shoal_broadcast's work after its entry; shoal_broadcast_tensor's host path too.
void broadcastBody(Call& call, const void* sendbuf, void* recvbuf, size_t count, shoal_dtype_t dtype, int root) {
  const char* name = call.name();
  shoal_comm& c = call.comm();
  checkDtype(name, dtype);
  checkRank(name, "root", root, c.size);
  size_t bytes = checkedBytes(name, "count", count, dtype);
  if (c.rank == root) checkBuffer(name, "sendbuf (on root)", sendbuf, bytes);
  checkBuffer(name, "recvbuf", recvbuf, bytes);
  if (c.rank == root) {
    checkNoPartialOverlap(name, sendbuf, bytes, recvbuf, bytes, sendbuf == recvbuf);
    if (sendbuf != recvbuf && bytes > 0) std::memcpy(recvbuf, sendbuf, bytes);
  }
  bool tree = c.algorithm == "tree" || (c.algorithm != "ring" && bytes <= c.treeMaxBytes);
  const bool shared = sharedSegmentFor(c, bytes);
  call.declare(signatureOf(CallKind::Broadcast, dtype, -1, count, root, shared ? "shm" : tree ? "tree" : "chain"));
  if (bytes == 0) return call.runEmpty();
  if (shared)  // every rank's signature is checked in the segment: no barrier first
    return call.run([&](Context& context) { broadcastShm(context, recvbuf, bytes, root); });
  call.run([&](Context& context) {
    // Broadcast data flows one way: the root hears from no one. Empty
    // messages along a dissemination pattern first carry every rank's
    // signature (root included) to every rank, so a rank that names another
    // root or dtype fails the call everywhere before any data is written.
    barrierDissemination(context);
    tree ? broadcastTree(context, recvbuf, bytes, root) : broadcastChain(context, recvbuf, bytes, root);
  });
}

}  // namespace

SHOAL_EXPORT shoal_status_t shoal_broadcast(shoal_comm_t comm, const void* sendbuf, void* recvbuf, size_t count,
                                            shoal_dtype_t dtype, int root) {
  return enter(comm, "shoal_broadcast",
               [&](Call& call) { broadcastBody(call, sendbuf, recvbuf, count, dtype, root); });
}

SHOAL_EXPORT shoal_status_t shoal_allgather_tensor(shoal_comm_t comm, const shoal_tensor_t* input,
                                                   const shoal_tensor_t* output) {
  return enter(comm, "shoal_allgather_tensor", [&](Call& call) {
    const char* name = call.name();
    shoal_comm& c = call.comm();
    if (input == nullptr || output == nullptr)
      fail(SHOAL_ERR_INVALID_ARGUMENT, "{}: input and output must not be NULL", name);
    size_t count = 0;
    MemoryRoute route = routeOf(name, {input, output});
    auto checks = [&] {
      count = checkedElements(name, "input", input);
      size_t outputCount = checkedElements(name, "output", output);
      checkDtype(name, input->dtype);
      if (output->dtype != input->dtype)
        fail(SHOAL_ERR_INVALID_ARGUMENT, "{}: output dtype {} differs from input dtype {}", name,
             shoal_dtype_name(output->dtype), shoal_dtype_name(input->dtype));
      size_t bytes = checkedBytes(name, "input elements x world size", count, input->dtype, c.size) / c.size;
      if (outputCount != count * c.size)
        fail(SHOAL_ERR_INVALID_ARGUMENT, "{}: output has {} elements; it must hold world size x input = {}", name,
             outputCount, count * c.size);
      checkBuffer(name, "input->data", input->data, bytes);
      checkBuffer(name, "output->data", output->data, bytes * c.size);
      const uint8_t* inPlace = static_cast<const uint8_t*>(output->data) + c.rank * bytes;
      checkNoPartialOverlap(name, input->data, bytes, output->data, bytes * c.size, input->data == inPlace);
    };
    if (!route.cuda) {
      checks();
      std::vector<size_t> counts(static_cast<size_t>(c.size), count);
      return allgathervBody(call, input->data, count, output->data, counts.data(), nullptr, input->dtype);
    }
    checkCudaArguments(c, call.sequence(), route, checks);
    checkCudaReady(c, name, route);
    cudaAllgather(c, call.sequence(), route, input->data, output->data, count, input->dtype);
  });
}

SHOAL_EXPORT shoal_status_t shoal_broadcast_tensor(shoal_comm_t comm, const shoal_tensor_t* tensor, int root) {
  return enter(comm, "shoal_broadcast_tensor", [&](Call& call) {
    const char* name = call.name();
    shoal_comm& c = call.comm();
    if (tensor == nullptr) fail(SHOAL_ERR_INVALID_ARGUMENT, "{}: tensor is NULL", name);
    size_t count = 0;
    MemoryRoute route = routeOf(name, {tensor});
    auto checks = [&] {
      count = checkedElements(name, "tensor", tensor);
      checkDtype(name, tensor->dtype);
      checkBuffer(name, "tensor->data", tensor->data, count * dtypeSize(tensor->dtype));
      checkRank(name, "root", root, c.size);
    };
    if (!route.cuda) {
      checks();
      return broadcastBody(call, tensor->data, tensor->data, count, tensor->dtype, root);
    }
    checkCudaArguments(c, call.sequence(), route, checks);
    checkCudaReady(c, name, route);
    cudaBroadcast(c, call.sequence(), route, tensor->data, tensor->data, count, tensor->dtype, root);
  });
}

namespace {

// shoal_reduce_scatter's work after its entry; shoal_reduce_scatter_tensor's host path too.
void reduceScatterBody(Call& call, const void* sendbuf, void* recvbuf, size_t recvcount, shoal_dtype_t dtype,
                       shoal_op_t op) {
  const char* name = call.name();
  shoal_comm& c = call.comm();
  checkDtypeOp(name, dtype, op);
  size_t totalBytes = checkedBytes(name, "recvcount x world size", recvcount, dtype, static_cast<size_t>(c.size));
  size_t bytes = recvcount * dtypeSize(dtype);
  checkBuffer(name, "sendbuf", sendbuf, totalBytes);
  checkBuffer(name, "recvbuf", recvbuf, bytes);
  const uint8_t* inPlace = static_cast<const uint8_t*>(sendbuf) + c.rank * bytes;
  checkNoPartialOverlap(name, sendbuf, totalBytes, recvbuf, bytes, recvbuf == inPlace);
  call.declare(signatureOf(CallKind::ReduceScatter, dtype, op, recvcount, -1, "ring"));
  if (recvcount == 0) return call.runEmpty();
  Reducer reducer(dtype, op);
  // The ring writes partial sums of every block: into scratch, so sendbuf
  // stays intact. (Slots 0 and 1 are the ring's receive buffers; 2 is free.)
  uint8_t* work = c.scratch.get(2, totalBytes);
  Blocks blocks = splitEvenly(recvcount * c.size, dtypeSize(dtype), c.size, c.segmentBytes, c.size);
  call.run([&](Context& context) {
    ringReduceScatter(context, static_cast<const uint8_t*>(sendbuf), work, blocks, reducer);
  });
  if (c.size == 1) std::memcpy(work, sendbuf, totalBytes);
  reducer.finish(work + blocks.offset[c.rank], recvcount, c.size);
  std::memcpy(recvbuf, work + blocks.offset[c.rank], bytes);
}

}  // namespace

SHOAL_EXPORT shoal_status_t shoal_reduce_scatter(shoal_comm_t comm, const void* sendbuf, void* recvbuf,
                                                 size_t recvcount, shoal_dtype_t dtype, shoal_op_t op) {
  return enter(comm, "shoal_reduce_scatter",
               [&](Call& call) { reduceScatterBody(call, sendbuf, recvbuf, recvcount, dtype, op); });
}

SHOAL_EXPORT shoal_status_t shoal_reduce_scatter_tensor(shoal_comm_t comm, const shoal_tensor_t* input,
                                                        const shoal_tensor_t* output, shoal_op_t op) {
  return enter(comm, "shoal_reduce_scatter_tensor", [&](Call& call) {
    const char* name = call.name();
    shoal_comm& c = call.comm();
    if (input == nullptr || output == nullptr)
      fail(SHOAL_ERR_INVALID_ARGUMENT, "{}: input and output must not be NULL", name);
    size_t count = 0;  // output's elements: each rank's block
    MemoryRoute route = routeOf(name, {input, output});
    auto checks = [&] {
      const size_t inputCount = checkedElements(name, "input", input);
      count = checkedElements(name, "output", output);
      checkDtypeOp(name, input->dtype, op);
      if (output->dtype != input->dtype)
        fail(SHOAL_ERR_INVALID_ARGUMENT, "{}: output dtype {} differs from input dtype {}", name,
             shoal_dtype_name(output->dtype), shoal_dtype_name(input->dtype));
      size_t bytes = checkedBytes(name, "output elements x world size", count, input->dtype, c.size) / c.size;
      if (inputCount != count * c.size)
        fail(SHOAL_ERR_INVALID_ARGUMENT, "{}: input has {} elements; it must hold world size x output = {}", name,
             inputCount, count * c.size);
      checkBuffer(name, "input->data", input->data, bytes * c.size);
      checkBuffer(name, "output->data", output->data, bytes);
      const uint8_t* inPlace = static_cast<const uint8_t*>(input->data) + c.rank * bytes;
      checkNoPartialOverlap(name, input->data, bytes * c.size, output->data, bytes, output->data == inPlace);
      if (route.cuda && !ncclReduces(op))
        fail(SHOAL_ERR_UNSUPPORTED, "{}: NCCL has no {} reduction for CUDA tensors; reduce-scatter with sum, avg, "
             "prod, min or max, or use shoal_allreduce_tensor (its device ring runs the bitwise ops)",
             name, shoal_op_name(op));
    };
    if (!route.cuda) {
      checks();
      return reduceScatterBody(call, input->data, output->data, count, input->dtype, op);
    }
    checkCudaArguments(c, call.sequence(), route, checks);
    checkCudaReady(c, name, route);
    cudaReduceScatter(c, call.sequence(), route, input->data, output->data, count, input->dtype, op);
  });
}

SHOAL_EXPORT shoal_status_t shoal_barrier(shoal_comm_t comm) {
  return enter(comm, "shoal_barrier", [&](Call& call) {
    call.declare(signatureOf(CallKind::Barrier, -1, -1, 0));
    const bool shared = sharedSegmentFor(call.comm(), 0);
    call.run([&](Context& context) { shared ? barrierShm(context) : barrierDissemination(context); });
  });
}
