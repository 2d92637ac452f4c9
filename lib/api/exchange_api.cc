// C entry points of alltoall(v), reduce, gather(v) and scatter(v). Like
// collectives_api.cc: every argument is checked before any communication,
// the call's sequence number is taken first (a refusal takes it too), and the
// body runs under the call's signature through runCollective.
//
// Agreement: a uniform count, the dtype, op and root travel in every
// message's signature (api/agree.h). Where a call's data flows one way (the
// rooted calls), empty messages along a dissemination pattern first carry
// every rank's signature to every rank, as broadcast does, so a rank naming
// another root or count fails everywhere. Per-peer counts (the v forms)
// cannot be in a common signature: a message's size is checked by its
// receiver, and a closing dissemination round makes every rank wait until all
// receivers checked theirs, so a disagreement fails on every rank, not only
// on the receiver.
#include <cstring>
#include <limits>
#include <tuple>
#include <vector>

#include "comm/agree.h"
#include "api/checks.h"
#include "comm/communicator.h"
#include "api/enter.h"
#include "api/export.h"
#include "api/guard.h"
#include "comm/call.h"
#include "collectives/collectives.h"
#include "collectives/exchange.h"
#include "gpu/exchange_route.h"
#include "runtime/blocking.h"

using namespace shoal;

namespace {

// Per-peer byte counts and offsets from element counts and displacements
// (NULL displacements pack the blocks), with the end of the furthest block.
struct Layout {
  std::vector<size_t> bytes, offset;
  size_t end = 0;
  PeerBlocks blocks() const { return {bytes.data(), offset.data()}; }
};

Layout layoutOf(const char* call, const char* countsName, const char* displsName, const size_t* counts,
                const size_t* displs, int peers, shoal_dtype_t dtype) {
  if (counts == nullptr)
    fail(SHOAL_ERR_INVALID_ARGUMENT, "{}: {} is NULL; pass one count per rank", call, countsName);
  Layout layout;
  layout.bytes.resize(peers);
  layout.offset.resize(peers);
  size_t packed = 0;
  for (int p = 0; p < peers; ++p) {
    const size_t bytes = checkedByteCount(call, countsName, counts[p], dtype);
    const size_t place = displs ? checkedByteCount(call, displsName, displs[p], dtype) : packed;
    if (std::numeric_limits<size_t>::max() - place < bytes || std::numeric_limits<size_t>::max() - packed < bytes ||
        place + bytes > kMaxBufferBytes)
      fail(SHOAL_ERR_INVALID_ARGUMENT, "{}: {}[{}] and {}[{}] reach beyond the largest buffer ({} bytes)", call,
           countsName, p, displsName, p, kMaxBufferBytes);
    layout.bytes[p] = bytes;
    layout.offset[p] = place;
    packed += bytes;
    layout.end = std::max(layout.end, place + bytes);
  }
  return layout;
}

Layout uniformLayout(size_t bytesEach, int peers) {
  Layout layout;
  layout.bytes.assign(peers, bytesEach);
  layout.offset.resize(peers);
  for (int p = 0; p < peers; ++p) layout.offset[p] = p * bytesEach;
  layout.end = bytesEach * peers;
  return layout;
}

// Alltoall(v) once arguments are checked. In place (send == recv) the send
// side is staged in scratch slot 2 (the algorithms use 0 and 1).
void runAlltoallv(shoal_comm& c, uint64_t sequence, const void* sendbuf, const Layout& send, void* recvbuf,
                  const Layout& recv, bool closingRound, const AlltoallAlgorithm& algorithm) {
  const uint8_t* source = static_cast<const uint8_t*>(sendbuf);
  if (sendbuf == recvbuf && send.end > 0) {
    uint8_t* staged = c.scratch.get(2, send.end);
    std::memcpy(staged, sendbuf, send.end);
    source = staged;
  }
  runCollective(c, sequence, [&](Context& context) {
    algorithm.run(context, source, send.blocks(), static_cast<uint8_t*>(recvbuf), recv.blocks());
    if (closingRound) barrierDissemination(context);
  });
}

// alltoall and alltoallv on host memory. alltoall's count is in the
// signature: every rank receives from every other, so a count that differs
// anywhere fails some receive on every rank, no closing round needed.
// alltoallv's per-peer counts take the closing round (see the top).
void hostAlltoall(shoal_comm& c, uint64_t sequence, CallKind kind, shoal_dtype_t dtype, size_t count,
                  const void* sendbuf, const Layout& send, void* recvbuf, const Layout& recv) {
  const bool v = kind == CallKind::Alltoallv;
  const AlltoallAlgorithm& algorithm = selectAlltoall(c.algorithm, !v, send.end);
  CallScope scope(c, signatureOf(kind, dtype, -1, v ? 0 : count, -1, algorithm.name));
  runAlltoallv(c, sequence, sendbuf, send, recvbuf, recv, v, algorithm);
}

// shoal_alltoall's checks (its tensor form's too): the uniform layout.
Layout checkAlltoall(const char* call, const shoal_comm& c, const void* sendbuf, void* recvbuf, size_t count,
                     shoal_dtype_t dtype) {
  checkDtype(call, dtype);
  const size_t total = checkedByteCount(call, "count x world size", count, dtype, static_cast<size_t>(c.size));
  checkBuffer(call, "sendbuf", sendbuf, total);
  checkBuffer(call, "recvbuf", recvbuf, total);
  checkNoPartialOverlap(call, sendbuf, total, recvbuf, total, sendbuf == recvbuf);
  return uniformLayout(count * dtypeSize(dtype), c.size);
}

// shoal_alltoallv's checks: the send and receive layouts.
std::pair<Layout, Layout> checkAlltoallv(const char* call, const shoal_comm& c, const void* sendbuf,
                                         const size_t* sendcounts, const size_t* sdispls, void* recvbuf,
                                         const size_t* recvcounts, const size_t* rdispls, shoal_dtype_t dtype) {
  checkDtype(call, dtype);
  Layout send = layoutOf(call, "sendcounts", "sdispls", sendcounts, sdispls, c.size, dtype);
  Layout recv = layoutOf(call, "recvcounts", "rdispls", recvcounts, rdispls, c.size, dtype);
  if (send.bytes[c.rank] != recv.bytes[c.rank])
    fail(SHOAL_ERR_INVALID_ARGUMENT, "{}: sendcounts[{}] = {} differs from recvcounts[{}] = {}; a rank's block "
         "to itself must have one size", call, c.rank, sendcounts[c.rank], c.rank, recvcounts[c.rank]);
  checkBuffer(call, "sendbuf", sendbuf, send.end);
  checkBuffer(call, "recvbuf", recvbuf, recv.end);
  checkNoPartialOverlap(call, sendbuf, send.end, recvbuf, recv.end, sendbuf == recvbuf);
  return {std::move(send), std::move(recv)};
}

}  // namespace

SHOAL_EXPORT shoal_status_t shoal_alltoall(shoal_comm_t comm, const void* sendbuf, void* recvbuf, size_t count,
                                           shoal_dtype_t dtype) {
  return enter(comm, "shoal_alltoall", [&](Call& thisCall) {
    shoal_comm& c = thisCall.comm();
    Layout layout = checkAlltoall(thisCall.name(), c, sendbuf, recvbuf, count, dtype);
    hostAlltoall(c, thisCall.sequence(), CallKind::Alltoall, dtype, count, sendbuf, layout, recvbuf, layout);
  });
}

SHOAL_EXPORT shoal_status_t shoal_alltoallv(shoal_comm_t comm, const void* sendbuf, const size_t* sendcounts,
                                            const size_t* sdispls, void* recvbuf, const size_t* recvcounts,
                                            const size_t* rdispls, shoal_dtype_t dtype) {
  return enter(comm, "shoal_alltoallv", [&](Call& thisCall) {
    shoal_comm& c = thisCall.comm();
    auto [send, recv] =
        checkAlltoallv(thisCall.name(), c, sendbuf, sendcounts, sdispls, recvbuf, recvcounts, rdispls, dtype);
    hostAlltoall(c, thisCall.sequence(), CallKind::Alltoallv, dtype, 0, sendbuf, send, recvbuf, recv);
  });
}

namespace {

void checkReduce(const char* call, const shoal_comm& c, const void* sendbuf, void* recvbuf, size_t count,
                 shoal_dtype_t dtype, shoal_op_t op, int root) {
  checkDtypeOp(call, dtype, op);
  checkRank(call, "root", root, c.size);
  const size_t bytes = checkedByteCount(call, "count", count, dtype);
  checkBuffer(call, "sendbuf", sendbuf, bytes);
  if (c.rank == root) {
    checkBuffer(call, "recvbuf (on root)", recvbuf, bytes);
    checkNoPartialOverlap(call, sendbuf, bytes, recvbuf, bytes, sendbuf == recvbuf);
  }
}

void runReduce(shoal_comm& c, uint64_t sequence, const void* sendbuf, void* recvbuf, size_t count,
               shoal_dtype_t dtype, shoal_op_t op, int root) {
  CallScope scope(c, signatureOf(CallKind::Reduce, dtype, op, count, root, "tree"));
  Reducer reducer(dtype, op);
  runCollective(c, sequence, [&](Context& context) {
    barrierDissemination(context);  // the root and count reach every rank first (see the top)
    reduceTree(context, sendbuf, recvbuf, count, reducer, root);
  });
}

}  // namespace

SHOAL_EXPORT shoal_status_t shoal_reduce(shoal_comm_t comm, const void* sendbuf, void* recvbuf, size_t count,
                                         shoal_dtype_t dtype, shoal_op_t op, int root) {
  return enter(comm, "shoal_reduce", [&](Call& thisCall) {
    checkReduce(thisCall.name(), thisCall.comm(), sendbuf, recvbuf, count, dtype, op, root);
    runReduce(thisCall.comm(), thisCall.sequence(), sendbuf, recvbuf, count, dtype, op, root);
  });
}

namespace {

// gather and gatherv after their own checks: root's layout, this rank's block.
void runGather(shoal_comm& c, uint64_t sequence, const void* sendbuf, size_t sendBytes, void* recvbuf,
               const Layout& recv, int root, bool closingRound) {
  uint8_t* out = static_cast<uint8_t*>(recvbuf);
  if (c.rank == root && sendBytes > 0 && sendbuf != out + recv.offset[root])
    std::memcpy(out + recv.offset[root], sendbuf, sendBytes);
  runCollective(c, sequence, [&](Context& context) {
    barrierDissemination(context);
    gatherLinear(context, sendbuf, sendBytes, out, recv.blocks(), root);
    if (closingRound) barrierDissemination(context);
  });
}

void runScatter(shoal_comm& c, uint64_t sequence, const void* sendbuf, const Layout& send, void* recvbuf,
                size_t recvBytes, int root, bool closingRound) {
  const uint8_t* in = static_cast<const uint8_t*>(sendbuf);
  if (c.rank == root && recvBytes > 0 && recvbuf != in + send.offset[root])
    std::memcpy(recvbuf, in + send.offset[root], recvBytes);
  runCollective(c, sequence, [&](Context& context) {
    barrierDissemination(context);
    scatterLinear(context, in, send.blocks(), recvbuf, recvBytes, root);
    if (closingRound) barrierDissemination(context);
  });
}

}  // namespace

namespace {

// The rooted calls' checks; each returns root's layout (every rank's block;
// on other ranks the v forms' layout is empty) and this rank's block bytes.
struct Rooted {
  Layout layout;
  size_t bytes = 0;
};

// Root's buffers against its layout, every rank's own block: gather's
// receive side on root (its own block may be root's block, in place), the
// send side elsewhere. scatter is the mirror image.
void checkGatherBuffers(const char* call, const shoal_comm& c, const void* sendbuf, void* recvbuf,
                        const Rooted& rooted, int root) {
  if (c.rank == root) {
    checkBuffer(call, "recvbuf (on root)", recvbuf, rooted.layout.end);
    const void* inPlace = static_cast<uint8_t*>(recvbuf) + rooted.layout.offset[root];
    if (sendbuf != inPlace) checkBuffer(call, "sendbuf", sendbuf, rooted.bytes);
    checkNoPartialOverlap(call, sendbuf, rooted.bytes, recvbuf, rooted.layout.end, sendbuf == inPlace);
  } else {
    checkBuffer(call, "sendbuf", sendbuf, rooted.bytes);
  }
}

void checkScatterBuffers(const char* call, const shoal_comm& c, const void* sendbuf, void* recvbuf,
                         const Rooted& rooted, int root) {
  if (c.rank == root) {
    checkBuffer(call, "sendbuf (on root)", sendbuf, rooted.layout.end);
    const void* inPlace = static_cast<const uint8_t*>(sendbuf) + rooted.layout.offset[root];
    if (recvbuf != inPlace) checkBuffer(call, "recvbuf", recvbuf, rooted.bytes);
    checkNoPartialOverlap(call, sendbuf, rooted.layout.end, recvbuf, rooted.bytes, recvbuf == inPlace);
  } else {
    checkBuffer(call, "recvbuf", recvbuf, rooted.bytes);
  }
}

// The fixed-count forms: `count` elements per rank, packed.
Rooted uniformRooted(const char* call, const shoal_comm& c, const char* what, size_t count, shoal_dtype_t dtype,
                     int root) {
  checkDtype(call, dtype);
  checkRank(call, "root", root, c.size);
  const size_t total = checkedByteCount(call, what, count, dtype, c.size);
  return Rooted{uniformLayout(total / c.size, c.size), total / c.size};
}

// The v forms: root's per-rank counts, whose own entry must equal `count`.
Rooted perRankRooted(const char* call, const shoal_comm& c, const char* countName, const char* countsName,
                     size_t count, const size_t* counts, const size_t* displs, shoal_dtype_t dtype, int root) {
  checkDtype(call, dtype);
  checkRank(call, "root", root, c.size);
  Rooted rooted;
  rooted.bytes = checkedByteCount(call, countName, count, dtype);
  if (c.rank == root) {
    rooted.layout = layoutOf(call, countsName, "displs", counts, displs, c.size, dtype);
    if (rooted.layout.bytes[root] != rooted.bytes)
      fail(SHOAL_ERR_INVALID_ARGUMENT, "{}: {} {} differs from {}[{}] = {} on root; they must be equal", call,
           countName, count, countsName, root, counts[root]);
  }
  return rooted;
}

Rooted checkGather(const char* call, const shoal_comm& c, const void* sendbuf, void* recvbuf, size_t sendcount,
                   shoal_dtype_t dtype, int root) {
  Rooted rooted = uniformRooted(call, c, "sendcount x world size", sendcount, dtype, root);
  checkGatherBuffers(call, c, sendbuf, recvbuf, rooted, root);
  return rooted;
}

Rooted checkGatherv(const char* call, const shoal_comm& c, const void* sendbuf, size_t sendcount, void* recvbuf,
                    const size_t* recvcounts, const size_t* displs, shoal_dtype_t dtype, int root) {
  Rooted rooted = perRankRooted(call, c, "sendcount", "recvcounts", sendcount, recvcounts, displs, dtype, root);
  checkGatherBuffers(call, c, sendbuf, recvbuf, rooted, root);
  return rooted;
}

Rooted checkScatter(const char* call, const shoal_comm& c, const void* sendbuf, void* recvbuf, size_t recvcount,
                    shoal_dtype_t dtype, int root) {
  Rooted rooted = uniformRooted(call, c, "recvcount x world size", recvcount, dtype, root);
  checkScatterBuffers(call, c, sendbuf, recvbuf, rooted, root);
  return rooted;
}

Rooted checkScatterv(const char* call, const shoal_comm& c, const void* sendbuf, const size_t* sendcounts,
                     const size_t* displs, void* recvbuf, size_t recvcount, shoal_dtype_t dtype, int root) {
  Rooted rooted = perRankRooted(call, c, "recvcount", "sendcounts", recvcount, sendcounts, displs, dtype, root);
  checkScatterBuffers(call, c, sendbuf, recvbuf, rooted, root);
  return rooted;
}

void hostGather(shoal_comm& c, uint64_t sequence, CallKind kind, size_t count, const void* sendbuf, void* recvbuf,
                const Rooted& rooted, shoal_dtype_t dtype, int root) {
  const bool v = kind == CallKind::Gatherv;
  CallScope scope(c, signatureOf(kind, dtype, -1, v ? 0 : count, root, "linear"));
  runGather(c, sequence, sendbuf, rooted.bytes, recvbuf, rooted.layout, root, v);
}

void hostScatter(shoal_comm& c, uint64_t sequence, CallKind kind, size_t count, const void* sendbuf, void* recvbuf,
                 const Rooted& rooted, shoal_dtype_t dtype, int root) {
  const bool v = kind == CallKind::Scatterv;
  CallScope scope(c, signatureOf(kind, dtype, -1, v ? 0 : count, root, "linear"));
  runScatter(c, sequence, sendbuf, rooted.layout, recvbuf, rooted.bytes, root, v);
}

}  // namespace

SHOAL_EXPORT shoal_status_t shoal_gather(shoal_comm_t comm, const void* sendbuf, void* recvbuf, size_t sendcount,
                                         shoal_dtype_t dtype, int root) {
  return enter(comm, "shoal_gather", [&](Call& thisCall) {
    Rooted rooted = checkGather(thisCall.name(), thisCall.comm(), sendbuf, recvbuf, sendcount, dtype, root);
    hostGather(thisCall.comm(), thisCall.sequence(), CallKind::Gather, sendcount, sendbuf, recvbuf, rooted, dtype,
               root);
  });
}

SHOAL_EXPORT shoal_status_t shoal_gatherv(shoal_comm_t comm, const void* sendbuf, size_t sendcount, void* recvbuf,
                                          const size_t* recvcounts, const size_t* displs, shoal_dtype_t dtype,
                                          int root) {
  return enter(comm, "shoal_gatherv", [&](Call& thisCall) {
    Rooted rooted = checkGatherv(thisCall.name(), thisCall.comm(), sendbuf, sendcount, recvbuf, recvcounts, displs,
                                 dtype, root);
    hostGather(thisCall.comm(), thisCall.sequence(), CallKind::Gatherv, 0, sendbuf, recvbuf, rooted, dtype, root);
  });
}

SHOAL_EXPORT shoal_status_t shoal_scatter(shoal_comm_t comm, const void* sendbuf, void* recvbuf, size_t recvcount,
                                          shoal_dtype_t dtype, int root) {
  return enter(comm, "shoal_scatter", [&](Call& thisCall) {
    Rooted rooted = checkScatter(thisCall.name(), thisCall.comm(), sendbuf, recvbuf, recvcount, dtype, root);
    hostScatter(thisCall.comm(), thisCall.sequence(), CallKind::Scatter, recvcount, sendbuf, recvbuf, rooted, dtype,
                root);
  });
}

SHOAL_EXPORT shoal_status_t shoal_scatterv(shoal_comm_t comm, const void* sendbuf, const size_t* sendcounts,
                                           const size_t* displs, void* recvbuf, size_t recvcount,
                                           shoal_dtype_t dtype, int root) {
  return enter(comm, "shoal_scatterv", [&](Call& thisCall) {
    Rooted rooted = checkScatterv(thisCall.name(), thisCall.comm(), sendbuf, sendcounts, displs, recvbuf, recvcount,
                                  dtype, root);
    hostScatter(thisCall.comm(), thisCall.sequence(), CallKind::Scatterv, 0, sendbuf, recvbuf, rooted, dtype, root);
  });
}

// ---- tensor forms: host tensors take the calls above, CUDA tensors NCCL ----
//
// The same checks as the raw-pointer calls, on the tensors' data, plus the
// tensors' own: dtypes, element counts, room for the layout. A host call's
// refusal is this rank's (as above); a CUDA call's reaches every rank through
// the agreement round of gpu/route.h, and the per-peer forms compare every
// pair's counts before NCCL moves data (gpu/exchange_route.h).

namespace {

size_t elementsOf(const char* call, const char* what, const shoal_tensor_t* tensor) {
  if (tensor == nullptr) fail(SHOAL_ERR_INVALID_ARGUMENT, "{}: {} is NULL", call, what);
  return checkedTensorElements(call, what, *tensor);
}

void sameDtype(const char* call, const shoal_tensor_t& input, const shoal_tensor_t& output) {
  if (output.dtype != input.dtype)
    fail(SHOAL_ERR_INVALID_ARGUMENT, "{}: output dtype {} differs from input dtype {}", call,
         shoal_dtype_name(output.dtype), shoal_dtype_name(input.dtype));
}

void expectElements(const char* call, const char* what, size_t elements, size_t expected, const char* rule) {
  if (elements != expected)
    fail(SHOAL_ERR_INVALID_ARGUMENT, "{}: {} has {} elements; it must hold {} ({})", call, what, elements, expected,
         rule);
}

// A v form's blocks must lie inside the tensor.
void expectRoom(const char* call, const char* what, const shoal_tensor_t& tensor, size_t elements, size_t end,
                const char* layout) {
  if (end > elements * dtypeSize(tensor.dtype))
    fail(SHOAL_ERR_INVALID_ARGUMENT, "{}: {} reach element {} but {} has {} elements", call, layout,
         end / dtypeSize(tensor.dtype), what, elements);
}

// The tensors a rank passes that it uses: rooted calls read some on root only
// (and accept NULL elsewhere), so only those decide the memory route.
std::vector<const shoal_tensor_t*> used(std::initializer_list<const shoal_tensor_t*> always,
                                        const shoal_tensor_t* onRootOnly, bool isRoot) {
  std::vector<const shoal_tensor_t*> tensors;
  for (const shoal_tensor_t* tensor : always)
    if (tensor != nullptr) tensors.push_back(tensor);
  if (isRoot && onRootOnly != nullptr) tensors.push_back(onRootOnly);
  return tensors;
}

DeviceBlocks deviceBlocks(const Layout& layout, int size) {
  if (layout.bytes.empty()) return DeviceBlocks{std::vector<size_t>(size), std::vector<size_t>(size)};
  return DeviceBlocks{layout.bytes, layout.offset};
}

// Blocks with bytes for one rank only, at offset 0 (a rooted call's one-way side).
DeviceBlocks oneBlock(int size, int rank, size_t bytes) {
  DeviceBlocks blocks{std::vector<size_t>(size), std::vector<size_t>(size)};
  blocks.bytes[rank] = bytes;
  return blocks;
}

// Host tensors: checks (refused on this rank alone, like the raw-pointer
// calls), then host(). CUDA tensors: checks whose refusal every rank hears
// of, this process's readiness, then device().
template <typename Checks, typename Host, typename Device>
void tensorCall(Call& call, MemoryRoute& route, Checks&& checks, Host&& host, Device&& device) {
  if (!route.cuda) {
    checks();
    return host();
  }
  checkCudaArguments(call.comm(), call.sequence(), route, checks);
  checkCudaReady(call.comm(), call.name(), route);
  device();
}

// The three shapes of tensor entry point. Each takes its call's own checks
// (`checks`, run on this rank or agreed across ranks by tensorCall) and does
// the rest alike for the fixed-count and the v form: the NULL test that comes
// before the memory route, the route, the host call and the CUDA exchange.

// What alltoall(v)'s checks leave: both layouts, the uniform count (0 for v).
struct Exchanged {
  Layout send, recv;
  size_t count = 0;
};

template <typename Checks>
shoal_status_t alltoallTensor(shoal_comm_t comm, const char* name, CallKind kind, const shoal_tensor_t* input,
                              const shoal_tensor_t* output, Checks&& checks) {
  return enter(comm, name, [&](Call& thisCall) {
    const char* call = thisCall.name();
    shoal_comm& c = thisCall.comm();
    const bool v = kind == CallKind::Alltoallv;
    if (input == nullptr || output == nullptr)
      fail(SHOAL_ERR_INVALID_ARGUMENT, "{}: input and output must not be NULL", call);
    MemoryRoute route = routeOf(call, {input, output});
    Exchanged layouts;
    tensorCall(
        thisCall, route, [&] { layouts = checks(call, c); },
        [&] {
          hostAlltoall(c, thisCall.sequence(), kind, input->dtype, layouts.count, input->data, layouts.send,
                       output->data, layouts.recv);
        },
        [&] {
          cudaExchange(c, thisCall.sequence(), route,
                       DeviceExchange{v ? "alltoallv" : "alltoall", input->dtype, layouts.count, -1, v, input->data,
                                      deviceBlocks(layouts.send, c.size), output->data,
                                      deviceBlocks(layouts.recv, c.size)});
        });
  });
}

// gather(v): `checks(call, c, count, out, recv)` checks root's side (`out`:
// the output's elements on root, `recv` its data; 0 and NULL elsewhere).
template <typename Checks>
shoal_status_t gatherTensor(shoal_comm_t comm, const char* name, CallKind kind, const shoal_tensor_t* input,
                            const shoal_tensor_t* output, int root, Checks&& checks) {
  return enter(comm, name, [&](Call& thisCall) {
    const char* call = thisCall.name();
    shoal_comm& c = thisCall.comm();
    const bool isRoot = c.rank == root, v = kind == CallKind::Gatherv;
    if (input == nullptr) fail(SHOAL_ERR_INVALID_ARGUMENT, "{}: input is NULL", call);
    MemoryRoute route = routeOf(call, used({input}, output, isRoot));
    size_t count = 0;
    void* recv = nullptr;
    Rooted rooted;
    tensorCall(
        thisCall, route,
        [&] {
          count = elementsOf(call, "input", input);
          size_t out = 0;
          if (isRoot) {
            out = elementsOf(call, "output (on root)", output);
            sameDtype(call, *input, *output);
            recv = output->data;
          }
          rooted = checks(call, c, count, out, recv);
        },
        [&] { hostGather(c, thisCall.sequence(), kind, count, input->data, recv, rooted, input->dtype, root); },
        [&] {
          cudaExchange(c, thisCall.sequence(), route,
                       DeviceExchange{v ? "gatherv" : "gather", input->dtype, v ? 0 : count, root, v, input->data,
                                      oneBlock(c.size, root, rooted.bytes), recv,
                                      isRoot ? deviceBlocks(rooted.layout, c.size) : oneBlock(c.size, root, 0)});
        });
  });
}

// scatter(v), gather's mirror image: `checks(call, c, count, in, send)`.
template <typename Checks>
shoal_status_t scatterTensor(shoal_comm_t comm, const char* name, CallKind kind, const shoal_tensor_t* input,
                             const shoal_tensor_t* output, int root, Checks&& checks) {
  return enter(comm, name, [&](Call& thisCall) {
    const char* call = thisCall.name();
    shoal_comm& c = thisCall.comm();
    const bool isRoot = c.rank == root, v = kind == CallKind::Scatterv;
    if (output == nullptr) fail(SHOAL_ERR_INVALID_ARGUMENT, "{}: output is NULL", call);
    MemoryRoute route = routeOf(call, used({output}, input, isRoot));
    size_t count = 0;
    const void* send = nullptr;
    Rooted rooted;
    tensorCall(
        thisCall, route,
        [&] {
          count = elementsOf(call, "output", output);
          size_t in = 0;
          if (isRoot) {
            in = elementsOf(call, "input (on root)", input);
            sameDtype(call, *input, *output);
            send = input->data;
          }
          rooted = checks(call, c, count, in, send);
        },
        [&] { hostScatter(c, thisCall.sequence(), kind, count, send, output->data, rooted, output->dtype, root); },
        [&] {
          cudaExchange(c, thisCall.sequence(), route,
                       DeviceExchange{v ? "scatterv" : "scatter", output->dtype, v ? 0 : count, root, v, send,
                                      isRoot ? deviceBlocks(rooted.layout, c.size) : oneBlock(c.size, root, 0),
                                      output->data, oneBlock(c.size, root, rooted.bytes)});
        });
  });
}

}  // namespace

SHOAL_EXPORT shoal_status_t shoal_alltoall_tensor(shoal_comm_t comm, const shoal_tensor_t* input,
                                                  const shoal_tensor_t* output) {
  return alltoallTensor(comm, "shoal_alltoall_tensor", CallKind::Alltoall, input, output,
                        [&](const char* call, const shoal_comm& c) {
                          const size_t elements = elementsOf(call, "input", input);
                          sameDtype(call, *input, *output);
                          if (elements % c.size != 0)
                            fail(SHOAL_ERR_INVALID_ARGUMENT, "{}: input has {} elements, not a multiple of the world "
                                 "size {}; use shoal_alltoallv_tensor for blocks of different sizes", call, elements,
                                 c.size);
                          expectElements(call, "output", elementsOf(call, "output", output), elements,
                                         "as many as input");
                          const size_t count = elements / c.size;
                          Layout layout = checkAlltoall(call, c, input->data, output->data, count, input->dtype);
                          return Exchanged{layout, layout, count};
                        });
}

SHOAL_EXPORT shoal_status_t shoal_alltoallv_tensor(shoal_comm_t comm, const shoal_tensor_t* input,
                                                   const size_t* sendcounts, const size_t* sdispls,
                                                   const shoal_tensor_t* output, const size_t* recvcounts,
                                                   const size_t* rdispls) {
  return alltoallTensor(comm, "shoal_alltoallv_tensor", CallKind::Alltoallv, input, output,
                        [&](const char* call, const shoal_comm& c) {
                          const size_t in = elementsOf(call, "input", input), out = elementsOf(call, "output", output);
                          sameDtype(call, *input, *output);
                          Exchanged layouts;
                          std::tie(layouts.send, layouts.recv) = checkAlltoallv(
                              call, c, input->data, sendcounts, sdispls, output->data, recvcounts, rdispls,
                              input->dtype);
                          expectRoom(call, "input", *input, in, layouts.send.end, "sendcounts and sdispls");
                          expectRoom(call, "output", *output, out, layouts.recv.end, "recvcounts and rdispls");
                          return layouts;
                        });
}

SHOAL_EXPORT shoal_status_t shoal_reduce_tensor(shoal_comm_t comm, const shoal_tensor_t* input,
                                                const shoal_tensor_t* output, shoal_op_t op, int root) {
  return enter(comm, "shoal_reduce_tensor", [&](Call& thisCall) {
    const char* call = thisCall.name();
    shoal_comm& c = thisCall.comm();
    const bool isRoot = c.rank == root;
    if (input == nullptr) fail(SHOAL_ERR_INVALID_ARGUMENT, "{}: input is NULL", call);
    MemoryRoute route = routeOf(call, used({input}, output, isRoot));
    size_t count = 0;
    void* recv = nullptr;
    tensorCall(
        thisCall, route,
        [&] {
          count = elementsOf(call, "input", input);
          if (isRoot) {
            expectElements(call, "output (on root)", elementsOf(call, "output (on root)", output), count,
                           "as many as input");
            sameDtype(call, *input, *output);
            recv = output->data;
          }
          checkReduce(call, c, input->data, recv, count, input->dtype, op, root);
          if (route.cuda && !ncclReduces(op))
            fail(SHOAL_ERR_UNSUPPORTED, "{}: NCCL has no {} reduction for CUDA tensors; reduce with sum, avg, prod, "
                 "min or max, or use shoal_allreduce_tensor (its device ring runs the bitwise ops)",
                 call, shoal_op_name(op));
        },
        [&] { runReduce(c, thisCall.sequence(), input->data, recv, count, input->dtype, op, root); },
        [&] { cudaReduce(c, thisCall.sequence(), route, input->data, recv, count, input->dtype, op, root); });
  });
}

SHOAL_EXPORT shoal_status_t shoal_gather_tensor(shoal_comm_t comm, const shoal_tensor_t* input,
                                                const shoal_tensor_t* output, int root) {
  return gatherTensor(comm, "shoal_gather_tensor", CallKind::Gather, input, output, root,
                      [&](const char* call, const shoal_comm& c, size_t count, size_t out, void* recv) {
                        if (c.rank == root) {
                          checkedByteCount(call, "input elements x world size", count, input->dtype, c.size);
                          expectElements(call, "output (on root)", out, count * c.size, "world size x input");
                        }
                        return checkGather(call, c, input->data, recv, count, input->dtype, root);
                      });
}

SHOAL_EXPORT shoal_status_t shoal_gatherv_tensor(shoal_comm_t comm, const shoal_tensor_t* input,
                                                 const shoal_tensor_t* output, const size_t* recvcounts,
                                                 const size_t* displs, int root) {
  return gatherTensor(comm, "shoal_gatherv_tensor", CallKind::Gatherv, input, output, root,
                      [&](const char* call, const shoal_comm& c, size_t count, size_t out, void* recv) {
                        Rooted rooted =
                            checkGatherv(call, c, input->data, count, recv, recvcounts, displs, input->dtype, root);
                        if (c.rank == root)
                          expectRoom(call, "output (on root)", *output, out, rooted.layout.end,
                                     "recvcounts and displs");
                        return rooted;
                      });
}

SHOAL_EXPORT shoal_status_t shoal_scatter_tensor(shoal_comm_t comm, const shoal_tensor_t* input,
                                                 const shoal_tensor_t* output, int root) {
  return scatterTensor(comm, "shoal_scatter_tensor", CallKind::Scatter, input, output, root,
                       [&](const char* call, const shoal_comm& c, size_t count, size_t in, const void* send) {
                         if (c.rank == root) {
                           checkedByteCount(call, "output elements x world size", count, output->dtype, c.size);
                           expectElements(call, "input (on root)", in, count * c.size, "world size x output");
                         }
                         return checkScatter(call, c, send, output->data, count, output->dtype, root);
                       });
}

SHOAL_EXPORT shoal_status_t shoal_scatterv_tensor(shoal_comm_t comm, const shoal_tensor_t* input,
                                                  const size_t* sendcounts, const size_t* displs,
                                                  const shoal_tensor_t* output, int root) {
  return scatterTensor(comm, "shoal_scatterv_tensor", CallKind::Scatterv, input, output, root,
                       [&](const char* call, const shoal_comm& c, size_t count, size_t in, const void* send) {
                         Rooted rooted =
                             checkScatterv(call, c, send, sendcounts, displs, output->data, count, output->dtype, root);
                         if (c.rank == root)
                           expectRoom(call, "input (on root)", *input, in, rooted.layout.end, "sendcounts and displs");
                         return rooted;
                       });
}
