// C entry points of the blocking collectives. Arguments are checked here, in
// one place, before any communication; a failure during communication aborts
// the communicator so every rank reports an error.
#include <cstring>
#include <limits>

#include "api/export.h"
#include "api/agree.h"
#include "api/checks.h"
#include "aggregate/client.h"
#include "api/comm.h"
#include "api/cuda_route.h"
#include "api/run.h"
#include "plugin/driver.h"
#include "collectives/collectives.h"
#include "runtime/blocking.h"

namespace shoal {
namespace {


void checkDtype(const char* call, shoal_dtype_t dtype) {
  if (dtypeSize(dtype) == 0)
    fail(SHOAL_ERR_INVALID_ARGUMENT, "{}: dtype {} is not a shoal_dtype_t; use SHOAL_F16 .. SHOAL_U64", call,
         static_cast<int>(dtype));
}

void checkDtypeOp(const char* call, shoal_dtype_t dtype, shoal_op_t op) {
  checkDtype(call, dtype);
  if (op < 0 || op >= SHOAL_OP_COUNT)
    fail(SHOAL_ERR_INVALID_ARGUMENT, "{}: op {} is not a shoal_op_t; use SHOAL_SUM .. SHOAL_BXOR", call,
         static_cast<int>(op));
  if (!isValidDtypeOp(dtype, op))
    fail(SHOAL_ERR_INVALID_ARGUMENT, "{}: op {} is not defined on dtype {}; bitwise ops need an integer dtype", call,
         shoal_op_name(op), shoal_dtype_name(dtype));
}

// count x elementSize x factor bytes within the largest buffer (api/checks.h).
size_t checkedBytes(const char* call, const char* what, size_t count, shoal_dtype_t dtype, size_t factor = 1) {
  return checkedByteCount(call, what, count, dtype, factor);
}

void checkBuffer(const char* call, const char* name, const void* buffer, size_t bytes) {
  if (buffer == nullptr && bytes > 0)
    fail(SHOAL_ERR_INVALID_ARGUMENT, "{}: {} is NULL but {} bytes were requested; pass a buffer or count 0", call,
         name, bytes);
}

// [a, a + na) and [b, b + nb) overlap without being the in-place layout:
// refused, since the result would depend on the copy order.
void checkNoPartialOverlap(const char* call, const void* a, size_t na, const void* b, size_t nb, bool inPlace) {
  auto pa = reinterpret_cast<uintptr_t>(a), pb = reinterpret_cast<uintptr_t>(b);
  if (inPlace || a == nullptr || b == nullptr || na == 0 || nb == 0) return;
  if (pa < pb + nb && pb < pa + na)
    fail(SHOAL_ERR_INVALID_ARGUMENT,
         "{}: sendbuf and recvbuf overlap without being the in-place layout; use separate buffers or the in-place form",
         call);
}

// Runs checks that come before the body takes the call's sequence number: a
// refusal still takes it (see runCollective), so the next call pairs up.
template <typename Checks>
void refuseTakingNumber(shoal_comm& c, Checks&& checks) {
  try {
    checks();
  } catch (const Error&) {
    c.sequence++;
    throw;
  }
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

CallSignature signatureOf(CallKind kind, int dtype, int op, uint64_t count, int root = -1,
                          std::string_view algorithm = {}) {
  CallSignature signature;
  signature.kind = kind;
  signature.dtype = dtype;
  signature.op = op;
  signature.count = count;
  signature.root = root;
  signature.algorithm = algorithm;
  return signature;
}

}  // namespace
}  // namespace shoal

using namespace shoal;

namespace shoal {

void plainAllreduce(shoal_comm& comm, uint64_t sequence, const void* send, void* recv, size_t count,
                    shoal_dtype_t dtype, shoal_op_t op) {
  const AllreduceAlgorithm& algorithm =
      selectAllreduce(comm.algorithm, count * dtypeSize(dtype), comm.size, comm.treeMaxBytes, comm.shmMaxBytes);
  plainAllreduce(comm, sequence, algorithm, send, recv, count, dtype, op);
}

void plainAllreduce(shoal_comm& comm, uint64_t sequence, const AllreduceAlgorithm& algorithm, const void* send,
                    void* recv, size_t count, shoal_dtype_t dtype, shoal_op_t op) {
  const size_t bytes = count * dtypeSize(dtype);
  Reducer reducer(dtype, op);
  if (count == 0) return emptyCall(comm, sequence);
  if (comm.algorithm == "aggregate" && aggregate::carries(dtype, op))  // else the ring (algos.cc)
    return aggregate::allreduce(comm, sequence, send, recv, count, dtype, op);
  if (algorithm.run == allreduceRing)  // the ring reads send directly: no copy
    return runCollective(comm, sequence, [&](Context& context) {
      allreduceRingOutOfPlace(context, send, recv, count, reducer);
    });
  if (send != recv) std::memcpy(recv, send, bytes);
  runCollective(comm, sequence, [&](Context& context) { algorithm.run(context, recv, count, reducer); });
}

size_t gatherCounts(shoal_comm& comm, size_t count, std::vector<size_t>& counts, std::vector<size_t>& displs) {
  counts.assign(comm.size, 0);
  counts[comm.rank] = count;
  Blocks countBlocks = blocksFrom(std::vector<size_t>(comm.size, 1).data(), nullptr, sizeof(size_t), comm.size,
                                  comm.segmentBytes, comm.size);
  runCollective(comm, comm.sequence++, [&](Context& context) {
    ringAllgather(context, reinterpret_cast<uint8_t*>(counts.data()), countBlocks);
  });
  displs.assign(comm.size, 0);
  size_t total = 0;
  for (int r = 0; r < comm.size; ++r) {
    displs[r] = total;
    total += counts[r];
  }
  return total;
}

void allgathervBytes(shoal_comm& comm, const void* send, size_t count, shoal_dtype_t dtype,
                     std::vector<uint8_t>& gathered, std::vector<size_t>& counts, std::vector<size_t>& displs) {
  const size_t element = dtypeSize(dtype);
  // First every rank's count, then the data.
  const size_t total = gatherCounts(comm, count, counts, displs);
  gathered.resize(total * element);
  if (count > 0) std::memcpy(gathered.data() + displs[comm.rank] * element, send, count * element);
  const uint64_t sequence = comm.sequence++;
  if (total == 0) return emptyCall(comm, sequence);
  Blocks blocks = blocksFrom(counts.data(), displs.data(), element, comm.size, comm.segmentBytes, comm.size);
  runCollective(comm, sequence, [&](Context& context) { ringAllgather(context, gathered.data(), blocks); });
}

}  // namespace shoal

SHOAL_EXPORT shoal_status_t shoal_allreduce(shoal_comm_t comm, const void* sendbuf, void* recvbuf, size_t count,
                                            shoal_dtype_t dtype, shoal_op_t op) {
  return guarded(comm, [&] {
    const char* call = "shoal_allreduce";
    shoal_comm& c = usableComm(comm, call);
    runtime::blockingCall(c, call, [&] {
      const uint64_t sequence = c.sequence++;
      checkDtypeOp(call, dtype, op);
      size_t bytes = checkedBytes(call, "count", count, dtype);
      checkBuffer(call, "sendbuf", sendbuf, bytes);
      checkBuffer(call, "recvbuf", recvbuf, bytes);
      checkNoPartialOverlap(call, sendbuf, bytes, recvbuf, bytes, sendbuf == recvbuf);
      shoal_tensor_t input = shoal_tensor_1d(const_cast<void*>(sendbuf), count, dtype);
      shoal_tensor_t output = shoal_tensor_1d(recvbuf, count, dtype);
      CallScope scope(c, signatureOf(CallKind::Allreduce, dtype, op, count));
      allreduceTensor(c, sequence, input, output, op, nullptr);
    });
  });
}

SHOAL_EXPORT shoal_status_t shoal_allreduce_tensor(shoal_comm_t comm, const shoal_tensor_t* input,
                                                   const shoal_tensor_t* output, shoal_op_t op,
                                                   const shoal_allreduce_options_t* options) {
  return guarded(comm, [&] {
    const char* call = "shoal_allreduce_tensor";
    shoal_comm& c = usableComm(comm, call);
    runtime::blockingCall(c, call, [&] {
      const uint64_t sequence = c.sequence++;
      if (input == nullptr || output == nullptr)
        fail(SHOAL_ERR_INVALID_ARGUMENT, "{}: input and output must not be NULL", call);
      shoal_allreduce_options_t resolved = SHOAL_ALLREDUCE_OPTIONS_INIT;
      // Memory kinds are checked again by the driver, which routes the call.
      MemoryRoute route = routeOf(call, {input, output});
      checkCudaArguments(c, sequence, route, [&] {
        if (options != nullptr && (options->struct_size == 0 || options->struct_size > sizeof(shoal_allreduce_options_t)))
          fail(SHOAL_ERR_INVALID_ARGUMENT, "{}: options->struct_size is {}; start from SHOAL_ALLREDUCE_OPTIONS_INIT", call,
               options->struct_size);
        if (options != nullptr) std::memcpy(&resolved, options, options->struct_size);
        checkDtypeOp(call, input->dtype, op);
        if (output->dtype != input->dtype)
          fail(SHOAL_ERR_INVALID_ARGUMENT, "{}: output dtype {} differs from input dtype {}", call,
               shoal_dtype_name(output->dtype), shoal_dtype_name(input->dtype));
        const size_t count = checkedTensorElements(call, "input", *input);
        const size_t outputCount = checkedTensorElements(call, "output", *output);
        if (count != outputCount)
          fail(SHOAL_ERR_INVALID_ARGUMENT, "{}: input has {} elements but output {}; shapes must hold the same count",
               call, count, outputCount);
        size_t bytes = checkedBytes(call, "the tensor's element count", count, input->dtype);
        checkBuffer(call, "input->data", input->data, bytes);
        checkBuffer(call, "output->data", output->data, bytes);
        checkNoPartialOverlap(call, input->data, bytes, output->data, bytes, input->data == output->data);
      });
      CallScope scope(c, signatureOf(CallKind::Allreduce, input->dtype, op, plugin::elementsCount(*input)));
      allreduceTensor(c, sequence, *input, *output, op, &resolved);
    });
  });
}

namespace {

// shoal_allgatherv's work after its entry checks; shoal_allgather's too.
void allgathervBody(shoal_comm& c, const char* call, const void* sendbuf, size_t sendcount, void* recvbuf,
                    const size_t* recvcounts, const size_t* displs, shoal_dtype_t dtype) {
  const uint64_t sequence = c.sequence++;
  checkDtype(call, dtype);
  if (recvcounts == nullptr)
    fail(SHOAL_ERR_INVALID_ARGUMENT, "{}: recvcounts is NULL; pass one count per rank", call);
  if (recvcounts[c.rank] != sendcount)
    fail(SHOAL_ERR_INVALID_ARGUMENT, "{}: sendcount {} differs from recvcounts[{}] = {}; they must be equal", call,
         sendcount, c.rank, recvcounts[c.rank]);
  size_t element = dtypeSize(dtype), totalBytes = 0, end = 0;
  for (int r = 0; r < c.size; ++r) {
    size_t bytes = checkedBytes(call, "recvcounts[r]", recvcounts[r], dtype);
    size_t place = displs ? checkedBytes(call, "displs[r]", displs[r], dtype) : totalBytes;
    if (std::numeric_limits<size_t>::max() - totalBytes < bytes || std::numeric_limits<size_t>::max() - place < bytes)
      fail(SHOAL_ERR_INVALID_ARGUMENT, "{}: recvcounts/displs overflow the addressable size", call);
    totalBytes += bytes;
    end = std::max(end, place + bytes);
  }
  size_t sendBytes = sendcount * element;
  checkBuffer(call, "sendbuf", sendbuf, sendBytes);
  checkBuffer(call, "recvbuf", recvbuf, end);
  uint8_t* ownPlace = static_cast<uint8_t*>(recvbuf) + (displs ? displs[c.rank] : [&] {
    size_t packed = 0;
    for (int r = 0; r < c.rank; ++r) packed += recvcounts[r];
    return packed;
  }()) * element;
  checkNoPartialOverlap(call, sendbuf, sendBytes, recvbuf, end, sendbuf == ownPlace);
  if (sendBytes > 0 && sendbuf != ownPlace) std::memmove(ownPlace, sendbuf, sendBytes);
  // Every rank's count, as every rank sees it, in one digest. (Displacements
  // place blocks in this rank's buffer only: they may differ between ranks.)
  uint64_t layout = 1469598103934665603ull;
  for (int r = 0; r < c.size; ++r) layout = (layout ^ recvcounts[r]) * 1099511628211ull;
  CallSignature signature = signatureOf(CallKind::Allgather, dtype, -1, totalBytes / element, -1, "ring");
  signature.layout = layout;
  CallScope scope(c, std::move(signature));
  if (totalBytes == 0) return emptyCall(c, sequence);
  // Every rank forwards every block: one tag per segment and step.
  Blocks blocks = blocksFrom(recvcounts, displs, element, c.size, c.segmentBytes, c.size);
  runCollective(c, sequence, [&](Context& context) { ringAllgather(context, static_cast<uint8_t*>(recvbuf), blocks); });
}

}  // namespace

SHOAL_EXPORT shoal_status_t shoal_allgatherv(shoal_comm_t comm, const void* sendbuf, size_t sendcount, void* recvbuf,
                                             const size_t* recvcounts, const size_t* displs, shoal_dtype_t dtype) {
  return guarded(comm, [&] {
    const char* call = "shoal_allgatherv";
    shoal_comm& c = usableComm(comm, call);
    runtime::blockingCall(c, call, [&] { allgathervBody(c, call, sendbuf, sendcount, recvbuf, recvcounts, displs, dtype); });
  });
}

SHOAL_EXPORT shoal_status_t shoal_allgather(shoal_comm_t comm, const void* sendbuf, void* recvbuf, size_t sendcount,
                                            shoal_dtype_t dtype) {
  return guarded(comm, [&] {
    const char* call = "shoal_allgather";
    shoal_comm& c = usableComm(comm, call);
    runtime::blockingCall(c, call, [&] {
      // allgathervBody checks the rest and takes the call's sequence number;
      // a refusal here takes it instead.
      refuseTakingNumber(c, [&] {
        checkDtype(call, dtype);
        checkedBytes(call, "sendcount x world size", sendcount, dtype, static_cast<size_t>(c.size));
      });
      std::vector<size_t> counts(static_cast<size_t>(c.size), sendcount);
      allgathervBody(c, call, sendbuf, sendcount, recvbuf, counts.data(), nullptr, dtype);
    });
  });
}

namespace {

// shoal_broadcast's work after its entry; shoal_broadcast_tensor's host path too.
void broadcastBody(shoal_comm& c, const char* call, const void* sendbuf, void* recvbuf, size_t count,
                   shoal_dtype_t dtype, int root) {
  const uint64_t sequence = c.sequence++;
  checkDtype(call, dtype);
  if (root < 0 || root >= c.size)
    fail(SHOAL_ERR_INVALID_ARGUMENT, "{}: root {} is not a rank; use 0..{}", call, root, c.size - 1);
  size_t bytes = checkedBytes(call, "count", count, dtype);
  if (c.rank == root) checkBuffer(call, "sendbuf (on root)", sendbuf, bytes);
  checkBuffer(call, "recvbuf", recvbuf, bytes);
  if (c.rank == root) {
    checkNoPartialOverlap(call, sendbuf, bytes, recvbuf, bytes, sendbuf == recvbuf);
    if (sendbuf != recvbuf && bytes > 0) std::memcpy(recvbuf, sendbuf, bytes);
  }
  bool tree = c.algorithm == "tree" || (c.algorithm != "ring" && bytes <= c.treeMaxBytes);
  const bool shared = sharedSegmentFor(c, bytes);
  CallScope scope(c, signatureOf(CallKind::Broadcast, dtype, -1, count, root, shared ? "shm" : tree ? "tree" : "chain"));
  if (bytes == 0) return emptyCall(c, sequence);
  if (shared)  // every rank's signature is checked in the segment: no barrier first
    return runCollective(c, sequence, [&](Context& context) { broadcastShm(context, recvbuf, bytes, root); });
  runCollective(c, sequence, [&](Context& context) {
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
  return guarded(comm, [&] {
    const char* call = "shoal_broadcast";
    shoal_comm& c = usableComm(comm, call);
    runtime::blockingCall(c, call, [&] { broadcastBody(c, call, sendbuf, recvbuf, count, dtype, root); });
  });
}

SHOAL_EXPORT shoal_status_t shoal_allgather_tensor(shoal_comm_t comm, const shoal_tensor_t* input,
                                                   const shoal_tensor_t* output) {
  return guarded(comm, [&] {
    const char* call = "shoal_allgather_tensor";
    shoal_comm& c = usableComm(comm, call);
    runtime::blockingCall(c, call, [&] {
      if (input == nullptr || output == nullptr) {
        c.sequence++;  // a refused call still takes its number (see runCollective)
        fail(SHOAL_ERR_INVALID_ARGUMENT, "{}: input and output must not be NULL", call);
      }
      size_t count = 0;
      MemoryRoute route = routeOf(call, {input, output});
      auto checks = [&] {
        count = checkedElements(call, "input", input);
        size_t outputCount = checkedElements(call, "output", output);
        checkDtype(call, input->dtype);
        if (output->dtype != input->dtype)
          fail(SHOAL_ERR_INVALID_ARGUMENT, "{}: output dtype {} differs from input dtype {}", call,
               shoal_dtype_name(output->dtype), shoal_dtype_name(input->dtype));
        size_t bytes = checkedBytes(call, "input elements x world size", count, input->dtype, c.size) / c.size;
        if (outputCount != count * c.size)
          fail(SHOAL_ERR_INVALID_ARGUMENT, "{}: output has {} elements; it must hold world size x input = {}", call,
               outputCount, count * c.size);
        checkBuffer(call, "input->data", input->data, bytes);
        checkBuffer(call, "output->data", output->data, bytes * c.size);
        const uint8_t* inPlace = static_cast<const uint8_t*>(output->data) + c.rank * bytes;
        checkNoPartialOverlap(call, input->data, bytes, output->data, bytes * c.size, input->data == inPlace);
      };
      if (!route.cuda) {
        refuseTakingNumber(c, checks);
        std::vector<size_t> counts(static_cast<size_t>(c.size), count);
        return allgathervBody(c, call, input->data, count, output->data, counts.data(), nullptr, input->dtype);
      }
      const uint64_t sequence = c.sequence++;
      checkCudaArguments(c, sequence, route, checks);
      checkCudaReady(c, call, route);
      cudaAllgather(c, sequence, route, input->data, output->data, count, input->dtype);
    });
  });
}

SHOAL_EXPORT shoal_status_t shoal_broadcast_tensor(shoal_comm_t comm, const shoal_tensor_t* tensor, int root) {
  return guarded(comm, [&] {
    const char* call = "shoal_broadcast_tensor";
    shoal_comm& c = usableComm(comm, call);
    runtime::blockingCall(c, call, [&] {
      if (tensor == nullptr) {
        c.sequence++;
        fail(SHOAL_ERR_INVALID_ARGUMENT, "{}: tensor is NULL", call);
      }
      size_t count = 0;
      MemoryRoute route = routeOf(call, {tensor});
      auto checks = [&] {
        count = checkedElements(call, "tensor", tensor);
        checkDtype(call, tensor->dtype);
        checkBuffer(call, "tensor->data", tensor->data, count * dtypeSize(tensor->dtype));
        if (root < 0 || root >= c.size)
          fail(SHOAL_ERR_INVALID_ARGUMENT, "{}: root {} is not a rank; use 0..{}", call, root, c.size - 1);
      };
      if (!route.cuda) {
        refuseTakingNumber(c, checks);
        return broadcastBody(c, call, tensor->data, tensor->data, count, tensor->dtype, root);
      }
      const uint64_t sequence = c.sequence++;
      checkCudaArguments(c, sequence, route, checks);
      checkCudaReady(c, call, route);
      cudaBroadcast(c, sequence, route, tensor->data, tensor->data, count, tensor->dtype, root);
    });
  });
}

SHOAL_EXPORT shoal_status_t shoal_reduce_scatter(shoal_comm_t comm, const void* sendbuf, void* recvbuf,
                                                 size_t recvcount, shoal_dtype_t dtype, shoal_op_t op) {
  return guarded(comm, [&] {
    const char* call = "shoal_reduce_scatter";
    shoal_comm& c = usableComm(comm, call);
    runtime::blockingCall(c, call, [&] {
      const uint64_t sequence = c.sequence++;
      checkDtypeOp(call, dtype, op);
      size_t totalBytes = checkedBytes(call, "recvcount x world size", recvcount, dtype, static_cast<size_t>(c.size));
      size_t bytes = recvcount * dtypeSize(dtype);
      checkBuffer(call, "sendbuf", sendbuf, totalBytes);
      checkBuffer(call, "recvbuf", recvbuf, bytes);
      const uint8_t* inPlace = static_cast<const uint8_t*>(sendbuf) + c.rank * bytes;
      checkNoPartialOverlap(call, sendbuf, totalBytes, recvbuf, bytes, recvbuf == inPlace);
      CallScope scope(c, signatureOf(CallKind::ReduceScatter, dtype, op, recvcount, -1, "ring"));
      if (recvcount == 0) return emptyCall(c, sequence);
      Reducer reducer(dtype, op);
      // The ring reduces in place over the whole buffer: work on a copy so sendbuf stays intact.
      // The ring writes partial sums of every block: into scratch, so sendbuf
      // stays intact. (Slots 0 and 1 are the ring's receive buffers; 2 is free.)
      uint8_t* work = c.scratch.get(2, totalBytes);
      Blocks blocks = splitEvenly(recvcount * c.size, dtypeSize(dtype), c.size, c.segmentBytes, c.size);
      runCollective(c, sequence, [&](Context& context) {
        ringReduceScatter(context, static_cast<const uint8_t*>(sendbuf), work, blocks, reducer);
      });
      if (c.size == 1) std::memcpy(work, sendbuf, totalBytes);
      reducer.finish(work + blocks.offset[c.rank], recvcount, c.size);
      std::memcpy(recvbuf, work + blocks.offset[c.rank], bytes);
    });
  });
}

SHOAL_EXPORT shoal_status_t shoal_barrier(shoal_comm_t comm) {
  return guarded(comm, [&] {
    shoal_comm& c = usableComm(comm, "shoal_barrier");
    runtime::blockingCall(c, "shoal_barrier", [&] {
      CallScope scope(c, signatureOf(CallKind::Barrier, -1, -1, 0));
      const bool shared = sharedSegmentFor(c, 0);
      runCollective(c, c.sequence++, [&](Context& context) { shared ? barrierShm(context) : barrierDissemination(context); });
    });
  });
}
